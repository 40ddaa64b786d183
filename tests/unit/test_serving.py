"""The server under training load: result cache (in-process and shared between worker processes),
batching window, /stats, request limits that accept peers' batches, truncation of an over-long
query, non-finite numbers, and `searchrl serve --workers 2`."""

from __future__ import annotations

import logging
import subprocess
import sys
import threading
import time

import httpx
import pytest
from fastapi.testclient import TestClient
from test_server import PASSAGES, QUERIES, WordOverlap

from searchrl.data.types import Passage
from searchrl.retrieval.http import HttpRetriever
from searchrl.retrieval.querycache import CachedRetriever, LocalCache, SharedCache, normalise_query
from searchrl.retrieval.server import ServerLimits, create_app, free_port, serve_in_background

DIALECTS = [
    ("/search", {"k": 3}),
    ("/queries", {"k": 3}),
    ("/retrieve", {"topk": 3, "return_scores": True}),
]


@pytest.fixture(params=["local", "shared"])
def cache(request, tmp_path):
    made = (
        LocalCache(100)
        if request.param == "local"
        else SharedCache(str(tmp_path / "c.sqlite"), "idx", 100)
    )
    yield made
    made.close()


# window 0: searched in the threadpool; 2 ms: by the batching thread
@pytest.mark.parametrize("window_ms", [0, 2])
@pytest.mark.parametrize(("path", "extra"), DIALECTS)
def test_cache_hits_return_what_a_miss_returns(cache, path, extra, window_ms):
    retriever = WordOverlap()
    plain = TestClient(create_app(WordOverlap()))
    client = TestClient(create_app(retriever, batch_window_ms=window_ms, cache=cache))
    want = plain.post(path, json={"queries": QUERIES, **extra}).json()
    miss = client.post(path, json={"queries": QUERIES, **extra}).json()
    assert retriever.calls == [3]
    hit = client.post(path, json={"queries": QUERIES, **extra}).json()
    assert retriever.calls == [3]  # all three from the cache
    assert hit == miss == want  # ids, titles, texts, scores, order
    # Whitespace does not make another query; the answer is the normalised query's.
    spaced = client.post(path, json={"queries": ["  capital of\n France "], **extra}).json()
    assert retriever.calls == [3]
    first = plain.post(path, json={"queries": ["capital of France"], **extra}).json()
    assert {k: v for k, v in spaced.items() if k != "queries"} == {
        k: v for k, v in first.items() if k != "queries"
    }


def test_cache_keys_keep_k_and_the_index_apart(tmp_path):
    path = str(tmp_path / "c.sqlite")
    a, b = SharedCache(path, "index-a", 10), SharedCache(path, "index-b", 10)
    one = [Passage("p1", "T", "x", 1.5)]
    a.put_many(["q"], 3, [one])
    assert a.get_many(["q", "other"], 3) == [one, None]
    assert a.get_many(["q"], 4) == [None]  # another k
    assert b.get_many(["q"], 3) == [None]  # another index, same file


def test_shared_cache_evicts_the_oldest_beyond_its_size(tmp_path):
    cache = SharedCache(str(tmp_path / "c.sqlite"), "idx", 3)
    for i in range(10):
        cache.put_many([f"q{i}"], 1, [[Passage(f"p{i}", "", "t", float(i))]])
    assert len(cache) == 3
    got = cache.get_many([f"q{i}" for i in range(10)], 1)
    assert [g is not None for g in got] == [False] * 7 + [True] * 3
    cache.put_many(["q9", "q10"], 1, [[], []])  # a replaced entry counts as new: still at most 3
    assert len(cache) <= 3 and cache.get_many(["q7", "q9", "q10"], 1) == [None, [], []]
    left = len(cache)
    assert cache.clear() == left and len(cache) == 0


def test_local_cache_evicts_the_least_recently_used():
    cache = LocalCache(2)
    cache.put_many(["a", "b"], 1, [["A"], ["B"]])
    assert cache.get_many(["a"], 1) == [["A"]]  # a is now the most recent
    cache.put_many(["c"], 1, [["C"]])
    assert len(cache) == 2 and cache.get_many(["a", "b", "c"], 1) == [["A"], None, ["C"]]


