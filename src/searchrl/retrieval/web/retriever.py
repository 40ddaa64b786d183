"""`WebRetriever`: a search API's top results, each page fetched and condensed into one passage.

A search goes cache -> budget (caps, pace) -> provider, with the keys in turn: a key that is
refused or out of quota is set aside and the next one tried; rate limits and server errors are
retried with backoff (`retrieval.web.retry`). Results, page texts and condensed passages are
cached in one SQLite file shared by all processes and runs, so a repeated query costs nothing.

The provider and the condenser are spoken to by one client, the result pages fetched by another
under the address policy (`searchrl.outbound`): a result or a redirect pointing at this machine,
the LAN or the metadata service is not read unless `retrieval.web.allow_private`.

With a `WebRecord` (`searchrl.retrieval.web.replay`) every answer served — from the provider or
the cache alike — is written into the run's record, which `ReplayRetriever` answers from.
"""

from __future__ import annotations

import json
import time
import uuid
from abc import abstractmethod
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

import httpx

from searchrl import outbound
from searchrl.data.types import Passage
from searchrl.errors import SearchRLError
from searchrl.retrieval.base import Retriever
from searchrl.retrieval.web.budget import SCHEMA, Budget, KeyRing
from searchrl.retrieval.web.config import WebConfig
from searchrl.retrieval.web.pages import USER_AGENT, LLMCondenser, PageReader, best_passage
from searchrl.retrieval.web.providers import NUM_RESULTS, PROVIDERS, Hit, classify
from searchrl.sqlcache import SqliteStore, digest

if TYPE_CHECKING:
    from searchrl.retrieval.web.record import WebRecord


def search_key(provider: str, sent: str) -> str:
    """The web cache's (and the record's) key of a search: provider, query as sent, results asked."""
    return digest(provider, sent, NUM_RESULTS)


def condensed_key(cfg: WebConfig, query: str, url: str) -> str:
    """The key of the passage an LLM condensed from `url`'s page for `query`."""
    return digest(cfg.condense.model, query, url, cfg.condense.words)


class WebSearch(Retriever):
    """Searches as passages: each query's hits, their pages read once a batch, each page condensed
    into one passage. Subclasses say where hits, pages (`self.pages`) and condensed texts come from:
    the web (`WebRetriever`) or a run's record of it (`ReplayRetriever`)."""

    cfg: WebConfig
    pages: PageReader
    pool: ThreadPoolExecutor

    def search(self, queries: list[str], k: int) -> list[list[Passage]]:
        if k > NUM_RESULTS:
            raise SearchRLError(f"web search returns at most {NUM_RESULTS} results per query; set rollout.k <= {NUM_RESULTS} (got {k})")
        asked = [q.strip() if q else "" for q in queries]
        todo = list(dict.fromkeys(q for q in asked if q))  # a batch of samples repeats its queries
        hits = dict(zip(todo, self.pool.map(self._hits, todo)))
        jobs = [(q, rank, h) for q in todo for rank, h in enumerate(hits[q][:k])]
        urls = list(dict.fromkeys(h.url for _, _, h in jobs)) if self.cfg.pages else []  # each page read once
        texts = dict(zip(urls, self.pool.map(self.pages.text, urls)))
        passages = self.pool.map(lambda job: self._passage(*job, texts.get(job[2].url)), jobs)
        done = dict(zip([(q, rank) for q, rank, _ in jobs], passages))
        return [[done[(q, rank)] for rank in range(len(hits[q][:k]))] if q else [] for q in asked]

    def sent(self, query: str) -> str:
        """`query` as sent to the provider."""
        return f"{query} site:{self.cfg.site}" if self.cfg.site else query

    @abstractmethod
    def _hits(self, query: str) -> list[Hit]:
        """The hits of `query` (not yet as sent), best first."""

    @abstractmethod
    def _condensed(self, query: str, hit: Hit, text: str) -> str | None:
        """`hit`'s page `text` condensed for `query` by the LLM (`condense.method=llm`); None: extract instead."""

    def _passage(self, query: str, rank: int, hit: Hit, text: str | None) -> Passage:
        """`hit` as a passage: its page's `text` condensed, or its snippet when the page is unread."""
        body = None
        if text is not None and self.cfg.condense.method == "llm":
            body = self._condensed(query, hit, text)
        if text is not None and body is None:
            body = best_passage(text, query, self.cfg.condense.words)
        # Reciprocal rank: providers order their results but give no score.
        return Passage(hit.url, hit.title or hit.url, body or hit.snippet, 1.0 / (rank + 1))


