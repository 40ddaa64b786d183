"""Tools (`searchrl.tools`): the registry and users' tools by import path, argument checks against
the schema, and the three built-in tools — search (one batched retrieval a round), open (passages
by id and title from a small index, pages by URL under the outbound policy) and calculate (exact
on cases; hostile and random input refused in bounded time, nothing outside its allow-list run).

Network tests talk to loopback servers only; the resolver and "internet" fixtures of
test_outbound map test names to addresses without any real DNS query."""

from __future__ import annotations

import re
import sys
import textwrap
import time
from pathlib import Path

import hypothesis.strategies as st
import pytest
from hypothesis import HealthCheck, given, settings
from loopback import Routes
from test_outbound import PUBLIC, _url, dns, internet  # noqa: F401  (dns, internet: the fixed resolver and internet)

from searchrl.data.types import Passage
from searchrl.errors import RetrievalUnavailable, SearchRLError
from searchrl.retrieval.base import Retriever
from searchrl.retrieval.index import build_index, open_index
from searchrl.retrieval.querycache import CachedRetriever
from searchrl.retrieval.web.config import WebConfig
from searchrl.retrieval.web.pages import PageReader
from searchrl.tools import (
    TOOLS,
    Observation,
    Tool,
    ToolContext,
    build_tools,
    check_arguments,
    check_schema,
)
from searchrl.tools.calculate import MAX_CHARS, calculate

TOOLS_GUIDE = Path(__file__).parents[2] / "docs" / "guides" / "tools.md"


def guide_tool() -> str:
    """The user tool docs/guides/tools.md shows under "Writing your own tool", as its code block has it."""
    section = TOOLS_GUIDE.read_text(encoding="utf-8").split("\n## Writing your own tool\n", 1)[1]
    return section.split("```python\n", 1)[1].split("```", 1)[0]


# Bad tools beside the guide's, in the same module.
BAD_TOOLS = textwrap.dedent('''
    class NotATool:
        pass

    class Loose(Weather):
        name = "loose"
        parameters = {"type": "object", "properties": {"when": {"type": "string", "format": "date-time"}}}

    class Abstract(Tool):
        name = "abstract"
        description = "No call."
        parameters = {"type": "object", "properties": {}}
''')


