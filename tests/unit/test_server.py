"""Retrieval server (three dialects, limits, health) and HttpRetriever (retries, errors, parsing)."""

from __future__ import annotations

import contextlib
import logging
import threading
import time

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from searchrl.data.types import Passage
from searchrl.errors import RetrievalUnavailable, SearchRLError
from searchrl.retrieval.base import Retriever
from searchrl.retrieval.http import HttpRetriever, RetryConfig, _r1_passages, _search_r1_passage
from searchrl.retrieval.querycache import LocalCache
from searchrl.retrieval.server import ServerLimits, create_app, free_port, serve_in_background

PASSAGES = [
    Passage("p0", "Paris", "Paris is the capital of France."),
    Passage("p1", "Berlin", "Berlin is the capital of Germany."),
    Passage("p2", "Rhine", " The Rhine flows through Germany and the Netherlands."),
    Passage("p3", 'The "Quoted" Title', "Text with\na newline and Title: inside."),
    Passage("p4", "", "A passage without a title about France."),
]


class WordOverlap(Retriever):
    """Ranks by shared lowercase words; ties by id. Records every batch it was asked."""

    kind = "word-overlap"

    def __init__(self) -> None:
        self.calls: list[int] = []

    def __len__(self) -> int:
        return len(PASSAGES)

    def search(self, queries: list[str], k: int) -> list[list[Passage]]:
        self.calls.append(len(queries))
        out = []
        for q in queries:
            words = set(q.lower().split())
            if not words:
                out.append([])
                continue
            scored = [
                (len(words & set((p.title + " " + p.text).lower().replace(".", "").split())), p)
                for p in PASSAGES
            ]
            scored.sort(key=lambda t: (-t[0], t[1].id))
            out.append([Passage(p.id, p.title, p.text, float(s) + 0.5) for s, p in scored[:k]])
        return out


QUERIES = ["capital of France", "Germany river", "quoted title newline"]


def running(app, keep_alive_s: float = 5, port: int | None = None):
    """A real uvicorn server on a (free) localhost port, in a background thread."""
    return serve_in_background(app, keep_alive_s=keep_alive_s, port=port)


@pytest.fixture(scope="module")
def retriever() -> WordOverlap:
    return WordOverlap()


@pytest.fixture(scope="module")
def limits() -> ServerLimits:
    return ServerLimits(max_batch=8, max_query_chars=50, max_k=4)


@pytest.fixture(scope="module")
def client(retriever, limits) -> TestClient:
    return TestClient(create_app(retriever, limits))


@pytest.fixture(scope="module")
def live(retriever, limits):
    with running(create_app(retriever, limits)) as url:
        yield url


def test_native_endpoint_returns_the_retrievers_passages(client, retriever):
    r = client.post("/search", json={"queries": QUERIES, "k": 3})
    assert r.status_code == 200
    got = [[Passage(**d) for d in ps] for ps in r.json()["results"]]
    assert got == retriever.search(QUERIES, 3)
    assert got[0][0].id == "p0" and got[0][0].score == 3.5  # capital, of, france


def test_r1searcher_endpoint_uses_title_text_strings(client, retriever):
    r = client.post("/queries", json={"queries": QUERIES, "k": 2}).json()
    want = retriever.search(QUERIES, 2)
    assert r["queries"] == QUERIES
    assert r["answers"][0][0] == "Title: Paris Text: Paris is the capital of France."
    assert r["answers"] == [[f"Title: {p.title} Text: {p.text}" for p in ps] for ps in want]
    assert r["ids"] == [[p.id for p in ps] for ps in want]
    assert r["scores"] == [[p.score for p in ps] for ps in want]


