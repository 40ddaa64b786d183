"""Checksums of a checkpoint's files, so corruption that loads without a word (flipped bits in the
weights, the trainer state) or a truncated file is found on resume, and the run falls back to an
older checkpoint.

`checksums.json` maps each file's path in the folder to its size and sha256. Hashing reads every
byte once: negligible for small models; for big ones it runs at disk or sha256 speed (~1-2 GB/s),
so a 7B model's 28 GB of float32 weights take ~15-30 s on each save and on the resume check.

The checksums must cover every file the folder holds: one that lists no files, or not all of
them, would check nothing of what it leaves out (emptying it would disable the check), so the
folder is then as damaged as one whose bytes do not match. An entry must be a plain relative path
inside the folder with an integer size and a sha256 of 64 hex digits.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import os
import re
from collections.abc import Sequence
from pathlib import Path, PurePosixPath

from searchrl.errors import listing

CHECKSUMS = "checksums.json"
_SHA256 = re.compile(r"[0-9a-f]{64}")


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        while chunk := fh.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def write_checksums(folder: Path) -> None:
    """Record the size and sha256 of every file now in `folder` (subfolders too)."""
    folder = Path(folder)
    sums = {
        str(p.relative_to(folder)): {"size": p.stat().st_size, "sha256": _sha256(p)}
        for p in sorted(folder.rglob("*")) if p.is_file() and p.name != CHECKSUMS
    }
    tmp = folder / f".{CHECKSUMS}.tmp"
    tmp.write_text(json.dumps(sums, indent=1) + "\n")
    os.replace(tmp, folder / CHECKSUMS)


def drop_file(folder: Path, name: str) -> None:
    """Delete one file of a verified folder and its entry in `checksums.json` (entry first: a kill
    in between leaves an uncovered file, which a resume reads as damage, never a silent gap)."""
    folder = Path(folder)
    sums = json.loads((folder / CHECKSUMS).read_text())
    sums.pop(name, None)
    tmp = folder / f".{CHECKSUMS}.tmp"
    tmp.write_text(json.dumps(sums, indent=1) + "\n")
    os.replace(tmp, folder / CHECKSUMS)
    (folder / name).unlink(missing_ok=True)


def _entry_problem(name: str, want) -> str | None:
    path = PurePosixPath(name)
    if not name or path.is_absolute() or ".." in path.parts or "\\" in name:
        return f"{CHECKSUMS} lists {name[:80]!r}, which is no file inside the checkpoint"
    if (not isinstance(want, dict) or set(want) != {"size", "sha256"} or not isinstance(want["size"], int)
            or isinstance(want["size"], bool) or not isinstance(want["sha256"], str) or not _SHA256.fullmatch(want["sha256"])):
        return f"{CHECKSUMS} has no size and sha256 for {name[:80]!r}"
    return None


def verify_checksums(folder: Path, uncovered: Sequence[str] = ()) -> str | None:
    """What is wrong with `folder`'s recorded files (missing, truncated, altered, or not covered by
    the checksums), or None when they match. A folder without `checksums.json` cannot be checked:
    that is a problem too. `uncovered`: name patterns of files the checksums may leave out (an
    older searchrl's checkpoint, whose pickled state they never covered)."""
    folder = Path(folder)
    try:
        sums = json.loads((folder / CHECKSUMS).read_text())
    except FileNotFoundError:
        return f"it has no {CHECKSUMS}"
    except (OSError, ValueError, RecursionError) as exc:
        return f"{CHECKSUMS} is unreadable ({type(exc).__name__})"
    if not isinstance(sums, dict):
        return f"{CHECKSUMS} is not a mapping of files to their sizes and sha256"
    for name, want in sums.items():
        if problem := _entry_problem(name, want):
            return problem
    held = {p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file() and p.name != CHECKSUMS}
    left_out = sorted(n for n in held - set(sums) if not any(fnmatch.fnmatchcase(n, pat) for pat in uncovered))
    if not sums:
        return f"{CHECKSUMS} lists no files"
    if left_out:
        return f"{CHECKSUMS} does not cover {listing(left_out, 5)} (it must list every file of the checkpoint)"
    for name, want in sums.items():
        path = folder / name
        if not path.is_file():
            return f"{name} is missing"
        size = path.stat().st_size
        if size != want["size"]:  # cheap: a truncated file needs no hashing
            return f"{name} has {size} bytes, {want['size']} were written"
        if _sha256(path) != want["sha256"]:
            return f"{name} does not match its sha256 (the file was altered or corrupted)"
    return None
