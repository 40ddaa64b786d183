"""Retrieval: corpus reading and chunking, BM25 and dense indexes, the HTTP server and client.

`open_retriever(source)` is the one way from what a user writes (a catalog index name, an index
directory, a server URL) to a `Retriever`.
"""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlsplit

from searchrl.errors import SearchRLError
from searchrl.retrieval.base import Retriever


def open_retriever(source: str, api: str = "native") -> Retriever:
    """A `Retriever` over `source`: an `http(s)://` retrieval server URL (spoken to in `api`:
    native, r1searcher or search-r1), an index directory written by `searchrl index build`, or a
    catalog index name (`toyworld`, `localwiki`, `localwiki-dense`; built on first use).
    `api` applies to URLs only."""
    # Imported when used: each backend brings its own heavy libraries (httpx, bm25s, faiss), and
    # the catalog its registries.
    if urlsplit(source).scheme in ("http", "https"):
        from searchrl.retrieval.http import HttpRetriever

        return HttpRetriever(source, api=api)
    from searchrl.retrieval.index import open_index

    path = Path(source).expanduser()
    if path.is_dir():
        return open_index(path)
    if "/" in source or path.suffix:
        raise SearchRLError(
            f"index directory {source} does not exist; build one with `searchrl index build`, or "
            "give a catalog index name (`searchrl data list`) or an http(s):// retrieval server URL"
        )
    from searchrl.data.catalog import named_index_dir

    return open_index(named_index_dir(source))