def test_cached_retriever_counts_hits_and_searches_each_distinct_query_once():
    inner = WordOverlap()
    cached = CachedRetriever(inner, LocalCache(10))
    got = cached.search(["capital of France", "", "capital  of France", "Germany river"], 2)
    assert inner.calls == [2]  # the repeat and the blank never reach the index
    assert got[1] == [] and got[0] == got[2] == inner.search(["capital of France"], 2)[0]
    cached.search(["Germany river"], 2)
    counts = cached.counts()
    assert (counts.queries, counts.cache_hits, counts.cached) == (4, 2, True) and counts.seconds > 0
    plain = CachedRetriever(WordOverlap())  # no cache: counting only
    plain.search(["a", "a"], 1)
    assert (plain.counts().queries, plain.counts().cache_hits, plain.counts().cached) == (
        2,
        0,
        False,
    )
    assert normalise_query(" a\t b\n") == "a b"


def test_a_2560_query_retrieve_request_succeeds_with_the_default_limits():
    # Search-R1's GRPO scripts: 512 prompts x 5 rollouts in one /retrieve call.
    retriever = WordOverlap()
    client = TestClient(create_app(retriever, batch_window_ms=2, cache=LocalCache(1000)))
    distinct = [
        f"capital {w} {i}" for i, w in enumerate(["France", "Germany", "river", "title"] * 128)
    ]
    queries = [q for q in distinct for _ in range(5)]
    r = client.post("/retrieve", json={"queries": queries, "topk": 3, "return_scores": True})
    assert r.status_code == 200
    result = r.json()["result"]
    assert len(result) == 2560
    want = WordOverlap().search(queries[::5], 3)
    assert [[d["document"]["id"] for d in ps] for ps in result[::5]] == [
        [p.id for p in ps] for ps in want
    ]
    assert retriever.calls == [512]  # one index call, each distinct query once


def test_an_overlong_query_is_truncated_and_logged_while_the_others_are_unaffected(caplog):
    retriever = WordOverlap()
    client = TestClient(create_app(retriever))  # default limit: 2,000 characters
    long = "Rhine Netherlands " + "x" * 4982
    assert len(long) == 5000
    with caplog.at_level(logging.WARNING, logger="searchrl.retrieval.server"):
        r = client.post("/search", json={"queries": [QUERIES[0], long, QUERIES[1]], "k": 2})
    assert r.status_code == 200
    got = [[Passage(**d) for d in ps] for ps in r.json()["results"]]
    assert (
        got[0] == retriever.search([QUERIES[0]], 2)[0]
        and got[2] == retriever.search([QUERIES[1]], 2)[0]
    )
    assert got[1] == retriever.search([long[:2000]], 2)[0] and got[1][0].id == "p2"
    assert retriever.calls[0] == 3 and len(retriever.calls) == 4  # one call for the batch
    assert (
        "1 of 3 queries truncated to max_query_chars=2000 (query 1 has 5000 characters)"
        in caplog.text
    )
    assert client.get("/stats").json()["truncated_queries"] == 1


@pytest.mark.parametrize(
    ("body", "shown"),
    [
        ('{"queries": ["a"], "k": NaN}', '"NaN"'),
        ('{"queries": ["a"], "k": Infinity}', '"Infinity"'),
        ('{"queries": ["a"], "k": -Infinity}', '"-Infinity"'),
        ('{"queries": ["a"], "k": 1e400}', '"Infinity"'),
        ('{"queries": ["a", NaN], "k": 1}', '"NaN"'),
    ],
)
@pytest.mark.parametrize("path", ["/search", "/queries", "/retrieve"])
def test_non_finite_numbers_get_a_422_with_a_json_detail(body, shown, path):
    # Python's JSON parser accepts NaN and Infinity (1e400 overflows to it); Starlette's error
    # response then refused to encode them and the client got a plain-text 500.
    if path == "/retrieve":
        body = body.replace('"k"', '"topk"')
    client = TestClient(create_app(WordOverlap()), raise_server_exceptions=False)
    r = client.post(path, content=body, headers={"content-type": "application/json"})
    assert r.status_code == 422
    assert r.headers["content-type"] == "application/json"
    detail = r.json()["detail"]  # valid JSON: the offending input is written as a string
    assert len(detail) == 1 and detail[0]["input"] == shown.strip('"')
    assert detail[0]["loc"][1] in ("k", "topk", "queries") and detail[0]["msg"]


