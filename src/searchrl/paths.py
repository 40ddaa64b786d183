"""Where things live: the cache (built indexes, converted models) and the shared benchmark data."""

from __future__ import annotations

import os
from pathlib import Path

from searchrl.errors import SearchRLError


def cache_dir() -> Path:
    """Root of everything searchrl builds once and reuses: `$SEARCHRL_HOME`, else ~/.cache/searchrl."""
    root = Path(os.environ.get("SEARCHRL_HOME", Path.home() / ".cache" / "searchrl"))
    root.mkdir(parents=True, exist_ok=True)
    return root


def find_shared_data() -> Path | None:
    """The benchmark data folder (`shared/data` beside the checkout), or None when absent.

    `$SEARCHRL_DATA` wins; otherwise look for `shared/data` next to the current directory,
    the checkout, or any of their parents (CI clones the repo beside a copy of `shared/`).
    """
    env = os.environ.get("SEARCHRL_DATA")
    if env:
        return Path(env) if Path(env).is_dir() else None
    starts = [Path.cwd().resolve(), Path(__file__).resolve().parent]
    for start in starts:
        for folder in [start, *start.parents]:
            candidate = folder / "shared" / "data"
            if candidate.is_dir():
                return candidate
    return None


def shared_data() -> Path:
    """Like `find_shared_data` but raises a clear error when the folder is missing."""
    found = find_shared_data()
    if found is None:
        raise SearchRLError(
            "benchmark data folder not found: expected `shared/data` beside the checkout. "
            "Set SEARCHRL_DATA=/path/to/data to point at it."
        )
    return found


def current_umask() -> int:
    """The process's file-creation mask, read without changing it where Linux tells it
    (/proc/self/status), else by setting and restoring it."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def make_readable(folder: Path) -> None:
    """Give `folder` and everything under it the modes a plain `open`/`mkdir` would under the
    umask (0644 files, 0755 folders under umask 022). safetensors and `tempfile.mkdtemp` create
    theirs private (0600, 0700), which teammates on a shared disk cannot read; checkpoints and
    exports are written in a temp folder, so this runs before their rename into place."""
    mask = current_umask()
    folder = Path(folder)
    for path in [folder, *folder.rglob("*")]:
        if path.is_symlink():
            continue
        path.chmod((0o777 if path.is_dir() else 0o666) & ~mask)
