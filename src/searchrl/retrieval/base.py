"""The one retrieval interface every backend implements (BM25, dense FAISS, HTTP, web)."""

from __future__ import annotations

from abc import ABC, abstractmethod

from typing_extensions import Self

from searchrl.data.types import Passage


class Retriever(ABC):
    """Batched passage search.

    Promises: one result list per query, in query order; an empty or blank query gets [];
    a backend that stays down after its retries raises `RetrievalUnavailable`.
    """

    @abstractmethod
    def search(self, queries: list[str], k: int) -> list[list[Passage]]:
        """Top-`k` passages for each query, best first, `score` filled in."""

    def check(self) -> None:
        """Raise `RetrievalUnavailable` when searches cannot be served now (a server that does not
        answer), so a command fails before it loads a model; a local index is always ready."""

    def usage(self) -> dict[str, float] | None:
        """What the searches of this retriever's run have cost so far (web search: requests,
        cache hits, dollars, pages; `searchrl.retrieval.web.budget.COUNTERS`); None when they
        cost nothing."""
        return None

    def close(self) -> None:
        """Release sockets, memory maps, ...; the default holds nothing."""

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
