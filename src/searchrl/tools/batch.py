"""One round of calls, run batched per tool: what the rollout engine does with the calls of every
trajectory that paused in a round.

Every call is checked first, and a call that cannot run gets an error observation the model reads
(`ok=False`), never an exception: an unknown tool (`unknown_tool`), arguments outside the tool's
schema (`bad_arguments`), a tool whose budget is spent (`budget`; the engine decides budgets).
The calls that can run are grouped by tool, and each tool is called once with its group, in the
order the calls came; `latency_s` is the group's wall time shared out per call when the tool did
not measure its own.

A user's tool (`package.module:Class`) is user code, held to its contract by name:

- a batched call that takes longer than the tool's `timeout_s` (60 s unless the class says
  otherwise) gives every call of the batch an error result (`timeout`, "tool 'x' did not answer
  within 60 s") and the round goes on; the call is left to finish in its thread, and while it has
  not, later calls of that tool get the same error at once (one warning says so);
- one that raises, or returns anything but one `Observation` per call (with text), stops the run
  with a one-line `SearchRLError` naming the tool and what it returned.
"""

from __future__ import annotations

import logging
import time
import weakref
from collections.abc import Mapping, Sequence

from searchrl.deadline import DeadlineExceeded, within
from searchrl.errors import SearchRLError
from searchrl.tools.base import Observation, Tool, ToolCall
from searchrl.tools.schema import check_arguments

log = logging.getLogger(__name__)

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
        observations = _call(tools[name], name, [calls[i].arguments for i in rows])
        share = (time.perf_counter() - t0) / len(rows)
        for i, obs in zip(rows, observations):
            if not obs.latency_s:
                obs.latency_s = share
            out[i] = obs
    return out  # type: ignore[return-value]


# A user tool's batched call still running past its deadline, by tool: its later calls are refused.
_STUCK: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _user_tool(tool: Tool) -> bool:
    inner = getattr(tool, "inner", tool)  # `ask`'s announcing wrapper
    return not type(inner).__module__.startswith("searchrl.")


def _call(tool: Tool, name: str, arguments: list) -> list[Observation]:
    """`tool.call(arguments)`, held to the contract of the module docstring."""
    late = f"tool {name!r} did not answer within {tool.timeout_s:g} s" if tool.timeout_s else ""
    stuck = _STUCK.get(tool)
    if stuck is not None and stuck.is_alive():
        return [Observation.refused(f"{late} (an earlier call of it is still running); answer without it", "timeout")
                for _ in arguments]
    user = _user_tool(tool)
    try:
        observations = within(lambda: tool.call(arguments), tool.timeout_s, f"tool {name!r}")
    except DeadlineExceeded as exc:
        if exc.still_running is not None:
            _STUCK[tool] = exc.still_running
        log.warning("%s: its %d call(s) of this round get an error result, and so do its later calls until it "
                    "returns; raise its timeout_s if it needs longer", late, len(arguments))
        return [Observation.refused(f"{late}; answer without it", "timeout") for _ in arguments]
    except SearchRLError:
        raise
    except Exception as exc:
        if not user:
            raise
        raise SearchRLError(f"tool {name!r} ({_where(tool)}) raised {type(exc).__name__}: {' '.join(str(exc).split())[:200]}; "
                            "a tool reports a failing call as Observation.refused(text, kind), never by raising") from exc
    problem = _returned_problem(observations, len(arguments))
    if problem is not None:
        raise SearchRLError(f"tool {name!r} ({_where(tool)}) returned {problem}; a tool's call returns one "
                            "searchrl.tools.base.Observation (with text, a str) per call, in order")
    return list(observations)


def _where(tool: Tool) -> str:
    cls = type(getattr(tool, "inner", tool))
    return f"{cls.__module__}:{cls.__qualname__}"


def _returned_problem(observations: object, n: int) -> str | None:
    """What is wrong with a tool's answer to `n` calls, or None."""
    if not isinstance(observations, (list, tuple)):
        return f"a {type(observations).__name__}, not a list of observations"
    if len(observations) != n:
        return f"{len(observations)} observations for {n} calls"
    for i, obs in enumerate(observations, start=1):
        if not isinstance(obs, Observation):
            return f"a {type(obs).__name__} for call {i} of {n}, not an Observation"
        if not isinstance(obs.text, str):
            return f"an Observation whose text is a {type(obs.text).__name__} for call {i} of {n}"
    return None
