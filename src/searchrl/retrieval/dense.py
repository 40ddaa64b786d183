"""Dense retrieval: sentence-transformers embeddings in a FAISS index, inner-product metric.

Embeddings are L2-normalised, so inner product = cosine. The default factory "Flat" is the
paper's exact search; "HNSW32", "IVF4096,PQ64", "SQ8", ... trade recall for memory and speed
at Wikipedia scale (docs/scale.md). Any factory string FAISS accepts works.
"""

from __future__ import annotations

import logging
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path

import faiss
import numpy as np
from tqdm.auto import tqdm

from searchrl.assets import load_embedder
from searchrl.data.types import Passage
from searchrl.errors import SearchRLError
from searchrl.retrieval.base import Retriever
from searchrl.retrieval.kinds import INDEX_KINDS, BuildOptions
from searchrl.retrieval.store import (
    Passages,
    PassageStore,
    StoredIndex,
    as_passages,
    index_text,
    read_manifest,
    save_passages,
    write_manifest,
)

log = logging.getLogger(__name__)

FAISS_FILE = "dense.faiss"
MAX_TRAIN = 200_000  # k-means on more points barely helps and costs RAM: 200k x 1024 x 4 B = 0.8 GB
# Embedders trained with instructions retrieve worse without them (BGE, E5 model cards).
_PREFIXES = {
    "bge": ("Represent this sentence for searching relevant passages: ", ""),
    "e5": ("query: ", "passage: "),
}


def default_prefixes(embedder: str) -> tuple[str, str]:
    """(query prefix, passage prefix) the embedder was trained with; ("", "") if none."""
    name = embedder.lower().rsplit("/", 1)[-1]
    for family, prefixes in _PREFIXES.items():
        if name.startswith(family) or f"-{family}-" in name:
            return prefixes
    return "", ""


def encode(model, texts: list[str], batch_size: int = 64) -> np.ndarray:
    """Texts -> unit-norm float32 embeddings [N, D], C-contiguous as FAISS wants."""
    vectors = model.encode(
        texts,
        batch_size=batch_size,
        normalize_embeddings=True,
        convert_to_numpy=True,
        show_progress_bar=False,
    )
    return np.ascontiguousarray(vectors, dtype=np.float32)


def _dimension(model) -> int:
    get = getattr(model, "get_embedding_dimension", None) or model.get_sentence_embedding_dimension
    return int(get())


def new_faiss_index(dim: int, factory: str) -> faiss.Index:
    try:
        return faiss.index_factory(dim, factory, faiss.METRIC_INNER_PRODUCT)
    except RuntimeError as exc:
        reason = str(exc).strip().splitlines()[-1]
        raise SearchRLError(
            f"FAISS cannot build factory {factory!r} for {dim}-d vectors ({reason}). "
            "Examples: Flat, HNSW32, SQ8, IVF1024,Flat, IVF4096,PQ64 (PQ m must divide the dimension)."
        ) from None


def _tune_for_search(index: faiss.Index) -> None:
    # FAISS defaults favour speed over recall (nprobe=1 scans 1 list; efSearch=16): raise them.
    ivf = faiss.try_extract_index_ivf(index)
    if ivf is not None:
        ivf.nprobe = max(ivf.nprobe, min(ivf.nlist, 32))
    hnsw = getattr(faiss.downcast_index(index), "hnsw", None)
    if hnsw is not None:
        hnsw.efSearch = max(hnsw.efSearch, 64)


def _text_batches(passages: Iterable[Passage], size: int, prefix: str) -> Iterator[list[str]]:
    batch: list[str] = []
    for p in passages:
        batch.append(prefix + index_text(p))
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch


def _train(index: faiss.Index, vectors: np.ndarray, factory: str) -> None:
    n = len(vectors)
    rows = np.sort(np.random.default_rng(0).choice(n, size=min(n, MAX_TRAIN), replace=False))
    try:
        index.train(np.ascontiguousarray(vectors[rows]))
    except RuntimeError as exc:
        reason = str(exc).strip().splitlines()[-1]
        raise SearchRLError(
            f"FAISS factory {factory!r} could not be trained on {len(rows)} vectors ({reason}). "
            "A small corpus needs fewer IVF lists (about N/39 at most) or a factory without training "
            "(Flat, HNSW32)."
        ) from None


