"""The one interface between the model's text and the rest of the house (docs/guides/protocols.md).

A `Protocol` is everything about what the model's text means: the prompt a rollout starts from,
where generation pauses, what a turn holds (a final answer, calls, malformed calls), the ids of
the observation that answers it, the answer, the format check. The rollout engine, rewards,
evaluation and training speak this interface only; each protocol is one module registered in
`PROTOCOLS` (`protocols.config`) under its `format` (`protocol.format` of the config).

Protocols work on token ids through a `Codec` (the generation backend is one): they never know
which backend generates.
"""

from __future__ import annotations

import math
import typing
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from searchrl.data.trajectory import Segment, Trajectory
from searchrl.data.types import Passage
from searchrl.protocols.config import ProtocolConfig
from searchrl.tools.base import Observation, ToolCall

if TYPE_CHECKING:
    from searchrl.reward_terms import FormatVerdict

Message = dict[str, Any]  # a chat message: role, content, tool_calls ...


class Codec(typing.Protocol):
    """Text <-> token ids as the policy's backend does them (`GenerationBackend` is one)."""

    def encode(self, text: str, *, prompt: bool = False) -> list[int]: ...

    def decode(self, token_ids: Sequence[int]) -> str: ...

    @property
    def tokenizer(self) -> Any: ...


@dataclass
class TurnRead:
    """What the protocol reads where a generation stopped: `stop`, a stop reason (the rollout
    ends there), or the calls to run (`calls`; `malformed`, one reason the model reads per bad
    call) and what the protocol needs again to answer them (`turn`: tool calls' parsed turn)."""

    stop: str | None = None
    calls: list[ToolCall] = field(default_factory=list)
    malformed: list[str] = field(default_factory=list)
    turn: Any = None


@dataclass
class Observed:
    """An observation as the engine appends it (loss mask 0): its ids, the text they decode to
    (what the model sees), whether it was cut to fit, and the messages it adds to the rollout's
    conversation (protocols that keep one)."""

    ids: list[int]
    text: str
    cut: bool = False
    messages: list[Message] = field(default_factory=list)


@dataclass(frozen=True)
class Step:
    """One step of a written rollout: the policy's `thought`, its `call`, what the tool returned."""

    thought: str
    call: ToolCall
    result: Observation


@dataclass(frozen=True)
class Script:
    """A rollout written out (gold trajectories for SFT): steps, then a last thought and the
    answer. The protocol renders it in its own syntax (`Protocol.written`)."""

    steps: tuple[Step, ...]
    final_thought: str
    answer: str


class Protocol(ABC):
    """How one format of model text maps to tool calls, observations and an answer."""

    format: ClassVar[str]
    """The registry key, `protocol.format` in configs."""
    default_template: ClassVar[str]
    """The prompt template when the config names none."""
    spent_turns_allowed: ClassVar[int] = 0
    """Turns whose every call was over its tool's budget that a rollout outlives (told so);
    one more ends it with `max_searches`."""

    # --- configuration ------------------------------------------------------------------------
    @classmethod
    def check_config(cls, cfg: ProtocolConfig, tools: Sequence[str] | None = None) -> None:
        """Raise ValueError when `cfg` (its template) or the run's `tools` (None: not known yet)
        do not fit this protocol."""

    @classmethod
    @abstractmethod
    def build(cls, cfg: ProtocolConfig, tools: Sequence[str], tokenizer) -> Protocol:
        """The protocol of `cfg` for a run with `tools`, bound to `tokenizer` where it needs one."""

    # --- the prompt and where generation pauses -------------------------------------------------
    @abstractmethod
    def prompt_ids(self, question: str, codec: Codec, prompt: str | None = None) -> list[int]:
        """The ids a rollout of `question` starts from; `prompt`: a prompt text given instead of
        the protocol's (evaluation's answer-only baselines), where the protocol takes one."""

    def conversation(self, question: str) -> list[Message]:
        """The chat messages a rollout starts from, for protocols whose observations are
        rendered from the conversation so far; [] for the others."""
        return []

    @abstractmethod
    def stop_strings(self) -> list[str]:
        """Where generation pauses besides EOS and budgets."""

    # --- a turn, its observation --------------------------------------------------------------
    @abstractmethod
    def read_turn(self, sampled_ids: Sequence[int], finish_reason: str, stop_string: str | None,
                  codec: Codec) -> TurnRead | None:
        """The turn written since the last observation, read where generation stopped; None when
        it stopped for a budget (the turn is never run)."""

    def min_observation_tokens(self, codec: Codec) -> float:
        """Tokens the smallest observation takes, checked before the calls run (a rollout without
        that room ends `context_full`, unserved); -inf when only the results can tell (the calls
        run, and `observe` returns None)."""
        return -math.inf

    @abstractmethod
    def observe(self, history: list[Message], read: TurnRead, sampled_ids: Sequence[int],
                results: Sequence[tuple[ToolCall | None, Observation]], room: float, codec: Codec) -> Observed | None:
        """The observation that answers a turn (`read`, from `sampled_ids`; `history`: the
        conversation before it) with the calls' `results`, in at most `room` tokens, shortened
        to fit; None when not even the smallest fits."""

    @abstractmethod
    def turn_text(self, ids: Sequence[int], final_eos: frozenset[int] = frozenset()) -> list[int]:
        """A policy turn's ids less the tokens that close it and are no text: the protocol's
        end-of-turn token, and `final_eos` (the EOS ids when EOS ended the rollout's last turn)."""

    # --- the answer and the format ------------------------------------------------------------
    @abstractmethod
    def answer(self, segments: Sequence[Segment], *, opened: bool = False, cut_short: bool = False) -> str | None:
        """The answer a response gives, read from the policy's text alone; None when none.
        `cut_short`: an answer the budget cut still counts (evaluation); `opened`: the prompt
        opened the answer (answer-only baselines), where the protocol has such prompts."""

    @abstractmethod
    def check_format(self, traj: Trajectory, *, max_answer_words: int | None = None, require_think: bool = True,
                     think_opened_in_prompt: bool | None = None) -> FormatVerdict:
        """Whether `traj` kept this protocol's format (`searchrl.protocols.format_rules`)."""

    @abstractmethod
    def think_text(self, traj: Trajectory) -> str:
        """The policy's reasoning in `traj`, for the repetition metrics."""

    # --- written rollouts ---------------------------------------------------------------------
    @abstractmethod
    def written(self, question: str, script: Script, codec: Codec) -> list[tuple[str, list[int], str]]:
        """`script` as this protocol's rollout: (source, ids, text) pieces in order, `policy` ones
        tokenized as a policy samples them, one `env` observation per step (loss mask 0)."""

    def chat_messages(self, question: str, script: Script) -> list[Message] | None:
        """`script` as chat messages (the shape datasets for tool calling use); None for
        protocols that have none."""
        return None

    # --- bounds -------------------------------------------------------------------------------
    @abstractmethod
    def search_block_tokens(self, passages: Sequence[Passage], encode: Callable[[str], list[int]]) -> tuple[int, float]:
        """(tokens of a search observation's frame, typical tokens per passage) over a sample of
        `passages`, for the context check before a run (`rollout.bounds`)."""



