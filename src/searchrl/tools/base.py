"""What a tool is: a name, a description, a JSON schema of its arguments, and a batched call.

The rollout engine collects every call of a round from every trajectory, groups them by tool and
makes one `Tool.call` per tool: many calls in, one `Observation` each out, in order. How a call is
written by the model (tags, or the chat template's native tool calls) and how an observation goes
back into the context is the protocol's business (`searchrl.protocols`), never a tool's.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:
    from searchrl.tools.context import ToolContext


@dataclass(frozen=True)
class ToolCall:
    """One call as the protocol parsed it from the policy's text."""

    name: str
    arguments: dict[str, Any]


@dataclass
class Observation:
    """What one call returned. `text` is what the model reads; the rest is for rewards and metrics.

    `ok` False: the call failed (bad arguments, a backend error, a refused URL) and `text` says why
    in words the model can read; it is counted, never raised."""

    text: str
    ok: bool = True
    passages: list = field(default_factory=list)  # [Passage] a search or an open returned
    latency_s: float = 0.0  # wall time of the batched call, shared out per call
    cost: float = 0.0  # provider cost units (web search calls, pages fetched)
    error: str | None = None  # a short machine-readable kind: "bad_arguments", "refused", ...

    @classmethod
    def refused(cls, text: str, error: str) -> Observation:
        """A call that failed: `text` says why to the model, `error` is its kind."""
        return cls(text, ok=False, error=error)


class Tool(ABC):
    """A tool the policy may call. Subclasses set the three class attributes and `call`."""

    name: ClassVar[str]
    description: ClassVar[str]
    parameters: ClassVar[dict[str, Any]]  # JSON schema (an "object") of the arguments
    # Most seconds one batched `call` may take; past it every call of the batch gets an error
    # result naming the tool (`timeout`) and the round goes on (`searchrl.tools.batch`). None: no
    # deadline (the built-in tools, whose requests have their own).
    timeout_s: ClassVar[float | None] = 60.0

    def __init__(self, context: ToolContext | None = None) -> None:
        """`context`: what the run gives its tools (the retriever, k, ...); `build_tools` passes it."""
        self.context = context

    @classmethod
    def schema(cls) -> dict[str, Any]:
        """The OpenAI / Hugging Face function schema, as chat templates take it in `tools=`."""
        return {
            "type": "function",
            "function": {"name": cls.name, "description": cls.description, "parameters": cls.parameters},
        }

    @abstractmethod
    def call(self, calls: Sequence[dict[str, Any]]) -> list[Observation]:
        """One observation per call's arguments, in order. Arguments arrive as the model wrote
        them (checked against `parameters` by the engine first); a failing call is an
        `Observation(ok=False)`, never an exception. A user's tool that raises, returns anything
        but one `Observation` per call, or takes longer than `timeout_s` is named in the error
        (`searchrl.tools.batch.run_calls`)."""

    def close(self) -> None:
        """Release what the tool holds (connections, files)."""
