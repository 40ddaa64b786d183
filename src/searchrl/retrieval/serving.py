"""`searchrl serve`: several worker processes behind one address, one result cache for all.

Workers are uvicorn's own multi-process mode (`workers=N`): the parent binds the socket,
supervises, and replaces a worker that dies; each worker builds its app with `worker_app` from
the plan the parent left in `$SEARCHRL_SERVE`. Each worker opens the index itself, memory-mapped
(`open_index` maps the passage store, BM25 score matrices and the FAISS indexes that allow it:
flat codes, IVF lists), so N workers share one copy of those files in the page cache and pay only
for their private state (the query encoder: ~90 MB for MiniLM; an HNSW graph, which FAISS cannot
map, is read by each worker). Forking workers from a parent that had loaded the index would share
the same pages, but would hand torch's and FAISS's thread pools to the children mid-state, which
is not fork-safe. Every worker gets `OMP_NUM_THREADS` = cores / workers unless it is set, and
answers requests only once a first search has loaded what searching needs.

The result cache is `SharedCache`, a SQLite file: by default a fresh one in /dev/shm (memory)
removed on exit, or `--cache-file` to keep it across restarts; its keys carry the index's
identity (folder, manifest and its time), so a rebuilt index never gets another's answers.
One worker without `--cache-file` keeps its cache in-process (`LocalCache`).
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

from pydantic import Field

from searchrl.config import StrictModel
from searchrl.errors import SearchRLError
from searchrl.retrieval import local_index_dir
from searchrl.retrieval.server import ServerLimits, create_app

ENV = "SEARCHRL_SERVE"


class ServeConfig(StrictModel):
    """`searchrl serve`: where, how many workers, batching, cache, request limits."""

    index: str = Field(
        description="Index directory, catalog index name, or an http(s):// server URL to front."
    )
    host: str = Field(
        "127.0.0.1",
        description="Interface to bind. On loopback only Host: 127.0.0.1, localhost or [::1] is "
        "answered (DNS rebinding); elsewhere anyone who reaches the port may search unless "
        "api_key_env is set.",
    )
    port: int = Field(8000, ge=1, le=65535, description="TCP port.")
    workers: int = Field(
        1,
        ge=1,
        description="Worker processes sharing the port, the memory-mapped index and the cache; up to one per core.",
    )
    batch_window_ms: float = Field(
        2.0,
        ge=0,
        le=1000,
        description="How long a request waits for others to share its index call; 0: no batching "
        "(each request searched alone, under a lock). Adds up to this much latency when idle.",
    )
    batch_max_queries: int = Field(
        1024,
        ge=1,
        description="Most queries gathered into one index call (a larger request goes alone).",
    )
    cache_size: int = Field(
        100_000,
        ge=0,
        description="Result cache entries ((query, k) pairs; ~4 KB each at k=5 over 100-word passages); 0: no cache.",
    )
    cache_file: str | None = Field(
        None,
        description="SQLite file of the cache, kept across restarts; default: a temporary one.",
    )
    limits: ServerLimits = Field(default_factory=ServerLimits, description="Request limits.")
    api_key_env: str | None = Field(
        None,
        description="Environment variable holding a bearer token that every request must carry "
        "(`Authorization: Bearer <token>`), /health, /stats, DELETE /cache and /docs included. "
        "Without one: no /docs, and DELETE /cache only from this machine.",
    )
    nprobe: int | None = Field(None, ge=1, description="Dense IVF index: lists probed per query (default: the index's).")
    ef_search: int | None = Field(None, ge=1, description="Dense HNSW index: search beam width (default: the index's).")
    k_factor: int | None = Field(None, ge=1, description="Dense index with a refine stage: candidates re-ranked per hit.")
    faiss_gpu: bool = Field(False, description="Dense index: search on the GPUs FAISS sees (faiss-gpu builds).")

    def search_settings(self):
        from searchrl.retrieval.kinds import SearchSettings

        return SearchSettings(nprobe=self.nprobe, ef_search=self.ef_search, k_factor=self.k_factor, gpu=self.faiss_gpu)


class WorkerPlan(StrictModel):
    """What each worker process needs: the config, the resolved index and the cache file."""

    config: ServeConfig
    source: str  # an index directory or a server URL
    index_id: str
    cache_file: str | None


def resolve_source(index: str) -> str:
    """An http(s) URL as given, otherwise the index directory (a catalog index is built now, once,
    rather than by every worker at the same time)."""
    if urlsplit(index).scheme in ("http", "https"):
        return index
    return str(local_index_dir(index).resolve())


def index_identity(source: str) -> str:
    """Names the index's contents in cache keys: its folder, manifest and the manifest's time."""
    if urlsplit(source).scheme in ("http", "https"):
        return source
    from searchrl.retrieval.store import MANIFEST, read_manifest

    read_manifest(Path(source))  # a folder that is no index: say so, naming it
    manifest = Path(source) / MANIFEST
    digest = hashlib.sha256(manifest.read_bytes()).hexdigest()[:16]
    return f"{source}@{digest}@{manifest.stat().st_mtime_ns}"


def api_key(name: str | None) -> str | None:
    """The token in the environment variable `name` (None when no variable is named)."""
    if name is None:
        return None
    token = os.environ.get(name, "").strip()
    if not token:
        raise SearchRLError(
            f"--api-key-env {name}: the environment variable {name} is unset or empty; put the "
            f"token there (`export {name}=$(openssl rand -hex 32)`) or leave --api-key-env out"
        )
    return token


def build_app(plan: WorkerPlan):
    """One worker's app: the index opened here (memory-mapped) and warmed up, the cache,
    batching, limits."""
    from searchrl.retrieval import open_retriever
    from searchrl.retrieval.querycache import LocalCache, SharedCache

    _log_to_stderr()
    cfg = plan.config
    if plan.cache_file is not None:
        cache = SharedCache(plan.cache_file, plan.index_id, cfg.cache_size, write_behind=True)
    else:
        cache = LocalCache(cfg.cache_size) if cfg.cache_size else None
    retriever = open_retriever(plan.source, settings=cfg.search_settings())
    if urlsplit(plan.source).scheme not in ("http", "https"):
        # Load now what the first search would (a dense index's query encoder, the index pages):
        # a worker takes requests only once it answers them at full speed.
        retriever.search(["warm up"], 1)
    return create_app(
        retriever,
        cfg.limits,
        batch_window_ms=cfg.batch_window_ms,
        batch_max_queries=cfg.batch_max_queries,
        cache=cache,
        api_key=api_key(cfg.api_key_env),  # workers inherit the variable; the plan never holds it
        host=cfg.host,
    )


def worker_app():
    """uvicorn's app factory in each worker process."""
    return build_app(WorkerPlan.model_validate_json(os.environ[ENV]))


