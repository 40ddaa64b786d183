"""One boundary for untrusted strings: what a search API, a model, the command line or a run folder
hands in is refused (a skipped result, an error observation, one `error:` line and exit 2) —
never an exception out of the engine or a crashed run. A hypothesis fuzz run drives the web
result reader with >= 10,000 generated answers and bodies: nothing but `SearchRLError` comes out."""

from __future__ import annotations

import json
import random
import string

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from loopback import PAGES, FakeWeb, provider_answer
from test_eval_services import GOLD, Q1, Q2

from searchrl import cli
from searchrl.assets import load_tokenizer
from searchrl.errors import EXIT_USAGE, SearchRLError
from searchrl.eval.run import EvalConfig, run_eval
from searchrl.outbound import OutboundRefused, check_public_url, split_url
from searchrl.protocols.tags import SEARCH_R1_TAGS
from searchrl.retrieval import RetrievalConfig
from searchrl.retrieval.web.providers import PROVIDERS, Hit
from searchrl.rollout.scripted import ScriptedBackend
from searchrl.tools import ToolContext, build_tools

BAD_URLS = ["http://[::1:P/x", "http://a\uff03b/", "http://localhost:99999/", "http://x:-1/", "https://[", "http://",
            "javascript:alert(1)", "//no-scheme", "", "   ", "http://\x00/", "http://a b/c"]


def _errors(capsys) -> tuple[list[str], str]:
    err = capsys.readouterr().err
    return [line for line in err.splitlines() if line.startswith("error")], err


# -- search results whose links URL parsing rejects -----------------------------------------------


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer("tiny-random")  # before `web` moves SEARCHRL_HOME (the built model is cached there)


@pytest.fixture
def web(monkeypatch, tmp_path):
    server = FakeWeb()
    monkeypatch.setenv("SEARXNG_URL", server.base)
    monkeypatch.setenv("SEARCHRL_HOME", str(tmp_path / "home"))
    yield server
    server.close()


def test_a_result_link_that_url_parsing_rejects_is_skipped_not_a_crash_of_eval_run_web(tokenizer, web, tmp_path):
    good = [(web.base + path, title, snippet) for path, (title, snippet, _) in PAGES.items()]

    def answer(seen):
        if seen.path == "/search":  # the bad links first: each is skipped, the good ones still come
            hits = [(url, "Forged", "a snippet") for url in BAD_URLS[:4]] + good
            return 200, provider_answer("searxng", hits, seen.query["q"]), "application/json"
        return None

    web.override = answer
    (tmp_path / "q.jsonl").write_text("".join(json.dumps({"id": f"q{i}", "question": q, "answers": [GOLD[q]]}) + "\n"
                                              for i, q in enumerate((Q1, Q2), 1)))
    (tmp_path / "prompt.txt").write_text("Q: {question}\nA: {think_open}")

    def policy(text: str) -> str:
        return " <search>Quellbridge river</search>" if SEARCH_R1_TAGS.docs_open not in text else "</think>\n<answer>x</answer>"

    cfg = EvalConfig(dataset=str(tmp_path / "q.jsonl"), protocol={"tags": "search-r1", "template": str(tmp_path / "prompt.txt")},
                     rollout={"k": 3}, retrieval={"web": {"provider": "searxng", "allow_private": True, "budget": {"requests_per_s": 0}}},
                     out=str(tmp_path / "out"))
    metrics = run_eval(cfg, progress=False, backend=ScriptedBackend(tokenizer, policy))
    assert metrics["n"] == 2
    records = [json.loads(line) for line in (tmp_path / "out" / "predictions.jsonl").read_text().splitlines()]
    shown = [pid for r in records for ids in r["retrieved_ids"] for pid in ids]
    assert len(records) == 2 and shown and all(pid.startswith(web.base) for pid in shown)


@pytest.mark.parametrize("url", BAD_URLS + ["file:///etc/passwd", "http://127.0.0.1:1/x"])
def test_the_open_tool_answers_a_malformed_url_with_an_error_observation(web, url):
    with RetrievalConfig(web={"provider": "searxng", "budget": {"requests_per_s": 0}}).open() as live:
        (seen,) = build_tools(["open"], ToolContext.of(live, k=1))["open"].call([{"url": url}])
    assert not seen.ok and seen.error in ("refused", "unreadable", "bad_arguments") and seen.text.startswith("open: ")


# -- the command line and run folders -------------------------------------------------------------


