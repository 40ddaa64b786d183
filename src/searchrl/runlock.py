"""One process per run directory: `RunLock`, taken by `train` (rank 0 for all ranks) and by
`eval run`. Two processes on one folder would interleave their records (metrics.jsonl,
predictions.jsonl) and overwrite each other's files."""

from __future__ import annotations

import fcntl
import json
import os
import socket
import sys
from datetime import datetime, timezone
from pathlib import Path

from typing_extensions import Self

from searchrl.errors import SearchRLError

LOCK_FILE = "run.lock"


class RunLock:
    """An exclusive OS lock (`flock`) on `run_dir/run.lock`, held while the context is open; the file
    names the owner (PID, host, since when) for the message a second process gets. The kernel drops
    the lock when its process dies, so a lock left by a killed run is taken over, with a note.
    A process forked while the lock is held shares it until it exits."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = Path(run_dir)
        self._fh = None

    def __enter__(self) -> Self:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        fh = (self.run_dir / LOCK_FILE).open("a+", encoding="utf-8")
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            owner = _owner(fh) or "its owner has not written its name yet"
            fh.close()
            raise SearchRLError(
                f"{self.run_dir} is in use by another searchrl process ({owner}); wait for it to end or stop it, "
                "or write into another --out"
            ) from None
        except OSError as exc:
            fh.close()
            raise SearchRLError(
                f"cannot lock {self.run_dir / LOCK_FILE} ({exc}); put the run directory on a file system with locks (a local disk)"
            ) from None
        previous = _owner(fh)
        if previous:  # written by an owner that never released it: it died
            print(f"note: taking over {self.run_dir} from {previous}, which ended without releasing it", file=sys.stderr, flush=True)
        fh.truncate(0)  # 'a+' appends, so the record lands at the start of the emptied file
        since = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
        fh.write(json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "since": since}) + "\n")
        fh.flush()
        self._fh = fh
        return self

    def __exit__(self, *exc: object) -> None:
        self._fh.truncate(0)  # an empty file: released cleanly
        self._fh.flush()
        fcntl.flock(self._fh, fcntl.LOCK_UN)
        self._fh.close()
        self._fh = None


def _owner(fh) -> str:
    """'PID 12 on host h, since T' from the lock file, '' when it is empty."""
    fh.seek(0)
    text = fh.read().strip()
    if not text:
        return ""
    try:
        rec = json.loads(text)
        return f"PID {rec['pid']} on host {rec['host']}, since {rec['since']}"
    except (ValueError, KeyError, TypeError):
        return f"unreadable owner record {text[:80]!r}"
