"""A retrieval server worker's counters (`/stats`), summed over the worker processes that share
a result cache file: each publishes its own into the file, every `publish_s` while they change.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
import uuid

from searchrl.data.types import Passage
from searchrl.retrieval.base import Retriever
from searchrl.retrieval.batching import BatchingRetriever
from searchrl.retrieval.querycache import CachedRetriever, SharedCache


class CountedIndex(Retriever):
    """The index behind a lock, counting its calls, queries and seconds."""

    def __init__(self, inner: Retriever) -> None:
        self.inner = inner
        self.calls = self.queries = 0
        self.seconds = 0.0
        self._lock = threading.Lock()

    def search(self, queries: list[str], k: int) -> list[list[Passage]]:
        with self._lock:
            started = time.perf_counter()
            try:
                return self.inner.search(queries, k)
            finally:
                self.calls += 1
                self.queries += len(queries)
                self.seconds += time.perf_counter() - started


class ServerStats:
    """One worker's counters; with a `SharedCache` they are published into its file (every
    `publish_s` while they change, and on each `/stats`), and `/stats` sums every worker's."""

    def __init__(
        self,
        index: CountedIndex,
        cached: CachedRetriever | None,
        batcher: BatchingRetriever | None,
        publish_s: float = 0.25,
    ) -> None:
        self.index, self.cached, self.batcher = index, cached, batcher
        self.cache = cached.cache if cached is not None else None
        self.requests = self.queries = self.truncated = 0
        self._lock = threading.Lock()
        self._worker = uuid.uuid4().hex
        self._published: dict | None = None
        if isinstance(self.cache, SharedCache):
            threading.Thread(target=self._publish_every, args=(publish_s,), daemon=True).start()

    def request(self, queries: int, truncated: int) -> None:
        """A request with `queries` non-blank queries, `truncated` of them cut."""
        with self._lock:
            self.requests += 1
            self.queries += queries
            self.truncated += truncated

    def mine(self) -> dict[str, float]:
        with self._lock:
            requests, queries, truncated = self.requests, self.queries, self.truncated
        return {
            "requests": requests,
            "queries": queries,
            "truncated_queries": truncated,
            "cache_hits": (self.cached.counts().cache_hits if self.cached is not None else 0)
            + (self.batcher.cache_hits if self.batcher is not None else 0),
            "index_calls": self.index.calls,
            "index_queries": self.index.queries,
            "index_seconds": self.index.seconds,
        }

    def _publish(self) -> None:
        mine = self.mine()
        if mine != self._published:
            self.cache.publish(f"{os.getpid()}-{self._worker}", mine)
            self._published = mine

    def _publish_every(self, interval_s: float) -> None:
        while True:
            time.sleep(interval_s)
            with contextlib.suppress(Exception):  # a busy or vanished file: try again next time
                self._publish()

    def report(self) -> dict:
        """`/stats`: the counters summed over the workers that share the cache file."""
        if isinstance(self.cache, SharedCache):
            self._publish()
            rows = self.cache.counters()
        else:
            rows = [self.mine()]
        total = {key: sum(r.get(key, 0) for r in rows) for key in rows[0]}
        queries, calls = total["queries"], total["index_calls"]
        return {
            "workers": len(rows),
            "requests": total["requests"],
            "queries": queries,
            "truncated_queries": total["truncated_queries"],
            "cache": {
                "kind": None
                if self.cache is None
                else ("shared" if isinstance(self.cache, SharedCache) else "local"),
                "entries": None if self.cache is None else len(self.cache),
                "max_entries": None if self.cache is None else self.cache.size,
                "hits": total["cache_hits"],
                "hit_rate": total["cache_hits"] / queries
                if self.cache is not None and queries
                else None,
            },
            "index": {
                "calls": calls,
                "queries": total["index_queries"],
                "seconds": round(total["index_seconds"], 3),
                "mean_batch": total["index_queries"] / calls if calls else None,
            },
        }
