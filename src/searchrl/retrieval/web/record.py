"""What a web search run was given: `RUN/web_record/` (`retrieval.web.record`), which a replay
answers from (`searchrl.retrieval.web.replay`; docs/guides/web-replay.md).

A recording run writes every answer its searches and page reads were served — by the provider or
by the shared web cache alike. `index.jsonl` holds one line per request, `{"kind": "search" |
"page" | "condensed", "provider", "key", "request", "sha256"}`: `key` is the web cache's key of the
request (a search: `retriever.search_key(provider, query as sent)`; a page: its URL; a condensed
passage: `retriever.condensed_key`), `request` the query or URL as a person reads it; the answer
itself is `blobs/<sha256>.json`, so a page many results link to is stored once.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import threading
from pathlib import Path

from searchrl.data.textio import read_appended_jsonl
from searchrl.errors import SearchRLError

RECORD_DIR = "web_record"
INDEX = "index.jsonl"


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
        if (self.path / INDEX).is_file():
            for line in read_appended_jsonl(self.path / INDEX, redo="those answers are then not replayed"):
                self._index.setdefault((line["kind"], line["key"]), line["sha256"])
                self.providers.add(line["provider"])

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
        """The recorded answer to the `kind` request `key`; None when the record lacks it."""
        sha = self._index.get((kind, key))
        if sha is None:
            return None
        try:
            return json.loads((self.path / "blobs" / f"{sha}.json").read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise SearchRLError(f"web record {self.path}: the answer {sha} of a {kind} request cannot be read ({exc}); "
                                "the record is damaged: replay another run, or record this one again") from None


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
