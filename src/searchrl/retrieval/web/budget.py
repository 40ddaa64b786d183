"""What web search may spend: one run's request and cost counters with hard caps, the provider's
pace, and the rotation of its API keys.

The counters live in the web cache's SQLite file, keyed by run (its directory) and provider, so
every process of a run (torchrun ranks, a resumed evaluation) counts against one cap, and a
request is counted before it is sent: no two processes can both take the last one. The pace is
shared the same way, per provider, by every process on the machine.
"""

from __future__ import annotations

import threading
import time

from searchrl.errors import SearchRLError
from searchrl.sqlcache import SqliteStore

SCHEMA = (
    (
        "CREATE TABLE IF NOT EXISTS usage (run TEXT, provider TEXT, requests INTEGER DEFAULT 0, cache_hits INTEGER DEFAULT 0, "
        "cost_usd REAL DEFAULT 0, pages INTEGER DEFAULT 0, page_failures INTEGER DEFAULT 0, PRIMARY KEY (run, provider))"
    ),
    "CREATE TABLE IF NOT EXISTS pace (provider TEXT PRIMARY KEY, next_at REAL)",
)
# Counters of a run: requests sent (retries included), searches served from the cache, the price
# of the requests that were answered, result pages read, pages that could not be read.
COUNTERS = ("requests", "cache_hits", "cost_usd", "pages", "page_failures")


class BudgetExhausted(SearchRLError):
    """The run reached one of its web search caps."""


class Budget:
    """One run's spending with one provider. `interval_s`: least time between two requests to
    the provider (0: no pacing); `max_requests` / `max_cost_usd`: the caps (None: none)."""

    def __init__(self, store: SqliteStore, run: str, provider: str, cost_usd: float, interval_s: float,
                 max_requests: int | None, max_cost_usd: float | None) -> None:
        self.store, self.run, self.provider = store, run, provider
        self.cost_usd, self.interval_s = cost_usd, interval_s
        self.max_requests, self.max_cost_usd = max_requests, max_cost_usd
        with store.transaction() as conn:
            conn.execute("INSERT OR IGNORE INTO usage (run, provider) VALUES (?, ?)", (run, provider))

    def reset(self) -> None:
        """Start the run's counters from zero (a fresh run in a folder used before)."""
        self.add(**{c: -v for c, v in self.usage().items()})

    def reserve(self) -> None:
        """Count one request against the caps and wait for the provider's pace; raise
        `BudgetExhausted` instead when the request would pass a cap."""
        with self.store.transaction() as conn:
            requests, cost = conn.execute(
                "SELECT requests, cost_usd FROM usage WHERE run = ? AND provider = ?", (self.run, self.provider)
            ).fetchone()
            if self.max_requests is not None and requests + 1 > self.max_requests:
                raise self._exhausted(f"max_requests={self.max_requests}", requests, cost)
            if self.max_cost_usd is not None and cost + self.cost_usd > self.max_cost_usd + 1e-9:
                raise self._exhausted(f"max_cost_usd={self.max_cost_usd:g}", requests, cost)
            self._add(conn, requests=1, cost_usd=self.cost_usd)
            wait = self._next_slot(conn)
        if wait > 0:
            time.sleep(wait)

    def refund(self) -> None:
        """A request that failed is not billed: its price comes off (it still counts as sent)."""
        self.add(cost_usd=-self.cost_usd)

    def add(self, **counts: float) -> None:
        if any(counts.values()):
            with self.store.transaction() as conn:
                self._add(conn, **counts)

    def usage(self) -> dict[str, float]:
        row = self.store.query(
            f"SELECT {', '.join(COUNTERS)} FROM usage WHERE run = ? AND provider = ?", (self.run, self.provider)
        )[0]
        return {c: round(v, 6) if c == "cost_usd" else v for c, v in zip(COUNTERS, row)}

    def _add(self, conn, **counts: float) -> None:
        sets = ", ".join(f"{c} = {c} + ?" for c in counts)
        conn.execute(f"UPDATE usage SET {sets} WHERE run = ? AND provider = ?", (*counts.values(), self.run, self.provider))

    def _next_slot(self, conn) -> float:
        """Seconds to wait for this request's turn; books the next turn one interval later."""
        if self.interval_s <= 0:
            return 0.0
        now = time.time()  # wall clock: the one clock all processes share
        row = conn.execute("SELECT next_at FROM pace WHERE provider = ?", (self.provider,)).fetchone()
        slot = max(now, row[0] if row else now)
        conn.execute("INSERT OR REPLACE INTO pace VALUES (?, ?)", (self.provider, slot + self.interval_s))
        return slot - now

    def _exhausted(self, cap: str, requests: int, cost: float) -> BudgetExhausted:
        return BudgetExhausted(
            f"the web search budget of this run is spent: {requests} requests to {self.provider}, ${cost:.2f} "
            f"(retrieval.web.budget.{cap}). Raise the cap to go on (`eval run --resume DIR` keeps the answers "
            "done; queries searched before are served from the cache at no cost)"
        )


class KeyRing:
    """A provider's API keys, used in turn; a key the provider refuses or has spent is set
    aside for the rest of the process."""

    def __init__(self, keys: list[str | None]) -> None:
        self._keys, self._turn, self._lock = list(keys), 0, threading.Lock()

    def next(self) -> str | None:
        with self._lock:
            self._turn += 1
            return self._keys[(self._turn - 1) % len(self._keys)]

    def drop(self, key: str | None) -> int:
        """Set `key` aside; returns how many keys are left."""
        with self._lock:
            if key in self._keys:
                self._keys.remove(key)
            return len(self._keys)
