"""Build an index folder from passages, and open one as a `Retriever`.

Index kinds (bm25, dense) register themselves in `searchrl.retrieval.kinds.INDEX_KINDS`.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import tempfile
from array import array
from collections import Counter
from collections.abc import Iterable, Iterator
from pathlib import Path

import numpy as np

from searchrl.data.types import Passage
from searchrl.errors import DataError, SearchRLError, listing
from searchrl.retrieval.base import Retriever
from searchrl.retrieval.encoding import EMBEDDINGS, PROGRESS, encoded_rows, remove_encoding
from searchrl.retrieval.kinds import INDEX_KINDS, BuildOptions, SearchSettings
from searchrl.retrieval.store import PassageStore, read_manifest

log = logging.getLogger(__name__)

_KIND_MODULES = {"bm25": "searchrl.retrieval.bm25", "dense": "searchrl.retrieval.dense"}


def _register_builtin_kinds(kind: str | None = None) -> None:
    # Imported on use: each kind brings its own heavy library (bm25s, faiss), so opening a BM25
    # index works where faiss is not installed.
    import importlib

    for name in [kind] if kind in _KIND_MODULES else _KIND_MODULES:
        importlib.import_module(_KIND_MODULES[name])


def index_kinds() -> list[str]:
    _register_builtin_kinds()
    return INDEX_KINDS.names()


def build_index(
    passages: Iterable[Passage],
    out_dir: Path,
    kind: str = "bm25",
    *,
    embedder: str = "minilm",
    factory: str = "Flat",
    batch_size: int = 64,
    shards: int = 1,
    nprobe: int | None = None,
    ef_search: int | None = None,
    k_factor: int | None = None,
    query_prefix: str | None = None,
    passage_prefix: str | None = None,
    encode_chunk: int = BuildOptions.encode_chunk,
    overwrite: bool = False,
    progress: bool = True,
    **manifest_fields,
) -> Path:
    """Build a `kind` index of `passages` into `out_dir` and return `out_dir`.

    The passages are streamed to disk first, so a corpus larger than RAM can be indexed as
    long as the index itself fits. Everything is built in the sibling folder `.NAME.building`,
    renamed into place at the end: a crash never leaves a half-built index behind. A dense
    build stopped after encoding some passages keeps that folder, and the same call run again
    continues the encoding where it stopped (a changed corpus or embedder starts it afresh).
    Extra keyword arguments (e.g. `source="corpus.jsonl"`) are recorded in the manifest.
    """
    _register_builtin_kinds(kind)
    cls = INDEX_KINDS.get(kind)
    out_dir = Path(out_dir)
    if out_dir.exists() and not out_dir.is_dir():
        raise SearchRLError(f"{out_dir} exists and is not a directory; choose another --out")
    if out_dir.is_dir() and any(out_dir.iterdir()) and not overwrite:
        raise SearchRLError(
            f"{out_dir} already exists and is not empty; pass --overwrite or choose another --out"
        )
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    work = out_dir.parent / f".{out_dir.name}.building"
    with _building(work, out_dir):
        try:
            id_hashes = array("q")  # 8 bytes a passage: 21M passages are checked in 170 MB
            store = PassageStore.write(_hashing_ids(passages, id_hashes), work, progress=progress)
            _check_unique_ids(store, id_hashes, manifest_fields.get("source"))
            options = BuildOptions(
                embedder=embedder,
                factory=factory,
                batch_size=batch_size,
                progress=progress,
                shards=shards,
                nprobe=nprobe,
                ef_search=ef_search,
                k_factor=k_factor,
                query_prefix=query_prefix,
                passage_prefix=passage_prefix,
                encode_chunk=encode_chunk,
            )
            index = cls.build_from(store, options)
            index.save(work, **manifest_fields)
            index.close()
            remove_encoding(work)  # left by an interrupted dense build when this one is bm25
            _swap_into_place(work, out_dir)
        except BaseException:
            done = encoded_rows(work)
            if done:
                log.warning(
                    "index build stopped; %s keeps %d encoded passages: run the same command "
                    "again to continue from there",
                    work,
                    done,
                )
            else:
                shutil.rmtree(work, ignore_errors=True)
            raise
    return out_dir


@contextlib.contextmanager
def _building(work: Path, out_dir: Path) -> Iterator[None]:
    """Hold `work` (the build folder of `out_dir`) for this process. A folder left by an
    interrupted build keeps only its encoded vectors; anything else in it is cleared."""
    import fcntl

    work.mkdir(exist_ok=True)
    handle = os.open(work, os.O_RDONLY)  # a lock on the folder travels with it when renamed
    try:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise SearchRLError(
                f"another `searchrl index build` is writing {out_dir} (in {work}); wait for it "
                "or choose another --out"
            ) from None
        keep = {EMBEDDINGS, PROGRESS} if encoded_rows(work) else set()
        for item in work.iterdir():
            if item.is_dir():
                shutil.rmtree(item)
            elif item.name not in keep:
                item.unlink()
        if keep:
            log.warning("continuing the interrupted build in %s", work)
        yield
    finally:
        os.close(handle)


def _hashing_ids(passages: Iterable[Passage], hashes: array) -> Iterator[Passage]:
    for p in passages:
        hashes.append(hash(p.id))
        yield p


def _check_unique_ids(store: PassageStore, hashes: array, source: str | None) -> None:
    """Raise when two passages share an id: search would return both under one label."""
    values = np.frombuffer(hashes, dtype=np.int64)
    unique, counts = np.unique(values, return_counts=True)
    rows = np.flatnonzero(np.isin(values, unique[counts > 1]))
    if not len(rows):
        return
    ids = Counter(p.id for p in store.get(rows.tolist()))  # equal hashes of different ids are no clash
    dupes = [pid for pid, n in ids.items() if n > 1]
    if dupes:
        store.close()
        raise DataError(
            f"{source or 'the passages'}: {len(dupes)} passage id(s) occur more than once: {listing(dupes)}; "
            "search results would carry the same id for different passages, so give each passage "
            "its own id (or leave ids out: records are then numbered in file order)"
        )


def _swap_into_place(new: Path, target: Path) -> None:
    if not target.exists():
        os.rename(new, target)
        return
    old = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".old", dir=target.parent))
    os.rename(target, old / target.name)
    os.rename(new, target)
    shutil.rmtree(old, ignore_errors=True)


def open_index(
    path: Path, *, mmap: bool = True, settings: SearchSettings | None = None
) -> Retriever:
    """Open an index folder written by `build_index` (or an index's `save`) as a `Retriever`.
    `settings` (nprobe, efSearch, GPU) override what a dense index recorded at build time."""
    path = Path(path)
    manifest = read_manifest(path)
    _register_builtin_kinds(manifest["kind"])
    cls = INDEX_KINDS.get(manifest["kind"])
    if settings is None or settings == SearchSettings():
        return cls.load(path, mmap=mmap)
    if manifest["kind"] != "dense":
        raise SearchRLError(
            f"{path} is a {manifest['kind']} index: nprobe, efSearch, k-factor and FAISS GPU search "
            "apply to dense indexes only; leave them unset"
        )
    return cls.load(path, mmap=mmap, settings=settings)


# --- command bodies (`searchrl index ...`) ---------------------------------------------


def build_command(
    corpus: Path,
    out: Path,
    kind: str,
    fmt: str,
    chunk_words: int,
    options: BuildOptions,
    overwrite: bool,
) -> None:
    """`searchrl index build`: read a corpus file, build, print what was built."""
    import sys
    import time
    import warnings

    from rich.console import Console
    from tqdm.auto import tqdm

    from searchrl.retrieval.corpus import CorpusWarning, detect_format, read_passages

    started = time.perf_counter()
    fmt = detect_format(Path(corpus)) if fmt == "auto" and Path(corpus).is_file() else fmt
    with warnings.catch_warnings():
        warnings.simplefilter("always", CorpusWarning)
        # One plain line per corpus warning, printed above the progress bar rather than through it.
        warnings.showwarning = lambda message, *_args, **_kw: tqdm.write(
            f"warning: {message}", file=sys.stderr
        )
        build_index(
            read_passages(Path(corpus), fmt, chunk_words),
            Path(out),
            kind,
            embedder=options.embedder,
            factory=options.factory,
            batch_size=options.batch_size,
            shards=options.shards,
            nprobe=options.nprobe,
            ef_search=options.ef_search,
            k_factor=options.k_factor,
            query_prefix=options.query_prefix,
            passage_prefix=options.passage_prefix,
            overwrite=overwrite,
            source=str(corpus),
            format=fmt,
            chunk_words=chunk_words,
        )
    manifest = read_manifest(Path(out))
    shards = f", {options.shards} shards" if options.shards > 1 else ""
    what = kind if kind == "bm25" else f"{kind}, {options.embedder}, {options.factory}{shards}"
    Console().print(
        f"indexed {manifest['count']:,} passages from {corpus} into {out} ({what}) "
        f"in {time.perf_counter() - started:.1f}s",
        highlight=False,
        soft_wrap=True,
    )

