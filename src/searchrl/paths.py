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
