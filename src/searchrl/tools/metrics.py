"""Tool-call metrics of a set of rollouts, under the stable names training (`metrics.jsonl`) and
evaluation (`metrics.json`) both report:

- `tools/<name>/calls`: calls of tool `name` per rollout (served or refused);
- `tools/<name>/latency_s`: wall seconds per call of `name` that ran (its batch's time shared
  out; None when none ran);
- `tools/invalid_rate`: the share of call attempts that were the policy's mistakes (malformed,
  an unknown tool, bad arguments: `batch.INVALID`); `tools/refused_rate`: over a budget.
"""

from __future__ import annotations

from collections.abc import Sequence

from searchrl import metric_names as mn
from searchrl.tools.batch import INVALID


def tool_metrics(calls: Sequence[Sequence[dict]], timings: Sequence[dict], tools: Sequence[str]) -> dict[str, float | None]:
    """The metrics of rollouts whose `tool_calls` are `calls` and `timing`s are `timings`, with a
    `tools/<name>/...` pair for every tool the run offers (`tools`). A call of any other name is
    the policy's mistake (`unknown_tool`), counted in `tools/invalid_rate` only: names a model
    makes up never become metric keys.

    >>> search = {"name": "search", "arguments": {"query": "q"}, "ok": True, "error": None}
    >>> bad = {"name": None, "arguments": None, "ok": False, "error": "malformed"}
    >>> made_up = {"name": "Paris", "arguments": {}, "ok": False, "error": "unknown_tool"}
    >>> m = tool_metrics([[search, search], [bad, made_up]], [{"tools/search_s": 0.5}, {}], ["search", "open"])
    >>> m["tools/search/calls"], m["tools/search/latency_s"], m["tools/open/calls"], m["tools/invalid_rate"]
    (1.0, 0.25, 0.0, 0.5)
    >>> sorted(k for k in m if k.startswith("tools/Paris"))
    []
    """
    n = max(len(calls), 1)
    attempts = [c for rollout in calls for c in rollout]
    out: dict[str, float | None] = {}
    for name in tools:
        served = sum(c["name"] == name and c["error"] not in (*INVALID, "budget") for c in attempts)  # that ran
        seconds = sum(t.get(f"tools/{name}_s", 0.0) for t in timings)
        out[mn.TOOL_CALLS.key(name)] = sum(c["name"] == name for c in attempts) / n
        out[mn.TOOL_LATENCY.key(name)] = seconds / served if served else None
    out[mn.TOOLS_INVALID_RATE] = sum(c["error"] in INVALID for c in attempts) / len(attempts) if attempts else 0.0
    out[mn.TOOLS_REFUSED_RATE] = sum(c["error"] == "budget" for c in attempts) / len(attempts) if attempts else 0.0
    return out
