"""`ToolContext`: what a run gives its tools (the retriever, k, the passages and pages `open`
reads). `Tool` (`searchrl.tools.base`) takes one and `build_tools` (`searchrl.tools.registry`)
passes it, so it lives apart from both."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from searchrl.data.types import Passage
from searchrl.tools.passages import format_passages

if TYPE_CHECKING:
    from searchrl.retrieval.base import Retriever
    from searchrl.retrieval.store import Passages
    from searchrl.retrieval.web.config import WebConfig
    from searchrl.retrieval.web.pages import PageReader

# `open` reads whole passages and pages: ~1000 tokens, room for a few in a 4k context.
MAX_OPEN_CHARS = 4000


@dataclass
class ToolContext:
    """What a run gives its tools. `format_passages`: passages -> observation text (the
    protocol's; default the documents block content in the r1searcher style); `passages`: the
    local corpus `open` reads by id and title (None: none); `pages`: how `open` reads URLs (None:
    it reads none); `max_open_chars`: the longest text `open` returns, cut with a note."""

    retriever: Retriever | None = None
    k: int = 3
    format_passages: Callable[[Sequence[Passage]], str] = format_passages
    passages: Passages | None = None
    pages: PageReader | None = None
    max_open_chars: int = MAX_OPEN_CHARS
    _owned: list = field(default_factory=list, repr=False)

    @classmethod
    def of(cls, retriever: Retriever, k: int, format_passages: Callable[[Sequence[Passage]], str] = format_passages,
           web: WebConfig | None = None, max_open_chars: int = MAX_OPEN_CHARS) -> ToolContext:
        """The context of a run searching with `retriever` (`RetrievalConfig.open()`'s): `open`
        reads the local index's passages when it has them, and URLs through web search's page
        reader (its cache, limits and budget) when the retriever is web search, else through a
        reader of `web` of its own (None: `open` reads no URLs)."""
        from searchrl.retrieval.web.pages import PageReader

        passages = getattr(retriever, "passages", None)  # a local index's store (CachedRetriever passes it on)
        pages = getattr(getattr(retriever, "inner", retriever), "pages", None)  # WebRetriever's reader
        ctx = cls(retriever, k, format_passages, passages, pages if isinstance(pages, PageReader) else None, max_open_chars)
        if ctx.pages is None and web is not None:
            ctx.pages = PageReader(web)
            ctx._owned.append(ctx.pages)
        return ctx

    def close(self) -> None:
        """Close what `of` opened for the tools (never the retriever: its owner closes it)."""
        while self._owned:
            self._owned.pop().close()