def serve(cfg: ServeConfig, log_level: str = "info") -> None:
    """Run the server until interrupted."""
    import uvicorn

    api_key(cfg.api_key_env)  # refused here, once, before any index is opened
    source = resolve_source(cfg.index)
    # Search settings change an approximate index's answers: they are part of the cache key.
    index_id = f"{index_identity(source)}@{cfg.search_settings()}"
    with _cache_file(cfg, index_id) as cache_file:
        plan = WorkerPlan(config=cfg, source=source, index_id=index_id, cache_file=cache_file)
        common = {"host": cfg.host, "port": cfg.port, "log_level": log_level, "access_log": False}
        # Per-request access lines cost measurable time at batch 1 and say nothing useful here.
        if cfg.workers == 1:
            app = build_app(plan)
            _announce(cfg, source, cache_file)
            uvicorn.run(app, **common)
            return
        os.environ[ENV] = plan.model_dump_json()
        os.environ.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // cfg.workers)))
        _announce(cfg, source, cache_file)
        # A worker that loads a large index may be slow to answer the parent's pings at first.
        uvicorn.run(
            f"{__name__}:worker_app",
            factory=True,
            workers=cfg.workers,
            timeout_worker_healthcheck=60,
            **common,
        )


@contextlib.contextmanager
def _cache_file(cfg: ServeConfig, index_id: str) -> Iterator[str | None]:
    """The shared cache's file: the configured one, or a temporary one while several workers run
    (removed afterwards); None for one worker without a file (its cache is in-process)."""
    from searchrl.retrieval.querycache import SharedCache

    if cfg.cache_file is None and cfg.workers == 1:
        yield None
        return
    tmp = None
    if cfg.cache_file is None:
        shm = "/dev/shm" if os.access("/dev/shm", os.W_OK) else None
        tmp = tempfile.mkdtemp(prefix="searchrl-serve-", dir=shm)
    path = cfg.cache_file or os.path.join(tmp, "cache.sqlite")
    try:
        # An unusable file fails here, once, not in every worker.
        cache = SharedCache(path, index_id, cfg.cache_size)
        cache.forget_counters()
        cache.close()
        yield path
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)


def _announce(cfg: ServeConfig, source: str, cache_file: str | None) -> None:
    cache = (
        "off"
        if not cfg.cache_size
        else f"{cfg.cache_size:,} entries" + (f" in {cache_file}" if cache_file else " in-process")
    )
    batching = f"{cfg.batch_window_ms:g} ms window" if cfg.batch_window_ms > 0 else "off"
    auth = f"token from ${cfg.api_key_env}" if cfg.api_key_env else "no token"
    print(
        f"serving {source} at http://{cfg.host}:{cfg.port} with {cfg.workers} worker(s); "
        f"batching {batching}; cache {cache}; {auth}; bodies up to "
        f"{cfg.limits.max_body_bytes() / 1e6:.1f} MB "
        "- POST /search (native), /queries (R1-Searcher), /retrieve (Search-R1); GET /health, /stats",
        flush=True,
    )


def _log_to_stderr() -> None:
    """Our warnings (a truncated query, a failing backend) beside uvicorn's own lines."""
    logger = logging.getLogger("searchrl")
    if not logger.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(levelname)s:     %(message)s"))
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)
