"""Dense retrieval: sentence-transformers embeddings in a FAISS index, inner-product metric.

Embeddings are L2-normalised, so inner product = cosine. The default factory "Flat" is the
paper's exact search; "IVF4096,PQ96x8", "OPQ96,IVF4096,PQ96", "HNSW32", "SQ8", ... trade recall
for memory and speed at Wikipedia scale (docs/scale.md); any factory string FAISS accepts works.
An index may be split into shards (consecutive rows, one file each) that are searched in
parallel and merged exactly. The FAISS mechanics live in `faiss_index`, the encoding in
`encoding`.
"""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import Iterable, Sequence
from pathlib import Path

import faiss

from searchrl.assets import load_embedder
from searchrl.data.types import Passage
from searchrl.errors import SearchRLError
from searchrl.retrieval.base import Retriever
from searchrl.retrieval.encoding import (
    ENCODE_CHUNK,
    default_prefixes,
    dimension,
    encode,
    encode_corpus,
    passages_digest,
    remove_encoding,
)
from searchrl.retrieval.faiss_index import (
    add_vectors,
    apply_search_settings,
    check_trainable,
    combine_shards,
    new_faiss_index,
    read_faiss,
    shard_bounds,
    to_gpu,
    train_index,
)
from searchrl.retrieval.kinds import INDEX_KINDS, BuildOptions, SearchSettings
from searchrl.retrieval.store import (
    MANIFEST,
    Passages,
    PassageStore,
    StoredIndex,
    as_passages,
    read_manifest,
    save_passages,
    write_manifest,
)

FAISS_FILE = "dense.faiss"


def shard_file(i: int, shards: int) -> str:
    """File of shard `i` of `shards`: `dense.faiss` when unsharded, as before shards existed."""
    return FAISS_FILE if shards == 1 else f"dense-{i:03d}-of-{shards:03d}.faiss"


