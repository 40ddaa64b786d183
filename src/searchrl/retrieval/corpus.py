"""Read corpus files of every common shape into ~100-word `Passage`s, streaming.

Formats (`fmt`):
  jsonl      one {"id", "title", "text"} object per line (id and title may be absent)
  flashrag   one {"id", "contents"} object per line; contents = '"Title"\\ntext' (FlashRAG, Search-R1)
  kilt       one KILT page per line: {"wikipedia_title", "text": [paragraphs], "wikipedia_id"?}
  tsv        DPR `id<TAB>text<TAB>title` with a header row, or headerless `id<TAB>text`
             (R1-Searcher samples: the title is recovered from "Title: X Text: Y" or "X   Y")
  json-list  a JSON list of {"title", "text"} (HippoRAG 2Wiki / MuSiQue corpora)
  json-dict  a JSON object title -> list of sentences (HippoRAG HotpotQA corpus)

The two JSON shapes must be parsed whole (the standard library cannot stream them); the
line-based shapes are read one line at a time, so a 29M-passage DPR file never sits in RAM.
"""

from __future__ import annotations

import csv
import json
import re
import sys
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import NamedTuple

from searchrl.data.textio import check_file, iter_json_lines, loads, read_json, read_lines
from searchrl.data.types import Passage
from searchrl.errors import DataError, DataWarning, SearchRLError

FORMATS = ("jsonl", "flashrag", "kilt", "tsv", "json-list", "json-dict")


class CorpusWarning(DataWarning):
    """Something in a corpus file was skipped or looks damaged, but reading went on."""


class _Doc(NamedTuple):
    where: str  # "file:line" (or "file: item N") for messages
    id: str
    title: str
    text: str


def read_passages(path: Path, fmt: str = "auto", chunk_words: int = 100) -> Iterator[Passage]:
    """Stream the passages of a corpus file, chunking long documents.

    Documents longer than about 1.5 x `chunk_words` words are split into equal chunks of about
    `chunk_words` words (ids `<docid>-<n>`, title kept); `chunk_words <= 0` never splits.
    The file and format are checked now; malformed rows raise `DataError` (file:line) while
    iterating, and a file that yields nothing raises `DataError` at the end.
    """
    path = Path(path)
    check_file(path, "corpus file")
    if fmt == "auto":
        fmt = detect_format(path)
    elif fmt not in _READERS:
        raise SearchRLError(
            f"unknown corpus format {fmt!r}; choose one of: auto, {', '.join(FORMATS)}"
        )
    return _passages(path, _READERS[fmt](path), chunk_words)


def chunk_document(doc_id: str, title: str, text: str, chunk_words: int = 100) -> list[Passage]:
    """One document -> passages of about `chunk_words` words (whitespace collapsed).

    The number of chunks is round(words / chunk_words) and the words are shared out evenly,
    so no passage is a stray few-word tail (DPR's fixed 100-word windows leave those).

    >>> [len(p.text.split()) for p in chunk_document("d", "T", "w " * 250)]
    [84, 83, 83]
    """
    words = text.split()
    if not words:
        return []
    title = " ".join(title.split())
    n_chunks = 1 if chunk_words <= 0 else max(1, int(len(words) / chunk_words + 0.5))
    if n_chunks == 1:
        return [Passage(id=doc_id, title=title, text=" ".join(words))]
    base, extra = divmod(len(words), n_chunks)
    passages, start = [], 0
    for i in range(n_chunks):
        end = start + base + (1 if i < extra else 0)
        passages.append(Passage(id=f"{doc_id}-{i}", title=title, text=" ".join(words[start:end])))
        start = end
    return passages


def detect_format(path: Path) -> str:
    """Guess the format from the extension and the first record; `DataError` when unsure."""
    ext = _suffix(path)
    if ext == ".tsv":
        return "tsv"
    first = _first_nonblank_line(path)
    if first is None:
        raise DataError(f"{path}: the file held no passages (it is empty)")
    head = first.lstrip()
    if head.startswith("["):
        return "json-list"
    if head.startswith("{"):
        try:
            record = loads(first, f"{path}:1")
        except json.JSONDecodeError:
            # A pretty-printed JSON object spans many lines; JSON-lines records never do.
            if ext == ".jsonl":
                raise DataError(f"{path}:1: the first line is not valid JSON") from None
            return "json-dict"
        if (
            isinstance(record, dict)
            and record
            and all(isinstance(v, list) for v in record.values())
        ):
            return "json-dict"
        if isinstance(record, dict):
            if "contents" in record:
                return "flashrag"
            if "wikipedia_title" in record:
                return "kilt"
            if "text" in record:
                return "jsonl"
        keys = ", ".join(list(record)[:8]) if isinstance(record, dict) else type(record).__name__
        raise DataError(
            f"{path}:1: cannot tell the corpus format from the first record (keys: {keys}); "
            f"expected 'text', 'contents' or 'wikipedia_title'. Pass --format ({', '.join(FORMATS)})."
        )
    if "\t" in first:
        return "tsv"
    raise DataError(
        f"{path}: cannot tell the corpus format from its extension or first line; "
        f"pass --format ({', '.join(FORMATS)})."
    )


