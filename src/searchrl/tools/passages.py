"""The text of passages as tools return them: one line per passage in a documents style
(`DOC_STYLES`), and the clean-up of a query's text. A protocol frames these lines (the tag
protocol's documents block, `searchrl.protocols.tags`); a tool never knows which protocol reads it."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from searchrl.data.types import Passage
from searchrl.registry import Registry

DOC_STYLES: Registry[Callable[[int, Passage], str]] = Registry("documents style")


@DOC_STYLES.register("r1searcher")
def _doc_r1searcher(i: int, p: Passage) -> str:
    # The shape of the authors' released trajectories: `(1)Title: Wapping Text: Wapping is ...`.
    # Checkpoints trained on it see exactly what they saw in training.
    return f"({i})Title: {p.title} Text: {p.text}"


@DOC_STYLES.register("title-lines")
def _doc_title_lines(i: int, p: Passage) -> str:
    # The documents block's other shape (docs/concepts/protocols.md): title on its own line, text below.
    return f"({i}) Title: {p.title}\n{p.text}"


def _neutralize(text: str, tags: Sequence[str]) -> str:
    # A corpus passage that happens to contain a protocol tag would let the documents block end
    # early or plant an answer; tags inside passages are replaced by a space.
    for tag in tags:
        if tag in text:
            text = text.replace(tag, " ")
    return text


def format_passages(passages: Sequence[Passage], style: str = "r1searcher", neutralize: Sequence[str] = ()) -> str:
    """The content of a documents block: one line per passage in `style` (the `search` tool's
    observation), with the strings of `neutralize` (a protocol's tags) inside passages replaced by a space.

    >>> format_passages([Passage("7", "Quellbridge", "A town."), Passage("8", "Tessaly", "A river.")])
    '(1)Title: Quellbridge Text: A town.\\n(2)Title: Tessaly Text: A river.'
    """
    line = DOC_STYLES.get(style)
    if neutralize:
        passages = [Passage(p.id, _neutralize(p.title, neutralize), _neutralize(p.text, neutralize)) for p in passages]
    return "\n".join(line(i, p) for i, p in enumerate(passages, start=1)) or "(no documents found)"


_QUOTES = "\"'`\u201c\u201d\u2018\u2019\u00ab\u00bb"


def clean_query(raw: str) -> str | None:
    """Strip surrounding quotes and whitespace, collapse inner whitespace; empty -> None.

    >>> clean_query('  "capital of   France"\\n')
    'capital of France'
    >>> clean_query(' "" ') is None
    True
    """
    q = " ".join(raw.split()).strip(_QUOTES + " ")
    return q or None