class Gated(WordOverlap):
    """Blocks its first call until `release` is set, so the next requests queue up meanwhile."""

    def __init__(self) -> None:
        super().__init__()
        self.entered, self.release = threading.Event(), threading.Event()

    def search(self, queries, k):
        if not self.calls:
            self.entered.set()
            assert self.release.wait(10)
        return super().search(queries, k)


def test_the_batching_window_merges_concurrent_requests_into_one_index_call():
    retriever = Gated()
    app = create_app(retriever, batch_window_ms=50)
    words = ["France", "Germany", "river", "title", "Netherlands", "Paris", "Berlin", "Rhine"]
    with serve_in_background(app) as url, HttpRetriever(url) as http:
        first = threading.Thread(target=http.search, args=(["capital of France"], 2))
        first.start()
        assert retriever.entered.wait(10)  # the index is busy with the first request
        got: dict[int, list] = {}
        threads = [
            threading.Thread(
                target=lambda i=i: got.__setitem__(i, http.search([words[i], "capital"], 2))
            )
            for i in range(8)
        ]
        for t in threads:
            t.start()
        deadline = time.monotonic() + 10
        while httpx.get(url + "/stats").json()["requests"] < 9:  # all eight arrived and wait
            assert time.monotonic() < deadline
            time.sleep(0.01)
        retriever.release.set()
        for t in [first, *threads]:
            t.join(10)
        stats = httpx.get(url + "/stats").json()
    assert retriever.calls == [1, 9]  # eight requests in one call: 8 words + the shared "capital"
    assert [got[i] for i in range(8)] == [WordOverlap().search([w, "capital"], 2) for w in words]
    assert stats["index"] == {
        "calls": 2,
        "queries": 10,
        "seconds": stats["index"]["seconds"],
        "mean_batch": 5.0,
    }


def test_a_backend_failure_inside_a_batch_reaches_the_request_as_a_500(caplog):
    class Broken(WordOverlap):
        def search(self, queries, k):
            raise ValueError("shard 3 unreadable")

    client = TestClient(create_app(Broken(), batch_window_ms=1), raise_server_exceptions=False)
    with caplog.at_level(logging.ERROR, logger="searchrl.retrieval.server"):
        r = client.post("/search", json={"queries": ["q"], "k": 1})
    assert r.status_code == 500
    detail = r.json()["detail"]
    assert detail.startswith(
        "backend word-overlap failed on 1 queries: internal error, see the server log"
    )
    assert "shard" not in detail and "ValueError: shard 3 unreadable" in caplog.text


def test_stats_count_requests_hits_and_index_calls_and_the_cache_can_be_emptied():
    # A client on this machine: without a token, only such a client may empty the cache.
    client = TestClient(create_app(WordOverlap(), cache=LocalCache(50)), client=("127.0.0.1", 1))
    client.post("/search", json={"queries": QUERIES, "k": 2})
    client.post("/search", json={"queries": [QUERIES[0], "", QUERIES[0], "new words"], "k": 2})
    stats = client.get("/stats").json()
    assert stats["requests"] == 2 and stats["queries"] == 6 and stats["workers"] == 1
    assert stats["cache"] == {
        "kind": "local",
        "entries": 4,
        "max_entries": 50,
        "hits": 2,
        "hit_rate": 2 / 6,
    }
    assert (
        stats["index"]["calls"] == 2
        and stats["index"]["queries"] == 4
        and stats["index"]["mean_batch"] == 2
    )
    assert client.delete("/cache").json() == {"cleared": 4}
    assert client.get("/stats").json()["cache"]["entries"] == 0
    plain = TestClient(create_app(WordOverlap())).get("/stats").json()
    assert plain["cache"]["kind"] is None and plain["cache"]["hit_rate"] is None


