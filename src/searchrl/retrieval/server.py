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

Endpoints are plain `def`s: FastAPI runs them in its threadpool, so a slow search never blocks
the event loop (health checks still answer). A lock serialises the backend because index
libraries (bm25s, faiss, torch encoders) make no thread-safety promise and already use every
core inside one call, so concurrent calls would gain nothing.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time

from fastapi import FastAPI, HTTPException, Response
from pydantic import BaseModel, ConfigDict, Field
from pydantic_core import to_json

from searchrl.config import StrictModel
from searchrl.data.types import Passage
from searchrl.errors import SearchRLError
from searchrl.retrieval.base import Retriever

log = logging.getLogger(__name__)


class ServerLimits(StrictModel):
    """Request limits that keep one client from stalling or exhausting the server."""

    max_batch: int = Field(512, ge=1, description="Most queries in one request (`--max-batch`).")
    max_query_chars: int = Field(
        2000, ge=1, description="Longest query accepted (`--max-query-chars`)."
    )
    max_k: int = Field(100, ge=1, description="Most passages per query (`--max-k`).")


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


def _json(payload: dict) -> Response:
    # pydantic-core's Rust encoder: several times faster than json.dumps on these nested lists,
    # and it skips FastAPI's response-model validation pass (the data is ours, already typed).
    return Response(to_json(payload, inf_nan_mode="null"), media_type="application/json")


def _passage_count(retriever: Retriever) -> int | None:
    try:
        return len(retriever)  # type: ignore[arg-type]
    except TypeError:
        return None


def create_app(retriever: Retriever, limits: ServerLimits | None = None) -> FastAPI:
    """A FastAPI app answering the three search dialects from `retriever`."""
    limits = limits or ServerLimits()
    lock = threading.Lock()
    kind = getattr(retriever, "kind", type(retriever).__name__)
    app = FastAPI(title="searchrl retrieval server", docs_url="/docs", redoc_url=None)

    def search(queries: list[str], k: int) -> list[list[Passage]]:
        if len(queries) > limits.max_batch:
            raise HTTPException(
                413,
                f"batch of {len(queries)} queries exceeds the server limit max_batch={limits.max_batch}; "
                f"send smaller batches (HttpRetriever(max_batch=...)) or restart the server with "
                f"`searchrl serve --max-batch {len(queries)}`",
            )
        for i, q in enumerate(queries):
            if len(q) > limits.max_query_chars:
                raise HTTPException(
                    413,
                    f"query {i} has {len(q)} characters, over the server limit "
                    f"max_query_chars={limits.max_query_chars}; shorten it or restart the server with "
                    f"`searchrl serve --max-query-chars {len(q)}`",
                )
        if k > limits.max_k:
            raise HTTPException(
                422,
                f"k={k} exceeds the server limit max_k={limits.max_k}; ask for fewer passages or "
                f"restart the server with `searchrl serve --max-k {k}`",
            )
        try:
            with lock:
                results = retriever.search(queries, k)
        except Exception as exc:  # the client sees why, and retries: the cause may be transient
            log.exception("backend %s failed on %d queries", kind, len(queries))
            raise HTTPException(
                500, f"backend {kind} failed: {type(exc).__name__}: {exc}"
            ) from None
        if len(results) != len(queries):
            raise HTTPException(
                500,
                f"backend {kind} returned {len(results)} result lists for {len(queries)} queries",
            )
        return results

    @app.post("/search")
    def native(req: SearchRequest) -> Response:
        results = search(req.queries, req.k)
        return _json(
            {
                "results": [
                    [{"id": p.id, "title": p.title, "text": p.text, "score": _score(p)} for p in ps]
                    for ps in results
                ]
            }
        )

    @app.post("/queries")
    def r1searcher(req: R1SearcherRequest) -> Response:
        results = search(req.queries, req.k)
        return _json(
            {
                "queries": req.queries,
                "answers": [[r1searcher_string(p) for p in ps] for ps in results],
                "ids": [[p.id for p in ps] for ps in results],
                "scores": [[_score(p) for p in ps] for ps in results],
            }
        )

    @app.post("/retrieve")
    def search_r1(req: SearchR1Request) -> Response:
        results = search(req.queries, req.topk)
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
    def health() -> dict:
        return {"status": "ok", "kind": kind, "passages": _passage_count(retriever)}

    return app


def serve(
    retriever: Retriever,
    host: str = "127.0.0.1",
    port: int = 8000,
    limits: ServerLimits | None = None,
    log_level: str = "info",
) -> None:
    """Run the server until interrupted. Bound to localhost unless `host` says otherwise:
    the API has no authentication, so exposing it is an explicit choice."""
    import uvicorn

    app = create_app(retriever, limits)
    size = _passage_count(retriever)
    print(
        f"serving {getattr(retriever, 'kind', type(retriever).__name__)} index"
        f"{f' ({size:,} passages)' if size is not None else ''} at http://{host}:{port} "
        "- POST /search (native), /queries (R1-Searcher), /retrieve (Search-R1); GET /health",
        flush=True,
    )
    # Per-request access lines cost measurable time at batch 1 and say nothing useful here.
    uvicorn.run(app, host=host, port=port, log_level=log_level, access_log=False)


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

    app = app_or_retriever if isinstance(app_or_retriever, FastAPI) else create_app(app_or_retriever)
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