# --- streaming and chunking ------------------------------------------------------------


def _passages(path: Path, docs: Iterator[_Doc], chunk_words: int) -> Iterator[Passage]:
    count, empty, first_empty = 0, 0, ""
    for doc in docs:
        chunks = chunk_document(doc.id, doc.title, doc.text, chunk_words)
        if not chunks:
            empty += 1
            first_empty = first_empty or doc.where
        count += len(chunks)
        yield from chunks
    if empty:
        warnings.warn(
            f"{path}: skipped {empty} record(s) with empty text (first at {first_empty})",
            CorpusWarning,
            stacklevel=2,
        )
    if count == 0:
        raise DataError(f"{path}: the file held no passages (no record had any text)")


def _suffix(path: Path) -> str:
    suffixes = [s.lower() for s in path.suffixes]
    if suffixes and suffixes[-1] == ".gz":
        suffixes.pop()
    return suffixes[-1] if suffixes else ""


def _first_nonblank_line(path: Path) -> str | None:
    return next((line for _, line in read_lines(path) if line.strip()), None)


def _ends_with_newline(path: Path) -> bool:
    if path.suffix.lower() == ".gz" or path.stat().st_size == 0:
        return True
    with open(path, "rb") as f:
        f.seek(-1, 2)
        return f.read(1) in (b"\n", b"\r")


def _as_text(value, where: str, field: str) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return " ".join(value)
    raise DataError(
        f"{where}: field {field!r} must be a string or a list of strings, got {type(value).__name__}"
    )


def _doc_id(record: dict, fallback: int, *keys: str) -> str:
    for key in keys:
        if record.get(key) not in (None, ""):
            return str(record[key])
    return str(fallback)


# --- JSON lines: jsonl, flashrag, kilt -------------------------------------------------


def _json_lines(path: Path, expected: str) -> Iterator[tuple[str, dict]]:
    for lineno, record in iter_json_lines(path, on_torn_tail=_warn):
        where = f"{path}:{lineno}"
        if not isinstance(record, dict):
            raise DataError(
                f"{where}: expected a JSON object {expected}, got {type(record).__name__}"
            )
        yield where, record


def _warn(message: str) -> None:
    warnings.warn(message, CorpusWarning, stacklevel=3)


def _missing(where: str, field: str, record: dict, expected: str) -> DataError:
    keys = ", ".join(list(record)[:8]) or "none"
    return DataError(f"{where}: record has no {field!r} field (has: {keys}); expected {expected}")


def _read_jsonl(path: Path) -> Iterator[_Doc]:
    expected = '{"id", "title", "text"}'
    for n, (where, rec) in enumerate(_json_lines(path, expected)):
        if "text" not in rec:
            raise _missing(where, "text", rec, expected)
        title = rec.get("title") or ""
        yield _Doc(
            where,
            _doc_id(rec, n, "id", "_id"),
            _as_text(title, where, "title"),
            _as_text(rec["text"], where, "text"),
        )


def _read_flashrag(path: Path) -> Iterator[_Doc]:
    expected = '{"id", "contents"}'
    for n, (where, rec) in enumerate(_json_lines(path, expected)):
        if "contents" not in rec:
            raise _missing(where, "contents", rec, expected)
        title, text = split_contents(_as_text(rec["contents"], where, "contents"))
        yield _Doc(where, _doc_id(rec, n, "id", "_id"), title, text)


def split_contents(contents: str) -> tuple[str, str]:
    """FlashRAG `contents` -> (title, text): the first line is the title, quoted or not."""
    first, newline, rest = contents.partition("\n")
    if not newline:
        return "", contents
    title = first.strip()
    if len(title) >= 2 and title[0] == title[-1] == '"':
        title = title[1:-1]
    return title, rest


_KILT_MARKUP = re.compile(r"^(Section|BULLET)::::")