def test_search_r1_endpoint_with_and_without_scores(client, retriever):
    want = retriever.search(QUERIES, 3)
    scored = client.post(
        "/retrieve", json={"queries": QUERIES, "topk": 3, "return_scores": True}
    ).json()["result"]
    assert scored == [
        [{"document": {"id": p.id, "contents": p.contents()}, "score": p.score} for p in ps]
        for ps in want
    ]
    assert scored[0][0]["document"]["contents"] == '"Paris"\nParis is the capital of France.'
    plain = client.post(
        "/retrieve", json={"queries": QUERIES, "topk": 3, "return_scores": False}
    ).json()["result"]
    assert plain == [[{"id": p.id, "contents": p.contents()} for p in ps] for ps in want]


def test_health_reports_kind_and_size(client):
    assert client.get("/health").json() == {"status": "ok", "kind": "word-overlap", "passages": 5}


@pytest.mark.parametrize(
    ("path", "body", "status", "needles"),
    [
        (
            "/search",
            {"queries": ["a"] * 9, "k": 1},
            413,
            ["9 queries", "max_batch=8", "--max-batch"],
        ),
        ("/retrieve", {"queries": ["a"], "topk": 5}, 422, ["k=5", "max_k=4", "--max-k"]),
    ],
)
def test_limits_answer_4xx_saying_which_limit_and_how_to_raise_it(
    client, path, body, status, needles
):
    r = client.post(path, json=body)
    assert r.status_code == status
    for needle in needles:
        assert needle in r.json()["detail"]


def test_misspelt_field_is_rejected_not_defaulted(client):
    assert client.post("/search", json={"queries": ["a"], "topk": 2}).status_code == 422


@pytest.mark.parametrize("api", ["native", "r1searcher", "search-r1"])
def test_http_retriever_round_trips_every_dialect(live, retriever, api):
    with HttpRetriever(live, api=api) as http:
        got = http.search(QUERIES, 3)
    assert got == retriever.search(
        QUERIES, 3
    )  # ids, titles (quotes, empty), texts (newlines, spaces), scores


def test_http_retriever_accepts_a_full_endpoint_url(live, retriever):
    with HttpRetriever(live + "/retrieve", api="search-r1") as http:
        assert http.url == live + "/retrieve"
        assert http.search(QUERIES[:1], 2) == retriever.search(QUERIES[:1], 2)


def test_http_retriever_splits_big_batches(live, retriever):
    queries = [f"capital {i}" for i in range(7)]
    retriever.calls.clear()
    with HttpRetriever(live, max_batch=3) as http:
        got = http.search(queries, 2)
    assert retriever.calls == [3, 3, 1]
    assert got == retriever.search(queries, 2)


def test_blank_queries_get_empty_lists_without_a_request(live, retriever):
    retriever.calls.clear()
    with HttpRetriever(live) as http:
        assert http.search(["", "   ", "\n"], 3) == [[], [], []]
        assert retriever.calls == []
        mixed = http.search(["", "capital of France", " "], 1)
    assert retriever.calls == [1]
    assert [len(ps) for ps in mixed] == [0, 1, 0] and mixed[1][0].id == "p0"


@pytest.mark.parametrize(
    ("queries", "k", "needle"),
    [
        (["q"] * 9, 1, "--max-batch"),
        (["q"], 10, "--max-k"),
        (["q"], 0, "k: Input should be greater than or equal to 1"),
    ],
)
def test_http_retriever_raises_the_servers_4xx_detail(live, queries, k, needle):
    with HttpRetriever(
        live, max_batch=100, retry=RetryConfig(retries=3, backoff_s=10)
    ) as http:  # 4xx must not be retried
        start = time.monotonic()
        with pytest.raises(SearchRLError) as err:
            http.search(queries, k)
    assert needle in str(err.value) and "rejected the request" in str(err.value)
    assert not isinstance(err.value, RetrievalUnavailable)
    assert time.monotonic() - start < 2


def test_unreachable_server_raises_retrieval_unavailable_after_retries():
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    with HttpRetriever(url, retry=RetryConfig(retries=2, backoff_s=0.01), timeout=2) as http:
        start = time.monotonic()
        with pytest.raises(RetrievalUnavailable) as err:
            http.search(["anything"], 3)
    assert time.monotonic() - start < 2
    msg = str(err.value)
    assert url + "/search" in msg and "3 attempts" in msg and "searchrl serve" in msg
    assert "raise retrieval.retry.retries (now 2)" in msg  # the count ran out, not the time


