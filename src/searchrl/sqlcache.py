"""A SQLite file shared by every thread and process that opens it: the judge's verdict cache and
the web search cache and budget live in one each.

SQLite rather than a folder of files because the web budget needs atomic read-modify-write
across processes (torchrun ranks count against one cap), which a transaction gives for free.
WAL mode lets readers go on while one process writes; `BEGIN IMMEDIATE` takes the write lock
up front, so two processes never both read a counter and then both bump it.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import sqlite3
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from searchrl.errors import SearchRLError

_SCHEMA = "CREATE TABLE IF NOT EXISTS kv (ns TEXT, key TEXT, value TEXT, at REAL, PRIMARY KEY (ns, key))"


def digest(*parts: object) -> str:
    """A stable key for any JSON-able parts.

    >>> digest("m", ["a", "b"]) == digest("m", ["a", "b"]) != digest("m", ["b", "a"])
    True
    """
    return hashlib.sha256(json.dumps(parts, ensure_ascii=False).encode()).hexdigest()


class SqliteStore:
    """One connection per store, serialised by a lock (sqlite3 objects are not thread-safe);
    every statement is short, so the lock is never held long."""

    def __init__(self, path: str | Path, schema: tuple[str, ...] = ()) -> None:
        self.path = Path(path).expanduser()
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            # isolation_level=None: no implicit transactions, ours are explicit.
            self._conn = sqlite3.connect(self.path, timeout=60, isolation_level=None, check_same_thread=False)
            self._conn.execute("PRAGMA journal_mode=WAL")
            for statement in (_SCHEMA, *schema):
                self._conn.execute(statement)
        except (OSError, sqlite3.Error) as exc:
            raise SearchRLError(f"cannot open the cache file {self.path} ({exc}); point the cache setting elsewhere") from None
        self._lock = threading.Lock()

    @contextlib.contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        """A write transaction, exclusive among all processes until it ends."""
        with self._lock:
            self._conn.execute("BEGIN IMMEDIATE")
            try:
                yield self._conn
            except BaseException:
                self._conn.execute("ROLLBACK")
                raise
            self._conn.execute("COMMIT")

    def query(self, sql: str, args: tuple = ()) -> list[tuple]:
        with self._lock:
            return self._conn.execute(sql, args).fetchall()

    def get(self, ns: str, key: str) -> str | None:
        rows = self.query("SELECT value FROM kv WHERE ns = ? AND key = ?", (ns, key))
        return rows[0][0] if rows else None

    def put(self, ns: str, key: str, value: str) -> None:
        with self.transaction() as conn:
            conn.execute("INSERT OR REPLACE INTO kv VALUES (?, ?, ?, ?)", (ns, key, value, time.time()))

    def close(self) -> None:
        with self._lock:
            self._conn.close()
