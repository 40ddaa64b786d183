"""The registry of index kinds (`bm25`, `dense`) and the options a kind is built with.

Each registered class provides `build_from(passages, options) -> index` with `save(folder)`, and
`load(folder, mmap) -> index`; `searchrl.retrieval.index` builds and opens indexes through it.
"""

from __future__ import annotations

from dataclasses import dataclass

from searchrl.registry import Registry

INDEX_KINDS: Registry[type] = Registry("index kind")


@dataclass(frozen=True)
class BuildOptions:
    """Everything a kind may need to build; each kind reads the fields that concern it."""

    embedder: str = "minilm"
    factory: str = "Flat"
    batch_size: int = 64
    progress: bool = True
