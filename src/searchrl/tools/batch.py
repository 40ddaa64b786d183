"""One round of calls, run batched per tool: what the rollout engine does with the calls of every
trajectory that paused in a round.

Every call is checked first, and a call that cannot run gets an error observation the model reads
(`ok=False`), never an exception: an unknown tool (`unknown_tool`), arguments outside the tool's
schema (`bad_arguments`), a tool whose budget is spent (`budget`; the engine decides budgets).
The calls that can run are grouped by tool, and each tool is called once with its group, in the
order the calls came; `latency_s` is the group's wall time shared out per call when the tool did
not measure its own.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence

from searchrl.tools.base import Observation, Tool, ToolCall
from searchrl.tools.schema import check_arguments

# Kinds of refused calls that are the policy's mistakes (`tools/invalid_rate`); `budget` is not one.
INVALID = ("malformed", "unknown_tool", "bad_arguments")


def run_calls(tools: Mapping[str, Tool], calls: Sequence[ToolCall | Observation]) -> list[Observation]:
    """One observation per entry of `calls`, in order: an `Observation` given in place of a call
    (a refusal the engine decided, e.g. a spent budget or a malformed call) is passed through;
    a call is checked against its tool and run with the others of its tool."""
    out: list[Observation | None] = [None] * len(calls)
    groups: dict[str, list[int]] = {}
    for i, call in enumerate(calls):
        if isinstance(call, Observation):
            out[i] = call
        elif call.name not in tools:
            out[i] = Observation.refused(f"unknown tool {call.name!r}; the tools are: {', '.join(tools)}", "unknown_tool")
        elif (problem := check_arguments(call.name, tools[call.name].parameters, call.arguments)) is not None:
            out[i] = Observation.refused(problem, "bad_arguments")
        else:
            groups.setdefault(call.name, []).append(i)
    for name, rows in groups.items():
        t0 = time.perf_counter()
        observations = tools[name].call([calls[i].arguments for i in rows])
        share = (time.perf_counter() - t0) / len(rows)
        if len(observations) != len(rows):
            raise RuntimeError(f"tool {name!r} returned {len(observations)} observations for {len(rows)} calls")
        for i, obs in zip(rows, observations):
            if not obs.latency_s:
                obs.latency_s = share
            out[i] = obs
    return out  # type: ignore[return-value]