@INDEX_KINDS.register("dense")
class DenseIndex(StoredIndex, Retriever):
    """Exact (Flat) or approximate FAISS search over normalised sentence embeddings."""

    kind = "dense"

    def __init__(
        self,
        index: faiss.Index,
        passages: Passages,
        *,
        embedder: str = "minilm",
        factory: str = "Flat",
        batch_size: int = 64,
        query_prefix: str | None = None,
        model=None,
    ) -> None:
        if index.ntotal != len(passages):
            raise SearchRLError(
                f"FAISS index holds {index.ntotal} vectors but there are {len(passages)} passages"
            )
        self.index = index
        self.passages = passages
        self.embedder = embedder
        self.factory = factory
        self.batch_size = batch_size
        self.query_prefix = default_prefixes(embedder)[0] if query_prefix is None else query_prefix
        self._model = model
        self._loaded_from: Path | None = None
        self.memory_mapped = False  # True when `load` mapped the vectors instead of reading them
        _tune_for_search(index)

    @classmethod
    def build(
        cls,
        passages: Iterable[Passage],
        *,
        embedder: str = "minilm",
        factory: str = "Flat",
        batch_size: int = 64,
        progress: bool = True,
    ) -> DenseIndex:
        """Encode `passages` and index them. Factories that need training (IVF, PQ, SQ) get
        the vectors parked in a memory-mapped scratch file first, then trained on a sample."""
        store = as_passages(passages)
        model = load_embedder(embedder)
        dim = _dimension(model)
        index = new_faiss_index(dim, factory)
        query_prefix, passage_prefix = default_prefixes(embedder)
        n = len(store)
        batches = _text_batches(store, batch_size * 8, passage_prefix)
        bar = tqdm(total=n, desc=f"Encode passages ({embedder})", unit="psg", disable=not progress)
        if index.is_trained:
            for texts in batches:
                index.add(encode(model, texts, batch_size))
                bar.update(len(texts))
        else:
            scratch = store.folder if isinstance(store, PassageStore) else None
            with tempfile.TemporaryDirectory(dir=scratch) as tmp:
                vectors = np.lib.format.open_memmap(
                    Path(tmp) / "vectors.npy", "w+", np.float32, (n, dim)
                )
                start = 0
                for texts in batches:
                    vectors[start : start + len(texts)] = encode(model, texts, batch_size)
                    start += len(texts)
                    bar.update(len(texts))
                bar.set_description(f"Train FAISS {factory}")
                _train(index, vectors, factory)
                for s in range(0, n, 65536):
                    index.add(np.ascontiguousarray(vectors[s : s + 65536]))
                del vectors  # the memmap must close before its folder goes
        bar.close()
        return cls(
            index,
            store,
            embedder=embedder,
            factory=factory,
            batch_size=batch_size,
            query_prefix=query_prefix,
            model=model,
        )

    @classmethod
    def build_from(cls, passages: Passages, options: BuildOptions) -> DenseIndex:
        return cls.build(
            passages,
            embedder=options.embedder,
            factory=options.factory,
            batch_size=options.batch_size,
            progress=options.progress,
        )

    def save(self, folder: Path, **manifest_fields) -> Path:
        """Write an index folder that `open_index` / `DenseIndex.load` can read."""
        folder = Path(folder)
        if self._loaded_from == folder.resolve():
            return folder  # unchanged since loading; overwriting a mapped file could crash readers
        folder.mkdir(parents=True, exist_ok=True)
        save_passages(self.passages, folder)
        faiss.write_index(self.index, str(folder / FAISS_FILE))
        write_manifest(
            folder,
            self.kind,
            len(self.passages),
            embedder=self.embedder,
            factory=self.factory,
            dim=int(self.index.d),
            metric="inner_product",
            query_prefix=self.query_prefix,
            **manifest_fields,
        )
        return folder

    @classmethod
    def load(cls, folder: Path, mmap: bool = True, *, batch_size: int = 64) -> DenseIndex:
        """Open a saved index. `mmap=True` maps the vectors instead of reading them into RAM
        where the index type allows it (flat codes, IVF lists); otherwise it reads normally."""
        folder = Path(folder)
        manifest = read_manifest(folder)
        if manifest["kind"] != cls.kind:
            raise SearchRLError(
                f"{folder} holds a {manifest['kind']!r} index, not dense; use open_index"
            )
        path = folder / FAISS_FILE
        if not path.is_file():
            raise SearchRLError(f"{folder}: {FAISS_FILE} is missing; rebuild the index")
        factory = manifest.get("factory") or "Flat"
        index, mapped = _read_faiss(path, mmap, factory)
        loaded = cls(
            index,
            PassageStore(folder),
            embedder=manifest.get("embedder") or "minilm",
            factory=factory,
            batch_size=batch_size,
            query_prefix=manifest.get("query_prefix", ""),
        )
        loaded._loaded_from = folder.resolve()
        loaded.memory_mapped = mapped
        return loaded

    @property
    def model(self):
        """The query encoder, loaded on first search so opening an index stays fast."""
        if self._model is None:
            model = load_embedder(self.embedder)
            if _dimension(model) != self.index.d:
                raise SearchRLError(
                    f"embedder {self.embedder!r} gives {_dimension(model)}-d vectors but the index holds "
                    f"{self.index.d}-d ones; query with the embedder the index was built with"
                )
            self._model = model
        return self._model

    def search(self, queries: list[str], k: int) -> list[list[Passage]]:
        results: list[list[Passage]] = [[] for _ in queries]
        live = [i for i, q in enumerate(queries) if q and q.strip()]
        if not live or k <= 0:
            return results
        vectors = encode(
            self.model, [self.query_prefix + queries[i].strip() for i in live], self.batch_size
        )
        scores, rows = self.index.search(vectors, min(k, self.index.ntotal))  # [Q, k] each
        for i, row_ids, row_scores in zip(live, rows, scores):
            # Approximate indexes pad with -1 when they find fewer than k neighbours.
            hits = [(int(r), float(s)) for r, s in zip(row_ids, row_scores) if r >= 0]
            results[i] = self.materialise(hits)
        return results

    def __repr__(self) -> str:
        return f"DenseIndex({len(self.passages)} passages, {self.embedder}, {self.factory!r})"


def _read_faiss(path: Path, mmap: bool, factory: str) -> tuple[faiss.Index, bool]:
    if mmap:
        # IO_FLAG_MMAP maps only IVF inverted lists; flat codes (Flat, HNSW, SQ, PQ) need
        # IO_FLAG_MMAP_IFC, else a Flat index is read fully into RAM (measured: 147 MB vs 0).
        flag = (
            faiss.IO_FLAG_MMAP
            if "IVF" in factory.upper()
            else getattr(faiss, "IO_FLAG_MMAP_IFC", faiss.IO_FLAG_MMAP)
        )
        try:
            return faiss.read_index(str(path), flag), True
        except RuntimeError as exc:
            log.info(
                "FAISS cannot memory-map %s (%s); reading it into memory",
                path,
                str(exc).splitlines()[-1],
            )
    return faiss.read_index(str(path)), False
