"""`BatchingRetriever`: concurrent small searches gathered into one index call.

Under a training run a server gets many small requests at once (one per rollout worker, or one per
rollout at batch 1). An index answers a batch of queries for much less than the sum of single
calls (one encoder forward, one matrix product), and index libraries make no thread-safety
promise anyway, so a single thread owns the index: it takes the first waiting request, gathers
whatever else arrives within `window_s` (up to `max_queries` queries), searches each k's distinct
queries in one call, and hands every request its share. A request larger than `max_queries` is
searched alone, whole.
"""

from __future__ import annotations

import queue
import threading
import time
from concurrent.futures import Future

from searchrl.data.types import Passage
from searchrl.errors import SearchRLError
from searchrl.retrieval.base import Retriever


class BatchingRetriever(Retriever):
    def __init__(self, inner: Retriever, window_s: float, max_queries: int = 1024) -> None:
        if window_s <= 0 or max_queries < 1:
            raise SearchRLError(
                f"batching needs window_s > 0 and max_queries >= 1 (got {window_s}, {max_queries})"
            )
        self.inner, self.window_s, self.max_queries = inner, window_s, max_queries
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="searchrl-batcher", daemon=True)
        self._thread.start()

    def search(self, queries: list[str], k: int) -> list[list[Passage]]:
        if not queries:
            return []
        done: Future = Future()
        self._jobs.put((queries, k, done))
        return done.result()

    def _run(self) -> None:
        while True:
            first = self._jobs.get()
            if first is None:  # close()
                return
            jobs, n = [first], len(first[0])
            deadline = time.monotonic() + self.window_s
            while n < self.max_queries and (left := deadline - time.monotonic()) > 0:
                try:
                    job = self._jobs.get(timeout=left)
                except queue.Empty:
                    break
                if job is None:
                    self._jobs.put(None)  # finish this batch, then stop
                    break
                jobs.append(job)
                n += len(job[0])
            for k in dict.fromkeys(job[1] for job in jobs):
                self._answer([job for job in jobs if job[1] == k], k)

    def _answer(self, jobs: list, k: int) -> None:
        distinct = list(dict.fromkeys(q for queries, _, _ in jobs for q in queries))
        try:
            results = self.inner.search(distinct, k)
            if len(results) != len(distinct):
                raise SearchRLError(
                    f"retriever returned {len(results)} result lists for {len(distinct)} queries"
                )
        except Exception as exc:  # noqa: BLE001 - every waiting request gets the failure; the thread goes on
            for _, _, done in jobs:
                done.set_exception(exc)
            return
        by_query = dict(zip(distinct, results))
        for queries, _, done in jobs:
            done.set_result([list(by_query[q]) for q in queries])

    def check(self) -> None:
        self.inner.check()

    def close(self) -> None:
        self._jobs.put(None)
        self._thread.join(5)
        self.inner.close()
