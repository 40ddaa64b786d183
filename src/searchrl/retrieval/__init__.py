"""Retrieval: corpus reading and chunking, BM25 and dense indexes, the HTTP server and client,
online web search.

`open_retriever(source)` is the one way from what a user writes (a catalog index name, an index
directory, a server URL) to a `Retriever`; `RetrievalConfig` is how every command configures it,
web search included (`retrieval.web`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal
from urllib.parse import urlsplit

from pydantic import Field, model_validator

from searchrl.config import StrictModel
from searchrl.errors import SearchRLError
from searchrl.retrieval.base import Retriever
from searchrl.retrieval.http import HttpRetriever, RetryConfig
from searchrl.retrieval.kinds import SearchSettings
from searchrl.retrieval.querycache import CachedRetriever, LocalCache
from searchrl.retrieval.web.config import WebConfig


def open_retriever(
    source: str,
    api: str = "native",
    retry: RetryConfig | None = None,
    settings: SearchSettings | None = None,
    api_key_env: str | None = None,
) -> Retriever:
    """A `Retriever` over `source`: an `http(s)://` retrieval server URL (spoken to in `api`:
    native, r1searcher or search-r1, retried within `retry`), an index directory written by
    `searchrl index build`, or a catalog index name (`toyworld`, `localwiki`, `localwiki-dense`;
    built on first use). `api` and `retry` apply to URLs only, `settings` (nprobe, efSearch,
    refine k-factor, FAISS on GPU) to dense indexes only; `api_key_env` (the variable holding the
    server's bearer token) to URLs only."""
    if urlsplit(source).scheme in ("http", "https"):
        if settings is not None and settings != SearchSettings():
            raise SearchRLError(
                f"nprobe, efSearch, k-factor or FAISS GPU search are set, but the server {source} searches; "
                "set them there (`searchrl serve --nprobe ...`)"
            )
        return HttpRetriever(source, api=api, retry=retry, api_key_env=api_key_env)
    # Imported when used: each index kind brings its own heavy libraries (bm25s, faiss).
    from searchrl.retrieval.index import open_index

    return open_index(local_index_dir(source), settings=settings)


def local_index_dir(source: str) -> Path:
    """The index folder `source` names: a directory written by `searchrl index build`, or a
    catalog index name (built on first use). A catalog name wins over a same-named folder that
    holds no index (e.g. the output of `searchrl data toyworld --out toyworld`)."""
    from searchrl.retrieval.catalog import INDEXES, named_index_dir
    from searchrl.retrieval.store import MANIFEST

    path = Path(source).expanduser()
    if source in INDEXES and not (path / MANIFEST).is_file():
        return named_index_dir(source)
    if path.is_dir():
        return path
    if path.exists():
        raise SearchRLError(
            f"{source} is a file, not an index directory; give the folder `searchrl index build --out` wrote, "
            "a catalog index name (`searchrl data list`) or an http(s):// retrieval server URL"
        )
    if "/" in source or path.suffix:
        raise SearchRLError(
            f"index directory {source} does not exist; build one with `searchrl index build CORPUS --out DIR`, "
            "or give a catalog index name (`searchrl data list`) or an http(s):// retrieval server URL"
        )
    return named_index_dir(source)  # an unknown bare name: the error lists the catalog


class RetrievalConfig(StrictModel):
    """Where searches go: a local index (searched in-process) or a retrieval server. Neither is
    valid where nothing is retrieved (`eval run --method direct`); the commands that search check
    that one is set and say how."""

    index: str | None = Field(
        None, description="Catalog index (toyworld, localwiki, localwiki-dense) or an index directory; null when `url` is set."
    )
    url: str | None = Field(
        None, description="Retrieval server URL (`searchrl serve`, R1-Searcher or Search-R1 servers); the paper's setup for 7B runs, one server shared by all trainers."
    )
    api: Literal["native", "r1searcher", "search-r1"] = Field(
        "native", description="Server API: native (/search), r1searcher (/queries), search-r1 (/retrieve)."
    )
    api_key_env: str | None = Field(
        None, description="With `url`: environment variable holding the server's token, sent as `Authorization: Bearer` "
        "(`searchrl serve --api-key-env`) only over https, to a loopback host or to a host listed in $SEARCHRL_KEY_HOSTS.",
    )
    retry: RetryConfig = Field(
        default_factory=RetryConfig,
        description="With `url`: how long a failing request is retried (retries, backoff_s, max_backoff_s, total_s) "
        "before the run stops; the default waits about a minute, enough for a server restart.",
    )

    nprobe: int | None = Field(
        None, ge=1, description="Local dense IVF index: lists probed per query (default: the index's, else 32); more = higher recall, slower."
    )
    ef_search: int | None = Field(
        None, ge=1, description="Local dense HNSW index: search beam width (default: the index's, else 64)."
    )
    k_factor: int | None = Field(
        None, ge=1, description="Local dense index with a refine stage (RFlat, Refine(...)): candidates re-ranked per passage returned (default: the index's, else 8)."
    )
    faiss_gpu: bool = Field(False, description="Local dense index: search on the GPUs FAISS sees (faiss-gpu builds).")

    web: WebConfig = Field(
        default_factory=WebConfig, description="Online web search instead of an index or server (web.provider, `--web PROVIDER`).",
    )
    cache_size: int = Field(
        8192, ge=0, description="In-process result cache, (normalised query, k) pairs: the rollouts of one question often "
        "search the same query. 0: off. Web search keeps its own cache (retrieval.web.cache) instead.",
    )

    @model_validator(mode="after")
    def _one_source(self) -> RetrievalConfig:
        given = [k for k, v in (("index", self.index), ("url", self.url), ("web", self.web.provider)) if v is not None]
        if len(given) > 1:
            raise ValueError(
                f"{' and '.join('retrieval.' + g for g in given)} are set: give one of retrieval.index, retrieval.url, "
                f"retrieval.web (--index, --retriever-url, --web), not both; to replace a config file's, add retrieval.{given[0]}=null"
            )
        return self

    @property
    def source(self) -> str | None:
        """The index, URL or `web:PROVIDER` searches go to; None when none is set."""
        if self.web.provider is not None:
            return f"web:{self.web.provider}"
        return self.url if self.url is not None else self.index

    def required(self, how: str) -> RetrievalConfig:
        """This config when it names a source; else the ValueError a config validator raises:
        `how` says who searches and which settings give it one."""
        if self.source is None:
            raise ValueError(how)
        return self

    def open(self, run: str | None = None, new_run: bool = False, web_record: str | None = None) -> CachedRetriever:
        """The configured retriever, behind the in-process cache, counting queries, cache hits
        and seconds. Web search counts against the budget of `run` (the run's directory; None:
        this process alone), from zero when `new_run`, and writes what it is served into the
        folder `web_record` when `retrieval.web.record` (None: nowhere); `retrieval.web.replay`
        answers from a record instead, sending nothing."""
        if self.source is None:
            raise SearchRLError("no retriever configured: set retrieval.index (e.g. toyworld), retrieval.url or retrieval.web")
        if self.web.replay is not None:
            from searchrl.retrieval.web.replay import ReplayRetriever

            return CachedRetriever(ReplayRetriever(self.web))
        if self.web.provider is not None:
            from searchrl.retrieval.web.record import WebRecord
            from searchrl.retrieval.web.retriever import WebRetriever

            record = WebRecord(web_record, self.web.provider, fresh=new_run) if web_record and self.web.record else None
            return CachedRetriever(WebRetriever(self.web, run, new_run, record))
        cache = LocalCache(self.cache_size) if self.cache_size else None
        settings = SearchSettings(nprobe=self.nprobe, ef_search=self.ef_search, k_factor=self.k_factor, gpu=self.faiss_gpu)
        return CachedRetriever(open_retriever(self.source, self.api, self.retry, settings, self.api_key_env), cache)
