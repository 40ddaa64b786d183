"""What an index folder holds besides the index itself: the passages (stored once, read lazily)
and `manifest.json` (what kind of index, how it was built).

Layout:
  manifest.json    kind, count, embedder, factory, created, searchrl_version, ...
  passages.jsonl   one {"id", "title", "text"} per line, in index row order
  offsets.npy      int64 [N + 1] byte offsets into passages.jsonl (row r = bytes[o[r]:o[r+1]])
  bm25/ | dense.faiss   the kind's own files
"""

from __future__ import annotations

import json
import mmap
import os
from array import array
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Protocol

import numpy as np
from tqdm.auto import tqdm

from searchrl import __version__
from searchrl.data.types import Passage
from searchrl.errors import DataError, SearchRLError

MANIFEST = "manifest.json"
PASSAGES = "passages.jsonl"
OFFSETS = "offsets.npy"


class Passages(Protocol):
    """What an index needs from its passages: a length, rows by number, and a full pass."""

    def __len__(self) -> int: ...

    def get(self, rows: Sequence[int]) -> list[Passage]: ...

    def __iter__(self) -> Iterator[Passage]: ...


class MemoryPassages:
    """Passages held in a list: for indexes built in memory (tests, small corpora)."""

    def __init__(self, passages: Iterable[Passage]) -> None:
        self._passages = list(passages)
        if not self._passages:
            raise DataError("no passages to index")

    def __len__(self) -> int:
        return len(self._passages)

    def get(self, rows: Sequence[int]) -> list[Passage]:
        return [self._passages[r] for r in rows]

    def __iter__(self) -> Iterator[Passage]:
        return iter(self._passages)

    def close(self) -> None:
        pass


class PassageStore:
    """The passages of an index folder, memory-mapped: opening a 29M-passage store reads
    nothing up front, and `get` touches only the rows asked for."""

    def __init__(self, folder: Path) -> None:
        self.folder = Path(folder).resolve()
        data_path, offsets_path = self.folder / PASSAGES, self.folder / OFFSETS
        if not data_path.is_file() or not offsets_path.is_file():
            raise SearchRLError(
                f"{self.folder}: no passage store ({PASSAGES} and {OFFSETS} expected)"
            )
        self._offsets = np.load(offsets_path, mmap_mode="r")  # int64 [N + 1]
        self._file = open(data_path, "rb")  # noqa: SIM115 - must outlive __init__ for the mmap; close() shuts it
        self._data = mmap.mmap(self._file.fileno(), 0, access=mmap.ACCESS_READ)
        if len(self._offsets) < 2 or int(self._offsets[-1]) != len(self._data):
            raise SearchRLError(
                f"{self.folder}: {OFFSETS} does not match {PASSAGES}; rebuild the index"
            )

    @classmethod
    def write(
        cls, passages: Iterable[Passage], folder: Path, *, progress: bool = True
    ) -> PassageStore:
        """Stream `passages` into `folder` and open the result. Raises `DataError` when empty."""
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        offsets = array("q", [0])  # 8 bytes per passage; a Python list of ints costs ~4x more
        position = 0
        with open(folder / PASSAGES, "wb") as f:
            # delay: a corpus whose first line is bad fails with its one error line, no bar before it
            for p in tqdm(passages, desc="Store passages", unit="psg", disable=not progress, delay=1.0):
                line = json.dumps(
                    {"id": p.id, "title": p.title, "text": p.text}, ensure_ascii=False
                )
                raw = line.encode("utf-8") + b"\n"
                f.write(raw)
                position += len(raw)
                offsets.append(position)
        if len(offsets) == 1:
            raise DataError("no passages to index: the corpus yielded none")
        np.save(folder / OFFSETS, np.frombuffer(offsets, dtype=np.int64))
        return cls(folder)

    def __len__(self) -> int:
        return len(self._offsets) - 1

    def get(self, rows: Sequence[int]) -> list[Passage]:
        out = []
        for r in rows:
            r = int(r)
            if not 0 <= r < len(self):
                raise IndexError(f"passage row {r} is outside 0..{len(self) - 1}")
            start, end = int(self._offsets[r]), int(self._offsets[r + 1])
            out.append(Passage(**json.loads(self._data[start:end])))
        return out

    def __iter__(self) -> Iterator[Passage]:
        with open(self.folder / PASSAGES, encoding="utf-8") as f:
            for line in f:
                yield Passage(**json.loads(line))

    def close(self) -> None:
        if not self._data.closed:
            self._data.close()
            self._file.close()


def as_passages(passages: Iterable[Passage] | Passages) -> Passages:
    """A store as is; any other iterable of passages gathered into memory."""
    if isinstance(passages, (PassageStore, MemoryPassages)):
        return passages
    return MemoryPassages(passages)


def save_passages(passages: Passages, folder: Path, *, progress: bool = True) -> None:
    """Write `passages` into `folder` unless they already live there (built in place)."""
    if isinstance(passages, PassageStore) and passages.folder == Path(folder).resolve():
        return
    PassageStore.write(passages, folder, progress=progress).close()


def index_text(p: Passage) -> str:
    """The text an index sees for a passage: the title matters for entity questions."""
    return f"{p.title}\n{p.text}" if p.title else p.text


# --- manifest --------------------------------------------------------------------------


def write_manifest(folder: Path, kind: str, count: int, **fields) -> dict:
    """Write `manifest.json` atomically (temp file + rename) and return its content."""
    manifest = {
        "kind": kind,
        "count": count,
        "embedder": None,
        "factory": None,
        **fields,
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "searchrl_version": __version__,
    }
    path = Path(folder) / MANIFEST
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
    os.replace(tmp, path)
    return manifest


def read_manifest(folder: Path) -> dict:
    """The manifest of an index folder; `SearchRLError` naming the folder when it is not one."""
    folder = Path(folder)
    path = folder / MANIFEST
    hint = f"build one with `searchrl index build CORPUS --out {folder}`"
    if not folder.is_dir():
        what = "a file, not a directory" if folder.exists() else "no such directory"
        raise SearchRLError(f"{folder} is not an index: {what}; {hint}")
    if not path.is_file():
        raise SearchRLError(f"{folder} is not an index: it has no {MANIFEST}; {hint}")
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise SearchRLError(f"{path}: unreadable manifest ({exc}); rebuild the index") from None
    if not isinstance(manifest, dict) or "kind" not in manifest:
        raise SearchRLError(f"{path}: manifest has no 'kind'; {folder} is not a searchrl index")
    return manifest


class StoredIndex:
    """Mixin of the indexes whose passages live in a `PassageStore` (or any row-addressed list)."""

    passages: Passages

    def materialise(self, hits: Sequence[tuple[int, float]]) -> list[Passage]:
        """(row, score) pairs, best first -> Passages with `score` filled in."""
        found = self.passages.get([row for row, _ in hits])
        return [replace(p, score=score) for p, (_, score) in zip(found, hits)]

    def close(self) -> None:
        close = getattr(self.passages, "close", None)
        if close is not None:
            close()

    def __len__(self) -> int:
        return len(self.passages)
