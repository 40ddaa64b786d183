"""Reading UTF-8 text and JSON-lines files with errors that name the file and line.

Every reader of question, corpus, prediction and metrics files goes through here, so bad bytes,
broken JSON and directories given for files all read the same way: `file:line: what; what to do`.

Two limits keep a hostile file from exhausting memory or the stack: a JSON-lines line may hold
at most `MAX_LINE_BYTES` (16 MiB; no real record comes near it) and any JSON value may nest at
most `MAX_DEPTH` (64) arrays or objects deep (the benchmark files nest at most 9; Python's
parser would otherwise recurse once per level and crash with RecursionError near 1,000).
"""

from __future__ import annotations

import gzip
import json
import os
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from searchrl.errors import DataError

_FIX_ENCODING = "re-save it as UTF-8 (e.g. `iconv -f latin1 -t utf-8`)"

MAX_LINE_BYTES = 16 * 2**20
MAX_DEPTH = 64

# A JSON string (escapes included) or one bracket: what the nesting scan steps over.
_JSON_TOKENS = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"|[\[\]{}]')


def check_file(path: Path, what: str = "file") -> None:
    """DataError unless `path` is a file: a directory and a missing path are told apart."""
    if path.is_dir():
        raise DataError(f"{path} is a directory, not a {what}; pass a file (one inside it?)")
    if not path.is_file():
        raise DataError(f"{path}: no such {what}")


def _decode(raw: bytes, where: str, bom: bool) -> str:
    try:
        return raw.decode("utf-8-sig" if bom else "utf-8")
    except UnicodeDecodeError as exc:
        raise DataError(
            f"{where}: not UTF-8 text (byte 0x{raw[exc.start]:02x} at byte {exc.start + 1} of the line); "
            f"{_FIX_ENCODING}"
        ) from None


def read_lines(path: Path, max_bytes: int | None = None) -> Iterator[tuple[int, str]]:
    """(line number, line with its ending) of a UTF-8 text file, `.gz` too; a leading
    byte-order mark is dropped. Lines are decoded one by one, so a bad byte names its line.
    A line longer than `max_bytes` (ending not counted) is an error, found without reading it whole."""
    path = Path(path)
    check_file(path)
    opener = gzip.open if path.suffix.lower() == ".gz" else open
    size = -1 if max_bytes is None else max_bytes + 2  # room for a "\r\n" ending
    with opener(path, "rb") as fh:
        lineno = 0
        while raw := fh.readline(size):
            lineno += 1
            if max_bytes is not None and len(raw) > max_bytes and len(raw.rstrip(b"\r\n")) > max_bytes:
                raise DataError(
                    f"{path}:{lineno}: line longer than {max_bytes:,} bytes, the limit for one JSON-lines "
                    "record; is this really a JSON-lines file? Split the record or fix the file"
                )
            yield lineno, _decode(raw, f"{path}:{lineno}", bom=lineno == 1)


def read_text(path: Path) -> str:
    """The whole of a UTF-8 text file (byte-order mark dropped); DataError names the bad line."""
    path = Path(path)
    check_file(path)
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


def _too_deep(text: str) -> int | None:
    """Offset of the first `[` or `{` nested deeper than MAX_DEPTH (strings skipped), None if
    none. A loop, not recursion: a hostile line may nest a million levels deep."""
    if text.count("[") + text.count("{") <= MAX_DEPTH:  # the common case, at C speed
        return None
    depth = 0
    for match in _JSON_TOKENS.finditer(text):
        token = match.group()
        if token in ("[", "{"):
            depth += 1
            if depth > MAX_DEPTH:
                return match.start()
        elif token in ("]", "}"):
            depth -= 1
    return None


def _nesting_error(where: str, column: int) -> DataError:
    return DataError(
        f"{where}: JSON nested more than {MAX_DEPTH} levels deep (at column {column}); "
        "no question, corpus or predictions record nests like that: fix or remove it"
    )


def loads(text: str, where: str) -> Any:
    """`json.loads` of one line, refusing values nested deeper than MAX_DEPTH with a DataError
    naming `where` ("file:line"). JSONDecodeError is left to the caller, which knows whether a
    torn line is expected there."""
    offset = _too_deep(text)
    if offset is not None:
        raise _nesting_error(where, offset + 1)
    return json.loads(text)


def read_json(path: Path) -> Any:
    """The value of a whole-file JSON document (a list of questions, a corpus, metrics), `.gz`
    too; DataError names the file and line of broken or too deeply nested JSON."""
    path = Path(path)
    text = "".join(line for _, line in read_lines(path))
    offset = _too_deep(text)
    if offset is not None:
        line = text.count("\n", 0, offset) + 1
        raise _nesting_error(f"{path}:{line}", offset - text.rfind("\n", 0, offset))
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise json_error(f"{path}:{exc.lineno}", exc) from None


def iter_json_lines(
    path: Path, on_torn_tail: Callable[[str], None] | None = None
) -> Iterator[tuple[int, Any]]:
    """(line number, value) for each non-blank line of a JSON-lines file.

    A last line that is invalid JSON and has no line ending was cut off mid-write (a crash, a
    partial copy): with `on_torn_tail` it is skipped and the callback gets a message saying so;
    without, it is an error like any other bad line.
    """
    for lineno, line in read_lines(path, MAX_LINE_BYTES):
        if not line.strip():
            continue
        try:
            value = loads(line, f"{path}:{lineno}")
        except json.JSONDecodeError as exc:
            if on_torn_tail is not None and not line.endswith(("\n", "\r")):
                on_torn_tail(f"{path}:{lineno}: the last line is cut off (no line ending, not valid JSON); skipped it")
                return
            raise json_error(f"{path}:{lineno}", exc) from None
        yield lineno, value


def read_appended_jsonl(path: Path, redo: str, numbered: bool = False) -> list:
    """The values of a JSON-lines file that a process appends to and may be killed writing: a
    torn last line (no line ending, not valid JSON) is dropped and cut from the file, so appending
    goes on from there; any other bad line is an error saying to delete it and what that costs
    (`redo`: "its round is then sampled again"). `numbered`: (line number, value) pairs."""
    if not path.is_file():
        return []
    text = read_text(path)  # bad bytes: an error naming their line
    lines = text.split("\n")
    kept, values = [], []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            value = loads(line, f"{path}:{n}")
        except json.JSONDecodeError:
            if n == len(lines):  # no newline after it: the write was cut short
                break
            raise DataError(f"{path}:{n} is not JSON; delete that line ({redo})") from None
        values.append((n, value) if numbered else value)
        kept.append(line)
    clean = "".join(line + "\n" for line in kept)
    if clean != text:  # also ends a valid last line cut before its newline
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(clean, encoding="utf-8")
        os.replace(tmp, path)
    return values