@pytest.fixture
def user_tools(tmp_path, monkeypatch):
    (tmp_path / "mytools.py").write_text(guide_tool() + BAD_TOOLS)
    (tmp_path / "broken.py").write_text("import nonexistent_package_xyz\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield
    for name in ("mytools", "broken"):
        sys.modules.pop(name, None)


# ------------------------------------------------------------------------------ registry


def test_builtin_tools_are_registered_and_built_in_order():
    assert TOOLS.names() == ["calculate", "open", "search"]
    tools = build_tools(["search", "open", "calculate"], ToolContext())
    assert list(tools) == ["search", "open", "calculate"]
    schema = tools["search"].schema()
    assert schema["type"] == "function" and schema["function"]["name"] == "search"
    assert schema["function"]["parameters"]["required"] == ["query"]
    for tool in tools.values():
        check_schema(tool.name, tool.parameters)


def test_a_user_tool_by_import_path_as_the_tools_guide_shows(user_tools):
    ctx = ToolContext(k=2)
    tools = build_tools(["calculate", "mytools:Weather"], ctx)
    assert list(tools) == ["calculate", "weather"] and tools["weather"].context is ctx
    (obs,) = tools["weather"].call([{"city": "Quellbridge"}])
    assert obs.ok and obs.text == "Sunny in Quellbridge, 21 C"
    assert check_arguments("weather", tools["weather"].parameters, {"town": "x"}) == (
        "weather: unknown argument `town`; its arguments are: `city`")


@pytest.mark.parametrize(("name", "message"), [
    ("mytools:Missing", "tool mytools:Missing: mytools has no Missing"),
    ("mytools:NotATool", "NotATool is not a subclass of searchrl.tools.base.Tool"),
    ("nosuchmodule_xyz:Tool", r"cannot import nosuchmodule_xyz \(ModuleNotFoundError: No module named 'nosuchmodule_xyz'\)"),
    ("broken:Tool", "cannot import broken .*nonexistent_package_xyz.*PYTHONPATH"),
    ("mytools:Loose", "tool mytools:Loose: its parameters schema uses format in `when`, which are not checked"),
    ("mytools:Abstract", "Abstract does not define call"),
    ("browse", "unknown tool 'browse'; choose among calculate, open, search, or give your own as package.module:ClassName"),
])
def test_bad_tool_names_are_clear_errors(user_tools, name, message):
    with pytest.raises(SearchRLError, match=message):
        build_tools([name], ToolContext())


def test_two_tools_of_one_name_are_refused():
    with pytest.raises(SearchRLError, match="a tool named 'search' is listed twice"):
        build_tools(["search", "search"], ToolContext())


@pytest.mark.parametrize(("schema", "message"), [
    ({"type": "string"}, "is not a JSON-schema object"),
    ({"type": "object", "properties": {"n": {"type": "object"}}}, "gives `n` no type among"),
    ({"type": "object", "properties": {"xs": {"type": "array", "items": {"type": "integer"}}}}, "items other than"),
    ({"type": "object", "properties": {}, "required": ["q"]}, "requires keys it does not define"),
    ({"type": "object", "properties": {}, "oneOf": []}, "uses oneOf, which are not checked"),
])
def test_schemas_outside_the_subset_are_refused(schema, message):
    with pytest.raises(SearchRLError, match=message):
        check_schema("mine", schema)


# ------------------------------------------------------------------------------ argument checks

SCHEMA = {"type": "object", "properties": {
    "query": {"type": "string", "maxLength": 10}, "n": {"type": "integer", "minimum": 1, "maximum": 5},
    "w": {"type": "number"}, "flag": {"type": "boolean"}, "tags": {"type": "array", "items": {"type": "string"}},
    "mode": {"type": "string", "enum": ["fast", "slow"]},
}, "required": ["query"]}


@pytest.mark.parametrize(("arguments", "message"), [
    ({"query": "ok", "n": 3, "w": 0.5, "flag": True, "tags": ["a"], "mode": "fast"}, None),
    ({"query": "ok", "w": 2}, None),  # an integer is a number
    ({}, "t: argument `query` is missing"),
    ("query", 't: the arguments must be an object of named values (`query`, `n`, `w`, `flag`, `tags`, `mode`), not "query"'),
    ({"query": 3}, "t: argument `query` must be a string, not 3"),
    ({"query": "ok", "n": "3"}, 't: argument `n` must be an integer, not "3"'),
    ({"query": "ok", "n": True}, "t: argument `n` must be an integer, not true"),
    ({"query": "ok", "n": 2.5}, "t: argument `n` must be an integer, not 2.5"),
    ({"query": "ok", "n": 9}, "t: argument `n` must be at most 5, not 9"),
    ({"query": "ok", "w": "x"}, 't: argument `w` must be a number, not "x"'),
    ({"query": "ok", "flag": 1}, "t: argument `flag` must be true or false, not 1"),
    ({"query": "ok", "tags": ["a", 2]}, 't: argument `tags` must be a list of strings, not ["a", 2]'),
    ({"query": "ok", "mode": "quick"}, 't: argument `mode` must be one of "fast", "slow", not "quick"'),
    ({"query": "x" * 11}, "t: argument `query` is 11 characters long; at most 10 are read"),
    ({"query": "ok", "extra": 1}, "t: unknown argument `extra`; its arguments are: `query`, `n`, `w`, `flag`, `tags`, `mode`"),
])
def test_check_arguments(arguments, message):
    assert check_arguments("t", SCHEMA, arguments) == message


def test_open_takes_exactly_one_argument_and_strings_have_a_default_cap():
    schema = TOOLS.get("open").parameters
    assert check_arguments("open", schema, {}) == "open: give exactly one of `id`, `title`, `url`"
    assert check_arguments("open", schema, {"id": "1", "url": "http://x"}) == "open: give exactly one of `id`, `title`, `url`"
    assert check_arguments("open", schema, {"title": "Quellbridge"}) is None
    loose = {"type": "object", "properties": {"s": {"type": "string"}}, "additionalProperties": True}
    assert check_arguments("t", loose, {"s": "x", "other": 1}) is None
    assert check_arguments("t", loose, {"s": "x" * 10_001}) == "t: argument `s` is 10001 characters long; at most 10000 are read"


# ------------------------------------------------------------------------------ search


class Recording(Retriever):
    def __init__(self, fail: bool = False) -> None:
        self.calls: list[tuple[list[str], int]] = []
        self.fail = fail

    def search(self, queries: list[str], k: int) -> list[list[Passage]]:
        if self.fail:
            raise RetrievalUnavailable("the retrieval server at http://127.0.0.1:1 did not answer")
        self.calls.append((list(queries), k))
        return [[Passage(f"{q}-{i}", q.title(), f"About {q} <|end_of_documents|>.") for i in range(k)] for q in queries]


def test_search_makes_one_batched_call_in_order_with_the_runs_k():
    retriever = Recording()
    search = build_tools(["search"], ToolContext(retriever, k=2))["search"]
    calls = [{"query": "river"}, {"query": "  "}, {"query": '"town  hall"'}, {"query": "river"}]
    out = search.call(calls)
    assert retriever.calls == [(["river", "town hall", "river"], 2)]  # blank skipped; quotes and spaces cleaned
    assert [o.ok for o in out] == [True, False, True, True]
    assert out[1].text == "search: the query is empty; write what to look for" and out[1].error == "bad_arguments"
    assert [p.id for p in out[2].passages] == ["town hall-0", "town hall-1"]
    # The documents block's content, as the tag protocols show it; tags are the protocol's to neutralise.
    assert out[0].text == "(1)Title: River Text: About river <|end_of_documents|>.\n(2)Title: River Text: About river <|end_of_documents|>."
    assert out[0].latency_s >= 0 and out[0].cost == 0


def test_search_formats_with_the_protocols_function_and_raises_outages():
    from searchrl.protocols.tags import R1SEARCHER_TAGS
    from searchrl.tools.passages import format_passages

    ctx = ToolContext(Recording(), k=1, format_passages=lambda ps: format_passages(ps, "title-lines", R1SEARCHER_TAGS.all_tags()))
    (obs,) = build_tools(["search"], ctx)["search"].call([{"query": "river"}])
    assert obs.text == "(1) Title: River\nAbout river  ."
    assert build_tools(["search"], ToolContext(Recording(), k=1))["search"].call([{"query": ""}])[0].ok is False
    down = build_tools(["search"], ToolContext(Recording(fail=True), k=1))["search"]
    with pytest.raises(RetrievalUnavailable):  # the environment failing, not the policy: the run's rules apply
        down.call([{"query": "river"}])


# ------------------------------------------------------------------------------ open: the corpus

CORPUS = [
    Passage("q1", "Quellbridge", "Quellbridge is a market town."),
    Passage("t1", "Tessaly", "The Tessaly is a river."),
    Passage("q2", "Quellbridge", "It lies on the river Tessaly."),
    Passage("o1", "Orrin Bay", "The Tessaly flows into Orrin Bay. " * 20),
]


@pytest.fixture(scope="module")
def corpus_tools(tmp_path_factory):
    out = build_index(CORPUS, tmp_path_factory.mktemp("idx") / "idx", "bm25", progress=False)
    retriever = CachedRetriever(open_index(out))
    ctx = ToolContext.of(retriever, k=2)
    yield build_tools(["search", "open"], ctx), ctx
    retriever.close()


def test_open_by_id_and_by_title_reads_the_local_index(corpus_tools):
    tools, ctx = corpus_tools
    assert ctx.passages is not None and ctx.pages is None  # a local index: passages, no web pages
    by_id, by_title, folded, missing, nobody, blank = tools["open"].call([
        {"id": "t1"}, {"title": "Quellbridge"}, {"title": " quellBRIDGE "}, {"id": "zz"}, {"title": "Atlantis"}, {"title": '""'},
    ])
    assert by_id.ok and by_id.text == "(1)Title: Tessaly Text: The Tessaly is a river." and [p.id for p in by_id.passages] == ["t1"]
    # An article chunked into passages reads whole, in corpus order.
    assert by_title.text == "(1)Title: Quellbridge Text: Quellbridge is a market town.\nIt lies on the river Tessaly."
    assert [p.id for p in by_title.passages] == ["q1", "q2"] and folded.text == by_title.text
    assert (missing.ok, missing.error, missing.text) == (False, "not_found", "open: no passage has the id 'zz'")
    assert nobody.text == "open: no article is titled 'Atlantis' in the corpus; search for it first"
    assert blank.error == "bad_arguments"
    (url,) = tools["open"].call([{"url": "http://127.0.0.1/"}])
    assert (url.ok, url.error) == (False, "unavailable") and "reads no web pages" in url.text


def test_open_cuts_long_documents_with_a_note(corpus_tools):
    tools, ctx = corpus_tools
    ctx.max_open_chars = 100
    try:
        (obs,) = tools["open"].call([{"title": "Orrin Bay"}])
    finally:
        ctx.max_open_chars = 4000
    body, note = obs.text.split("\n[cut")
    assert body == "(1)Title: Orrin Bay Text: " + ("The Tessaly flows into Orrin Bay. " * 20)[:100]
    assert note == ": the first 100 characters are shown]"


# ------------------------------------------------------------------------------ open: URLs


@pytest.fixture
def site():
    server = Routes({})
    port = server.httpd.server_address[1]
    server.routes.update({
        "/page": (200, "<html><body><nav>Menu</nav><p>Quellbridge lies on the Tessaly.</p></body></html>", "text/html"),
        "/secret": (200, "<p>instance credentials</p>", "text/html"),
        "/to-loopback": (302, "", "text/plain", {"Location": f"http://127.0.0.1:{port}/secret"}),
        "/pdf": (200, b"%PDF-1.4", "application/pdf"),
        "/long": (200, "<p>" + "word " * 400 + "</p>", "text/html"),
    })
    yield server
    server.close()


def _open(tmp_path, allow_private: bool, **ctx) -> tuple[Tool, ToolContext]:
    web = WebConfig(allow_private=allow_private, cache=str(tmp_path / "web.sqlite"), timeout_s=5)
    context = ToolContext.of(Recording(), k=1, web=web, **ctx)
    return build_tools(["open"], context)["open"], context


def test_open_reads_a_loopback_page_when_private_pages_are_allowed_and_caches_it(tmp_path, site):
    tool, ctx = _open(tmp_path, allow_private=True)
    try:
        first, pdf = tool.call([{"url": site.base + "/page"}, {"url": site.base + "/pdf"}])
        (again,) = tool.call([{"url": site.base + "/page"}])
    finally:
        ctx.close()
    assert first.ok and first.text == f"(1)Title: {site.base}/page Text: Quellbridge lies on the Tessaly."
    assert first.passages == [Passage(site.base + "/page", site.base + "/page", "Quellbridge lies on the Tessaly.")]
    assert (first.cost, again.cost, again.text) == (1.0, 0.0, first.text)  # the second read came from the web cache
    assert (pdf.ok, pdf.error, pdf.text) == (False, "unreadable", f"open: {site.base}/pdf is application/pdf, not a readable page")
    assert sorted(site.paths()) == ["/page", "/pdf"]  # each fetched once (concurrently: in any order)


@pytest.mark.parametrize(("url", "why"), [
    ("http://127.0.0.1:{port}/secret", "127.0.0.1 is a loopback address: not fetched"),
    ("http://10.0.0.1/", "10.0.0.1 is a private address: not fetched"),
    ("http://169.254.169.254/latest/meta-data/", "169.254.169.254 is a link-local address: not fetched"),
    ("file:///etc/passwd", "only http and https URLs are fetched, not file:"),
])
def test_open_refuses_loopback_private_link_local_and_file_urls(tmp_path, site, dns, internet, url, why):  # noqa: F811
    tool, ctx = _open(tmp_path, allow_private=False)
    try:
        (obs,) = tool.call([{"url": url.format(port=site.httpd.server_address[1])}])
    finally:
        ctx.close()
    assert (obs.ok, obs.error) == (False, "refused") and why in obs.text and obs.text.startswith("open: ")
    assert "allow_private" not in obs.text  # how a user allows it is not the model's business
    assert site.requests == [] and internet == []


def test_open_refuses_a_redirect_to_loopback_at_that_hop(tmp_path, site, dns, internet):  # noqa: F811
    dns["news.test"] = PUBLIC
    tool, ctx = _open(tmp_path, allow_private=False)
    try:
        page, hop = tool.call([{"url": _url(site, "news.test", "/page")}, {"url": _url(site, "news.test", "/to-loopback")}])
    finally:
        ctx.close()
    assert page.ok and "Quellbridge lies on the Tessaly." in page.text  # a public page is read
    assert (hop.ok, hop.error) == (False, "refused") and "127.0.0.1 is a loopback address" in hop.text
    assert sorted(site.paths()) == ["/page", "/to-loopback"]  # the secret was never asked for


def test_open_shares_web_searchs_reader_cache_and_budget(tmp_path, site, monkeypatch):
    from searchrl.retrieval.web.retriever import WebRetriever

    monkeypatch.setenv("SEARXNG_URL", site.base)
    web = WebRetriever(WebConfig(provider="searxng", allow_private=True, cache=str(tmp_path / "w.sqlite"),
                                 budget={"requests_per_s": 0}))
    retriever = CachedRetriever(web)
    try:
        ctx = ToolContext.of(retriever, k=1, web=WebConfig())
        assert ctx.pages is web.pages and ctx._owned == []  # web search's reader, not a second one
        (obs,) = build_tools(["open"], ctx)["open"].call([{"url": site.base + "/page"}])
        assert obs.ok and retriever.usage()["pages"] == 1  # counted in the run's web budget
    finally:
        retriever.close()


def test_page_reader_counts_failures_without_caching_them(tmp_path, site):
    reader = PageReader(WebConfig(allow_private=True, cache=str(tmp_path / "c.sqlite")))
    try:
        assert reader.text(site.base + "/missing") is None and reader.text(site.base + "/missing") is None
        assert reader.text(site.base + "/page") == "Quellbridge lies on the Tessaly."
    finally:
        reader.close()
    assert site.paths() == ["/missing", "/missing", "/page"]


def test_a_page_cached_with_private_addresses_allowed_is_refused_to_a_run_that_refuses_them(tmp_path, site, dns, internet):  # noqa: F811
    dns["news.test"] = PUBLIC
    urls = [{"url": site.base + "/secret"}, {"url": _url(site, "news.test", "/to-loopback")}]  # private; redirects there
    tool, ctx = _open(tmp_path, allow_private=True)
    try:
        assert all(obs.ok and "instance credentials" in obs.text for obs in tool.call(urls))
    finally:
        ctx.close()
    tool, ctx = _open(tmp_path, allow_private=False)  # the same web cache
    try:
        direct, hop = tool.call(urls)
    finally:
        ctx.close()
    for obs in (direct, hop):
        assert (obs.ok, obs.error) == (False, "refused") and "127.0.0.1 is a loopback address: not fetched" in obs.text
        assert "instance credentials" not in obs.text
    # The first run read the secret twice (directly, then redirected); the second fetched only the redirect again.
    assert sorted(site.paths()) == ["/secret", "/secret", "/to-loopback", "/to-loopback"]


def test_a_page_cached_under_the_public_policy_is_served_to_either_cut_to_the_readers_cap(tmp_path, site, dns, internet):  # noqa: F811
    dns["news.test"] = PUBLIC
    cache, page, long = str(tmp_path / "c.sqlite"), _url(site, "news.test", "/page"), _url(site, "news.test", "/long")
    readers = [PageReader(WebConfig(cache=cache)), PageReader(WebConfig(cache=cache)),
               PageReader(WebConfig(cache=cache, allow_private=True)), PageReader(WebConfig(cache=cache, max_page_bytes=1000))]
    try:
        assert readers[0].read(page) == ("Quellbridge lies on the Tessaly.", True)
        assert readers[1].read(page) == readers[2].read(page) == ("Quellbridge lies on the Tessaly.", False)  # cache hits
        full, fetched = readers[0].read(long)
        assert (len(full), fetched) == (1999, True) and readers[3].read(long) == (full[:1000], False)
    finally:
        for reader in readers:
            reader.close()
    assert site.paths() == ["/page", "/long"]


def test_pages_cached_before_the_policy_was_recorded_are_served_only_where_private_addresses_are_allowed(
        tmp_path, site, dns, internet):  # noqa: F811
    from searchrl.retrieval.web.budget import SCHEMA
    from searchrl.sqlcache import SqliteStore

    dns["news.test"] = PUBLIC
    cache, url = tmp_path / "c.sqlite", _url(site, "news.test", "/page")
    old = SqliteStore(cache, SCHEMA)
    old.put("page", url, "an old cache's text")  # the namespace pages had before their policy was recorded
    old.close()
    private, public = PageReader(WebConfig(cache=str(cache), allow_private=True)), PageReader(WebConfig(cache=str(cache)))
    try:
        assert private.read(url) == ("an old cache's text", False)
        assert public.read(url) == ("Quellbridge lies on the Tessaly.", True)  # fetched under its own policy
        assert public.read(url) == private.read(url) == ("Quellbridge lies on the Tessaly.", False)  # now recorded public
    finally:
        private.close()
        public.close()
    assert site.paths() == ["/page"]


# ------------------------------------------------------------------------------ calculate


@pytest.mark.parametrize(("expression", "value"), [
    ("1 + 2 * 3", "7"), ("(1 + 2) * 3", "9"), ("7 / 2", "3.5"), ("7 // 2", "3"), ("-7 // 2", "-4"), ("7 % 3", "1"),
    ("2 ** 10", "1024"), ("2 ** -1", "0.5"), ("-3 ** 2", "-9"), ("--3", "3"), ("0.1 + 0.2", "0.3"), ("1.5e3", "1500"),
    ("2.5E-3 * 4", "0.01"), ("10 ** 30", "1" + "0" * 30), ("3 > 2", "true"), ("3 <= 2", "false"), ("1 < 2 < 3", "true"),
    ("2 == 2.0", "true"), ("1 != 1", "false"), ("abs(-4.5)", "4.5"), ("round(2.5)", "2"), ("round(3.14159, 2)", "3.14"),
    ("min(4, 2, 8)", "2"), ("max(4, 2.5)", "4"), ("sqrt(16)", "4"), ("sqrt(2)", "1.41421356237"), ("pi * 2", "6.28318530718"),
    ("2020-03-01 - 1999-12-31", "7366"), ("2024-03-01 - 2024-02-01", "29"), ("1999-12-31 + 1", "2000-01-01"),
    ("2020-03-01 - 60", "2020-01-01"), ("1969-07-20 < 1970-01-01", "true"), ("2000-01-01 == 2000-01-01", "true"),
    ("(2020-03-01 - 2020-01-01) / 7", "8.57142857143"), ("(" * 40 + "1 + 2" + ")" * 40, "3"),
])
def test_calculate_exact_results(expression, value):
    assert calculate(expression) == value
    (obs,) = build_tools(["calculate"], ToolContext())["calculate"].call([{"expression": expression}])
    assert obs.ok and obs.text == value


@pytest.mark.parametrize(("expression", "message"), [
    ("1 / 0", "division by zero"), ("5 % 0", "division by zero"), ("9 ** 9 ** 9", "the result is too large"),
    ("2 ** 100000", "the result is too large"), ("1e308 * 10", "the result is too large"),
    ("10 ** 1000 / 3", "the result is too large"), ("(-8) ** 0.5", "the result is not a real number"),
    ("sqrt(-1)", "sqrt of a negative number"), ("2020-02-30 - 2020-01-01", "2020-02-30 is not a date"),
    ("2020-01-01 + 2020-01-02", "dates take only date - date"), ("2020-01-01 * 2", "dates take only date - date"),
    ("2020-01-01 < 5", "a date compares only with a date"), ("min(1)", "min takes 2 to 20 numbers"),
    ("abs()", "abs takes 1 numbers"), ("round(1.5, 99)", "round takes a whole number of digits"),
    ("1 +", "cannot read the expression"), ("x + 1", "`x` is not allowed"), ("2 ^ 3", r"`2 \^ 3` is not allowed"),
    ("True + 1", "`True` is not allowed"), ("'a' * 3", "`'a'` is not allowed"), ("1j * 1j", "`1j` is not allowed"),
    ("1" * (MAX_CHARS + 1), f"at most {MAX_CHARS} are read"), ("-" * 150 + "1", "at most 200 parts"),
    ("abs(" * 35 + "1" + ")" * 35, "nests too deep"), ("(1 < 2) + 1", "true or false is no number"),
])
def test_calculate_errors_are_readable(expression, message):
    (obs,) = build_tools(["calculate"], ToolContext())["calculate"].call([{"expression": expression}])
    assert not obs.ok and obs.error == "bad_expression" and obs.text.startswith("calculate: ")
    assert re.search(message, obs.text), obs.text


HOSTILE = [
    "__import__('os').system('touch /tmp/pwned')", "().__class__.__bases__[0].__subclasses__()", "(lambda: 1)()",
    "[x for x in range(10)]", "{1: 2}", "open('/etc/passwd').read()", "eval('1')", "exec('x=1')", "globals()",
    "abs.__self__", "sqrt.__call__(4)", "(1).__add__(2)", "f'{1}'", "[1, 2][0]", "(x := 1)", "1 if 1 else 2",
    "not 1", "1 and 2", "~1", "1 << 1000", "abs(*[1])", "round(x=1)", "pi.real", "__builtins__", "min(1, 2, key=abs)",
    "breakpoint()", "\\x00", "yield 1", "await x", "\n".join(["1"] * 3), "9**9**9**9", "10**10**10", "(10**100)**(10**100)",
]


def _executions():
    """Audit events of running code, importing or opening files, while a flag is on."""
    seen: list[str] = []
    watch = {"exec", "import", "open", "os.system", "subprocess.Popen", "builtins.input", "compile.eval"}
    state = {"on": False}

    def hook(event, args):
        if state["on"] and event in watch:
            seen.append(event)

    sys.addaudithook(hook)  # hooks cannot be removed: this one records only while the flag is on
    return seen, state


_SEEN, _WATCHING = _executions()


def _timed(expression: str) -> Observation:
    tool = TOOLS.get("calculate")(ToolContext())
    _WATCHING["on"] = True
    t0 = time.perf_counter()
    try:
        (obs,) = tool.call([{"expression": expression}])
    finally:
        elapsed = time.perf_counter() - t0
        _WATCHING["on"] = False
        seen = list(_SEEN)
        _SEEN.clear()
    assert elapsed < 0.1, f"{expression!r} took {elapsed:.3f} s"
    assert seen == [], f"{expression!r} ran code: {seen}"
    return obs


def test_the_execution_watch_sees_eval_and_imports():
    sys.modules.pop("colorsys", None)
    _WATCHING["on"] = True
    try:
        eval("1")  # the watch must see what the calculator must never do
        __import__("colorsys")
    finally:
        _WATCHING["on"] = False
        seen = list(_SEEN)
        _SEEN.clear()
    assert "exec" in seen and "import" in seen


@pytest.mark.parametrize("expression", HOSTILE)
def test_calculate_refuses_hostile_input_without_running_it(expression, tmp_path):
    obs = _timed(expression)
    assert not obs.ok and obs.text.startswith("calculate: ")


_ATOMS = st.sampled_from(["1", "0", "-2", "3.5", "1e300", "9", "2020-03-01", "1999-12-31", "pi", "x", "__import__",
                          "()", "''", "True", "None", "[]", "os", "1j"])
_EXPRESSIONS = st.recursive(_ATOMS, lambda inner: st.one_of(
    st.tuples(inner, st.sampled_from(["+", "-", "*", "/", "//", "%", "**", "<", "==", "^", "and", ".", "if"]), inner)
    .map(lambda t: f"({t[0]} {t[1]} {t[2]})"),
    st.tuples(st.sampled_from(["abs", "round", "min", "max", "sqrt", "eval", "__import__", "open", "lambda: ", ""]),
              st.lists(inner, max_size=3)).map(lambda t: f"{t[0]}({', '.join(t[1])})"),
    inner.map(lambda e: f"-{e}"), inner.map(lambda e: f"{e}.__class__"), inner.map(lambda e: f"[{e} for _ in ()]"),
), max_leaves=25)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(st.text(max_size=MAX_CHARS + 20), st.text("0123456789.e+-*/%() <>=!,abcdefghijklmnopqrstuvwxyz_", max_size=80)))
def test_calculate_fuzz_random_text(expression):
    obs = _timed(expression)
    assert isinstance(obs.text, str) and obs.text


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_EXPRESSIONS)
def test_calculate_fuzz_random_trees(expression):
    obs = _timed(expression)
    if _FORBIDDEN.search(expression):  # anything outside the allow-list is refused, never computed
        assert not obs.ok and obs.text.startswith("calculate: ")


_FORBIDDEN = re.compile(r"\b(x|os|open|eval|True|None|__import__|and|if|for|lambda)\b|__|''|\[|1j|\^")


@settings(max_examples=200, deadline=None)
@given(st.recursive(st.integers(-50, 50).map(str), lambda inner: st.tuples(inner, st.sampled_from("+-*"), inner)
                    .map(lambda t: f"({t[0]} {t[1]} {t[2]})"), max_leaves=12))
def test_calculate_agrees_with_python_on_integer_arithmetic(expression):
    # The oracle evaluates text this test generated itself (integers and + - * only).
    assert calculate(expression) == str(eval(expression))


def test_tool_metrics_docstring_examples():
    import doctest

    import searchrl.tools.metrics

    result = doctest.testmod(searchrl.tools.metrics)
    assert result.attempted >= 1 and result.failed == 0
