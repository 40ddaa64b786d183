"""What an evaluation spends on services that may cost money — the ACC_L judge and web search —
and on retrieval (queries, in-process cache hits, seconds in search), summed over every
invocation of a run: an interrupted run leaves its sums in progress.json (with its generation
seconds), a finished one in metrics.json."""

from __future__ import annotations

from collections.abc import Sequence

from searchrl.eval import result_names as rn
from searchrl.retrieval.base import Retriever
from searchrl.retrieval.querycache import CachedRetriever
from searchrl.retrieval.web.budget import COUNTERS
from searchrl.retrieval.web.replay import REPLAY_COUNTERS

JUDGE_KEYS = (rn.JUDGE_REQUESTS, rn.JUDGE_CACHE_HITS, rn.JUDGE_MALFORMED)
WEB_KEYS = tuple(rn.WEB_COUNTER.key(c) for c in (*COUNTERS, *REPLAY_COUNTERS))  # a replay's counters only in a replay
RETRIEVAL_KEYS = (rn.RETRIEVAL_QUERIES, rn.RETRIEVAL_CACHE_HITS, rn.RETRIEVAL_S)  # cache hits: only with a cache
SPENT_KEYS = (rn.SECONDS, *JUDGE_KEYS, *WEB_KEYS, *RETRIEVAL_KEYS)


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
        out = {**self.before, rn.SECONDS: self.before.get(rn.SECONDS, 0.0) + self.seconds}
        if self.judge is not None:
            stats = self.judge.stats
            for key, value in zip(JUDGE_KEYS, (stats.requests, stats.cache_hits, stats.malformed)):
                out[key] = self.before.get(key, 0) + value
        if self._web_start is not None:
            for c, value in self.retriever.usage().items():
                key = rn.WEB_COUNTER.key(c)
                out[key] = round(self.before.get(key, 0) + value - self._web_start[c], 6)
        if self._searched_start is not None:
            done = self.retriever.counts().since(self._searched_start)
            out[rn.RETRIEVAL_QUERIES] = self.before.get(rn.RETRIEVAL_QUERIES, 0) + done.queries
            if done.cached:
                out[rn.RETRIEVAL_CACHE_HITS] = self.before.get(rn.RETRIEVAL_CACHE_HITS, 0) + done.cache_hits
            out[rn.RETRIEVAL_S] = round(self.before.get(rn.RETRIEVAL_S, 0.0) + done.seconds, 3)
        return out


def cache_hit_rate(spent: dict) -> float | None:
    """Share of the run's queries answered without a search of their own; None without a cache."""
    queries = spent.get(rn.RETRIEVAL_QUERIES)
    return spent[rn.RETRIEVAL_CACHE_HITS] / queries if queries and rn.RETRIEVAL_CACHE_HITS in spent else None


def spending_rows(metrics: dict) -> list[tuple[str, str]]:
    """metrics.md rows for the judge and web search, when the run used them."""
    rows = []
    if metrics.get(rn.RETRIEVAL_QUERIES):
        searched = (f"{metrics[rn.RETRIEVAL_QUERIES]} ({_percent(metrics[rn.RETRIEVAL_CACHE_HIT_RATE])}), "
                    f"{metrics[rn.RETRIEVAL_S]:.2f}")
        rows.append(("queries searched (cache hit %), seconds in search", searched))
    if rn.JUDGE_REQUESTS in metrics:
        rows.append(("judge requests (verdicts from cache, replies without one)",
                     f"{metrics[rn.JUDGE_REQUESTS]} ({metrics[rn.JUDGE_CACHE_HITS]}, {metrics[rn.JUDGE_MALFORMED]})"))
    web = {c: metrics.get(rn.WEB_COUNTER.key(c)) for c in (*COUNTERS, *REPLAY_COUNTERS)}
    if web["requests"] is not None:
        rows.append(("web search requests (served from cache)", f"{web['requests']} ({web['cache_hits']})"))
        rows.append(("web search cost, USD", f"{web['cost_usd']:.4f}"))
        rows.append(("pages read (unreadable)", f"{web['pages']} ({web['page_failures']})"))
    if web["replayed"] is not None:
        rows.append(("web answers replayed (missing from the record)", f"{web['replayed']} ({web['missing']})"))
    return rows


def _percent(value: float | None) -> str:
    return "no cache" if value is None else f"{100 * value:.1f}"