@pytest.mark.parametrize("value", ["[" * 100_000 + "]" * 100_000, "{a: " * 100_000 + "1" + "}" * 100_000,
                                   "".join("  " * i + "k:\n" for i in range(2_000)),
                                   ("[&a [1,1,1,1,1,1,1,1,1,1], &b [*a,*a,*a,*a,*a,*a,*a,*a,*a,*a], &c [*b,*b,*b,*b,*b,*b,*b,*b,*b,*b], "
                                   "&d [*c,*c,*c,*c,*c,*c,*c,*c,*c,*c], [*d,*d,*d,*d,*d,*d,*d,*d,*d,*d]]")])
@pytest.mark.parametrize("key", ["rollout.k", "retrieval.web.site"])
def test_a_set_value_nested_100k_deep_is_one_line_and_exit_2(tmp_path, capsys, key, value):
    code = cli.run(["eval", "run", "--model", "tiny-random", "--dataset", "toyworld:test", "--out", str(tmp_path / "run"),
                    "--set", f"{key}={value}"])
    errors, err = _errors(capsys)
    assert code == EXIT_USAGE and len(errors) == 1 and "Traceback" not in err, err[-500:]
    assert len(errors[0]) < 400 and ("levels deep" in errors[0] or "values" in errors[0])
    assert not (tmp_path / "run").exists()


def test_a_set_key_of_100k_parts_and_a_config_file_nested_too_deep_are_one_line(tmp_path, capsys):
    assert cli.run(["eval", "run", "--dataset", "toyworld:test", "--out", str(tmp_path / "a"), "--set", "a." * 100_000 + "b=1"]) == EXIT_USAGE
    errors, _ = _errors(capsys)
    assert len(errors) == 1 and "more than 64 parts" in errors[0]
    deep = tmp_path / "deep.yaml"
    deep.write_text("rollout: " + "[" * 100_000 + "]" * 100_000 + "\n")
    assert cli.run(["eval", "run", "--config", str(deep), "--dataset", "toyworld:test", "--out", str(tmp_path / "b")]) == EXIT_USAGE
    errors, _ = _errors(capsys)
    assert len(errors) == 1 and f"config file {deep}: nested more than 64 levels deep" in errors[0]


def test_ask_refuses_an_empty_question(capsys):
    for question in ("", "   \n"):
        assert cli.run(["ask", question, "--model", "tiny-random"]) == EXIT_USAGE
        errors, _ = _errors(capsys)
        assert errors == [('error: ask: the question is empty; give the question to answer, e.g. searchrl ask "Which river '
                          'flows through the capital?"')]


def test_ask_refuses_max_new_tokens_past_the_context_as_eval_run_does(world, tmp_path, capsys):
    huge = ["--max-new-tokens", "100000000"]
    assert cli.run(["ask", "Which river flows through Town 1?", "--model", "tiny-random", "--index", str(world / "index"), *huge]) == EXIT_USAGE
    (asked,), _ = _errors(capsys)
    assert cli.run(["eval", "run", "--model", "tiny-random", "--dataset", str(world / "q.jsonl"), "--index", str(world / "index"),
                    "--out", str(tmp_path / "eval"), *huge]) == EXIT_USAGE
    (evaluated,), _ = _errors(capsys)
    bound = "but the model's context holds"
    assert bound in asked and bound in evaluated and "max_new_tokens=100,000,000; lower" in asked
    assert asked.split(":")[1].split("tokens")[0] == evaluated.split(":")[1].split("tokens")[0] or "a rollout may need" in asked


def test_prompts_per_step_beyond_the_dataset_is_refused_before_the_model_loads(world, tmp_path, monkeypatch):
    from searchrl.config import load_config
    from searchrl.rl import trainer
    from searchrl.rl.actor import Actor
    from searchrl.rl.config import TrainConfig

    def never(*args, **kwargs):
        raise AssertionError("the model loaded")

    monkeypatch.setattr(Actor, "load", never)
    cfg = load_config(TrainConfig, None, ["model=tiny-random", f"retrieval.index={world / 'index'}", f"out={tmp_path / 'run'}",
                                         f"stage1.dataset={world / 'q.jsonl'}", "stage1.prompts_per_step=7", "stage2.enabled=false",
                                         f"protocol.template={world / 'prompt.txt'}", "logging.progress=false"])
    with pytest.raises(SearchRLError, match=r"stage1.prompts_per_step=7 is more than the 6 questions of stage1.dataset \(.*q.jsonl\): "
                                            "a step would ask some of them twice; set stage1.prompts_per_step to 6 or less"):
        trainer.train(cfg)


