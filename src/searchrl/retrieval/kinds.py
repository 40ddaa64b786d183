"""The registry of index kinds (`bm25`, `dense`) and the options a kind is built and searched with.

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
    shards: int = 1  # dense: FAISS shards searched in parallel, results merged exactly
    nprobe: int | None = None  # dense IVF: lists probed per query, recorded as the index's default
    ef_search: int | None = None  # dense HNSW: search beam width, recorded likewise
    k_factor: int | None = None  # dense refine stage: candidates re-ranked per hit, likewise
    query_prefix: str | None = None  # dense: None = the embedder's documented prefix
    passage_prefix: str | None = None
    encode_chunk: int = 16_384  # dense: passages encoded between two resumable checkpoints


@dataclass(frozen=True)
class SearchSettings:
    """Search-time knobs of approximate indexes; None keeps the index's recorded value or our
    default. More lists probed / a wider HNSW beam: higher recall, slower queries."""

    nprobe: int | None = None  # IVF: inverted lists scanned per query (of nlist)
    ef_search: int | None = None  # HNSW: candidate list size during the graph walk
    k_factor: int | None = None  # refine stage (RFlat, Refine(...)): candidates re-ranked per hit
    gpu: bool = False  # search on every GPU FAISS sees (faiss-gpu builds); ignored without one

    def over(self, recorded: SearchSettings) -> SearchSettings:
        """These settings where given, `recorded` (e.g. the index's manifest) elsewhere."""
        return SearchSettings(
            nprobe=recorded.nprobe if self.nprobe is None else self.nprobe,
            ef_search=recorded.ef_search if self.ef_search is None else self.ef_search,
            k_factor=recorded.k_factor if self.k_factor is None else self.k_factor,
            gpu=self.gpu or recorded.gpu,
        )
