"""Checksums of a checkpoint's files, so corruption that loads without a word (flipped bits in the
weights, the trainer state) or a truncated file is found on resume, and the run falls back to an
older checkpoint.

`checksums.json` maps each file's path in the folder to its size and sha256. Hashing reads every
byte once: negligible for small models; for big ones it runs at disk or sha256 speed (~1-2 GB/s),
so a 7B model's 28 GB of float32 weights take ~15-30 s on each save and on the resume check.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

CHECKSUMS = "checksums.json"


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


def verify_checksums(folder: Path) -> str | None:
    """What is wrong with `folder`'s recorded files (missing, truncated, altered), or None when
    they match. A folder without `checksums.json` cannot be checked: that is a problem too."""
    folder = Path(folder)
    try:
        sums = json.loads((folder / CHECKSUMS).read_text())
    except FileNotFoundError:
        return f"it has no {CHECKSUMS}"
    except (OSError, ValueError) as exc:
        return f"{CHECKSUMS} is unreadable ({exc})"
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
