"""Serve any `Retriever` over HTTP, speaking three dialects.

- native     `POST /search`   `{"queries": [...], "k": 5}` ->
             `{"results": [[{"id", "title", "text", "score"}, ...], ...]}`
- R1-Searcher `POST /queries` `{"queries": [...], "k": 3}` ->
             `{"queries": [...], "answers": [["Title: <t> Text: <x>", ...], ...], "ids": ..., "scores": ...}`
  The authors' rollout strips a leading numeric id (`^\\d+\\s+`) from each string and inserts it as
  `(1)Title: … Text: …` (see the released `gen_text_store`), so the strings carry title and text
  in exactly that form. `ids` and `scores` are extra keys their client ignores; ours reads them
  so nothing is lost.
- Search-R1 / FlashRAG `POST /retrieve` `{"queries": [...], "topk": 3, "return_scores": true}` ->
  `{"result": [[{"document": {"id", "contents"}, "score"}, ...], ...]}` (plain documents when
  `return_scores` is false); `contents` is `Passage.contents()`: `"<title>"\\n<text>`.
- `GET /health` -> `{"status": "ok", "kind": ..., "passages": n | null}`.
- `GET /stats` -> requests, queries, truncated queries, cache hits and hit rate, index calls and
  their mean batch, summed over every worker process (`ServerStats`); `DELETE /cache` empties it.
- `GET /docs`, `/openapi.json`: the API's pages, only on a server with a token.

Before a route runs, `Guard` (guard.py) checks the Host header on a loopback-bound server, the
bearer token when there is one, and the body's size (`ServerLimits.max_body_mb`), reading no byte
past the limit. A failure inside is logged with its traceback under a request id; the client gets
that id and no exception text (which may hold paths or data).

A search goes: limits (an over-long query is cut to `max_query_chars` and logged, not refused:
one runaway rollout must not fail its whole batch) -> the result cache (optional) -> the batching
window (`BatchingRetriever`, optional) -> the index, whose calls a lock serialises (index libraries
make no thread-safety promise and use every core inside one call). `create_app` turns neither on
unless asked; `searchrl serve` turns both on (`serving.py`).

With batching, a request never holds a thread: on the event loop it is validated, looked up in
the cache (an in-process dict or a SQLite read), and its misses are awaited from the batching
thread, which also writes them to the cache, once per index call. Without batching, each request
is searched alone in FastAPI's threadpool, as before. Either way /health answers while searches
run. Bad input is a 422 with a JSON `detail`, non-finite numbers included: Python's JSON parser
accepts `NaN` and `Infinity`, validation then rejects them for every field, and the error handler
writes them as strings (Starlette's default refuses to encode NaN, which turned `"k": NaN` into a
plain-text 500).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
import uuid

from fastapi import FastAPI, HTTPException, Request, Response
from fastapi.concurrency import run_in_threadpool
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ConfigDict, Field
from pydantic_core import to_json

from searchrl.config import StrictModel
from searchrl.data.types import Passage
from searchrl.errors import SearchRLError
from searchrl.outbound import is_loopback_host
from searchrl.retrieval.base import Retriever
from searchrl.retrieval.batching import BatchingRetriever
from searchrl.retrieval.guard import Guard
from searchrl.retrieval.querycache import CachedRetriever, LocalCache, SharedCache
from searchrl.retrieval.serverstats import CountedIndex, ServerStats

log = logging.getLogger(__name__)


class ServerLimits(StrictModel):
    """Request limits that keep one client from stalling or exhausting the server. The defaults
    accept what peers send with their shipped settings: Search-R1's GRPO scripts put 512 prompts x
    5 rollouts = 2,560 queries in one `/retrieve` call."""

    max_batch: int = Field(4096, ge=1, description="Most queries in one request (`--max-batch`); more get HTTP 413.")
    max_query_chars: int = Field(
        2000, ge=1, description="Longer queries are cut to this many characters and logged (`--max-query-chars`)."
    )
    max_k: int = Field(100, ge=1, description="Most passages per query (`--max-k`); more get HTTP 422.")
    max_body_mb: float | None = Field(
        None,
        gt=0,
        description="Largest request body in MB of 10^6 bytes (`--max-body-mb`); a larger one "
        "gets HTTP 413 before it is read. Default: max_batch queries of max_query_chars characters, each "
        "written as a 6-byte JSON escape (`\\uXXXX`), plus 1 MB: 50.2 MB with the defaults.",
    )

    def max_body_bytes(self) -> int:
        if self.max_body_mb is not None:
            return int(self.max_body_mb * 1e6)
        return self.max_batch * self.max_query_chars * 6 + 1_000_000


class _Request(BaseModel):
    # Unknown keys are rejected so a misspelt `topk`/`k` fails loudly instead of using a default.
    model_config = ConfigDict(extra="forbid")

    queries: list[str] = Field(description="Search queries; a blank one gets no passages.")


class SearchRequest(_Request):
    k: int = Field(5, ge=1, description="Passages per query.")


class R1SearcherRequest(_Request):
    k: int = Field(3, ge=1, description="Passages per query.")


class SearchR1Request(_Request):
    topk: int = Field(3, ge=1, description="Passages per query.")
    return_scores: bool = Field(False, description="Wrap each document as {document, score}.")


def r1searcher_string(p: Passage) -> str:
    """The passage as R1-Searcher's rollout inserts it after `(i)`."""
    return f"Title: {p.title} Text: {p.text}"


