"""Web search as a `Retriever`: each provider's documented request and answer against a loopback
server that speaks it, keys from the environment (rotated, set aside when spent), the run's
caps, the provider's pace, and the cache shared between processes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from loopback import PAGES, FakeWeb

from searchrl.errors import SearchRLError
from searchrl.retrieval import RetrievalConfig
from searchrl.retrieval.web.budget import BudgetExhausted
from searchrl.retrieval.web.config import WebConfig
from searchrl.retrieval.web.retriever import WebRetriever

KEY_ENVS = ("GOOGLE_API_KEY", "GOOGLE_CSE_ID", "BRAVE_API_KEY", "SERPER_API_KEY", "SERPAPI_API_KEY")
Q = "Which river flows through Quellbridge?"


@pytest.fixture
def web(monkeypatch, tmp_path):
    """A loopback web; every provider's endpoint and key point at it, the cache is the test's own."""
    server = FakeWeb()
    for name, value in server.env().items():
        monkeypatch.setenv(name, value)
    for name in KEY_ENVS:
        monkeypatch.setenv(name, f"{name.lower()}-1")
    monkeypatch.setenv("SEARCHRL_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("SEARCHRL_KEY_HOSTS", "127.0.0.1")  # the loopback stand-in may get keys
    yield server
    server.close()


def _retriever(provider="searxng", run=None, **kw) -> WebRetriever:
    budget = {"requests_per_s": 0, **kw.pop("budget", {})}
    retry = {"backoff_s": 0.01, "max_backoff_s": 0.02, "total_s": 5}
    return WebRetriever(WebConfig(provider=provider, budget=budget, retry=retry, **kw), run=run)


# The request each provider documents, for "nile delta" restricted to en.wikipedia.org.
SENT = "nile delta site:en.wikipedia.org"
REQUESTS = {
    "google": ("GET", "/customsearch/v1", {"key": "google_api_key-1", "cx": "google_cse_id-1", "q": SENT, "num": "10"}, {}, None),
    "brave": ("GET", "/res/v1/web/search", {"q": SENT, "count": "10"}, {"x-subscription-token": "brave_api_key-1"}, None),
    "serper": ("POST", "/search", {}, {"x-api-key": "serper_api_key-1"}, {"q": SENT, "num": 10}),
    "serpapi": ("GET", "/search.json", {"engine": "google", "q": SENT, "api_key": "serpapi_api_key-1", "num": "10"}, {}, None),
    "searxng": ("GET", "/search", {"q": SENT, "format": "json"}, {}, None),
}


@pytest.mark.parametrize("provider", sorted(REQUESTS))
def test_each_provider_sends_its_documented_request_and_reads_its_answer(web, provider):
    with _retriever(provider, site="en.wikipedia.org", pages=False) as r:
        found = r.search(["nile delta", "  "], 2)
    (seen,) = web.searches()
    method, path, query, headers, body = REQUESTS[provider]
    assert (seen.method, seen.path, seen.query, seen.body) == (method, path, query, body)
    assert headers.items() <= seen.headers.items()
    assert found[1] == []  # a blank query is not sent
    titles = [title for title, _, _ in PAGES.values()][:2]
    assert [(p.id, p.title) for p in found[0]] == [(web.base + path, t) for path, t in zip(PAGES, titles)]
    assert found[0][0].text == "Quellbridge is a market town."  # snippets lose their HTML
    assert [p.score for p in found[0]] == [1.0, 0.5]


@pytest.mark.parametrize(
    ("provider", "unset", "variable"),
    [("google", "GOOGLE_API_KEY", "GOOGLE_API_KEY"), ("google", "GOOGLE_CSE_ID", "GOOGLE_CSE_ID"),
     ("brave", "BRAVE_API_KEY", "BRAVE_API_KEY"), ("serper", "SERPER_API_KEY", "SERPER_API_KEY"),
     ("serpapi", "SERPAPI_API_KEY", "SERPAPI_API_KEY"), ("searxng", "SEARXNG_URL", "SEARXNG_URL")],
)
def test_a_missing_key_is_a_one_line_error_naming_the_variable(web, monkeypatch, provider, unset, variable):
    monkeypatch.delenv(unset)
    with pytest.raises(SearchRLError, match=variable) as err:
        RetrievalConfig(web={"provider": provider}).open()
    assert "\n" not in str(err.value)
    assert web.requests == []


def test_unknown_provider_and_two_sources_are_config_errors():
    with pytest.raises(ValueError, match="choose one of: brave, google, searxng, serpapi, serper"):
        RetrievalConfig(web={"provider": "bing"})
    with pytest.raises(ValueError, match=r"retrieval.index and retrieval.web are set.*retrieval.index=null"):
        RetrievalConfig(index="toyworld", web={"provider": "brave"})
    assert RetrievalConfig(web={"provider": "brave"}).source == "web:brave"


def test_the_cap_stops_requests_at_the_cap_and_the_cache_still_serves(web):
    with _retriever(run="run-a", workers=1, pages=False, budget={"max_requests": 3}) as r:
        r.search(["q1", "q2"], 1)
        with pytest.raises(BudgetExhausted, match=r"3 requests to searxng.*max_requests=3.*Raise the cap"):
            r.search(["q3", "q4", "q5"], 1)
        assert len(web.searches()) == 3
        assert r.search(["q1"], 1)[0]  # searched before: no request, no cap
        assert r.usage()["requests"] == 3 and r.usage()["cache_hits"] == 1
    priced = {"cost_per_request": 0.01, "max_cost_usd": 0.025}
    with _retriever(run="run-b", workers=1, pages=False, budget=priced) as r:
        with pytest.raises(BudgetExhausted, match=r"\$0.02 .*max_cost_usd=0.025"):
            r.search(["c1", "c2", "c3"], 1)
        assert r.usage()["cost_usd"] == pytest.approx(0.02)
    assert len(web.searches()) == 5


def test_a_run_keeps_its_count_a_new_run_starts_from_zero(web):
    with _retriever(run="run", pages=False) as r:
        r.search(["a", "b"], 1)
    again = WebRetriever(WebConfig(provider="searxng", pages=False), run="run")
    assert again.usage()["requests"] == 2  # a resumed run counts on
    fresh = WebRetriever(WebConfig(provider="searxng", pages=False), run="run", new_run=True)
    assert fresh.usage() == {"requests": 0, "cache_hits": 0, "cost_usd": 0.0, "pages": 0, "page_failures": 0}
    again.close()
    fresh.close()


def test_requests_keep_the_providers_pace(web):
    with _retriever(workers=4, pages=False, budget={"requests_per_s": 20}) as r:
        r.search([f"q{i}" for i in range(5)], 1)
    times = sorted(s.at for s in web.searches())
    assert times[-1] - times[0] >= 0.18  # 4 intervals of 1/20 s (unpaced, 4 workers take ~0.01 s)


def test_keys_rotate_and_a_spent_or_refused_key_is_set_aside(web, monkeypatch):
    monkeypatch.setenv("BRAVE_API_KEY", "k1, k2,k3")

    def brave(seen):
        key = seen.headers["x-subscription-token"]
        if key == "k2":
            return 429, {"error": {"code": "QUOTA_LIMITED", "detail": "Request quota limit exceeded for plan."}}, ""
        if key == "k3":
            return 401, {"error": {"detail": "Invalid subscription token"}}, ""
        return None

    web.override = brave
    with _retriever("brave", workers=1, pages=False) as r:
        assert all(r.search([f"q{i}" for i in range(4)], 1))
        assert r.usage()["cost_usd"] == pytest.approx(4 * 0.005)  # refused requests are not billed
    used = [s.headers["x-subscription-token"] for s in web.searches()]
    assert used == ["k1", "k2", "k1", "k3", "k1", "k1"]  # in turn; k2 and k3 once, then set aside
    web.override = lambda seen: (402, {"message": "Not enough credits"}, "")
    with _retriever("brave", pages=False) as r, pytest.raises(SearchRLError, match="quota of every key in BRAVE_API_KEY is spent"):
        r.search(["q9"], 1)


def test_rate_limits_and_server_errors_are_retried(web):
    failures = iter([(429, {"error": "Request rate limit exceeded"}, ""), (503, "busy", "text/plain")])
    web.override = lambda seen: next(failures, None) if seen.path == "/search" else None
    with _retriever(pages=False) as r:
        assert len(r.search([Q], 3)[0]) == 3
        assert r.usage()["requests"] == 3
    web.override = lambda seen: (503, "down", "text/plain")
    with _retriever(pages=False) as r, pytest.raises(SearchRLError, match=r"searxng at .* did not answer a search .*HTTP 503"):
        r.search(["other"], 1)


def test_searxng_without_json_format_and_serpapi_without_results(web):
    web.override = lambda seen: (403, "Forbidden", "text/html")
    with _retriever(pages=False) as r, pytest.raises(SearchRLError, match="settings.yml lists json under search.formats"):
        r.search([Q], 1)
    web.override = lambda seen: (200, {"error": "Google hasn't returned any results for this query."}, "")
    with _retriever("serpapi", pages=False) as r:
        assert r.search(["zzzz qqqq"], 3) == [[]]
    with _retriever(pages=False) as r, pytest.raises(SearchRLError, match="at most 10 results"):
        r.search([Q], 11)


SCRIPT = """
import json, sys
from searchrl.retrieval.web.config import WebConfig
from searchrl.retrieval.web.retriever import WebRetriever
cache, run, queries = sys.argv[1], sys.argv[2], sys.argv[3:]
cfg = WebConfig(provider="searxng", cache=cache, workers=1, allow_private=True, budget={"requests_per_s": 0, "max_requests": 5})
r = WebRetriever(cfg, run=run)
try:
    found = r.search(queries, 2)
    print(json.dumps([[[p.id, p.text] for p in ps] for ps in found]))