class WebRetriever(WebSearch):
    """Web search with `cfg`, counting against the budget of `run` (its directory; None: this
    process alone). `new_run`: start that run's counters from zero. `record`: where every answer
    served is written (None: nowhere)."""

    def __init__(self, cfg: WebConfig, run: str | None = None, new_run: bool = False, record: WebRecord | None = None) -> None:
        from searchrl.paths import cache_dir

        self.cfg, self.record = cfg, record
        self.provider = PROVIDERS.get(cfg.provider)(cfg.url)
        self.keys = KeyRing(self.provider.keys())  # a missing key fails here, before any model loads
        self.store = SqliteStore(cfg.cache or cache_dir() / "web-cache.sqlite", SCHEMA)
        rate = cfg.budget.requests_per_s if cfg.budget.requests_per_s is not None else self.provider.requests_per_s
        price = cfg.budget.cost_per_request if cfg.budget.cost_per_request is not None else self.provider.cost_usd
        self.budget = Budget(self.store, run or f"process-{uuid.uuid4()}", self.provider.name, price,
                             1.0 / rate if rate > 0 else 0.0, cfg.budget.max_requests, cfg.budget.max_cost_usd)
        if new_run:
            self.budget.reset()
        self.http = outbound.client(cfg.timeout_s, headers={"User-Agent": USER_AGENT})
        self.pages = PageReader(cfg, self.store, self.budget, record)  # the `open` tool reads URLs through it too
        self.pool = ThreadPoolExecutor(cfg.workers)
        self.condenser = None
        if cfg.condense.method == "llm":
            from searchrl.llm import ChatClient

            c = cfg.condense
            chat = ChatClient(c.url, c.model, c.api_key_env, role="the page condenser", flag="retrieval.web.condense.url")
            self.condenser = LLMCondenser(chat, c.words, c.max_input_chars)

    def usage(self) -> dict[str, float]:
        return self.budget.usage()

    def close(self) -> None:
        self.pool.shutdown(wait=True)
        self.http.close()
        self.pages.close()
        self.store.close()

    # -------------------------------------------------------------------------------- searching

    def _hits(self, query: str) -> list[Hit]:
        sent = self.sent(query)
        key = search_key(self.provider.name, sent)
        cached = self.store.get("search", key)
        if cached is not None:
            self.budget.add(cache_hits=1)
            hits = [Hit(*h) for h in json.loads(cached)]
        else:
            hits = self._request(sent)
            self.store.put("search", key, json.dumps([[h.url, h.title, h.snippet] for h in hits]))
        if self.record is not None:
            self.record.put("search", key, sent, {"hits": [[h.url, h.title, h.snippet] for h in hits]})
        return hits

    def _request(self, query: str) -> list[Hit]:
        started, retries, last = time.monotonic(), 0, ""
        while True:
            self.budget.reserve()
            api_key = self.keys.next()
            call = self.provider.call(query, api_key)
            try:
                params = {k: v for k, v in call.params.items() if v is not None}  # a withheld key is left out
                resp = self.http.request(call.method, call.url, params=params or None, headers=call.headers, json=call.json)
                status, text = resp.status_code, resp.text
            except httpx.HTTPError as exc:
                status, text = 0, f"{type(exc).__name__}: {exc}"
            verdict = classify(status, text) if status else "retry"
            if verdict == "ok":
                return self.provider.read(text)  # non-JSON or too deeply nested: a SearchRLError saying so
            self.budget.refund()
            last = f"HTTP {status}: {text[:200]}" if status else text
            if verdict in ("refused", "exhausted"):
                self._set_aside(api_key, verdict, last)
                continue
            if verdict == "error":
                raise SearchRLError(f"{self.provider.name} at {self.provider.url} rejected the search ({last})")
            retries += 1
            wait = self.cfg.retry.wait(retries, time.monotonic() - started)
            if wait is None:
                raise SearchRLError(
                    f"{self.provider.name} at {self.provider.url} did not answer a search after {retries} attempts ({last}); "
                    "is it reachable? Raise retrieval.web.retry.total_s to wait longer, or lower retrieval.web.budget.requests_per_s"
                )
            time.sleep(wait)

    def _set_aside(self, api_key: str | None, verdict: str, last: str) -> None:
        env, name = self.provider.key_env, self.provider.name
        if env is None:
            raise SearchRLError(f"{name} at {self.provider.url} refused the search ({last}); {self.provider.refused_hint()}")
        if api_key is None:
            raise SearchRLError(
                f"{name} at {self.provider.url} refused the search ({last}); the key in {env} was withheld from this host: "
                f"add it to {outbound.KEY_HOSTS_ENV} to send it"
            )
        if self.keys.drop(api_key):
            return
        if verdict == "exhausted":
            raise SearchRLError(
                f"{name}: the quota of every key in {env} is spent ({last}); wait for it to renew, add a key "
                f"(comma-separated in {env}) or search with another provider"
            )
        raise SearchRLError(f"{name} refused every key in {env} ({last}); {self.provider.refused_hint()}")

    # -------------------------------------------------------------------------------- pages

    def _condensed(self, query: str, hit: Hit, text: str) -> str | None:
        key = condensed_key(self.cfg, query, hit.url)
        cached = self.store.get("condensed", key)
        if cached is None:
            cached = self.condenser(self.http, query, hit.title, text)
            if cached is not None:
                self.store.put("condensed", key, cached)
        if self.record is not None:
            self.record.put("condensed", key, f"{query} | {hit.url}", {"text": cached})
        return cached