def test_spent_time_budget_names_the_url_the_time_and_the_setting_to_raise():
    url = f"http://127.0.0.1:{free_port()}"
    retry = RetryConfig(backoff_s=0.05, max_backoff_s=0.1, total_s=0.6)
    with HttpRetriever(url, retry=retry) as http:
        start = time.monotonic()
        with pytest.raises(RetrievalUnavailable) as err:
            http.search(["anything"], 3)
    assert 0.6 <= time.monotonic() - start < 1.5  # the whole budget, in waits of at most 0.1 s
    msg = str(err.value)
    assert url + "/search" in msg and "did not answer for 0.6 s" in msg
    assert "raise retrieval.retry.total_s (now 0.6)" in msg


def test_default_retry_budget_waits_a_minute_in_capped_doubling_steps():
    retry, waits, elapsed = RetryConfig(), [], 0.0
    while (wait := retry.wait(len(waits) + 1, elapsed)) is not None:  # every attempt refused at once
        waits.append(wait)
        elapsed += wait
    assert waits[:6] == [0.5, 1, 2, 4, 5, 5] and max(waits) == 5
    assert elapsed == 60 and len(waits) < retry.retries  # time, not the count, ends a restart's wait


def test_check_finds_a_server_even_without_health_endpoint(live):
    HttpRetriever(live).check()
    foreign = FastAPI()  # like R1-Searcher's or Search-R1's servers: no /health, answers 404
    with running(foreign) as url:
        HttpRetriever(url + "/retrieve", api="search-r1").check()
    url = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(RetrievalUnavailable, match=f"no retrieval server answers at {url}/search .*searchrl serve"):
        HttpRetriever(url).check()


def test_a_server_that_comes_up_within_the_budget_is_waited_for(retriever):
    port, app = free_port(), create_app(retriever)
    retry = RetryConfig(backoff_s=0.1, max_backoff_s=0.2, total_s=10)
    with contextlib.ExitStack() as stack, HttpRetriever(f"http://127.0.0.1:{port}", retry=retry) as http:
        threading.Timer(1.0, lambda: stack.enter_context(running(app, port=port))).start()
        begin = time.monotonic()
        assert http.search(QUERIES, 2) == retriever.search(QUERIES, 2)
        assert 1.0 <= time.monotonic() - begin < 3  # noticed within max_backoff_s of coming up


def test_503_twice_then_success_is_retried(retriever):
    app = create_app(retriever)
    seen = []

    @app.middleware("http")
    async def flaky(request, call_next):
        seen.append(request.url.path)
        if len(seen) <= 2:
            from fastapi.responses import JSONResponse

            return JSONResponse({"detail": "warming up"}, status_code=503)
        return await call_next(request)

    with running(app) as url, HttpRetriever(url, retry=RetryConfig(retries=3, backoff_s=0.01)) as http:
        got = http.search(QUERIES, 2)
    assert seen == ["/search"] * 3
    assert got == retriever.search(QUERIES, 2)


def test_persistent_5xx_ends_in_retrieval_unavailable_with_the_detail(retriever):
    app = create_app(retriever)

    @app.middleware("http")
    async def broken(request, call_next):
        from fastapi.responses import JSONResponse

        return JSONResponse({"detail": "index not loaded"}, status_code=500)

    with (
        running(app) as url,
        HttpRetriever(url, retry=RetryConfig(retries=1, backoff_s=0.01)) as http,
        pytest.raises(RetrievalUnavailable, match="index not loaded"),
    ):
        http.search(["q"], 1)


def test_connection_closed_by_the_server_while_idle_is_reopened_transparently(retriever):
    with (
        running(create_app(retriever), keep_alive_s=0.1) as url,
        HttpRetriever(url, retry=RetryConfig(retries=0)) as http,
    ):
        first = http.search(QUERIES, 2)
        time.sleep(0.4)  # the server drops the idle keep-alive connection
        assert http.search(QUERIES, 2) == first == retriever.search(QUERIES, 2)