def test_workers_sharing_a_cache_file_answer_from_each_others_searches(tmp_path):
    path = str(tmp_path / "c.sqlite")
    first, second = WordOverlap(), WordOverlap()
    a = TestClient(create_app(first, cache=SharedCache(path, "idx", 100)))
    b = TestClient(create_app(second, cache=SharedCache(path, "idx", 100)))
    want = a.post("/search", json={"queries": QUERIES, "k": 2}).json()
    assert b.post("/search", json={"queries": QUERIES, "k": 2}).json() == want
    assert (first.calls, second.calls) == ([3], [])
    deadline = time.monotonic() + 5
    while (stats := b.get("/stats").json())[
        "requests"
    ] < 2:  # a publishes its counters every 0.25 s
        assert time.monotonic() < deadline, stats
        time.sleep(0.05)
    assert stats["workers"] == 2 and stats["requests"] == 2 and stats["queries"] == 6
    assert (
        stats["cache"]["hits"] == 3
        and stats["cache"]["entries"] == 3
        and stats["index"]["calls"] == 1
    )


@pytest.fixture(scope="module")
def bm25_dir(tmp_path_factory):
    from searchrl.retrieval.index import build_index

    return build_index(
        PASSAGES, tmp_path_factory.mktemp("idx") / "bm25", kind="bm25", progress=False
    )


def serve_cmd(index_dir, port: int, *options: str) -> list[str]:
    """The `searchrl serve` command line for a test server on `port`."""
    return [sys.executable, "-m", "searchrl.cli", "serve", "--index", str(index_dir), "--port", str(port), *options]


def test_serve_with_two_workers_answers_and_shares_its_cache(bm25_dir, tmp_path):
    from searchrl.retrieval.index import open_index

    port = free_port()
    cmd = serve_cmd(bm25_dir, port, "--workers", "2", "--cache-file", str(tmp_path / "cache.sqlite"))
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}"
    queries = ["capital of Germany", "Rhine Netherlands", "newline title", "capital of France"]
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, proc.stderr.read()
            assert time.monotonic() < deadline, "searchrl serve --workers 2 did not come up in 60 s"
            try:
                if (
                    httpx.get(url + "/stats", timeout=1).json()["workers"] == 2
                ):  # both started and published
                    break
            except httpx.TransportError:
                pass
            time.sleep(0.1)
        want = open_index(bm25_dir).search(queries, 2)
        with HttpRetriever(url) as http:
            got: dict[int, list] = {}
            threads = [
                threading.Thread(target=lambda i=i: got.__setitem__(i, http.search(queries, 2)))
                for i in range(8)
            ]
            for t in threads:
                t.start()
            for t in threads:
                t.join(30)
        assert [got[i] for i in range(8)] == [want] * 8
        time.sleep(0.3)  # the other worker publishes its counters every 0.25 s
        stats = httpx.get(url + "/stats").json()
        assert stats["workers"] == 2 and stats["requests"] == 8 and stats["queries"] == 32
        assert stats["cache"]["kind"] == "shared" and stats["cache"]["entries"] == 4
        assert (
            4 <= stats["index"]["queries"] <= 32 - stats["cache"]["hits"]
        )  # concurrent misses merge in a batch
    finally:
        proc.terminate()
        proc.wait(15)


def test_entries_written_behind_are_read_here_at_once_and_elsewhere_once_written(tmp_path):
    path, one = str(tmp_path / "c.sqlite"), [Passage("p1", "T", "x", 1.5)]
    writer, other = SharedCache(path, "idx", 10, write_behind=True), SharedCache(path, "idx", 10)
    writer.put_many(["q"], 3, [one])
    assert writer.get_many(["q"], 3) == [one]  # queued or written: this process sees it now
    writer.flush()
    assert other.get_many(["q"], 3) == [one] and len(other) == 1


def test_a_query_that_arrives_while_its_twin_is_searched_is_not_searched_again():
    retriever = Gated()
    app = create_app(retriever, batch_window_ms=50, cache=LocalCache(10))
    with serve_in_background(app) as url, HttpRetriever(url) as http:
        got: dict[str, list] = {}
        first = threading.Thread(
            target=lambda: got.__setitem__("first", http.search(["capital of France"], 2))
        )
        first.start()
        assert retriever.entered.wait(10)  # being searched; the twin misses the cache on arrival
        twin = threading.Thread(
            target=lambda: got.__setitem__("twin", http.search(["capital  of France"], 2))
        )
        twin.start()
        deadline = time.monotonic() + 10
        while httpx.get(url + "/stats").json()["requests"] < 2:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        retriever.release.set()
        first.join(10)
        twin.join(10)
        stats = httpx.get(url + "/stats").json()
    assert retriever.calls == [1]  # the batching thread found it in the cache before searching
    assert got["twin"] == got["first"] == WordOverlap().search(["capital of France"], 2)
    assert (stats["cache"]["hits"], stats["index"]["queries"]) == (1, 1)


