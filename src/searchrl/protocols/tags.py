"""Tag presets and the text they frame (docs/concepts/protocols.md): documents blocks, and the parsers of
queries, answers and reasoning.

The model writes free text with tags; the rollout engine stops generation on `stop_strings(tags)`,
reads the query with `extract_query`, and appends `format_documents(passages, tags, style)`.
Rewards and evaluation read the answer with `extract_answer`. Prompt templates
(`searchrl.protocols.prompts`) and the tag protocol (`searchrl.protocols.tagged`) are built on this module.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, fields

from searchrl.data.trajectory import Segment
from searchrl.data.types import Passage
from searchrl.registry import Registry
from searchrl.tools.passages import clean_query, format_passages


@dataclass(frozen=True)
class TagSet:
    """The eight tag strings of one protocol preset."""

    query_open: str
    query_close: str
    docs_open: str
    docs_close: str
    think_open: str = "<think>"
    think_close: str = "</think>"
    answer_open: str = "<answer>"
    answer_close: str = "</answer>"

    def as_dict(self) -> dict[str, str]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    def all_tags(self) -> tuple[str, ...]:
        return tuple(getattr(self, f.name) for f in fields(self))


TAG_PRESETS: Registry[TagSet] = Registry("tag preset")
# The barred form is what the authors' code and released checkpoints use (docs/concepts/protocols.md).
R1SEARCHER_TAGS = TAG_PRESETS.register("r1searcher")(
    TagSet(
        "<|begin_of_query|>", "<|end_of_query|>", "<|begin_of_documents|>", "<|end_of_documents|>"
    )
)
# Single-word tags: the only ones a 135M model picked up quickly in our trials (docs/concepts/protocols.md).
SEARCH_R1_TAGS = TAG_PRESETS.register("search-r1")(
    TagSet("<search>", "</search>", "<information>", "</information>")
)


def get_tags(tags: str | TagSet) -> TagSet:
    """A preset by name (`r1searcher`, `search-r1`), or the TagSet itself."""
    return tags if isinstance(tags, TagSet) else TAG_PRESETS.get(tags)


def stop_strings(tags: TagSet) -> list[str]:
    """Strings on which the engine pauses generation: end of a query (run a search) or of the
    answer (done). EOS and the length budget are the backend's business."""
    return [tags.query_close, tags.answer_close]


# ----------------------------------------------------------------------------------------------
# Documents blocks


def format_documents(passages: Sequence[Passage], tags: TagSet, style: str = "r1searcher") -> str:
    """The environment's documents block, inserted right after the end-of-query tag.

    >>> print(format_documents([Passage("7", "Quellbridge", "A town on the Tessaly.")], R1SEARCHER_TAGS), end="|")
    <BLANKLINE>
    <BLANKLINE>
    <|begin_of_documents|>
    (1)Title: Quellbridge Text: A town on the Tessaly.
    <|end_of_documents|>
    <BLANKLINE>
    |
    """
    return f"\n\n{tags.docs_open}\n{format_passages(passages, style, tags.all_tags())}\n{tags.docs_close}\n\n"


# ----------------------------------------------------------------------------------------------
# Parsing

def extract_query(text: str, tags: TagSet) -> str | None:
    """The query after the LAST begin-of-query tag (docs/concepts/rollout.md), cut at the end-of-query tag if present.

    None when there is no begin-of-query tag, the query is empty, or a stray end tag follows the
    last complete query (the generation stopped on an end tag that opens nothing new: searching
    the old query again would reward a stutter).

    >>> extract_query("I should look. <|begin_of_query|> 'Quellbridge river'<|end_of_query|>", R1SEARCHER_TAGS)
    'Quellbridge river'
    >>> extract_query("<search> a </search> then <search>b  c</search>", SEARCH_R1_TAGS)
    'b c'
    """
    start = text.rfind(tags.query_open)
    if start < 0:
        return None
    rest = text[start + len(tags.query_open) :]
    end = rest.find(tags.query_close)
    if end < 0:
        return clean_query(rest)
    if rest.find(tags.query_close, end + len(tags.query_close)) >= 0:
        return None
    return clean_query(rest[:end])


def extract_queries(text: str, tags: TagSet) -> list[str]:
    """Every complete, non-empty query in order (unclosed or empty ones are skipped)."""
    pattern = re.escape(tags.query_open) + r"(.*?)" + re.escape(tags.query_close)
    found = (
        clean_query(_after_last(m.group(1), tags.query_open))
        for m in re.finditer(pattern, text, re.DOTALL)
    )
    return [q for q in found if q is not None]


def _after_last(text: str, tag: str) -> str:
    # With nested opens (`<q> a <q> b </q>`) the innermost text is the one the engine searched for.
    i = text.rfind(tag)
    return text if i < 0 else text[i + len(tag) :]


def extract_answer(text: str, tags: TagSet) -> str | None:
    """The text of the LAST complete answer block, stripped; None when there is none.

    >>> extract_answer("<think>x</think>\\n\\n <answer> Tessaly </answer>", R1SEARCHER_TAGS)
    'Tessaly'
    >>> extract_answer("<answer>unfinished", R1SEARCHER_TAGS) is None
    True
    """
    end = text.rfind(tags.answer_close)
    if end < 0:
        return None
    start = text.rfind(tags.answer_open, 0, end)
    if start < 0:
        return None
    return text[start + len(tags.answer_open) : end].strip()


def extract_reasoning(
    text: str,
    tags: TagSet,
    *,
    think_opened_in_prompt: bool = True,
    drop_documents: bool = False,
) -> str | None:
    """The text of the (first) think block, stripped; None when there is no think block.

    With `think_opened_in_prompt` (the prompt ended with the think tag) the block starts at the
    beginning of `text`. An unclosed block runs to the answer tag or the end of the text.
    """
    if think_opened_in_prompt:
        begin = 0
    else:
        i = text.find(tags.think_open)
        if i < 0:
            return None
        begin = i + len(tags.think_open)
    stops = [
        j
        for j in (text.find(tags.think_close, begin), text.find(tags.answer_open, begin))
        if j >= 0
    ]
    body = text[begin : min(stops) if stops else len(text)]
    if drop_documents:
        body = "".join(s.text for s in segments_from_text(body, tags) if s.source == "policy")
    return body.strip()


def segments_from_text(text: str, tags: TagSet) -> list[Segment]:
    """Rebuild provenance for a plain-text trajectory (e.g. the authors' released ones): every
    complete documents block, with the blank lines around it, is `env`; the rest is `policy`.

    Text alone cannot tell a forged block from an inserted one; use this only for records whose
    engine is known to have inserted every block (never on our own trajectories, which carry
    their segments).
    """
    pattern = (
        r"\n{0,2}" + re.escape(tags.docs_open) + r".*?" + re.escape(tags.docs_close) + r"\n{0,2}"
    )
    segments: list[Segment] = []
    pos = 0
    for m in re.finditer(pattern, text, re.DOTALL):
        if m.start() > pos:
            segments.append(Segment(text[pos : m.start()], "policy"))
        segments.append(Segment(m.group(0), "env"))
        pos = m.end()
    if pos < len(text):
        segments.append(Segment(text[pos:], "policy"))
    return segments
