"""The tag protocol (`protocol.format: tags`, docs/concepts/protocols.md): the paper's. The model
writes free text; a search is its query between the query tags (`<search>q</search>`), answered
by a documents block the environment inserts; the answer sits between the answer tags. A tag
preset (`searchrl.protocols.tags`), a prompt template (`searchrl.protocols.prompts`) and a
documents style make one protocol; it speaks the `search` tool only.

**The documents block** is tokenized on its own: it starts with a blank line, so it splits no
token with the policy text before it, and its ids decode back to exactly its text with byte-level
BPE tokenizers (a warning, once, when a tokenizer does not round-trip; trajectories record the
text the model saw). Passages are data (`searchrl.datatext`): no passage makes a control token.
A block that does not fit the room left is cut: its opening part (blank line, documents tag) and
closing part (newline, closing tag, blank line) are tokenized on their own and kept whole, and
the passages between them are kept as a prefix of their tokens, i.e. whole passages while they
fit and the next one cut at a token boundary (never inside a character). When not even the two
tags fit, the search is not served (`min_observation_tokens`). A block that fits is inserted
exactly as without a limit.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import cached_property

from searchrl.data.trajectory import Segment, Trajectory
from searchrl.data.types import Passage
from searchrl.datatext import data, data_passage, strip_marks
from searchrl.protocols.base import Codec, Message, Observed, Protocol, Script, TurnRead
from searchrl.protocols.config import PROTOCOLS, ProtocolConfig
from searchrl.protocols.format_rules import check_segments, tag_think_text
from searchrl.protocols.prompts import (
    TOOL_TEMPLATES,
    build_prompt,
    resolve_template,
    template_opens_think,
    template_turn_end,
)
from searchrl.protocols.tags import (
    TagSet,
    extract_answer,
    extract_queries,
    extract_query,
    format_documents,
    get_tags,
    stop_strings,
)
from searchrl.reward_terms import FormatVerdict
from searchrl.tools.base import Observation, ToolCall

log = logging.getLogger(__name__)


def document_block_ends(tags: TagSet) -> tuple[str, str]:
    """The opening and closing parts of every documents block (`tags.format_documents`), which a
    cut keeps whole: block = opening + passage lines (without the last newline) + closing."""
    return f"\n\n{tags.docs_open}\n", f"\n{tags.docs_close}\n\n"


@PROTOCOLS.register("tags")
@dataclass(frozen=True)
class TagProtocol(Protocol):
    """Tags + prompt template + documents style: everything about the text format of a rollout.

    >>> TagProtocol.named("search-r1").stop_strings()  # end of query, of answer, of the model's turn
    ['</search>', '</answer>', '\\nUser:']
    """

    format = "tags"
    default_template = "base"

    tags: TagSet
    template: str = "base"
    doc_style: str = "r1searcher"
    _warned: set[str] = field(default_factory=set, compare=False, repr=False)  # warnings given once

    @classmethod
    def check_config(cls, cfg: ProtocolConfig, tools: Sequence[str] | None = None) -> None:
        if cfg.template in TOOL_TEMPLATES:
            raise ValueError(f"template {cfg.template!r} is a tool-call prompt; set protocol.format: tool-calls, or pick a tag template")
        resolve_template(cfg.template)
        if tools is not None and list(tools) != ["search"]:
            raise ValueError(f"the tag protocols speak the search tool only (tools: {list(tools)}); "
                             "set protocol.format: tool-calls to give the model other tools")

    @classmethod
    def build(cls, cfg: ProtocolConfig, tools: Sequence[str] = ("search",), tokenizer=None) -> TagProtocol:
        return cls.from_config(cfg)

    @classmethod
    def from_config(cls, cfg: ProtocolConfig) -> TagProtocol:
        return cls(get_tags(cfg.tags), cfg.template, cfg.doc_style)

    @classmethod
    def of(cls, protocol: Protocol | TagSet) -> Protocol:
        """A bare `TagSet` as the tag protocol of those tags (its prompts open the think block)."""
        return cls(protocol) if isinstance(protocol, TagSet) else protocol

    @classmethod
    def named(cls, tags: str, template: str = "base", doc_style: str = "r1searcher") -> TagProtocol:
        return cls.from_config(ProtocolConfig(tags=tags, template=template, doc_style=doc_style))

    def prompt(self, question: str, tokenizer=None) -> str:
        return build_prompt(question, self.tags, self.template, tokenizer, doc_style=self.doc_style)

    def prompt_ids(self, question: str, codec: Codec, prompt: str | None = None) -> list[int]:
        # The question is data (searchrl.datatext): never a control token.
        text = prompt if prompt is not None else self.prompt(data(question), codec.tokenizer)
        return codec.encode(text, prompt=True)

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

    def read_turn(self, sampled_ids: Sequence[int], finish_reason: str, stop_string: str | None,
                  codec: Codec) -> TurnRead | None:
        return self.read_text(codec.decode(sampled_ids), finish_reason, stop_string)

    def read_text(self, text: str, finish_reason: str, stop_string: str | None) -> TurnRead | None:
        """Where a generation stopped, read: EOS, the answer tag or a new user turn end the
        rollout; the end-of-query tag is a `search` call with the query written since the last
        documents block (`text`), or `empty_query`; None for anything else (a budget).

        >>> p = TagProtocol.named("search-r1")
        >>> p.read_text("Look. <search> Quellbridge  river</search>", "stop", "</search>").calls
        [ToolCall(name='search', arguments={'query': 'Quellbridge river'})]
        >>> p.read_text("<answer>Tessaly</answer>", "stop", "</answer>").stop, p.read_text("x", "length", None)
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

    # --- documents blocks (module docstring) ------------------------------------------------------
    def marked_documents(self, passages: Sequence[Passage]) -> str:
        """The documents block of `passages` with their titles and texts marked as data
        (`searchrl.datatext`): what is tokenized, so that no passage makes a control token."""
        return self.format_documents([data_passage(p) for p in passages])

    def documents(self, passages: Sequence[Passage], codec: Codec) -> tuple[list[int], str]:
        """The documents block of `passages` as inserted: its ids (the block tokenized on its own,
        passages as data) and the text they decode to, which is what the model sees."""
        marked = self.marked_documents(passages)
        block = strip_marks(marked)
        ids = codec.encode(marked)
        seen = codec.decode(ids)
        if seen != block and self._once("roundtrip"):
            log.warning("the tokenizer does not round-trip documents blocks; trajectories record "
                        "the decoded text the model saw (first block: %r vs %r)", block[:80], seen[:80])
        return ids, seen

    def fitted_documents(self, passages: Sequence[Passage], codec: Codec,
                         room: float = math.inf) -> tuple[list[int], str, bool] | None:
        """The documents block of `passages` in at most `room` tokens, cut by the module
        docstring's rule: (ids, decoded text, whether it was cut), or None when not even its
        tags fit."""
        whole, seen = self.documents(passages, codec)
        if len(whole) <= room:
            return whole, seen, False
        block = self.marked_documents(passages)
        head_text, tail_text = document_block_ends(self.tags)
        head, tail = codec.encode(head_text), codec.encode(tail_text)
        n = int(room) - len(head) - len(tail)
        if n < 0:
            return None
        body = codec.encode(block[len(head_text) : -len(tail_text)])[:n]
        while body and codec.decode(body[-4:]).endswith("\ufffd"):
            body = body[:-1]  # a cut inside a multi-byte character
        ids = head + body + tail
        if self._once("cut"):
            log.warning("a documents block of %d passages was cut to fit the model's context (%d of %d tokens); "
                        "trajectories count such blocks (truncated_documents): lower rollout.k or rollout.max_searches",
                        len(passages), len(ids), len(whole))
        return ids, codec.decode(ids), True

    def _once(self, what: str) -> bool:
        """True the first time `what` is asked for (a warning given once per protocol)."""
        first = what not in self._warned
        self._warned.add(what)
        return first

    def min_observation_tokens(self, codec: Codec) -> float:
        """Tokens of the smallest documents block a cut can leave: its opening and closing parts."""
        return sum(len(codec.encode(part)) for part in document_block_ends(self.tags))

    def observe(self, history: list[Message], read: TurnRead, sampled_ids: Sequence[int],
                results: Sequence[tuple[ToolCall | None, Observation]], room: float, codec: Codec) -> Observed | None:
        """The documents block of the turn's one search (its passages), cut to `room`."""
        fitted = self.fitted_documents(results[0][1].passages, codec, room)
        return None if fitted is None else Observed(*fitted)

    def turn_text(self, ids: Sequence[int], final_eos: frozenset[int] = frozenset()) -> list[int]:
        return list(ids[:-1]) if ids and ids[-1] in final_eos else list(ids)

    # --- the format, written rollouts, bounds ---------------------------------------------------
    def check_format(self, traj: Trajectory, *, max_answer_words: int | None = None, require_think: bool = True,
                     think_opened_in_prompt: bool | None = None) -> FormatVerdict:
        """The tag rules (`format_rules.check_segments`); `think_opened_in_prompt`: None for this
        protocol's template's."""
        opened = self.think_opened_in_prompt if think_opened_in_prompt is None else think_opened_in_prompt
        return check_segments(traj.segments, self.tags, question=traj.question, think_opened_in_prompt=opened,
                              max_answer_words=max_answer_words, require_think=require_think)

    def think_text(self, traj: Trajectory) -> str:
        return tag_think_text(traj.segments, self.tags, self.think_opened_in_prompt)

    def script_texts(self, script: Script) -> list[str]:
        """The policy's text of a written rollout: one piece ending with each query, then one
        ending with the answer (the think block opened first when the prompt does not)."""
        tags = self.tags
        out = [f"{step.thought}\n\n{tags.query_open}{step.call.arguments['query']}{tags.query_close}"
               for step in script.steps]
        out.append(f"{script.final_thought}{tags.think_close}\n\n{tags.answer_open}{script.answer}{tags.answer_close}")
        out[0] = ("" if self.think_opened_in_prompt else tags.think_open) + " " + out[0]
        return out

    def written(self, question: str, script: Script, codec: Codec) -> list[tuple[str, list[int], str]]:
        pieces: list[tuple[str, list[int], str]] = []
        for i, text in enumerate(self.script_texts(script)):
            pieces.append(("policy", codec.encode(text), text))
            if i < len(script.steps):
                ids, seen, _ = self.fitted_documents(script.steps[i].result.passages, codec)
                pieces.append(("env", ids, seen))
        return pieces

    def search_block_tokens(self, passages: Sequence[Passage], encode: Callable[[str], list[int]]) -> tuple[int, float]:
        tags = sum(len(encode(part)) for part in document_block_ends(self.tags))
        return tags, (len(encode(self.format_documents(passages))) - tags) / len(passages)

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

        >>> p, policy = TagProtocol.named("search-r1"), lambda text: [Segment(text, "policy")]
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