def test_one_client_shared_by_threads(live, retriever):
    queries = [f"capital {w}" for w in ("France", "Germany", "river", "title")] * 5
    want = retriever.search(queries, 2)
    with HttpRetriever(live, max_batch=1) as http:
        got: dict[int, list] = {}
        threads = [
            threading.Thread(target=lambda i=i: got.__setitem__(i, http.search(queries, 2)))
            for i in range(4)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert [got[i] for i in range(4)] == [want] * 4


def test_slow_server_times_out_into_retrieval_unavailable(retriever):
    import asyncio

    app = create_app(retriever)

    @app.middleware("http")
    async def slow(request, call_next):
        await asyncio.sleep(0.6)
        return await call_next(request)

    with running(app) as url, HttpRetriever(url, timeout=0.2, retry=RetryConfig(retries=1, backoff_s=0.01)) as http:
        start = time.monotonic()
        with pytest.raises(RetrievalUnavailable, match="2 attempts.*timed out"):
            http.search(["q"], 1)
        assert time.monotonic() - start < 1.0  # two 0.2 s timeouts, not the server's 0.6 s


def test_a_backend_exception_is_logged_and_the_client_gets_a_request_id_not_its_text(caplog):
    class Broken(Retriever):
        def search(self, queries, k):
            raise ValueError("shard /srv/secret/3.bin unreadable")

    client = TestClient(create_app(Broken()), raise_server_exceptions=False)
    with caplog.at_level(logging.ERROR, logger="searchrl.retrieval.server"):
        r = client.post("/search", json={"queries": ["q"], "k": 1})
    assert r.status_code == 500
    detail = r.json()["detail"]
    assert detail.startswith(
        "backend Broken failed on 1 queries: internal error, see the server log"
    )
    assert "ValueError" not in r.text and "secret" not in r.text
    request_id = detail.rsplit(" ", 1)[1]
    (record,) = caplog.records
    assert record.getMessage() == f"request {request_id}: backend Broken failed on 1 queries"
    assert (
        "ValueError: shard /srv/secret/3.bin unreadable" in caplog.text
    )  # the traceback is logged
    assert client.get("/health").json() == {"status": "ok", "kind": "Broken", "passages": None}


def test_an_unhandled_exception_outside_a_search_is_a_generic_500(caplog):
    class NoLength(WordOverlap):
        def __len__(self):
            raise RuntimeError("manifest at /srv/secret unreadable")

    client = TestClient(create_app(NoLength()), raise_server_exceptions=False)
    with caplog.at_level(logging.ERROR, logger="searchrl.retrieval.server"):
        r = client.get("/health")
    assert r.status_code == 500 and r.headers["content-type"] == "application/json"
    assert r.json()["detail"].startswith(
        "unhandled error: internal error, see the server log for request "
    )
    assert "secret" not in r.text and "RuntimeError" not in r.text
    assert "RuntimeError: manifest at /srv/secret unreadable" in caplog.text


async def _asgi(app, method: str, path: str, headers: dict[str, str], chunks: list[bytes]):
    """One request straight into the ASGI app: (status, JSON body, how many chunks it read)."""
    import json

    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "client": ("127.0.0.1", 5000),
        "server": ("127.0.0.1", 8000),
        "headers": [(b"host", b"127.0.0.1"), (b"content-type", b"application/json")]
        + [(k.lower().encode(), v.encode()) for k, v in headers.items()],
    }
    read, sent = [0], []

    async def receive():
        read[0] += 1
        i = read[0] - 1
        return {"type": "http.request", "body": chunks[i], "more_body": i + 1 < len(chunks)}

    async def send(message):
        sent.append(message)

    await app(scope, receive, send)
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return sent[0]["status"], json.loads(body), read[0]