def _score(p: Passage) -> float | None:
    # Backends may hand back numpy scalars, which JSON encoders refuse.
    return None if p.score is None else float(p.score)


def _json(payload: dict, status: int = 200) -> Response:
    # pydantic-core's Rust encoder: several times faster than json.dumps on these nested lists,
    # and it skips FastAPI's response-model validation pass (the data is ours, already typed).
    return Response(to_json(payload, inf_nan_mode="null"), status_code=status, media_type="application/json")


def _passage_count(retriever: Retriever) -> int | None:
    try:
        return len(retriever)  # type: ignore[arg-type]
    except TypeError:
        return None


def create_app(
    retriever: Retriever,
    limits: ServerLimits | None = None,
    *,
    batch_window_ms: float = 0.0,
    batch_max_queries: int = 1024,
    cache: LocalCache | SharedCache | None = None,
    api_key: str | None = None,
    host: str | None = None,
) -> FastAPI:
    """A FastAPI app answering the three search dialects from `retriever`.

    `batch_window_ms` > 0 gathers concurrent requests into one index call (at most
    `batch_max_queries` queries, a larger request alone); `cache` answers repeated queries.
    `api_key`: the bearer token every request must carry (None: no token, no docs pages, and
    `DELETE /cache` only from loopback clients). `host`: the address the server is bound to; a
    loopback one turns the Host check on."""
    limits = limits or ServerLimits()
    kind = getattr(retriever, "kind", type(retriever).__name__)
    index = CountedIndex(retriever)
    cached = CachedRetriever(index, cache) if cache is not None else None
    batcher = None
    if batch_window_ms > 0:  # the cache is written on the batching thread, once per index call
        batcher = BatchingRetriever(index, batch_window_ms / 1000, batch_max_queries, cache=cache)
    stats = ServerStats(index, cached, batcher)
    docs = api_key is not None
    app = FastAPI(
        title="searchrl retrieval server",
        docs_url="/docs" if docs else None,
        openapi_url="/openapi.json" if docs else None,
        redoc_url=None,
    )
    loopback_only = host is not None and is_loopback_host(host)
    app.add_middleware(
        Guard, max_body=limits.max_body_bytes(), token=api_key, loopback_only=loopback_only
    )

    @app.exception_handler(RequestValidationError)
    async def invalid(_request: Request, exc: RequestValidationError) -> Response:
        # `input` may hold NaN or Infinity: written as strings, the body stays valid JSON.
        detail = to_json({"detail": exc.errors()}, inf_nan_mode="strings", fallback=str)
        return Response(detail, status_code=422, media_type="application/json")

    @app.exception_handler(Exception)
    async def crashed(_request: Request, _exc: Exception) -> Response:
        return _json({"detail": _logged_failure("unhandled error")}, 500)

    async def run(queries: list[str], k: int) -> list[list[Passage]]:
        if batcher is None:  # each request searched alone, in a worker thread, under the index lock
            return await run_in_threadpool((index if cached is None else cached).search, queries, k)
        if cached is None:
            return await asyncio.wrap_future(batcher.submit(queries, k))
        # On the event loop: a lookup is a dict or a SQLite read; only misses wait for the batcher.
        started = time.perf_counter()
        lookup = cached.lookup(queries, k)
        if lookup.missing:
            lookup.fill(await asyncio.wrap_future(batcher.submit(list(lookup.missing), k)))
        cached.count(lookup.asked, lookup.hits, started)
        return lookup.out

    async def search(queries: list[str], k: int) -> list[list[Passage]]:
        if len(queries) > limits.max_batch:
            raise HTTPException(
                413,
                f"batch of {len(queries)} queries exceeds the server limit max_batch={limits.max_batch}; "
                f"send smaller batches (HttpRetriever(max_batch=...)) or restart the server with "
                f"`searchrl serve --max-batch {len(queries)}`",
            )
        if k > limits.max_k:
            raise HTTPException(
                422,
                f"k={k} exceeds the server limit max_k={limits.max_k}; ask for fewer passages or "
                f"restart the server with `searchrl serve --max-k {k}`",
            )
        queries, truncated = _truncate(queries, limits.max_query_chars)
        stats.request(sum(1 for q in queries if q and q.strip()), truncated)
        try:
            results = await run(queries, k)
        except Exception:  # noqa: BLE001 - logged there; the client retries: it may be transient
            raise HTTPException(
                500, _logged_failure(f"backend {kind} failed on {len(queries)} queries")
            ) from None
        if len(results) != len(queries):
            raise HTTPException(
                500,
                f"backend {kind} returned {len(results)} result lists for {len(queries)} queries",
            )
        return results

    @app.post("/search")
    async def native(req: SearchRequest) -> Response:
        results = await search(req.queries, req.k)
        return _json(
            {
                "results": [
                    [{"id": p.id, "title": p.title, "text": p.text, "score": _score(p)} for p in ps]
                    for ps in results
                ]
            }
        )

    @app.post("/queries")
    async def r1searcher(req: R1SearcherRequest) -> Response:
        results = await search(req.queries, req.k)
        return _json(
            {
                "queries": req.queries,
                "answers": [[r1searcher_string(p) for p in ps] for ps in results],
                "ids": [[p.id for p in ps] for ps in results],
                "scores": [[_score(p) for p in ps] for ps in results],
            }
        )

    @app.post("/retrieve")
    async def search_r1(req: SearchR1Request) -> Response:
        results = await search(req.queries, req.topk)
        if req.return_scores:
            out = [
                [
                    {"document": {"id": p.id, "contents": p.contents()}, "score": _score(p)}
                    for p in ps
                ]
                for ps in results
            ]
        else:
            out = [[{"id": p.id, "contents": p.contents()} for p in ps] for ps in results]
        return _json({"result": out})

    @app.get("/health")
    async def health() -> dict:
        return {"status": "ok", "kind": kind, "passages": _passage_count(retriever)}

    @app.get("/stats")
    def stats_endpoint() -> Response:
        return _json(stats.report())

    @app.delete("/cache")
    def clear_cache() -> dict:
        return {"cleared": cache.clear() if cache is not None else 0}

    return app


