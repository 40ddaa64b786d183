"""Reading UTF-8 text and JSON-lines files with errors that name the file and line.

Every reader of question, corpus, prediction and metrics files goes through here, so bad bytes,
broken JSON and directories given for files all read the same way: `file:line: what; what to do`.
"""

from __future__ import annotations

import gzip
import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from searchrl.errors import DataError

_FIX_ENCODING = "re-save it as UTF-8 (e.g. `iconv -f latin1 -t utf-8`)"


def _check_file(path: Path) -> None:
    if path.is_dir():
        raise DataError(f"{path} is a directory; pass a file (one inside it?)")
    if not path.is_file():
        raise DataError(f"{path}: no such file")


def _decode(raw: bytes, where: str, bom: bool) -> str:
    try:
        return raw.decode("utf-8-sig" if bom else "utf-8")
    except UnicodeDecodeError as exc:
        raise DataError(
            f"{where}: not UTF-8 text (byte 0x{raw[exc.start]:02x} at byte {exc.start + 1} of the line); "
            f"{_FIX_ENCODING}"
        ) from None


def read_lines(path: Path) -> Iterator[tuple[int, str]]:
    """(line number, line with its ending) of a UTF-8 text file, `.gz` too; a leading
    byte-order mark is dropped. Lines are decoded one by one, so a bad byte names its line."""
    path = Path(path)
    _check_file(path)
    opener = gzip.open if path.suffix.lower() == ".gz" else open
    with opener(path, "rb") as fh:
        for lineno, raw in enumerate(fh, start=1):
            yield lineno, _decode(raw, f"{path}:{lineno}", bom=lineno == 1)


def read_text(path: Path) -> str:
    """The whole of a UTF-8 text file (byte-order mark dropped); DataError names the bad line."""
    path = Path(path)
    _check_file(path)
    raw = path.read_bytes()
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        lineno = raw.count(b"\n", 0, exc.start) + 1
        raise DataError(
            f"{path}:{lineno}: not UTF-8 text (byte 0x{raw[exc.start]:02x}); {_FIX_ENCODING}"
        ) from None


def head(path: Path) -> str:
    """The start of a file (4 KB, leading whitespace dropped), to tell a JSON list from JSON
    lines; "" for a missing file. Bad bytes are left to the full read, which names their line."""
    path = Path(path)
    if not path.is_file():
        return ""
    with path.open("rb") as fh:
        return fh.read(4096).decode("utf-8-sig", errors="ignore").lstrip()


def json_error(where: str, exc: json.JSONDecodeError) -> DataError:
    """`where: invalid JSON at column N (reason); fix or remove the line`."""
    # Some of json's messages end in "at" ("Unterminated string starting at") for its own suffix.
    reason = exc.msg.removesuffix(" at")
    return DataError(f"{where}: invalid JSON at column {exc.colno} ({reason}); fix or remove the line")


def iter_json_lines(
    path: Path, on_torn_tail: Callable[[str], None] | None = None
) -> Iterator[tuple[int, Any]]:
    """(line number, value) for each non-blank line of a JSON-lines file.

    A last line that is invalid JSON and has no line ending was cut off mid-write (a crash, a
    partial copy): with `on_torn_tail` it is skipped and the callback gets a message saying so;
    without, it is an error like any other bad line.
    """
    for lineno, line in read_lines(path):
        if not line.strip():
            continue
        try:
            value = json.loads(line)
        except json.JSONDecodeError as exc:
            if on_torn_tail is not None and not line.endswith(("\n", "\r")):
                on_torn_tail(f"{path}:{lineno}: the last line is cut off (no line ending, not valid JSON); skipped it")
                return
            raise json_error(f"{path}:{lineno}", exc) from None
        yield lineno, value


def read_appended_jsonl(path: Path, redo: str) -> list:
    """The values of a JSON-lines file that a process appends to and may be killed writing: a
    torn last line (no line ending, not valid JSON) is dropped and cut from the file, so appending
    goes on from there; any other bad line is an error saying to delete it and what that costs
    (`redo`: "its round is then sampled again")."""
    if not path.is_file():
        return []
    text = path.read_text(encoding="utf-8")
    lines = text.split("\n")
    kept, values = [], []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            values.append(json.loads(line))
        except json.JSONDecodeError:
            if n == len(lines):  # no newline after it: the write was cut short
                break
            raise DataError(f"{path}:{n} is not JSON; delete that line ({redo})") from None
        kept.append(line)
    clean = "".join(line + "\n" for line in kept)
    if clean != text:  # also ends a valid last line cut before its newline
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(clean, encoding="utf-8")
        os.replace(tmp, path)
    return values