def _body(size: int) -> bytes:
    """A valid /search body of exactly `size` bytes."""
    head, tail = b'{"queries": ["capital ', b'"], "k": 1}'
    return head + b"x" * (size - len(head) - len(tail)) + tail


def test_a_content_length_over_the_limit_is_refused_before_a_byte_is_read(retriever):
    import asyncio

    app = create_app(retriever, ServerLimits(max_body_mb=0.001))  # 1,000 bytes
    retriever.calls.clear()
    status, body, read = asyncio.run(
        _asgi(app, "POST", "/search", {"content-length": "400000000"}, [b"{"] * 10)
    )
    assert (status, read) == (413, 0)
    assert "400,000,000 bytes exceeds the server limit of 1,000 bytes" in body["detail"]
    assert "--max-body-mb" in body["detail"] and retriever.calls == []
    exact = asyncio.run(_asgi(app, "POST", "/search", {"content-length": "1000"}, [_body(1000)]))
    assert exact[0] == 200 and retriever.calls == [1]  # the limit itself is allowed


def test_a_chunked_body_is_read_up_to_the_limit_and_no_further(retriever):
    import asyncio

    app = create_app(retriever, ServerLimits(max_body_mb=0.001))
    whole = _body(4000)
    chunks = [whole[i : i + 300] for i in range(0, 4000, 300)]  # 14 chunks, no Content-Length
    retriever.calls.clear()
    status, body, read = asyncio.run(_asgi(app, "POST", "/search", {}, chunks))
    assert (status, read) == (413, 4)  # 1,200 bytes: the fourth chunk crossed 1,000
    assert (
        "more than 1,000 bytes exceeds the server limit" in body["detail"] and retriever.calls == []
    )
    fits = _body(1000)
    status, _, read = asyncio.run(_asgi(app, "POST", "/search", {}, [fits[:600], fits[600:]]))
    assert (status, read) == (200, 2)
    # Over TestClient too: a body without Content-Length gets the same 413.
    r = TestClient(app, base_url="http://127.0.0.1").post("/search", content=iter(chunks))
    assert r.status_code == 413 and "more than 1,000 bytes" in r.json()["detail"]


def test_the_default_body_limit_holds_a_full_batch_of_escaped_longest_queries():
    import json

    limits = ServerLimits()
    assert limits.max_body_bytes() == 4096 * 2000 * 6 + 1_000_000 == 50_152_000
    # The widest body a Python client sends for max_batch queries of max_query_chars: every
    # character escaped as \uXXXX (json.dumps' ensure_ascii, which requests uses).
    widest = json.dumps({"queries": ["é" * 2000] * 4096, "k": 100})
    assert len(widest) <= limits.max_body_bytes()
    assert ServerLimits(max_batch=8192).max_body_bytes() == 8192 * 2000 * 6 + 1_000_000
    assert ServerLimits(max_body_mb=200).max_body_bytes() == 200_000_000


TOKEN = "t0ken-9f2c"


@pytest.fixture(scope="module")
def locked(retriever):
    return TestClient(
        create_app(retriever, api_key=TOKEN, cache=LocalCache(10)), raise_server_exceptions=False
    )


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("POST", "/search"),
        ("POST", "/queries"),
        ("POST", "/retrieve"),
        ("GET", "/health"),
        ("GET", "/stats"),
        ("DELETE", "/cache"),
        ("GET", "/docs"),
        ("GET", "/openapi.json"),
        ("GET", "/nowhere"),
    ],
)
@pytest.mark.parametrize(
    "auth", [None, "Bearer wrong", f"Basic {TOKEN}", f"Bearer {TOKEN}x", "Bearer"]
)
def test_with_a_token_every_route_needs_it(locked, retriever, method, path, auth):
    retriever.calls.clear()
    headers = {} if auth is None else {"Authorization": auth}
    r = locked.request(
        method, path, json={"queries": ["capital"], "k": 1, "topk": 1}, headers=headers
    )
    assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
    assert "Authorization: Bearer <token>" in r.json()["detail"] and retriever.calls == []