# -- the fuzz run: the web result reader ----------------------------------------------------------

PROVIDER_NAMES = ("google", "brave", "serper", "serpapi", "searxng")
RESULT_KEYS = {"google": ("items",), "brave": ("web", "results"), "serper": ("organic",), "serpapi": ("organic_results",),
               "searxng": ("results",)}


@pytest.fixture(scope="module")
def providers():
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("GOOGLE_CSE_ID", "cx")
        return {name: PROVIDERS.get(name)("http://127.0.0.1:9/api") for name in PROVIDER_NAMES}


_URL_PARTS = st.sampled_from(["http://", "https://", "ftp://", "javascript:", "//", "", "http://[", "http://[::1", ":P", "]",
                              "/x", "?q=1", "#f", ":99999", ":-1", "@", "\uff03", "\x00", " ", "%", "xn--", "[::1]", "example.org"])
URLS = st.one_of(st.sampled_from(BAD_URLS), st.lists(_URL_PARTS, max_size=6).map("".join),
                 st.text(alphabet=string.printable + "\uff03\u200e\ufeff[]", max_size=30))
LEAVES = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=True, allow_infinity=True),
                   st.text(max_size=12), URLS)


def _wrapped(value, depth: int, as_list: bool):
    for _ in range(depth):
        value = [value] if as_list else {"k": value}
    return value


# A value of any JSON type, a leaf nested a few levels in lists or objects (cheap to draw: the run
# is about how many answers, not how clever each one is).
VALUES = st.builds(_wrapped, LEAVES, st.integers(0, 3), st.booleans())
FIELDS = ("url", "link", "title", "snippet", "content", "description")  # every provider's names for a result's parts
RESULTS = st.fixed_dictionaries({}, optional={name: st.one_of(URLS, VALUES) if name in ("url", "link") else VALUES
                                              for name in FIELDS})


def _answer(name: str, results: list, shape: str, extra):
    """`results` where `name`'s answer keeps them, or in a wrong place or type (`shape`)."""
    found = results if shape != "not a list" else {"0": results}
    for key in reversed(RESULT_KEYS[name]):
        found = {key: found}
    if shape == "extra":
        found = {**found, "error": extra} if name == "serpapi" else {**found, "kind": extra}
    elif shape == "bare":
        found = extra
    return found


ANSWERS = st.builds(lambda name, results, shape, extra: (name, _answer(name, results, shape, extra)),
                    st.sampled_from(PROVIDER_NAMES), st.lists(st.one_of(RESULTS, VALUES), max_size=5),
                    st.sampled_from(["plain", "plain", "not a list", "extra", "bare"]), VALUES)


RUN: dict[str, int] = {}  # inputs each fuzz test fed the reader in this session


def _read_through(provider, answer) -> None:
    """The reader's contract: hits whose links URL parsing accepts, or `SearchRLError`; each link
    then meets the page reader's URL check, which may refuse it (`OutboundRefused`) and nothing else."""
    try:
        hits = provider.parse(answer) if not isinstance(answer, (str, bytes)) else provider.read(answer)
    except SearchRLError:
        return
    assert isinstance(hits, list) and all(isinstance(h, Hit) for h in hits)
    for hit in hits:
        assert isinstance(hit.url, str) and hit.url and isinstance(hit.title, str) and isinstance(hit.snippet, str)
        split_url(hit.url)  # accepted by URL parsing: the reader never hands on a link it rejects
        try:
            check_public_url(hit.url, allow_private=True)
        except OutboundRefused:
            pass


FUZZ = settings(deadline=None, database=None, suppress_health_check=list(HealthCheck))


def _fed(test: str, n: int) -> None:
    RUN[test] = RUN.get(test, 0) + n


@settings(FUZZ, max_examples=300)
@given(ANSWERS)
def test_fuzz_provider_answers_of_any_shape(providers, case):
    """Answers drawn field by field by hypothesis (which shrinks a failing one to its least)."""
    name, answer = case
    _read_through(providers[name], answer)
    _fed("shapes", 1)


# The volume: hypothesis draws a seed, and a seeded generator builds a batch of answers and bodies
# from the same parts (a draw per input instead of dozens: hypothesis's own cost per drawn value is
# far above the reader's). A failure names the seed, which rebuilds the batch exactly.
_deep: list = []
for _ in range(100):
    _deep = [_deep]
