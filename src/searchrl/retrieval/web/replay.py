"""Web search as a recorded run was answered, from its record alone (`retrieval.web.replay`,
`eval run --web-replay RUN`; the record: `searchrl.retrieval.web.record`; docs/guides/web-replay.md).

No provider, HTTP client, web cache or budget is made, so nothing goes out and nothing is spent.
A request the record lacks is never sent: the search gets one passage saying so (id `MISSING_ID`),
a page is unreadable (the `open` tool says so, a result shows its snippet); each is warned about
and counted (`missing` in `usage()`, `web_missing` in an evaluation's metrics).
"""

from __future__ import annotations

import threading
import warnings
from concurrent.futures import ThreadPoolExecutor

from searchrl.data.types import Passage
from searchrl.errors import DataWarning
from searchrl.retrieval.web.budget import COUNTERS
from searchrl.retrieval.web.config import WebConfig
from searchrl.retrieval.web.pages import PageReader, PageUnreadable
from searchrl.retrieval.web.providers import Hit
from searchrl.retrieval.web.record import WebRecord, record_folder
from searchrl.retrieval.web.retriever import WebSearch, condensed_key, search_key

# A replay's counters beside the budget's (all zero in a replay): answers served from the record,
# requests the record lacks.
REPLAY_COUNTERS = ("replayed", "missing")
MISSING_ID = "web-replay:missing"


def missing_passage(sent: str) -> Passage:
    """What a search the record lacks returns: one passage that says so."""
    return Passage(MISSING_ID, "not in the web record",
                   f"This search ({sent}) is not in the web record being replayed; nothing was searched.")


class _Tally:
    """A replay's counters; every missing request is warned about, with what it was."""

    def __init__(self, record: WebRecord) -> None:
        self.record, self.counts, self._lock = record, dict.fromkeys(REPLAY_COUNTERS, 0), threading.Lock()

    def add(self, counter: str, kind: str = "", request: str = "") -> None:
        with self._lock:
            self.counts[counter] += 1
        if counter == "missing":
            warnings.warn(DataWarning(f"web replay: the record {self.record.path} holds no {kind} {request!r}; "
                                      "not sent (counted in web_missing)"), stacklevel=3)


class ReplayPages(PageReader):
    """Pages as the recorded run read them: its text, or its failure again; nothing fetched."""

    def __init__(self, cfg: WebConfig, record: WebRecord, tally: _Tally) -> None:  # no client, no cache
        self.cfg, self.budget, self.record, self.tally = cfg, None, record, tally

    def read(self, url: str) -> tuple[str, bool]:
        found = self.record.get("page", url)
        if found is None:
            self.tally.add("missing", "page", url)
            raise PageUnreadable(f"{url} is not in the web record being replayed; it was not fetched")
        self.tally.add("replayed")
        if "error" in found:
            raise PageUnreadable(found["error"], refused=found["refused"])
        return found["text"][: self.cfg.max_page_bytes], False

    def close(self) -> None:
        pass


class ReplayRetriever(WebSearch):
    """`WebRetriever` as it answered the recorded run of `cfg.replay`, from its record alone."""

    def __init__(self, cfg: WebConfig) -> None:
        self.cfg = cfg
        self.record = WebRecord(record_folder(cfg.replay))
        self.tally = _Tally(self.record)
        self.pages = ReplayPages(cfg, self.record, self.tally)  # the `open` tool reads URLs through it too
        self.pool = ThreadPoolExecutor(cfg.workers)

    def search(self, queries: list[str], k: int) -> list[list[Passage]]:
        asked = [q.strip() if q else "" for q in queries]
        lacking = {q for q in asked if q and ("search", search_key(self.cfg.provider, self.sent(q))) not in self.record}
        for q in lacking:
            self.tally.add("missing", "search", self.sent(q))
        found = super().search(["" if q in lacking else q for q in asked], k)
        return [[missing_passage(self.sent(q))] if q in lacking else got for q, got in zip(asked, found)]

    def usage(self) -> dict[str, float]:
        """Nothing spent (the budget's counters, all 0), and what the record answered or lacked."""
        return {**dict.fromkeys(COUNTERS, 0), **self.tally.counts}

    def close(self) -> None:
        self.pool.shutdown(wait=True)

    def _hits(self, query: str) -> list[Hit]:
        self.tally.add("replayed")
        found = self.record.get("search", search_key(self.cfg.provider, self.sent(query)))
        return [Hit(*h) for h in found["hits"]]

    def _condensed(self, query: str, hit: Hit, text: str) -> str | None:
        found = self.record.get("condensed", condensed_key(self.cfg, query, hit.url))
        if found is None:  # the page's extract stands in
            self.tally.add("missing", "condensed passage of", hit.url)
            return None
        self.tally.add("replayed")
        return found["text"]
