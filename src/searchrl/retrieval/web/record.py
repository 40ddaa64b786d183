"""What a web search run was given: `RUN/web_record/` (`retrieval.web.record`), which a replay
answers from (`searchrl.retrieval.web.replay`; docs/guides/web-replay.md).

A recording run writes every answer its searches and page reads were served — by the provider or
by the shared web cache alike. `index.jsonl` holds one line per request, `{"kind": "search" |
"page" | "condensed", "provider", "key", "request", "sha256"}`: `key` is the web cache's key of the
request (a search: `retriever.search_key(provider, query as sent)`; a page: its URL; a condensed
passage: `retriever.condensed_key`), `request` the query or URL as a person reads it; the answer
itself is `blobs/<sha256>.json`, so a page many results link to is stored once.

A record is data from elsewhere (a colleague's run, a download), so a replay trusts nothing in it:
every index line must have exactly these fields with these types and a `sha256` of 64 lowercase
hex digits (a name, never a path), or the replay stops with an error naming the file and line; a
blob is read only by that name and its bytes must hash to it (an edited answer is refused, not
replayed); its answer must have the shape its kind has (`_ANSWERS`), else an error names it.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import threading
from pathlib import Path

from searchrl.data.textio import loads, read_appended_jsonl
from searchrl.errors import DataError, SearchRLError

RECORD_DIR = "web_record"
INDEX = "index.jsonl"
KINDS = ("search", "page", "condensed")
_SHA256 = re.compile(r"[0-9a-f]{64}")
_DAMAGED = "the record was edited or damaged: replay another run, or record this one again"
# An index line's fields and their types (`provider`: None for a record written without one).
_FIELDS = {"kind": str, "provider": (str, type(None)), "key": str, "request": str, "sha256": str}


def _index_entry(where: str, line) -> tuple[str, str, str, str | None]:
    """(kind, key, sha256, provider) of one index line, or a DataError naming `where` (file:line)."""
    if not isinstance(line, dict):
        raise DataError(f"{where}: an index line is a JSON object, not {type(line).__name__}; {_DAMAGED}")
    if set(line) != set(_FIELDS):
        missing, extra = sorted(set(_FIELDS) - set(line)), sorted(set(line) - set(_FIELDS))
        said = "; ".join(p for p in (f"missing {', '.join(missing)}" if missing else "",
                                     f"unknown {', '.join(map(repr, extra[:5]))}" if extra else "") if p)
        raise DataError(f"{where}: an index line has the fields {', '.join(_FIELDS)} ({said}); {_DAMAGED}")
    for name, kind in _FIELDS.items():
        if not isinstance(line[name], kind):
            raise DataError(f"{where}: {name} is {type(line[name]).__name__}, not a string; {_DAMAGED}")
    if line["kind"] not in KINDS:
        raise DataError(f"{where}: kind {line['kind'][:40]!r} is none of {', '.join(KINDS)}; {_DAMAGED}")
    if not _SHA256.fullmatch(line["sha256"]):
        raise DataError(f"{where}: sha256 {line['sha256'][:80]!r} is not 64 lowercase hexadecimal digits (a blob's name, "
                        f"never a path); {_DAMAGED}")
    return line["kind"], line["key"], line["sha256"], line["provider"]


def _strings(value, n: int | None = None) -> bool:
    return isinstance(value, list) and all(isinstance(v, str) for v in value) and (n is None or len(value) == n)


# The shape of each kind's answer: a search's hits as [url, title, snippet]; a page's text, or the
# error its read gave (and whether the address policy refused it); a condensed passage's text or None.
_ANSWERS = {
    "search": lambda a: set(a) == {"hits"} and isinstance(a["hits"], list) and all(_strings(h, 3) for h in a["hits"]),
    "page": lambda a: (set(a) == {"text"} and isinstance(a["text"], str)) or (
        set(a) == {"error", "refused"} and isinstance(a["error"], str) and isinstance(a["refused"], bool)),
    "condensed": lambda a: set(a) == {"text"} and isinstance(a["text"], (str, type(None))),
}


class WebRecord:
    """The record in folder `path` of a run searching with `provider`: `put` as the run goes
    (threads share it; a resumed run appends), `get` in a replay. `fresh`: a new run, whose
    folder starts empty."""

    def __init__(self, path: str | Path, provider: str | None = None, fresh: bool = False) -> None:
        self.path, self.provider = Path(path), provider
        if fresh:
            shutil.rmtree(self.path, ignore_errors=True)
        self._lock = threading.Lock()
        self._index: dict[tuple[str, str], str] = {}  # (kind, key) -> sha256 of the answer
        self.providers: set[str] = set()
        index = self.path / INDEX
        if index.is_file():
            for n, line in read_appended_jsonl(index, redo="those answers are then not replayed", numbered=True):
                kind, key, sha, provider = _index_entry(f"{index}:{n}", line)
                self._index.setdefault((kind, key), sha)
                self.providers.add(provider)

    def __len__(self) -> int:
        return len(self._index)

    def __contains__(self, request: tuple[str, str]) -> bool:
        """Whether the record holds an answer to the (kind, key) `request`."""
        return request in self._index

    def put(self, kind: str, key: str, request: str, answer: dict) -> None:
        """Record `answer` to the `kind` request `key` (`request`: as a person reads it); the first
        answer to a request is the one kept (the web cache serves that one again anyway)."""
        data = json.dumps(answer, ensure_ascii=False, sort_keys=True).encode()
        sha = hashlib.sha256(data).hexdigest()
        line = json.dumps({"kind": kind, "provider": self.provider, "key": key, "request": request, "sha256": sha},
                          ensure_ascii=False) + "\n"
        with self._lock:
            if (kind, key) in self._index:
                return
            blob = self.path / "blobs" / f"{sha}.json"
            if not blob.is_file():
                blob.parent.mkdir(parents=True, exist_ok=True)
                part = blob.with_suffix(".part")
                part.write_bytes(data)
                os.replace(part, blob)  # a blob is whole or absent
            with open(self.path / INDEX, "a", encoding="utf-8") as f:
                f.write(line)
            self._index[(kind, key)] = sha

    def get(self, kind: str, key: str) -> dict | None:
        """The recorded answer to the `kind` request `key`; None when the record lacks it. Its
        blob must hash to its name and hold an answer of `kind`'s shape (module docstring)."""
        sha = self._index.get((kind, key))
        if sha is None:
            return None
        blob = self.path / "blobs" / f"{sha}.json"  # `sha` is 64 hex digits (`_index_entry`): a name, not a path
        try:
            data = blob.read_bytes()
        except OSError as exc:
            raise SearchRLError(f"web record {self.path}: the answer {sha} of a {kind} request cannot be read "
                                f"({exc.strerror or exc}); {_DAMAGED}") from None
        if hashlib.sha256(data).hexdigest() != sha:
            raise SearchRLError(f"web record {self.path}: {blob} does not match its sha256 (its content changed since it was "
                                f"recorded); {_DAMAGED}")
        try:
            answer = loads(data.decode("utf-8"), str(blob))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:  # a hash that matches bytes no recorder writes
            raise SearchRLError(f"web record {self.path}: {blob} is not a JSON answer ({exc}); {_DAMAGED}") from None
        if not isinstance(answer, dict) or not _ANSWERS[kind](answer):
            raise SearchRLError(f"web record {self.path}: {blob} is not the answer to a {kind} request (its fields or their "
                                f"types are not a {kind}'s); {_DAMAGED}")
        return answer


