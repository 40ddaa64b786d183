"""The protocol a run speaks: how the model's text maps to tool calls and how results go back
(docs/concepts/protocols.md). Configured by `ProtocolConfig`; `searchrl.rollout.agent.build_protocol`
builds one of two kinds, which the rollout engine, rewards and evaluation read alike (a prompt,
stop strings, `read_turn`, `answer`):

- `format: tags` -> `Protocol` (this module): the paper's protocol, a tag preset + prompt
  template + documents style; the `search` tool spoken in tags (`<search>q</search>`). Tags and
  their parsers live in `searchrl.tags`, prompt templates in `searchrl.prompts`.
- `format: tool-calls` -> `searchrl.toolformat.protocol.NativeProtocol`: the model's chat
  template's own tool calls, any tool of the registry.

Nothing outside these modules (and `searchrl.toolformat`) parses model text.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field, field_validator, model_validator

from searchrl.config import StrictModel
from searchrl.data.trajectory import Segment
from searchrl.data.types import Passage
from searchrl.prompts import build_prompt, resolve_template, template_opens_think, template_turn_end
from searchrl.tags import (
    DOC_STYLES,
    TAG_PRESETS,
    TagSet,
    extract_answer,
    extract_queries,
    extract_query,
    format_documents,
    get_tags,
    stop_strings,
)
from searchrl.tools.base import ToolCall

if TYPE_CHECKING:
    from searchrl.toolformat.parse import Turn

# Tool-call prompt templates -> worked example conversations they show (searchrl.toolformat.protocol).
NATIVE_TEMPLATES = {"tools": 0, "tools-oneshot": 1, "tools-fewshot": 2}


@dataclass
class TurnRead:
    """What the protocol reads where a generation stopped: `stop`, a stop reason (the rollout
    ends there), or the calls to run (`calls`; `malformed`, one reason the model reads per bad
    call) and, for tool calls, the parsed `turn` they came from."""

    stop: str | None = None
    calls: list[ToolCall] = field(default_factory=list)
    malformed: list[str] = field(default_factory=list)
    turn: Turn | None = None


class ProtocolConfig(StrictModel):
    """Which protocol a run speaks. Search limits and k belong to the rollout config."""

    format: Literal["tags", "tool-calls"] = "tags"
    """`tags`: the paper's protocol, search queries between tags (the keys below). `tool-calls`:
    the chat template's native tool calls, with the run's `tools`."""
    tags: str = "r1searcher"
    """Tag preset: `r1searcher` (barred tags of the authors' checkpoints) or `search-r1`
    (single-word tags; the ones tiny models learn)."""
    template: str | None = None
    """Prompt template. Tags (default `base`): `base` (completion models), `chat` (instruct models,
    needs the tokenizer's chat template), `fewshot` / `fewshot-chat` (two worked examples, for very
    small models), `oneshot` (the first example only: a shorter prompt, faster on CPU), or the
    path of a template file with `{question}` and `{instruction}` / tag placeholders. Tool calls
    (default `tools`): `tools`, `tools-oneshot`, `tools-fewshot` (0, 1, 2 worked conversations)."""
    doc_style: str = "r1searcher"
    """Documents block lines: `r1searcher` = `(1)Title: T Text: X` as in the authors' released
    trajectories; `title-lines` = `(1) Title: T` then the text on the next line."""

    chat_template: str | None = Field(
        None, description="Tool calls: the chat template, null = the tokenizer's own; a shipped name (hermes-fallback, "
        "for models whose template has no tool section: SmolLM2) or a .jinja file. Never chosen silently."
    )
    call_format: str | None = Field(
        None, description="Tool calls: how calls are written (hermes, llama3-json); null = detected from the chat template."
    )
    template_kwargs: dict[str, Any] = Field(
        default_factory=dict, description="Tool calls: extra variables of every rendering (e.g. enable_thinking for Qwen3)."
    )

    @model_validator(mode="after")
    def _template_of_format(self) -> ProtocolConfig:
        if self.template is None:  # a default, not a setting: `model_fields_set` keeps telling what was given
            self.__dict__["template"] = "base" if self.format == "tags" else "tools"
        native = self.template in NATIVE_TEMPLATES
        if self.format == "tags" and native:
            raise ValueError(f"template {self.template!r} is a tool-call prompt; set protocol.format: tool-calls, or pick a tag template")
        if self.format == "tool-calls" and not native:
            raise ValueError(f"protocol.format tool-calls takes the templates {', '.join(NATIVE_TEMPLATES)}, not {self.template!r}")
        if self.format == "tags":
            resolve_template(self.template)
        return self

    @field_validator("tags")
    @classmethod
    def _known_tags(cls, v: str) -> str:
        TAG_PRESETS.get(v)
        return v

    @field_validator("doc_style")
    @classmethod
    def _known_style(cls, v: str) -> str:
        DOC_STYLES.get(v)
        return v


@dataclass(frozen=True)
class Protocol:
    """Tags + prompt template + documents style: everything about the text format of a rollout.

    >>> Protocol.named("search-r1").stop_strings()  # end of query, of answer, of the model's turn
    ['</search>', '</answer>', '\\nUser:']
    """

    tags: TagSet
    template: str = "base"
    doc_style: str = "r1searcher"

    @classmethod
    def from_config(cls, cfg: ProtocolConfig) -> Protocol:
        return cls(get_tags(cfg.tags), cfg.template, cfg.doc_style)

    @classmethod
    def named(cls, tags: str, template: str = "base", doc_style: str = "r1searcher") -> Protocol:
        return cls.from_config(ProtocolConfig(tags=tags, template=template, doc_style=doc_style))

    def prompt(self, question: str, tokenizer=None) -> str:
        return build_prompt(question, self.tags, self.template, tokenizer, doc_style=self.doc_style)

    @cached_property
    def think_opened_in_prompt(self) -> bool:
        """Whether prompts end with the think tag, so responses start inside the think block."""
        return template_opens_think(self.template, self.tags)

    @cached_property
    def turn_end(self) -> str | None:
        """Text after which the model is writing the next user turn, not its answer (a rollout
        stops there: `turn_end`); None for chat templates, whose turns end with EOS."""
        return template_turn_end(self.template)

    def stop_strings(self) -> list[str]:
        return stop_strings(self.tags) + ([self.turn_end] if self.turn_end else [])

    def read_turn(self, text: str, finish_reason: str, stop_string: str | None) -> TurnRead | None:
        """Where a generation stopped, read: EOS, the answer tag or a new user turn end the
        rollout; the end-of-query tag is a `search` call with the query written since the last
        documents block (`text`), or `empty_query`; None for anything else (a budget).

        >>> p = Protocol.named("search-r1")
        >>> p.read_turn("Look. <search> Quellbridge  river</search>", "stop", "</search>").calls
        [ToolCall(name='search', arguments={'query': 'Quellbridge river'})]
        >>> p.read_turn("<answer>Tessaly</answer>", "stop", "</answer>").stop, p.read_turn("x", "length", None)
        ('answer', None)
        """
        if finish_reason == "eos":
            return TurnRead("eos")
        if finish_reason != "stop":
            return None
        if stop_string == self.tags.answer_close:
            return TurnRead("answer")
        if stop_string == self.turn_end:
            return TurnRead("turn_end")
        if stop_string == self.tags.query_close:
            query = self.extract_query(text)
            return TurnRead(calls=[ToolCall("search", {"query": query})]) if query else TurnRead("empty_query")
        return None

    def format_documents(self, passages: Sequence[Passage]) -> str:
        return format_documents(passages, self.tags, self.doc_style)

    def extract_query(self, text: str) -> str | None:
        return extract_query(text, self.tags)

    def extract_queries(self, text: str) -> list[str]:
        return extract_queries(text, self.tags)

    def answer(self, segments: Sequence[Segment], *, opened: bool = False, cut_short: bool = False) -> str | None:
        """The answer a response gives, read from the policy's text alone (documents never count):
        the text of its last complete answer block, stripped; None when there is none. The one
        reader of answers: the engine records it as `Trajectory.answer`, which rewards, `ask` and
        data selection use; evaluation reads it here with its two fallbacks.

        `cut_short` (an agent evaluated): an answer block the budget cut reads as its first line.
        `opened` (the rag/direct answer prompts, which end with the opening answer tag): the text
        up to the closing tag (None if empty); never closed, the first non-empty line written
        before the turn ended, protocol tags taken as line breaks.

        >>> p, policy = Protocol.named("search-r1"), lambda text: [Segment(text, "policy")]
        >>> p.answer(policy("</think><answer> Velmar </answer>")), p.answer(policy("<answer>Velmar"))
        ('Velmar', None)
        >>> p.answer(policy("</think><answer> Velmar\\nport"), cut_short=True)  # the budget cut it
        'Velmar'
        >>> p.answer(policy(" Velmar </answer>"), opened=True), p.answer(policy("<answer>Velmar</answer>"), opened=True)
        ('Velmar', 'Velmar')
        >>> [p.answer(policy(t), opened=True) for t in ("Velmar port\\nmore", "\\nUser:", "</answer>")]
        ['Velmar port', None, None]
        """
        tags = self.tags
        policy = "".join(s.text for s in segments if s.source == "policy")
        if opened:
            if tags.answer_close in policy:  # the prompt's open tag, or one the model wrote again
                return extract_answer(tags.answer_open + policy, tags) or None
            return _first_line(policy.split(template_turn_end("base"), 1)[0], tags)
        answer = extract_answer(policy, tags)
        if answer is None and cut_short:
            start = policy.rfind(tags.answer_open)
            return None if start < 0 else _first_line(policy[start + len(tags.answer_open) :], tags)
        return answer


def _first_line(text: str, tags: TagSet) -> str | None:
    """The first non-empty line of `text`, stripped, every protocol tag taken as a line break."""
    for tag in tags.all_tags():
        text = text.replace(tag, "\n")
    for line in text.splitlines():
        if line.strip():
            return line.strip()
    return None

