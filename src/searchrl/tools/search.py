"""`search`: the run's retriever (local index, retrieval server or web search) as a tool.

The model gives a query only: k is the rollout config's (`rollout.k`), as in the tag protocols,
so documents cost the same tokens whichever way the model speaks, and a run's searches compare.
A retrieval outage (`RetrievalUnavailable`, a spent web budget) is raised, not observed: it is
the environment failing, not the policy, and the run's retry / abort rules apply to it.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any, ClassVar

from searchrl.errors import SearchRLError
from searchrl.tools.base import Observation, Tool
from searchrl.tools.passages import clean_query
from searchrl.tools.registry import TOOLS


@TOOLS.register("search")
class Search(Tool):
    name = "search"
    timeout_s = None  # built in: its requests have deadlines of their own
    description = "Search the knowledge source for passages about a query; returns the top passages with their titles."
    parameters: ClassVar[dict[str, Any]] = {
        "type": "object",
        "properties": {"query": {"type": "string", "description": "What to look for, a few keywords.", "maxLength": 500}},
        "required": ["query"],
    }

    def call(self, calls: Sequence[dict[str, Any]]) -> list[Observation]:
        ctx = self.context
        if ctx is None or ctx.retriever is None:
            raise SearchRLError("the search tool has no retriever: set retrieval.index, retrieval.url or retrieval.web")
        queries = [clean_query(c["query"]) for c in calls]
        asked = [q for q in queries if q is not None]
        spent, t0 = _spent(ctx.retriever), time.perf_counter()
        results = ctx.retriever.search(asked, ctx.k) if asked else []  # one batch for the whole round
        latency = (time.perf_counter() - t0) / max(len(asked), 1)
        cost = (_spent(ctx.retriever) - spent) / max(len(asked), 1)
        if len(results) != len(asked):
            raise RuntimeError(f"retriever returned {len(results)} result lists for {len(asked)} queries")
        results = iter(results)
        out = []
        for q in queries:
            if q is None:
                out.append(Observation("search: the query is empty; write what to look for", ok=False, error="bad_arguments"))
                continue
            passages = list(next(results))
            out.append(Observation(ctx.format_passages(passages), passages=passages, latency_s=latency, cost=cost))
        return out


def _spent(retriever) -> float:
    """Dollars the retriever's run has spent so far (web search); 0 for searches that cost nothing."""
    return (retriever.usage() or {}).get("cost_usd", 0.0)
