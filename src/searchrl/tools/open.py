"""`open`: read a whole passage or page — by passage id or title from the local corpus, or a URL.

By id: that passage. By title: every passage of that title in corpus order (an article chunked
into passages reads as the article), matched exactly, else ignoring case and spacing. The
id and title lookup is built on first use, one pass over the passage store: 64-bit hashes
sorted in two arrays (16 bytes a passage each), each hit checked against the passage itself.

By URL: through the web path (`searchrl.retrieval.web.pages.PageReader`): the address policy
(`searchrl.outbound`: http and https only; loopback, private and link-local addresses refused,
on every redirect, unless `retrieval.web.allow_private`), web search's size and time limits,
cache and budget. The text returned is cut at `ToolContext.max_open_chars`, with a note.
"""

from __future__ import annotations

import hashlib
import logging
import time
from array import array
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, ClassVar

import numpy as np

from searchrl.data.types import Passage
from searchrl.tools.base import Observation, Tool
from searchrl.tools.passages import clean_query
from searchrl.tools.registry import TOOLS

log = logging.getLogger(__name__)


def _hash(text: str) -> int:
    return int.from_bytes(hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=8).digest(), "little")


def _title_key(title: str) -> str:
    return " ".join((clean_query(title) or "").casefold().split())


class CorpusLookup:
    """Rows of a passage store by passage id and by (normalised) title."""

    def __init__(self, passages) -> None:
        self.passages = passages
        ids, titles = array("Q"), array("Q")
        t0 = time.perf_counter()
        for p in passages:
            ids.append(_hash(p.id))
            titles.append(_hash(_title_key(p.title)))
        self._ids = self._sorted(ids)
        self._titles = self._sorted(titles)
        log.info("open: looked up %d passages by id and title in %.1f s", len(ids), time.perf_counter() - t0)

    @staticmethod
    def _sorted(keys: array) -> tuple[np.ndarray, np.ndarray]:
        keys = np.frombuffer(keys, dtype=np.uint64)
        rows = np.argsort(keys, kind="stable")  # equal keys keep corpus order
        return keys[rows], rows

    @staticmethod
    def _rows(table: tuple[np.ndarray, np.ndarray], key: int) -> np.ndarray:
        keys, rows = table
        lo, hi = np.searchsorted(keys, np.uint64(key), "left"), np.searchsorted(keys, np.uint64(key), "right")
        return rows[lo:hi]

    def by_id(self, pid: str) -> Passage | None:
        found = [p for p in self.passages.get(self._rows(self._ids, _hash(pid)).tolist()) if p.id == pid]
        return found[0] if found else None

    def by_title(self, title: str) -> Iterator[Passage]:
        """The passages titled `title`, in corpus order: exact titles if any, else case- and space-blind."""
        key = _title_key(title)
        rows = self._rows(self._titles, _hash(key)).tolist()
        matches = [p for p in self.passages.get(rows) if _title_key(p.title) == key]
        exact = [p for p in matches if p.title == title.strip()]
        return iter(exact or matches)


@TOOLS.register("open")
class Open(Tool):
    name = "open"
    timeout_s = None  # built in: its requests have deadlines of their own
    description = ("Read a whole document: a passage by its `id`, an article by its `title` (as search results show it), "
                   "or a web page by its `url`. Give exactly one of them.")
    parameters: ClassVar[dict[str, Any]] = {
        "type": "object",
        "properties": {
            "id": {"type": "string", "description": "A passage id.", "maxLength": 200},
            "title": {"type": "string", "description": "The title of an article in the corpus.", "maxLength": 300},
            "url": {"type": "string", "description": "An http or https URL.", "maxLength": 2048},
        },
        "minProperties": 1,
        "maxProperties": 1,
    }

    def __init__(self, context=None) -> None:
        super().__init__(context)
        self._lookup: CorpusLookup | None = None

    def call(self, calls: Sequence[dict[str, Any]]) -> list[Observation]:
        urls = [c["url"] for c in calls if "url" in c]
        pages = iter(self._read_urls(urls) if urls else [])
        out = []
        for c in calls:
            t0 = time.perf_counter()
            obs = next(pages) if "url" in c else self._corpus(c)
            obs.latency_s = obs.latency_s or time.perf_counter() - t0
            out.append(obs)
        return out

    # ------------------------------------------------------------------------------ the corpus

    def _corpus(self, args: dict[str, str]) -> Observation:
        passages = getattr(self.context, "passages", None)
        if passages is None:
            return Observation.refused("open: this run has no local corpus to read passages from; open a `url` instead", "unavailable")
        if self._lookup is None:
            self._lookup = CorpusLookup(passages)
        if "id" in args:
            found = self._lookup.by_id(args["id"].strip())
            if found is None:
                return Observation.refused(f"open: no passage has the id {args['id']!r}", "not_found")
            return self._observation(found.title, [found])
        title = args["title"]
        if not _title_key(title):
            return Observation.refused("open: the title is empty; give a title as search results show it", "bad_arguments")
        chosen, size = [], 0
        for p in self._lookup.by_title(title):  # read only what the cap keeps
            chosen.append(p)
            size += len(p.text) + 1
            if size > self._cap():
                break
        if not chosen:
            return Observation.refused(f"open: no article is titled {title.strip()!r} in the corpus; search for it first", "not_found")
        return self._observation(chosen[0].title, chosen)

    def _observation(self, title: str, passages: list[Passage]) -> Observation:
        """One document of `passages`' texts, cut at the cap with a note."""
        text = "\n".join(p.text for p in passages)
        cap, note = self._cap(), ""
        if len(text) > cap:
            text, note = text[:cap], f"\n[cut: the first {cap} characters are shown]"
        page = Passage(passages[0].id, title, text)
        return Observation(self.context.format_passages([page]) + note, passages=passages)

    def _cap(self) -> int:
        return self.context.max_open_chars

    # ------------------------------------------------------------------------------ the web

    def _read_urls(self, urls: list[str]) -> list[Observation]:
        reader = getattr(self.context, "pages", None)
        if reader is None:
            return [Observation.refused("open: this run reads no web pages; open a passage by `id` or `title`", "unavailable")
                    for _ in urls]
        with ThreadPoolExecutor(min(len(urls), reader.cfg.workers)) as pool:
            return list(pool.map(self._read_url, urls))

    def _read_url(self, url: str) -> Observation:
        from searchrl.retrieval.web.pages import PageUnreadable

        reader, url, t0 = self.context.pages, url.strip(), time.perf_counter()
        try:
            text, fetched = reader.read(url)  # the address policy checks the URL first, cached or not
        except PageUnreadable as exc:
            return Observation.refused(f"open: {_for_model(str(exc))}", "refused" if exc.refused else "unreadable")
        except (ValueError, UnicodeError) as exc:  # a URL the model wrote that some parser below still rejects
            return Observation.refused(f"open: {url[:300]!r} is not a URL that can be read ({type(exc).__name__})", "bad_arguments")
        obs = self._observation(url, [Passage(url, url, text)])
        obs.passages = [Passage(url, url, text[: self._cap()])]  # what the model read, not the 2 MB page
        obs.cost, obs.latency_s = float(fetched), time.perf_counter() - t0  # cost: pages fetched, not cached
        return obs


def _for_model(message: str) -> str:
    # The policy's messages end with how a user allows private pages: not the model's to read.
    return message.split(". To read intranet pages", 1)[0]