def _logged_failure(what: str) -> str:
    """Logs the exception being handled, traceback included, under a new request id; returns what
    the client is told: `what` and that id, no exception text."""
    request_id = uuid.uuid4().hex[:12]
    log.exception("request %s: %s", request_id, what)
    return f"{what}: internal error, see the server log for request {request_id}"


def _truncate(queries: list[str], max_chars: int) -> tuple[list[str], int]:
    """`queries` with each one longer than `max_chars` cut to that length; one log line a request."""
    cut = [i for i, q in enumerate(queries) if len(q) > max_chars]
    if not cut:
        return queries, 0
    longest = max(cut, key=lambda i: len(queries[i]))
    log.warning(
        "%d of %d queries truncated to max_query_chars=%d (query %d has %d characters); "
        "`searchrl serve --max-query-chars` raises the limit",
        len(cut), len(queries), max_chars, longest, len(queries[longest]),
    )
    out = list(queries)
    for i in cut:
        out[i] = queries[i][:max_chars]
    return out, len(cut)


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nothing listens on right now (the OS picks it)."""
    import socket

    with socket.socket() as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


@contextlib.contextmanager
def serve_in_background(app_or_retriever, host: str = "127.0.0.1", keep_alive_s: float = 5, port: int | None = None):
    """A real uvicorn server on `port` (default: a free one) in a daemon thread; yields its base URL.

    For the demo and tests: the same HTTP path as `searchrl serve`, without a second process.
    """
    import uvicorn

    app = app_or_retriever
    if not isinstance(app, FastAPI):
        app = create_app(app_or_retriever, host=host)
    port = port or free_port(host)
    config = uvicorn.Config(
        app, host=host, port=port, log_level="error", access_log=False, timeout_keep_alive=keep_alive_s
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise SearchRLError(f"the retrieval server did not start on {host}:{port}")
        time.sleep(0.01)
    try:
        yield f"http://{host}:{port}"
    finally:
        server.should_exit = True
        thread.join(5)