finally:
    r.close()
"""


def _process(web, cache: Path, run: str, *queries: str) -> subprocess.Popen:
    env = {**os.environ, **web.env(), "PYTHONPATH": os.pathsep.join(sys.path)}
    return subprocess.Popen([sys.executable, "-c", SCRIPT, str(cache), run, *queries], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_the_cache_serves_repeats_across_processes_and_the_cap_holds_across_them(web, tmp_path):
    cache = tmp_path / "shared.sqlite"
    first = _process(web, cache, "r1", Q)
    out1, err1 = first.communicate(timeout=60)
    assert first.returncode == 0, err1
    assert (len(web.searches()), sorted(web.pages_read())) == (1, ["/wiki/Orrin_Optics", "/wiki/Quellbridge"])
    second = _process(web, cache, "r2", Q)
    out2, err2 = second.communicate(timeout=60)
    assert second.returncode == 0, err2
    assert out2 == out1 and "market town on the river Tessaly" in out1
    assert (len(web.searches()), len(web.pages_read())) == (1, 2)  # the second process asked nothing

    # Two processes of one run, 4 new queries each, against the run's cap of 5 requests.
    both = [_process(web, cache, "r3", *(f"{who} {i}" for i in range(4))) for who in ("a", "b")]
    results = [p.communicate(timeout=60) + (p.returncode,) for p in both]
    assert len(web.searches()) == 1 + 5
    assert any(code != 0 and "max_requests=5" in err for _, err, code in results)


def test_k_passages_one_per_result_in_the_providers_order(web):
    with _retriever(pages=False) as r:
        found = r.search([Q, Q], 3)
    assert found[0] == found[1] and len(web.searches()) == 1  # a batch's repeats go out once
    assert [p.id.rsplit("/", 1)[1] for p in found[0]] == ["Quellbridge", "Orrin_Optics", "Gone"]


def test_doctests_pass():
    import doctest

    from searchrl import sqlcache
    from searchrl.retrieval.web import providers

    assert all(doctest.testmod(m).failed == 0 for m in (providers, sqlcache))
