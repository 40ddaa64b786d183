"""`BatchingRetriever`: concurrent small searches gathered into one index call.

Under a training run a server gets many small requests at once (one per rollout worker, or one per
rollout at batch 1). An index answers a batch of queries for less than the sum of single calls
(one encoder forward, one matrix product, one Python call), and index libraries make no
thread-safety promise anyway, so a single thread owns the index: it takes the first waiting
request, gathers whatever else is queued or arrives within `window_s` (up to `max_queries`
queries), searches each k's distinct queries in one call, and hands every request its share. A
request larger than `max_queries` is searched alone, whole.

While the index is busy, requests queue up and the next call takes them all: under load batches
form without waiting. The window is waited out only while traffic is concurrent (the last call
served more than one request); a client alone is never delayed by it.

With a `cache`, this thread writes each call's results into it and, when a request waited behind
an index call, looks the batch up again just before searching: a query that arrived while its
twin was being searched (the 16 rollouts of a question come at nearly the same moment) is
answered from the cache, not searched twice.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from concurrent.futures import Future

from searchrl.data.types import Passage
from searchrl.errors import SearchRLError
from searchrl.retrieval.base import Retriever
from searchrl.retrieval.querycache import LocalCache, SharedCache

log = logging.getLogger(__name__)


class BatchingRetriever(Retriever):
    def __init__(
        self,
        inner: Retriever,
        window_s: float,
        max_queries: int = 1024,
        cache: LocalCache | SharedCache | None = None,
    ) -> None:
        if window_s <= 0 or max_queries < 1:
            raise SearchRLError(
                f"batching needs window_s > 0 and max_queries >= 1 (got {window_s}, {max_queries})"
            )
        self.inner, self.window_s, self.max_queries = inner, window_s, max_queries
        self.cache = cache
        self.cache_hits = 0  # queries found in the cache just before searching
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._concurrent = False  # the last call served more than one request
        self._free_since = 0.0  # when the last index call ended (time.monotonic())
        self._thread = threading.Thread(target=self._run, name="searchrl-batcher", daemon=True)
        self._thread.start()

    def submit(self, queries: list[str], k: int) -> Future:
        """Queue a search; the future's result is one passage list per query."""
        done: Future = Future()
        if queries:
            self._jobs.put((queries, k, done, time.monotonic()))
        else:
            done.set_result([])
        return done

    def search(self, queries: list[str], k: int) -> list[list[Passage]]:
        return self.submit(queries, k).result()

    def _run(self) -> None:
        while True:
            first = self._jobs.get()
            if first is None:  # close()
                return
            jobs, n = [first], len(first[0])
            deadline = time.monotonic() + (self.window_s if self._concurrent else 0.0)
            while n < self.max_queries:
                try:
                    job = self._jobs.get_nowait()
                except queue.Empty:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        break
                    try:
                        job = self._jobs.get(timeout=left)
                    except queue.Empty:
                        break
                if job is None:
                    self._jobs.put(None)  # finish this batch, then stop
                    break
                jobs.append(job)
                n += len(job[0])
            self._concurrent = len(jobs) > 1
            # A request queued before the last call ended may have a twin that call answered.
            waited = self.cache is not None and min(job[3] for job in jobs) < self._free_since
            for k in dict.fromkeys(job[1] for job in jobs):
                self._answer([job for job in jobs if job[1] == k], k, waited)
            self._free_since = time.monotonic()

    def _answer(self, jobs: list, k: int, recheck: bool) -> None:
        distinct = list(dict.fromkeys(q for queries, _, _, _ in jobs for q in queries))
        try:
            found = self.cache.get_many(distinct, k) if recheck else [None] * len(distinct)
            by_query = {q: hit for q, hit in zip(distinct, found) if hit is not None}
            todo = [q for q in distinct if q not in by_query]
            results = self.inner.search(todo, k) if todo else []
            if len(results) != len(todo):
                raise SearchRLError(
                    f"retriever returned {len(results)} result lists for {len(todo)} queries"
                )
        except Exception as exc:  # noqa: BLE001 - every waiting request gets the failure; the thread goes on
            for _, _, done, _ in jobs:
                done.set_exception(exc)
            return
        self.cache_hits += len(by_query)
        by_query |= dict(zip(todo, results))
        for queries, _, done, _ in jobs:
            done.set_result([list(by_query[q]) for q in queries])
        if self.cache is not None and todo:
            try:
                self.cache.put_many(todo, k, results)
            except Exception:  # a failed cache write costs searches later, not this answer
                log.exception("storing %d results failed", len(todo))

    def check(self) -> None:
        self.inner.check()

    def close(self) -> None:
        self._jobs.put(None)
        self._thread.join(5)
        self.inner.close()