TOKEN_ENV, TOKEN = "SEARCHRL_TEST_SERVE_TOKEN", "9c1e-test-token"
AUTH = {"authorization": f"Bearer {TOKEN}"}


@pytest.fixture(scope="module")
def guarded(bm25_dir):
    """`searchrl serve` with the default limits and a token: (URL, process)."""
    import os

    port = free_port()
    cmd = serve_cmd(bm25_dir, port, "--api-key-env", TOKEN_ENV)
    env = {**os.environ, TOKEN_ENV: TOKEN}
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, proc.stderr.read()
            assert time.monotonic() < deadline, "searchrl serve did not come up in 60 s"
            try:
                if httpx.get(url + "/health", headers=AUTH, timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.1)
        yield url, proc
    finally:
        proc.terminate()
        proc.wait(15)


def _kb(pid: int, field: str) -> int:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(field + ":"))


def _generated(mb: int):
    """A /search body of `mb` million bytes and 25 more, made as it is sent."""
    yield b'{"queries": ["'
    chunk = b"a" * 1_000_000
    for _ in range(mb):
        yield chunk
    yield b'"], "k": 1}'


@pytest.mark.parametrize("framing", ["content-length", "chunked"])
def test_a_400_mb_body_gets_413_and_the_server_holds_at_most_its_limit(guarded, framing):
    url, proc = guarded
    limit = ServerLimits().max_body_bytes()  # the default: 50.2 MB
    headers = {**AUTH, "content-type": "application/json"}
    if framing == "content-length":
        headers["content-length"] = str(400_000_025)
    with open(f"/proc/{proc.pid}/clear_refs", "w") as f:
        f.write("5")  # the peak (VmHWM) starts again from the current RSS
    before = _kb(proc.pid, "VmRSS") * 1024
    start = time.monotonic()
    r = httpx.post(url + "/search", content=_generated(400), headers=headers, timeout=60)
    assert r.status_code == 413 and time.monotonic() - start < 30
    assert f"exceeds the server limit of {limit:,} bytes" in r.json()["detail"]
    grown, peak = (_kb(proc.pid, f) * 1024 - before for f in ("VmRSS", "VmHWM"))
    assert grown < limit
    # Refused by its Content-Length, the body is never read; without one, read up to the limit.
    assert peak < (5_000_000 if framing == "content-length" else limit + 5_000_000)
    ok = httpx.post(url + "/search", json={"queries": ["capital of France"], "k": 1}, headers=AUTH)
    assert ok.json()["results"][0][0]["id"] == "p0"


def test_serve_with_a_token_refuses_requests_without_it_and_foreign_host_names(guarded):
    url, _ = guarded
    r = httpx.get(url + "/health")
    assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
    assert httpx.get(url + "/stats", headers={"authorization": "Bearer nope"}).status_code == 401
    assert httpx.get(url + "/health", headers=AUTH).json() == {
        "status": "ok",
        "kind": "bm25",
        "passages": 5,
    }
    assert httpx.delete(url + "/cache", headers=AUTH).status_code == 200
    assert httpx.get(url + "/docs", headers=AUTH).status_code == 200
    rebound = httpx.get(url + "/health", headers={**AUTH, "host": "attacker.example:8000"})
    assert (
        rebound.status_code == 400
        and "Host: 127.0.0.1, localhost or [::1]" in rebound.json()["detail"]
    )


@pytest.mark.parametrize("value", [None, "", "   "])
def test_serve_refuses_to_start_when_the_token_variable_is_unset_or_empty(
    bm25_dir, monkeypatch, value
):
    from typer.testing import CliRunner

    from searchrl.cli import app

    if value is None:
        monkeypatch.delenv(TOKEN_ENV, raising=False)
    else:
        monkeypatch.setenv(TOKEN_ENV, value)
    result = CliRunner().invoke(
        app, ["serve", "--index", str(bm25_dir), "--api-key-env", TOKEN_ENV]
    )
    assert result.exit_code != 0
    assert f"the environment variable {TOKEN_ENV} is unset or empty" in str(result.exception)