def test_with_the_token_every_route_answers(locked):
    auth = {"Authorization": f"Bearer {TOKEN}"}
    assert (
        locked.post(
            "/search", json={"queries": ["capital of France"], "k": 1}, headers=auth
        ).json()["results"][0][0]["id"]
        == "p0"
    )
    assert (
        locked.post("/retrieve", json={"queries": ["x"], "topk": 1}, headers=auth).status_code
        == 200
    )
    assert locked.get("/health", headers={"authorization": f"bearer  {TOKEN} "}).status_code == 200
    assert locked.get("/stats", headers=auth).json()["requests"] >= 1
    assert locked.delete("/cache", headers=auth).json()["cleared"] >= 1
    assert locked.get("/docs", headers=auth).status_code == 200
    assert (
        locked.get("/openapi.json", headers=auth).json()["info"]["title"]
        == "searchrl retrieval server"
    )


def test_without_a_token_no_docs_and_the_cache_is_emptied_only_from_this_machine(retriever):
    app = create_app(retriever, cache=LocalCache(10))
    far = TestClient(app, client=("203.0.113.7", 40000))
    assert far.get("/docs").status_code == 404 and far.get("/openapi.json").status_code == 404
    assert far.post("/search", json={"queries": ["capital"], "k": 1}).status_code == 200
    assert far.get("/stats").json()["cache"]["entries"] == 1
    r = far.delete("/cache")
    assert r.status_code == 403 and "--api-key-env" in r.json()["detail"]
    assert far.get("/stats").json()["cache"]["entries"] == 1
    for near in (("127.0.0.1", 1), ("::1", 1)):
        assert TestClient(app, client=near).delete("/cache").status_code == 200


@pytest.mark.parametrize(
    ("header", "ok"),
    [
        ("127.0.0.1", True),
        ("127.0.0.1:8000", True),
        ("localhost", True),
        ("LocalHost:80", True),
        ("[::1]", True),
        ("[::1]:8000", True),
        ("evil.example", False),
        ("evil.example:8000", False),
        ("127.0.0.1.evil.example", False),
        ("localhost.evil.example", False),
        ("127.0.0.2", False),
        ("", False),
        ("::1", False),
        ("127.0.0.1:8000:1", False),
        ("127.0.0.1@evil.example", False),
        ("[::1]evil", False),
    ],
)
def test_a_loopback_server_answers_only_loopback_host_names(retriever, header, ok):
    client = TestClient(create_app(retriever, host="127.0.0.1"), base_url="http://127.0.0.1:8000")
    r = client.get("/health", headers={"host": header})
    assert r.status_code == (200 if ok else 400)
    if not ok:
        assert "answers only Host: 127.0.0.1, localhost or [::1]" in r.json()["detail"]


@pytest.mark.parametrize(
    ("host", "checked"),
    [
        ("127.0.0.1", True),
        ("::1", True),
        ("localhost", True),
        ("127.0.0.5", True),
        ("0.0.0.0", False),
        ("10.1.2.3", False),
    ],
)
def test_the_host_check_is_on_only_when_bound_to_loopback(retriever, host, checked):
    client = TestClient(create_app(retriever, host=host), base_url="http://127.0.0.1:8000")
    assert client.get("/health", headers={"host": "evil.example"}).status_code == (
        400 if checked else 200
    )


def test_parses_r1searcher_strings_from_the_authors_server():
    # Their server sends bare corpus lines, sometimes led by a numeric id their rollout strips.
    got = _r1_passages(
        ["123 Title: Home Rule League Text:  The Home Rule League was", "Title: A Text: b"],
        None,
        None,
    )
    assert got[0] == Passage("123", "Home Rule League", " The Home Rule League was")
    assert (got[1].title, got[1].text, got[1].score) == ("A", "b", None)
    assert got[1].id == _r1_passages(["Title: A Text: b"], None, None)[0].id  # stable content id


