"""Query result caches and `CachedRetriever`, the wrapper that searches through one and counts.

The 16 rollouts of one question often issue the same query, and ask for it in the same batched
call or a moment apart, so a search is looked up by (normalised query, k) before it reaches the
index. Two caches share one interface (`get_many`, `put_many`, `clear`, `__len__`):

- `LocalCache`: in-process LRU, what training and evaluation use (`retrieval.cache_size`);
- `SharedCache`: one SQLite file every worker process of `searchrl serve` opens, keyed by
  (index identity, normalised query, k); it also holds each worker's counters for `/stats`.

Normalising only collapses whitespace: case is kept, since a cased encoder answers "US" and
"us" differently. The query the index sees is the normalised one, so a cache hit returns exactly
what a miss would have.
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass

from pydantic_core import from_json, to_json

from searchrl.data.types import Passage
from searchrl.errors import SearchRLError
from searchrl.retrieval.base import Retriever
from searchrl.sqlcache import SqliteStore

log = logging.getLogger(__name__)


def normalise_query(query: str) -> str:
    """The cache key's form of a query: whitespace collapsed, ends stripped.

    >>> normalise_query("  capital\\n of   France ")
    'capital of France'
    """
    return " ".join(query.split())


class LocalCache:
    """An in-process LRU of `size` entries, safe to share between threads."""

    def __init__(self, size: int) -> None:
        if size < 1:
            raise SearchRLError(f"a query cache needs size >= 1 (got {size}); use no cache instead")
        self.size = size
        self._items: OrderedDict[tuple[str, int], list[Passage]] = OrderedDict()
        self._lock = threading.Lock()

    def get_many(self, queries: list[str], k: int) -> list[list[Passage] | None]:
        out = []
        with self._lock:
            for q in queries:
                hit = self._items.get((q, k))
                if hit is not None:
                    self._items.move_to_end((q, k))
                out.append(hit)
        return out

    def put_many(self, queries: list[str], k: int, results: list[list[Passage]]) -> None:
        with self._lock:
            for q, r in zip(queries, results, strict=True):
                self._items[(q, k)] = r
                self._items.move_to_end((q, k))
            while len(self._items) > self.size:
                self._items.popitem(last=False)

    def clear(self) -> int:
        with self._lock:
            n = len(self._items)
            self._items.clear()
        return n

    def __len__(self) -> int:
        return len(self._items)

    def close(self) -> None:
        pass


_SHARED_SCHEMA = (
    # n orders entries by insertion: eviction drops the oldest (FIFO; a hit writes nothing).
    "CREATE TABLE IF NOT EXISTS results (n INTEGER PRIMARY KEY, key BLOB UNIQUE NOT NULL, value BLOB NOT NULL)",
    "CREATE TABLE IF NOT EXISTS counters (worker TEXT PRIMARY KEY, value TEXT NOT NULL, at REAL NOT NULL)",
)
_SQL_VARS = 500  # keys per SELECT ... IN (...): far below SQLite's variable limit
_WRITE_EVERY_S = 0.005  # written behind: at most one write transaction per worker this often


class SharedCache:
    """Results in a SQLite file shared by processes, at most `size` entries (0: none stored, the
    file then only carries the workers' counters). Entries of different indexes never mix: the
    key includes `index_id`. Durability is switched off (`synchronous=OFF`): a cache lost in a
    crash costs searches, nothing else.

    `write_behind`: `put_many` only queues the entries (this process reads them at once) and a
    thread of its own writes them, so a search never waits for another process's write lock.
    """

    def __init__(self, path: str, index_id: str, size: int, write_behind: bool = False) -> None:
        if size < 0:
            raise SearchRLError(f"cache size must be >= 0 (got {size})")
        self.path, self.index_id, self.size = path, index_id, size
        # Reads and writes on separate connections: a read (on a server's event loop) never
        # waits for a write that waits for another process's write lock.
        self._store = SqliteStore(path, _SHARED_SCHEMA)
        self._store.query("PRAGMA synchronous=OFF")
        self._reader = SqliteStore(path)
        self._pending: dict[bytes, bytes] = {}  # written behind, not yet in the file
        self._pending_lock = threading.Lock()
        self._wake = threading.Event()
        self.write_behind = write_behind
        if write_behind:
            threading.Thread(target=self._writer, name="searchrl-cache-writer", daemon=True).start()

    def _key(self, query: str, k: int) -> bytes:
        return hashlib.blake2b(to_json([self.index_id, k, query]), digest_size=16).digest()

    def get_many(self, queries: list[str], k: int) -> list[list[Passage] | None]:
        if not self.size:
            return [None] * len(queries)
        keys = [self._key(q, k) for q in queries]
        with self._pending_lock:
            found = {key: self._pending[key] for key in keys if key in self._pending}
        todo = [key for key in keys if key not in found]
        for start in range(0, len(todo), _SQL_VARS):
            part = todo[start : start + _SQL_VARS]
            marks = ",".join("?" * len(part))
            found.update(
                self._reader.query(
                    f"SELECT key, value FROM results WHERE key IN ({marks})", tuple(part)
                )
            )
        return [_decode(found[key]) if key in found else None for key in keys]

    def put_many(self, queries: list[str], k: int, results: list[list[Passage]]) -> None:
        if not self.size or not queries:
            return
        rows = [(self._key(q, k), _encode(r)) for q, r in zip(queries, results, strict=True)]
        if self.write_behind:
            with self._pending_lock:
                self._pending.update(rows)
            self._wake.set()
            return
        self._write(rows)

    def _writer(self) -> None:
        while True:
            self._wake.wait()
            time.sleep(_WRITE_EVERY_S)  # gathers the next calls' entries into the same transaction
            self._wake.clear()
            try:
                self.flush()
            except Exception:  # the entries stay queued; the next write retries
                log.exception("writing the result cache %s failed", self.path)
                time.sleep(1)

    def flush(self) -> None:
        """Write the queued entries now."""
        with self._pending_lock:
            rows = list(self._pending.items())
        if not rows:
            return
        self._write(rows)
        with self._pending_lock:
            for key, value in rows:
                if self._pending.get(key) is value:
                    del self._pending[key]

    def _write(self, rows: list[tuple[bytes, bytes]]) -> None:
        with self._store.transaction() as conn:
            conn.executemany("INSERT OR REPLACE INTO results (key, value) VALUES (?, ?)", rows)
            # Entries keep distinct, growing n, so this leaves at most `size` of them.
            conn.execute(
                "DELETE FROM results WHERE n <= (SELECT max(n) FROM results) - ?", (self.size,)
            )

    def clear(self) -> int:
        with self._pending_lock:
            self._pending.clear()
        with self._store.transaction() as conn:
            return conn.execute("DELETE FROM results").rowcount

    def __len__(self) -> int:
        return self._reader.query("SELECT count(*) FROM results")[0][0]

    def publish(self, worker: str, counters: dict[str, float]) -> None:
        """Record one worker's counters (its totals so far), replacing what it published before."""
        with self._store.transaction() as conn:
            conn.execute(
                "INSERT OR REPLACE INTO counters VALUES (?, ?, ?)",
                (worker, to_json(counters).decode(), time.time()),
            )

    def counters(self) -> list[dict[str, float]]:
        """Every worker's last published counters."""
        return [from_json(v) for (v,) in self._reader.query("SELECT value FROM counters")]

    def forget_counters(self) -> None:
        """Drop the counters of earlier servers that used this file."""
        with self._store.transaction() as conn:
            conn.execute("DELETE FROM counters")

    def close(self) -> None:
        self.flush()
        self._store.close()
        self._reader.close()


def _encode(passages: list[Passage]) -> bytes:
    return to_json(
        [[p.id, p.title, p.text, None if p.score is None else float(p.score)] for p in passages]
    )


def _decode(value: bytes) -> list[Passage]:
    return [Passage(*row) for row in from_json(value)]


@dataclass
class RetrievalCounts:
    """What a `CachedRetriever` has done so far."""

    queries: int = 0  # non-blank queries asked
    cache_hits: int = 0  # of those, answered without a search of their own (see CachedRetriever)
    seconds: float = 0.0  # wall time inside `search`, cache included
    cached: bool = False  # whether there is a cache (no cache: no hit rate)

    def since(self, before: RetrievalCounts) -> RetrievalCounts:
        return RetrievalCounts(
            self.queries - before.queries,
            self.cache_hits - before.cache_hits,
            self.seconds - before.seconds,
            self.cached,
        )


@dataclass
class Lookup:
    """One call's queries after the cache: `out` holds the hits (and [] for blank queries),
    `missing` maps each distinct normalised query still to search to its positions."""

    out: list[list[Passage]]
    missing: dict[str, list[int]]
    asked: int  # non-blank queries

    @property
    def hits(self) -> int:
        return self.asked - len(self.missing)

    def fill(self, results: list[list[Passage]]) -> list[list[Passage]]:
        """`out` once the missing queries' `results` (in `missing` order) are in."""
        if len(results) != len(self.missing):
            raise SearchRLError(
                f"the index returned {len(results)} result lists for {len(self.missing)} queries"
            )
        for positions, passages in zip(self.missing.values(), results):
            for i in positions:
                self.out[i] = list(passages)
        return self.out


class CachedRetriever(Retriever):
    """`inner` searched through `cache` (None: no cache, counting only).

    With a cache, blank queries get [] without a search, the others are normalised, looked up,
    and the misses searched in one call to `inner`, each distinct query once. A cache hit is a
    query answered without a search of its own: found in the cache, or a repeat of another
    query of the same call (the 16 rollouts of a question come in one batched call).
    The steps (`lookup`, search the misses, `fill`, `count`) are public for the server, which
    searches the misses through its batching thread and stores them there.
    """

    def __init__(self, inner: Retriever, cache: LocalCache | SharedCache | None = None) -> None:
        self.inner, self.cache = inner, cache
        self.kind = getattr(inner, "kind", type(inner).__name__)
        self._counts = RetrievalCounts(cached=cache is not None)
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self.inner)  # type: ignore[arg-type]  # TypeError when the inner has no size

    @property
    def passages(self):
        """The inner index's passage store (gold SFT trajectories read it); AttributeError when
        the inner has none (a server, web search)."""
        return self.inner.passages

    def search(self, queries: list[str], k: int) -> list[list[Passage]]:
        started = time.perf_counter()
        if self.cache is None:
            out = self.inner.search(queries, k)
            self.count(sum(1 for q in queries if q and q.strip()), 0, started)
            return out
        lookup = self.lookup(queries, k)
        if lookup.missing:
            todo = list(lookup.missing)
            results = self.inner.search(todo, k)
            lookup.fill(results)
            self.cache.put_many(todo, k, results)
        self.count(lookup.asked, lookup.hits, started)
        return lookup.out

    def lookup(self, queries: list[str], k: int) -> Lookup:
        """The cache's answers to `queries` and what is left to search."""
        norm = {i: normalise_query(q) for i, q in enumerate(queries) if q and q.strip()}
        lookup = Lookup([[] for _ in queries], {}, len(norm))
        for (i, q), hit in zip(
            norm.items(), self.cache.get_many(list(norm.values()), k), strict=True
        ):
            if hit is None:
                lookup.missing.setdefault(q, []).append(i)
            else:
                lookup.out[i] = list(hit)
        return lookup

    def count(self, queries: int, hits: int, started: float) -> None:
        """Add one call: its non-blank `queries`, `hits`, and the time since `started`."""
        with self._lock:
            self._counts.queries += queries
            self._counts.cache_hits += hits
            self._counts.seconds += time.perf_counter() - started

    def counts(self) -> RetrievalCounts:
        """A snapshot of the counters."""
        with self._lock:
            return RetrievalCounts(**vars(self._counts))

    def check(self) -> None:
        self.inner.check()

    def usage(self) -> dict[str, float] | None:
        return self.inner.usage()

    def close(self) -> None:
        self.inner.close()
        if self.cache is not None:
            self.cache.close()