def _read_kilt(path: Path) -> Iterator[_Doc]:
    expected = '{"wikipedia_title", "text": [paragraphs]}'
    for n, (where, rec) in enumerate(_json_lines(path, expected)):
        for field in ("wikipedia_title", "text"):
            if field not in rec:
                raise _missing(where, field, rec, expected)
        title = _as_text(rec["wikipedia_title"], where, "wikipedia_title")
        paragraphs = (
            rec["text"] if isinstance(rec["text"], list) else [_as_text(rec["text"], where, "text")]
        )
        if paragraphs and isinstance(paragraphs[0], str) and paragraphs[0].strip() == title.strip():
            paragraphs = paragraphs[1:]  # KILT repeats the title as paragraph 0
        # Section headings and bullets keep their words; only the KILT markers go.
        text = _as_text(
            [_KILT_MARKUP.sub("", p) if isinstance(p, str) else p for p in paragraphs],
            where,
            "text",
        )
        yield _Doc(where, _doc_id(rec, n, "wikipedia_id", "id", "_id"), title, text)


# --- TSV -------------------------------------------------------------------------------

_TSV_NAMES = {"id", "text", "title", "contents"}
_TITLE_TEXT = re.compile(r"^\s*Title:\s*(.*?)\s+Text:\s*(.*)$", re.DOTALL)
_TITLE_SPACES = re.compile(r"^(\S.*?) {3,}(.*)$", re.DOTALL)


def _read_tsv(path: Path) -> Iterator[_Doc]:
    csv.field_size_limit(min(sys.maxsize, 2**31 - 1))  # whole KILT pages exceed the 128 KiB default
    columns: list[str] | None = None
    title_pattern: re.Pattern | None = None
    last_line = 0
    reader = csv.reader((line for _, line in read_lines(path)), delimiter="\t")
    for row in reader:
        lineno = last_line = reader.line_num
        where = f"{path}:{lineno}"
        if not any(cell.strip() for cell in row):
            continue
        if columns is None:
            names = [c.strip().lower() for c in row]
            if set(names) <= _TSV_NAMES and ({"text", "contents"} & set(names)):
                columns = names
                continue
            if len(row) < 2:
                raise DataError(
                    f"{where}: expected id<TAB>text[<TAB>title], found a single column"
                )
            columns = ["id", "text", "title"][: min(len(row), 3)]
            if len(columns) == 2:
                # Headerless id<TAB>text rows pack the title into the text; learn how once.
                title_pattern = next(
                    (p for p in (_TITLE_TEXT, _TITLE_SPACES) if p.match(row[1])), None
                )
        if len(row) < len(columns):
            missing = ", ".join(columns[len(row) :])
            raise DataError(
                f"{where}: row has {len(row)} column(s); missing {missing} (columns: {', '.join(columns)})"
            )
        cells = dict(zip(columns, row))
        text, title = cells.get("text", ""), cells.get("title", "")
        if "contents" in cells:
            title, text = split_contents(cells["contents"])
        elif title_pattern is not None and (m := title_pattern.match(text)):
            title, text = m.group(1), m.group(2)
        yield _Doc(where, cells.get("id") or str(lineno), title, text)
    if last_line and not _ends_with_newline(path):
        warnings.warn(
            f"{path}:{last_line}: the last row has no line ending; if the file was cut off, "
            "that passage ends mid-text (kept it)",
            CorpusWarning,
            stacklevel=2,
        )


# --- whole-file JSON: json-list, json-dict ---------------------------------------------


def _read_json_list(path: Path) -> Iterator[_Doc]:
    data = read_json(path)
    if not isinstance(data, list):
        raise DataError(
            f"{path}: expected a JSON list of {{'title', 'text'}} objects, got a {type(data).__name__}"
        )
    for i, rec in enumerate(data):
        where = f"{path}: item {i}"
        if not isinstance(rec, dict):
            raise DataError(
                f"{where}: expected an object with 'title' and 'text', got {type(rec).__name__}"
            )
        if "text" not in rec:
            raise _missing(where, "text", rec, '{"title", "text"}')
        title = _as_text(rec.get("title") or "", where, "title")
        yield _Doc(
            where, _doc_id(rec, i, "id", "_id", "idx"), title, _as_text(rec["text"], where, "text")
        )


def _read_json_dict(path: Path) -> Iterator[_Doc]:
    data = read_json(path)
    if not isinstance(data, dict):
        raise DataError(
            f"{path}: expected a JSON object title -> list of sentences, got a {type(data).__name__}"
        )
    for i, (title, sentences) in enumerate(data.items()):
        where = f"{path}: entry {title!r}"
        if isinstance(sentences, list):
            sentences = [s.strip() if isinstance(s, str) else s for s in sentences]
        yield _Doc(where, str(i), title, _as_text(sentences, where, "sentences"))


_READERS: dict[str, Callable[[Path], Iterator[_Doc]]] = {
    "jsonl": _read_jsonl,
    "flashrag": _read_flashrag,
    "kilt": _read_kilt,
    "tsv": _read_tsv,
    "json-list": _read_json_list,
    "json-dict": _read_json_dict,
}