def record_folder(run: str) -> Path:
    """The web_record folder of `run`: a run folder holding one, or that folder itself."""
    path = Path(run).expanduser()
    for folder in (path / RECORD_DIR, path):
        if (folder / INDEX).is_file():
            return folder
    hint = "record one with a live web run (`eval run --web PROVIDER`, retrieval.web.record=true)"
    source = _replayed_from(path / "config.yaml")
    if source:
        hint = f"it is itself a replay, which records nothing: replay {source}, the run it replayed"
    raise SearchRLError(f"retrieval.web.replay={run}: no web record there ({path / RECORD_DIR / INDEX} is missing); {hint}")


def _replayed_from(config: Path) -> str | None:
    """The run a replayed run's config.yaml replayed; None for any other file or none."""
    import yaml

    try:
        tree = yaml.safe_load(config.read_text(encoding="utf-8"))
        return tree["retrieval"]["web"]["replay"]
    except (OSError, yaml.YAMLError, KeyError, TypeError):
        return None


def recorded_provider(run: str) -> str:
    """The provider whose searches the record of `run` holds."""
    record = WebRecord(record_folder(run))
    if len(record.providers) != 1:
        raise SearchRLError(f"web record {record.path} holds the searches of {len(record.providers)} providers "
                            f"({', '.join(sorted(map(str, record.providers))) or 'none'}); one run records one")
    return next(iter(record.providers))
