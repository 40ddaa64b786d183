"""The protocol a run speaks (SPEC §1-2): tag preset + prompt template + documents style,
bundled as `Protocol` (what the engine, rewards and evaluation share) and configured by
`ProtocolConfig`. Tags and parsers live in `searchrl.tags`, prompt templates in `searchrl.prompts`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property

from pydantic import field_validator

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


class ProtocolConfig(StrictModel):
    """Which protocol a run speaks. Search limits and k belong to the rollout config."""

    tags: str = "r1searcher"
    """Tag preset: `r1searcher` (barred tags of the authors' checkpoints) or `search-r1`
    (single-word tags; the ones tiny models learn, SPEC §6)."""
    template: str = "base"
    """Prompt template: `base` (completion models), `chat` (instruct models, needs the tokenizer's
    chat template), `fewshot` / `fewshot-chat` (two worked examples, for very small models),
    `oneshot` (the first example only: a shorter prompt, faster on CPU), or the
    path of a template file with `{question}` and `{instruction}` / tag placeholders."""
    doc_style: str = "r1searcher"
    """Documents block lines: `r1searcher` = `(1)Title: T Text: X` as in the authors' released
    trajectories; `title-lines` = `(1) Title: T` then the text on the next line."""

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

    @field_validator("template")
    @classmethod
    def _known_template(cls, v: str) -> str:
        resolve_template(v)
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