def test_parses_flashrag_documents_with_title_and_text_fields():
    got = _search_r1_passage(
        {"document": {"id": "7", "contents": '"T"\nx', "title": "T", "text": "x"}, "score": 0.25}
    )
    assert got == Passage("7", "T", "x", 0.25)
    assert _search_r1_passage({"id": "8", "contents": '"Only"\nline one\nline two'}) == Passage(
        "8", "Only", "line one\nline two"
    )


def test_bad_url_and_api_are_clear_errors():
    with pytest.raises(SearchRLError, match="not an http"):
        HttpRetriever("localhost:8000")
    with pytest.raises(SearchRLError, match="choose one of"):
        HttpRetriever("http://127.0.0.1:1", api="elastic")


@pytest.fixture(scope="module")
def bm25_dir(tmp_path_factory):
    from searchrl.retrieval.index import build_index

    return build_index(
        PASSAGES, tmp_path_factory.mktemp("idx") / "bm25", kind="bm25", progress=False
    )


@pytest.mark.parametrize("api", ["native", "r1searcher", "search-r1"])
def test_real_bm25_index_served_equals_in_process(bm25_dir, api):
    from searchrl.retrieval import open_retriever
    from searchrl.retrieval.index import open_index

    local = open_index(bm25_dir)
    queries = ["capital of Germany", "Rhine Netherlands", "", "newline title"]
    with (
        running(create_app(open_retriever(str(bm25_dir)))) as url,
        HttpRetriever(url, api=api) as http,
    ):
        assert http.search(queries, 3) == local.search(queries, 3)
        assert http.search(queries, 3)[0][0].id == "p1"


def test_serve_command_answers_health_and_search(bm25_dir):
    import subprocess
    import sys

    import httpx

    port = free_port()
    cmd = [
        sys.executable,
        "-m",
        "searchrl.cli",
        "serve",
        "--index",
        str(bm25_dir),
        "--port",
        str(port),
        "--max-k",
        "2",
    ]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, proc.stderr.read()
            assert time.monotonic() < deadline, "searchrl serve did not come up in 60 s"
            try:
                health = httpx.get(url + "/health", timeout=1).json()
                break
            except httpx.TransportError:
                time.sleep(0.1)
        assert health == {"status": "ok", "kind": "bm25", "passages": 5}
        with HttpRetriever(url) as http:
            assert http.search(["capital of France"], 2)[0][0].id == "p0"
            with pytest.raises(SearchRLError, match="max_k=2"):
                http.search(["capital"], 3)
    finally:
        proc.terminate()
        proc.wait(10)


def test_serve_command_rejects_a_missing_index_directory(tmp_path):
    from typer.testing import CliRunner

    from searchrl.cli import app

    result = CliRunner().invoke(app, ["serve", "--index", str(tmp_path / "missing")])
    assert result.exit_code != 0
    assert "does not exist" in str(result.exception)


@pytest.mark.parametrize("api", ["native", "r1searcher", "search-r1"])
def test_client_with_the_token_searches_a_locked_server_and_without_it_is_told_what_to_set(retriever, monkeypatch, api):
    app = create_app(retriever, api_key=TOKEN, host="127.0.0.1")
    path = {"native": "", "r1searcher": "/queries", "search-r1": "/retrieve"}[api]
    with running(app) as url:
        monkeypatch.setenv("SEARCHRL_TEST_RETRIEVAL_TOKEN", TOKEN)
        with HttpRetriever(url + path, api=api, api_key_env="SEARCHRL_TEST_RETRIEVAL_TOKEN") as http:
            http.check()
            assert [p.id for p in http.search(["capital of France"], k=1)[0]] == ["p0"]
        monkeypatch.setenv("SEARCHRL_TEST_RETRIEVAL_TOKEN", "wrong")
        with HttpRetriever(url + path, api=api, api_key_env="SEARCHRL_TEST_RETRIEVAL_TOKEN") as http:
            with pytest.raises(SearchRLError, match="401") as err:
                http.search(["capital of France"], k=1)
            assert not isinstance(err.value, RetrievalUnavailable)  # a refusal is not an outage: no retries
