"""Text -> vectors for the dense index: the prefixes each embedder was trained with, and corpus
encoding into a memory-mapped `.npy` file in resumable chunks.

Encoding is the slow part of a Wikipedia-scale build (21M passages: hours even on a GPU), so
`encode_corpus` records its progress after every chunk; an interrupted `searchrl index build`
run again with the same corpus and embedder continues after the last finished chunk.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import logging
import os
from pathlib import Path

import numpy as np
from tqdm.auto import tqdm

from searchrl.retrieval.store import PASSAGES, Passages, PassageStore, index_text

log = logging.getLogger(__name__)

EMBEDDINGS = "embeddings.npy"  # float32 [N, D], row r = passage r
PROGRESS = "embeddings.json"  # what the file holds: rows done, and for which corpus and embedder
ENCODE_CHUNK = 16_384  # passages encoded between two progress records (768-d: 50 MB)

BGE_INSTRUCTION = "Represent this sentence for searching relevant passages: "
BGE_INSTRUCTION_ZH = "为这个句子生成表示以用于检索相关文章："
# (pattern on the model's name, (query prefix, passage prefix)): the first match wins. Embedders
# trained with instructions retrieve worse without them (E5 and BGE model cards); BGE puts its
# instruction on queries only, E5 marks both sides; BGE-M3 and MiniLM take none.
PREFIXES: tuple[tuple[str, tuple[str, str]], ...] = (
    ("bge-m3*", ("", "")),
    ("bge-*-zh*", (BGE_INSTRUCTION_ZH, "")),
    ("bge-*", (BGE_INSTRUCTION, "")),
    ("e5-*", ("query: ", "passage: ")),
    ("*-e5-*", ("query: ", "passage: ")),  # multilingual-e5-large, ...
)


def default_prefixes(embedder: str) -> tuple[str, str]:
    """(query prefix, passage prefix) the embedder was trained with; ("", "") if none is known.
    `embedder` is a short name (e5-base, bge-large), a hub id or a local path."""
    name = embedder.lower().rstrip("/").rsplit("/", 1)[-1]
    for pattern, prefixes in PREFIXES:
        if fnmatch.fnmatchcase(name, pattern):
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


def dimension(model) -> int:
    get = getattr(model, "get_embedding_dimension", None) or model.get_sentence_embedding_dimension
    return int(get())


def passages_digest(passages: Passages) -> str | None:
    """A fingerprint of a passage store's content (None for passages held in memory), so a
    resumed encoding never mixes vectors of two different corpora."""
    if not isinstance(passages, PassageStore):
        return None
    with open(passages.folder / PASSAGES, "rb") as f:
        return hashlib.file_digest(f, "blake2b").hexdigest()[:32]


def encode_corpus(
    model,
    passages: Passages,
    folder: Path,
    *,
    prefix: str,
    key: dict,
    batch_size: int = 64,
    chunk: int = ENCODE_CHUNK,
    progress: bool = True,
) -> np.ndarray:
    """Encode every passage (`prefix` + title + text) into `folder`/embeddings.npy and return
    it memory-mapped read-only [N, D]. After each `chunk` passages the file is flushed and
    embeddings.json records the rows done; a later call whose `key` (embedder, prefix, corpus
    digest), row count and dimension match continues from there instead of starting over."""
    folder = Path(folder)
    path, record = folder / EMBEDDINGS, folder / PROGRESS
    n, dim = len(passages), dimension(model)
    what = {"rows": n, "dim": dim, **key}
    done = _rows_done(record, path, what)
    if done:
        log.info("resuming the encoding: %d of %d passages already encoded in %s", done, n, path)
        vectors = np.load(path, mmap_mode="r+")
    else:
        vectors = np.lib.format.open_memmap(path, "w+", np.float32, (n, dim))
        _write_record(record, {**what, "done": 0})
    desc = f"Encode passages ({key.get('embedder', 'embedder')})"
    with tqdm(total=n, initial=done, desc=desc, unit="psg", disable=not progress) as bar:
        for start in range(done, n, chunk):
            stop = min(n, start + chunk)
            texts = [prefix + index_text(p) for p in passages.get(range(start, stop))]
            vectors[start:stop] = encode(model, texts, batch_size)
            vectors.flush()  # the rows reach the file before the record says they are done
            _write_record(record, {**what, "done": stop})
            bar.update(stop - start)
    del vectors
    return np.load(path, mmap_mode="r")


def encoded_rows(folder: Path) -> int:
    """Rows an interrupted encoding left in `folder` (0 when it holds none)."""
    try:
        return int(json.loads((Path(folder) / PROGRESS).read_text())["done"])
    except (OSError, ValueError, KeyError, TypeError):
        return 0


def remove_encoding(folder: Path) -> None:
    """Delete the embeddings file and its record once the index holds the vectors."""
    for name in (EMBEDDINGS, PROGRESS):
        (Path(folder) / name).unlink(missing_ok=True)


def _rows_done(record: Path, path: Path, what: dict) -> int:
    if not record.is_file() or not path.is_file():
        return 0
    try:
        state = json.loads(record.read_text())
    except ValueError:
        return 0
    if {k: state.get(k) for k in what} != what:
        log.info("%s was made for another corpus or embedder; encoding from the start", path)
        return 0
    return int(state.get("done", 0))


def _write_record(record: Path, state: dict) -> None:
    tmp = record.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(state) + "\n")
    os.replace(tmp, record)
