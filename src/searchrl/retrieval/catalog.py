"""Named indexes over the catalog's corpora, built on first use and cached under `cache_dir()`:
`named_index_dir("localwiki")` (what `searchrl.retrieval.open_retriever("localwiki")` opens).
The corpora are `searchrl.data.catalog`'s; the indexes are retrieval's, so the data package
never imports retrieval back.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from searchrl.data.catalog import cached_build, localwiki_dir, world_dir, world_rel
from searchrl.errors import SearchRLError
from searchrl.paths import cache_dir
from searchrl.registry import Registry


@dataclass(frozen=True)
class IndexEntry:
    name: str
    description: str
    build: Callable[[Path], None]  # writes the index into the given (empty) folder


INDEXES: Registry[IndexEntry] = Registry("index")


def _index_entry(name: str, description: str, passages: Callable[[], list], kind: str) -> None:
    def build(tmp: Path) -> None:
        from searchrl.retrieval.index import build_index

        items = passages()
        print(f"building index {name!r} over {len(items)} passages ({kind}; first use, cached afterwards) ...",
              file=sys.stderr, flush=True)
        started = time.perf_counter()
        build_index(items, tmp, kind=kind, source=f"catalog:{name}")
        print(f"index {name!r} built in {time.perf_counter() - started:.1f}s", file=sys.stderr, flush=True)

    INDEXES.register(name)(IndexEntry(name, description, build))


def _localwiki_passages() -> list:
    from searchrl.data.localwiki import read_corpus

    return read_corpus(localwiki_dir() / "corpus.jsonl")


def _world_passages(world: str) -> Callable[[], list]:
    def passages() -> list:
        from searchrl.data.localwiki import read_corpus

        return read_corpus(world_dir(world) / "corpus.jsonl")

    return passages


_index_entry("toyworld", "BM25 over the toy world corpus", _world_passages("toyworld"), "bm25")
_index_entry("toyworld-alt", "BM25 over the held-out toy world corpus", _world_passages("toyworld-alt"), "bm25")
_index_entry("localwiki", "BM25 over localwiki (~22k real Wikipedia paragraphs)", _localwiki_passages, "bm25")
_index_entry("localwiki-dense", "all-MiniLM-L6-v2 + exact inner-product FAISS over localwiki", _localwiki_passages, "dense")


def _index_rel(name: str) -> str:
    if name in ("toyworld", "toyworld-alt"):
        return f"indexes/{name}-{world_rel(name).rsplit('-', 1)[1]}"
    from searchrl.data.localwiki import VERSION

    return f"indexes/{name}-v{VERSION}"


def named_index_dir(name: str) -> Path:
    """The folder of catalog index `name`, built on first use."""
    if name not in INDEXES:
        raise SearchRLError(
            f"unknown index {name!r}; give a catalog index ({', '.join(INDEXES.names())}), "
            "the directory of an index built with `searchrl index build`, or an http(s):// "
            "retrieval server URL"
        )
    return cached_build(_index_rel(name), INDEXES.get(name).build)


def list_indexes() -> list[tuple[str, str, bool]]:
    """(name, description, already built?) for every catalog index."""
    out = []
    for name in INDEXES.names():
        try:
            built = (cache_dir() / _index_rel(name)).is_dir()
        except ImportError:
            built = False
        out.append((name, INDEXES.get(name).description, built))
    return out