@INDEX_KINDS.register("dense")
class DenseIndex(StoredIndex, Retriever):
    """Exact (Flat) or approximate FAISS search over normalised sentence embeddings."""

    kind = "dense"

    def __init__(
        self,
        parts: faiss.Index | Sequence[faiss.Index],
        passages: Passages,
        *,
        embedder: str = "minilm",
        factory: str = "Flat",
        batch_size: int = 64,
        query_prefix: str | None = None,
        passage_prefix: str | None = None,
        settings: SearchSettings | None = None,
        model=None,
    ) -> None:
        self.parts = [parts] if isinstance(parts, faiss.Index) else list(parts)  # CPU shards
        total = sum(p.ntotal for p in self.parts)
        if total != len(passages):
            raise SearchRLError(
                f"FAISS index holds {total} vectors but there are {len(passages)} passages"
            )
        defaults = default_prefixes(embedder)
        self.passages = passages
        self.embedder = embedder
        self.factory = factory
        self.batch_size = batch_size
        self.query_prefix = defaults[0] if query_prefix is None else query_prefix
        self.passage_prefix = defaults[1] if passage_prefix is None else passage_prefix
        self.settings = settings = settings or SearchSettings()
        for part in self.parts:
            apply_search_settings(part, settings, factory)
        # GPU copies get the settings the CPU shards carry when they are made.
        self.index = combine_shards([to_gpu(p) for p in self.parts] if settings.gpu else self.parts)
        self._model = model
        self._home: Path | None = None  # the folder holding its FAISS files (built or loaded there)
        self.memory_mapped = False  # True when the FAISS files are mapped rather than read

    @classmethod
    def build(
        cls,
        passages: Iterable[Passage],
        *,
        embedder: str = "minilm",
        factory: str = "Flat",
        batch_size: int = 64,
        shards: int = 1,
        settings: SearchSettings | None = None,
        query_prefix: str | None = None,
        passage_prefix: str | None = None,
        encode_chunk: int = ENCODE_CHUNK,
        folder: Path | None = None,
        progress: bool = True,
    ) -> DenseIndex:
        """Encode `passages` into a memory-mapped embeddings file (resumable, in chunks), train
        the factory's index on a sample of it, and add the vectors chunk by chunk, shard by shard.

        `folder` is the index folder being built (what `build_index` passes; else a temporary
        one is used): the embeddings file lives there until the index holds the vectors, a
        build interrupted there continues where it stopped, and each finished shard is written
        there and mapped back, so RAM never holds the vectors nor more than the shard being
        filled."""
        store = as_passages(passages)
        model = load_embedder(embedder)
        dim = dimension(model)
        # A bad factory or shard count fails before hours of encoding, not after.
        template = new_faiss_index(dim, factory)
        check_trainable(template, len(store), factory)
        bounds = shard_bounds(len(store), shards)
        prefixes = default_prefixes(embedder)
        query_prefix = prefixes[0] if query_prefix is None else query_prefix
        passage_prefix = prefixes[1] if passage_prefix is None else passage_prefix
        home = Path(folder).resolve() if folder is not None else None
        with contextlib.ExitStack() as stack:
            work = home or Path(stack.enter_context(tempfile.TemporaryDirectory()))
            key = {
                "embedder": embedder,
                "prefix": passage_prefix,
                "passages": passages_digest(store),
            }
            vectors = encode_corpus(
                model,
                store,
                work,
                prefix=passage_prefix,
                key=key,
                batch_size=batch_size,
                chunk=encode_chunk,
                progress=progress,
            )
            train_index(template, vectors, factory)
            parts = []
            for i, (start, stop) in enumerate(bounds):
                last = i == shards - 1
                part = template if last else faiss.clone_index(template)
                template = None if last else template  # a written shard is freed, the last too
                add_vectors(part, vectors[start:stop], progress=progress)
                if home is not None:
                    path = home / shard_file(i, shards)
                    faiss.write_index(part, str(path))
                    del part
                    part, _ = read_faiss(path, True, factory)
                parts.append(part)
            del vectors  # the memory map must close before its file goes
            remove_encoding(work)
        index = cls(
            parts,
            store,
            embedder=embedder,
            factory=factory,
            batch_size=batch_size,
            query_prefix=query_prefix,
            passage_prefix=passage_prefix,
            settings=settings,
            model=model,
        )
        index._home = home
        index.memory_mapped = home is not None
        return index

    @classmethod
    def build_from(cls, passages: Passages, options: BuildOptions) -> DenseIndex:
        return cls.build(
            passages,
            embedder=options.embedder,
            factory=options.factory,
            batch_size=options.batch_size,
            shards=options.shards,
            settings=SearchSettings(
                nprobe=options.nprobe, ef_search=options.ef_search, k_factor=options.k_factor
            ),
            query_prefix=options.query_prefix,
            passage_prefix=options.passage_prefix,
            encode_chunk=options.encode_chunk,
            folder=passages.folder if isinstance(passages, PassageStore) else None,
            progress=options.progress,
        )

    def save(self, folder: Path, **manifest_fields) -> Path:
        """Write an index folder that `open_index` / `DenseIndex.load` can read."""
        folder = Path(folder)
        home = self._home == folder.resolve()
        if home and (folder / MANIFEST).is_file():
            return folder  # unchanged since loading; overwriting a mapped file could crash readers
        folder.mkdir(parents=True, exist_ok=True)
        save_passages(self.passages, folder)  # a no-op for passages stored there already
        if not home:  # an index built in `folder` has its FAISS files there already
            for old in folder.glob("dense*.faiss"):
                old.unlink()
            for i, part in enumerate(self.parts):
                faiss.write_index(part, str(folder / shard_file(i, len(self.parts))))
        write_manifest(
            folder,
            self.kind,
            len(self.passages),
            embedder=self.embedder,
            factory=self.factory,
            dim=int(self.index.d),
            metric="inner_product",
            query_prefix=self.query_prefix,
            passage_prefix=self.passage_prefix,
            shards=[int(p.ntotal) for p in self.parts],
            nprobe=self.settings.nprobe,
            ef_search=self.settings.ef_search,
            k_factor=self.settings.k_factor,
            **manifest_fields,
        )
        return folder

    @classmethod
    def load(
        cls,
        folder: Path,
        mmap: bool = True,
        *,
        batch_size: int = 64,
        settings: SearchSettings | None = None,
    ) -> DenseIndex:
        """Open a saved index. `mmap=True` maps the vectors instead of reading them into RAM
        where the index type allows it (flat codes, IVF lists); otherwise it reads normally.
        `settings` given override those recorded at build time."""
        folder = Path(folder)
        manifest = read_manifest(folder)
        if manifest["kind"] != cls.kind:
            raise SearchRLError(
                f"{folder} holds a {manifest['kind']!r} index, not dense; use open_index"
            )
        factory = manifest.get("factory") or "Flat"
        shards = len(manifest.get("shards") or [0])
        paths = [folder / shard_file(i, shards) for i in range(shards)]
        missing = [p.name for p in paths if not p.is_file()]
        if missing:
            raise SearchRLError(f"{folder}: {', '.join(missing)} missing; rebuild the index")
        read = [read_faiss(path, mmap, factory) for path in paths]
        recorded = SearchSettings(
            nprobe=manifest.get("nprobe"), ef_search=manifest.get("ef_search")
        )
        loaded = cls(
            [index for index, _ in read],
            PassageStore(folder),
            embedder=manifest.get("embedder") or "minilm",
            factory=factory,
            batch_size=batch_size,
            query_prefix=manifest.get("query_prefix", ""),
            passage_prefix=manifest.get("passage_prefix", ""),
            settings=(settings or SearchSettings()).over(recorded),
        )
        loaded._home = folder.resolve()
        loaded.memory_mapped = all(mapped for _, mapped in read)
        return loaded

    @property
    def model(self):
        """The query encoder, loaded on first search so opening an index stays fast."""
        if self._model is None:
            model = load_embedder(self.embedder)
            if dimension(model) != self.index.d:
                raise SearchRLError(
                    f"embedder {self.embedder!r} gives {dimension(model)}-d vectors but the index holds "
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
        shards = f", {len(self.parts)} shards" if len(self.parts) > 1 else ""
        return (
            f"DenseIndex({len(self.passages)} passages, {self.embedder}, {self.factory!r}{shards})"
        )