POOL = [None, True, False, 0, -1, 2**70, 1.5, float("nan"), float("inf"), "", "x", "<b>t</b> &amp; s", "\x00\x1b[2J",
        [], {}, ["http://a.org"], {"k": {"k": []}}, _deep, "a" * 10_000, *BAD_URLS,
        "https://example.org/a", "http://127.0.0.1/x", "HTTP://EXAMPLE.ORG", "https://[::1]/", "http://xn--/"]
PARTS = ["http://", "https://", "ftp://", "javascript:", "//", "", "http://[", "http://[::1", ":P", "]", "/x", "?q=1", "#f",
         ":99999", ":-1", "@", "\uff03", "\x00", " ", "%", "xn--", "[::1]", "example.org", "\u200e", "\ufeff", "\ud800"]
BATCH = 50


def _value(rng: random.Random, depth: int = 0):
    roll = rng.random()
    if roll < 0.35:
        value = rng.choice(POOL)
    elif roll < 0.7:
        value = "".join(rng.choice(PARTS) for _ in range(rng.randrange(6)))
    elif roll < 0.85:
        value = "".join(rng.choice(string.printable + "\uff03[]{}") for _ in range(rng.randrange(30)))
    elif depth < 3:
        value = [_value(rng, depth + 1) for _ in range(rng.randrange(4))]
    else:
        value = {}
    for _ in range(rng.choice([0, 0, 0, 1, 2, 5])):
        value = [value] if rng.random() < 0.5 else {"k": value}
    return value


HOSTS = ["example.org", "127.0.0.1", "[::1]", "[::1", "::1]", "a\uff03b", "example.org:99999", "example.org:-1", "xn--",
         "a b", "", "user@host", "EXAMPLE.org.", "[v1.x]", "1.2.3.4.5", "\u0430pple.com", "x" * 300]


def _url(rng: random.Random) -> str:
    """A link that looks like one: a scheme, a host (often malformed), a path of any characters."""
    path = "".join(rng.choice(string.printable + "\uff03\u200e[]%") for _ in range(rng.randrange(12)))
    return rng.choice(["http://", "https://", "HTTP://", "ftp://", "//", ""]) + rng.choice(HOSTS) + "/" + path


def _random_case(rng: random.Random):
    name = rng.choice(PROVIDER_NAMES)

    def field(f: str):
        return _url(rng) if f in ("url", "link") and rng.random() < 0.7 else _value(rng)

    results = [{f: field(f) for f in FIELDS if rng.random() < 0.7} if rng.random() < 0.9 else _value(rng)
               for _ in range(rng.randrange(7))]
    answer = _answer(name, results, rng.choice(["plain", "plain", "plain", "not a list", "extra", "bare"]), _value(rng))
    form, n = rng.choice(["object"] * 4 + ["json"] * 2 + ["nested", "bytes", "cut", "random"]), rng.randrange(1, 20_000)
    if form == "object":
        return name, answer
    if form == "random":
        return name, rng.randbytes(rng.randrange(200))
    return name, _body(answer, "json" if form == "object" else form, n)


@settings(FUZZ, max_examples=200)
@given(st.integers(0, 2**64 - 1))
def test_fuzz_answers_and_bodies_in_volume(providers, seed):
    rng = random.Random(seed)
    for _ in range(BATCH):
        name, case = _random_case(rng)
        _read_through(providers[name], case)
    _fed("volume", BATCH)


def _body(answer, form: str, n: int) -> str | bytes:
    body = json.dumps(answer, allow_nan=True)
    if form == "nested":  # a body nested far past any answer, at any depth
        return '{"results": ' + "[" * n + "]" * n + "}"
    if form == "bytes":
        return body.encode("utf-8", "surrogatepass")[: n % (len(body) + 1)] + b"\xff\xfe"
    if form == "cut":
        return body[: n % (len(body) + 1)]
    return body


@settings(FUZZ, max_examples=200)
@given(st.sampled_from(PROVIDER_NAMES), ANSWERS, st.sampled_from(["json", "nested", "bytes", "cut"]), st.integers(1, 20_000))
def test_fuzz_answer_bodies_as_sent(providers, name, case, form, n):
    _read_through(providers[name], _body(case[1], form, n))
    _fed("bodies", 1)


def test_the_fuzz_run_fed_the_reader_at_least_10000_inputs():
    if set(RUN) != {"shapes", "volume", "bodies"}:
        pytest.skip("the fuzz tests did not all run in this session")
    assert sum(RUN.values()) >= 10_000, RUN
