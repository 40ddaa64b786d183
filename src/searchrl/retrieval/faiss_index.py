"""FAISS mechanics of the dense index, independent of text: build an index from a factory
string, train it on a sample, add vectors chunk by chunk from a memory-mapped file, split it
into shards searched in parallel, apply search-time settings, read and write it (memory-mapped).

At Wikipedia scale (21M x 768 e5, 29M x 1024 BGE) the vectors never sit in RAM at once: they
are encoded into an `.npy` file, sampled for training, and streamed into the index in chunks.
docs/scale.md has the measured memory, speed and recall of the factory strings.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Sequence
from pathlib import Path

import faiss
import numpy as np
from tqdm.auto import tqdm

from searchrl.errors import SearchRLError
from searchrl.retrieval.kinds import SearchSettings

log = logging.getLogger(__name__)

MIN_TRAIN = 200_000  # k-means on more points barely helps and costs RAM: 200k x 1024 x 4 B = 0.8 GB
TRAIN_PER_LIST = 40  # FAISS warns below 39 training points per IVF list
ADD_CHUNK = 65_536  # rows copied out of the memory map per `add` call: 65k x 1024 x 4 B = 256 MB
DEFAULT_NPROBE = 32  # FAISS's own defaults favour speed over recall: nprobe=1 scans one list
DEFAULT_EF_SEARCH = 64  # ... and efSearch=16
DEFAULT_K_FACTOR = 8  # ... and a refine stage re-ranks only the k hits it is given
_SMALL_CORPUS = (
    "A small corpus needs fewer IVF lists (about N/39 at most) or a factory without training "
    "(Flat, HNSW32)."
)


def new_faiss_index(
    dim: int, factory: str, metric: int = faiss.METRIC_INNER_PRODUCT
) -> faiss.Index:
    """An empty index from a FAISS factory string ("Flat", "IVF4096,PQ96x8", "OPQ64,IVF1024,PQ64",
    "HNSW32", "SQ8", ...); a clear error naming the factory when FAISS refuses it."""
    try:
        return faiss.index_factory(dim, factory, metric)
    except RuntimeError as exc:
        reason = str(exc).strip().splitlines()[-1]
        raise SearchRLError(
            f"FAISS cannot build factory {factory!r} for {dim}-d vectors ({reason}). "
            "Examples: Flat, HNSW32, SQ8, IVF1024,Flat, IVF4096,PQ64 (PQ m must divide the dimension)."
        ) from None


def train_size(index: faiss.Index, n: int) -> int:
    """How many of `n` vectors to train on: 200k, or 40 per IVF list when there are more lists."""
    ivf = faiss.try_extract_index_ivf(index)
    lists = ivf.nlist if ivf is not None else 0
    return min(n, max(MIN_TRAIN, TRAIN_PER_LIST * lists))


def check_trainable(index: faiss.Index, n: int, factory: str) -> None:
    """Raise when `n` vectors cannot train `index` (an IVF needs a vector per list at least)."""
    ivf = faiss.try_extract_index_ivf(index)
    if not index.is_trained and ivf is not None and n < ivf.nlist:
        raise SearchRLError(
            f"FAISS factory {factory!r} could not be trained on {n} vectors (its IVF has "
            f"{ivf.nlist} lists). {_SMALL_CORPUS}"
        )


def train_index(
    index: faiss.Index, vectors: np.ndarray, factory: str, *, size: int | None = None, seed: int = 0
) -> None:
    """Train `index` on a random sample of `size` rows of `vectors` (default `train_size`; a
    memory map is fine: only the sampled rows are read, in file order). No-op for indexes that
    need no training (Flat, HNSW)."""
    if index.is_trained:
        return
    n = len(vectors)
    size = min(n, size or train_size(index, n))
    rows = np.sort(np.random.default_rng(seed).choice(n, size=size, replace=False))
    _skip_polysemous_training(index)
    ivf = faiss.try_extract_index_ivf(index)
    if ivf is not None and faiss.get_num_gpus() > 0:
        # The coarse k-means is most of the training time; FAISS runs it on GPU this way.
        ivf.clustering_index = faiss.index_cpu_to_all_gpus(faiss.IndexFlatL2(ivf.d))
    try:
        index.train(np.ascontiguousarray(vectors[rows], dtype=np.float32))
    except RuntimeError as exc:
        reason = str(exc).strip().splitlines()[-1]
        raise SearchRLError(
            f"FAISS factory {factory!r} could not be trained on {len(rows)} vectors ({reason}). "
            f"{_SMALL_CORPUS}"
        ) from None
    finally:
        if ivf is not None:
            ivf.clustering_index = None


def _skip_polysemous_training(index: faiss.Index) -> None:
    # index_factory turns on polysemous training for PQ codes; it only serves `polysemous_ht`
    # search, which we never use, and its annealing costs ~15 s of CPU even on 1,000 vectors.
    while index is not None:
        index = faiss.downcast_index(index)
        if hasattr(index, "do_polysemous_training"):
            index.do_polysemous_training = False
            return
        index = getattr(index, "index", None) or getattr(index, "base_index", None)


def add_vectors(
    index: faiss.Index, vectors: np.ndarray, *, chunk: int = ADD_CHUNK, progress: bool = False
) -> None:
    """Add `vectors` [N, D] (typically `np.load(path, mmap_mode="r")`) `chunk` rows at a time,
    so only one chunk is copied into RAM besides the index itself."""
    with tqdm(total=len(vectors), desc="Add to FAISS", unit="vec", disable=not progress) as bar:
        for start in range(0, len(vectors), chunk):
            block = np.ascontiguousarray(vectors[start : start + chunk], dtype=np.float32)
            index.add(block)
            bar.update(len(block))


def shard_bounds(n: int, shards: int) -> list[tuple[int, int]]:
    """Split rows 0..n into `shards` contiguous ranges of near-equal size."""
    if not 1 <= shards <= n:
        raise SearchRLError(f"cannot split {n} vectors into {shards} shards; use 1 to {n}")
    cuts = np.linspace(0, n, shards + 1).round().astype(int)
    return [(int(a), int(b)) for a, b in itertools.pairwise(cuts)]


def combine_shards(parts: Sequence[faiss.Index]) -> faiss.Index:
    """One index over `parts` holding consecutive rows: a query runs on every shard in its own
    thread and the top-k lists are merged exactly (by inner product or L2, as the shards use),
    so the result equals searching one index that holds all rows. One part is returned as is."""
    if len(parts) == 1:
        return parts[0]
    metrics = {p.metric_type for p in parts}
    if len(metrics) > 1 or len({p.d for p in parts}) > 1:
        raise SearchRLError("shards differ in metric or dimension; rebuild the index")
    shards = faiss.IndexShards(parts[0].d, True, True)  # threaded, successive ids
    for part in parts:
        shards.add_shard(part)
    shards.metric_type = parts[0].metric_type  # the merge order (max for IP, min for L2)
    return shards


def apply_search_settings(index: faiss.Index, settings: SearchSettings, factory: str) -> None:
    """Set nprobe / efSearch / the refine k-factor on `index` (through OPQ transforms, refine
    stages and shards). A value given for an index without that knob is an error; defaults
    apply where it has one."""
    space = faiss.ParameterSpace()
    for name, value, default, applies in (
        ("nprobe", settings.nprobe, DEFAULT_NPROBE, "IVF indexes"),
        ("efSearch", settings.ef_search, DEFAULT_EF_SEARCH, "HNSW indexes"),
        (
            "k_factor_rf",
            settings.k_factor,
            DEFAULT_K_FACTOR,
            "indexes with a refine stage (RFlat, Refine(...))",
        ),
    ):
        if value is not None and value < 1:
            raise SearchRLError(f"{name} must be at least 1, got {value}")
        try:
            space.set_index_parameter(index, name, value if value is not None else default)
        except RuntimeError:
            if value is not None:
                raise SearchRLError(
                    f"{name.removesuffix('_rf')} does not apply to FAISS index {factory!r}: it is for "
                    f"{applies}; leave it unset"
                ) from None


def to_gpu(index: faiss.Index) -> faiss.Index:
    """`index` copied onto every GPU FAISS sees (faiss-gpu builds), or unchanged without one or
    when its type has no GPU version (HNSW)."""
    if faiss.get_num_gpus() == 0:
        return index
    try:
        return faiss.index_cpu_to_all_gpus(index)
    except RuntimeError as exc:
        log.warning(
            "FAISS cannot move this index to GPU (%s); searching on CPU", str(exc).splitlines()[-1]
        )
        return index


def has_refine(factory: str) -> bool:
    """Whether the factory ends in a refine stage (full or finer vectors re-rank candidates)."""
    return "RFlat" in factory or "Refine(" in factory


def read_faiss(path: Path, mmap: bool, factory: str) -> tuple[faiss.Index, bool]:
    """Read an index file, memory-mapped when `mmap` and the index type allows it; returns the
    index and whether it is mapped."""
    if mmap:
        # IO_FLAG_MMAP maps IVF inverted lists; IO_FLAG_MMAP_IFC maps flat codes (Flat, HNSW, SQ,
        # PQ, a refine stage's vectors), else a Flat index is read fully into RAM (measured:
        # 147 MB vs 0). FAISS takes one of the two: with a refine stage its vectors are the bulk,
        # so they are mapped and the compressed IVF lists read into RAM.
        ivf_lists = "IVF" in factory.upper() and not has_refine(factory)
        flag = faiss.IO_FLAG_MMAP if ivf_lists else faiss.IO_FLAG_MMAP_IFC
        try:
            return faiss.read_index(str(path), flag), True
        except RuntimeError as exc:
            log.info(
                "FAISS cannot memory-map %s (%s); reading it into memory",
                path,
                str(exc).splitlines()[-1],
            )
    return faiss.read_index(str(path)), False
