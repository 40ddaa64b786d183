"""What an evaluation spends on services that may cost money — the ACC_L judge and web search —
and on retrieval (queries, in-process cache hits, seconds in search), summed over every
invocation of a run: an interrupted run leaves its sums in progress.json (with its generation
seconds), a finished one in metrics.json."""

from __future__ import annotations

from collections.abc import Sequence

from searchrl.retrieval.base import Retriever
from searchrl.retrieval.querycache import CachedRetriever
from searchrl.retrieval.web.budget import COUNTERS
from searchrl.retrieval.web.replay import REPLAY_COUNTERS

JUDGE_KEYS = ("judge_requests", "judge_cache_hits", "judge_malformed")
WEB_KEYS = tuple(f"web_{c}" for c in (*COUNTERS, *REPLAY_COUNTERS))  # a replay's counters only in a replay
RETRIEVAL_KEYS = ("retrieval_queries", "retrieval_cache_hits", "retrieval_s")  # cache hits: only with a cache
SPENT_KEYS = ("seconds", *JUDGE_KEYS, *WEB_KEYS, *RETRIEVAL_KEYS)


def judge_records(judge, recs: Sequence[dict]) -> None:
    """Ask `judge` (a `searchrl.judge.Judge`) about every record; its verdict goes into `judge`."""
    from searchrl.judge import JudgeItem

    items = [JudgeItem(r["question"], tuple(r["answers"]), r["prediction"]) for r in recs]
    for rec, verdict in zip(recs, judge.judge_many(items)):
        rec["judge"] = verdict


class Spending:
    """The run's sums: `before` (what earlier invocations saved) plus this process's generation
    `seconds`, judge requests and the searches of `retriever` since it was opened."""

    def __init__(self, before: dict, judge=None, retriever: Retriever | None = None) -> None:
        self.before, self.judge, self.retriever = before, judge, retriever
        self.seconds = 0.0
        self._web_start = retriever.usage() if retriever is not None else None
        self._searched_start = retriever.counts() if isinstance(retriever, CachedRetriever) else None

    def totals(self) -> dict:
        out = {**self.before, "seconds": self.before.get("seconds", 0.0) + self.seconds}
        if self.judge is not None:
            stats = self.judge.stats
            for key, value in zip(JUDGE_KEYS, (stats.requests, stats.cache_hits, stats.malformed)):
                out[key] = self.before.get(key, 0) + value
        if self._web_start is not None:
            for c, value in self.retriever.usage().items():
                out[f"web_{c}"] = round(self.before.get(f"web_{c}", 0) + value - self._web_start[c], 6)
        if self._searched_start is not None:
            done = self.retriever.counts().since(self._searched_start)
            out["retrieval_queries"] = self.before.get("retrieval_queries", 0) + done.queries
            if done.cached:
                out["retrieval_cache_hits"] = self.before.get("retrieval_cache_hits", 0) + done.cache_hits
            out["retrieval_s"] = round(self.before.get("retrieval_s", 0.0) + done.seconds, 3)
        return out


def cache_hit_rate(spent: dict) -> float | None:
    """Share of the run's queries answered without a search of their own; None without a cache."""
    queries = spent.get("retrieval_queries")
    return spent["retrieval_cache_hits"] / queries if queries and "retrieval_cache_hits" in spent else None


def spending_rows(metrics: dict) -> list[tuple[str, str]]:
    """metrics.md rows for the judge and web search, when the run used them."""
    rows = []
    if metrics.get("retrieval_queries"):
        rows.append(("queries searched (cache hit %), seconds in search",
                     f"{metrics['retrieval_queries']} ({_percent(metrics['retrieval_cache_hit_rate'])}), {metrics['retrieval_s']:.2f}"))
    if "judge_requests" in metrics:
        rows.append(("judge requests (verdicts from cache, replies without one)",
                     f"{metrics['judge_requests']} ({metrics['judge_cache_hits']}, {metrics['judge_malformed']})"))
    if "web_requests" in metrics:
        rows.append(("web search requests (served from cache)", f"{metrics['web_requests']} ({metrics['web_cache_hits']})"))
        rows.append(("web search cost, USD", f"{metrics['web_cost_usd']:.4f}"))
        rows.append(("pages read (unreadable)", f"{metrics['web_pages']} ({metrics['web_page_failures']})"))
    if "web_replayed" in metrics:
        rows.append(("web answers replayed (missing from the record)", f"{metrics['web_replayed']} ({metrics['web_missing']})"))
    return rows


def _percent(value: float | None) -> str:
    return "no cache" if value is None else f"{100 * value:.1f}"
