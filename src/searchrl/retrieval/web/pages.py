"""From a result's page to passage-sized text: fetch it, extract its text, condense it.

Plain extraction (the default) keeps the window of about `words` words whose paragraphs share the
most distinct words with the query — a free, deterministic stand-in for the paper's condensing
LLM. `LLMCondenser` asks an OpenAI-compatible model instead, as the paper does (gpt-4o-mini).
"""

from __future__ import annotations

import re
import warnings
from html.parser import HTMLParser
from typing import TYPE_CHECKING

import httpx

from searchrl import outbound
from searchrl.errors import DataWarning, SearchRLError
from searchrl.llm import ChatClient
from searchrl.outbound import OutboundRefused, check_public_url
from searchrl.retrieval.web.budget import SCHEMA
from searchrl.sqlcache import SqliteStore

if TYPE_CHECKING:
    from searchrl.retrieval.web.budget import Budget
    from searchrl.retrieval.web.config import WebConfig
    from searchrl.retrieval.web.record import WebRecord

USER_AGENT = "searchrl/0.1 (research evaluation; https://pypi.org/project/searchrl/)"

# Content that is never the page's text.
_SKIP = frozenset({"script", "style", "noscript", "svg", "nav", "header", "footer", "aside", "form", "button",
                   "select", "template", "iframe", "head", "sup"})
# Tags that end a paragraph.
_BLOCK = frozenset({"p", "div", "li", "ul", "ol", "br", "tr", "td", "th", "table", "section", "article", "main",
                    "h1", "h2", "h3", "h4", "h5", "h6", "dd", "dt", "blockquote", "pre", "figcaption", "title"})
_READABLE = ("text/html", "application/xhtml+xml", "text/plain")
_WORD = re.compile(r"\w+")
_STOP = frozenset({
    "a", "an", "and", "are", "as", "at", "be", "by", "for", "from", "has", "he", "in", "is", "it", "its",
    "of", "on", "or", "that", "the", "to", "was", "were", "what", "when", "where", "which", "who", "whom",
    "whose", "why", "how", "with", "did", "does", "do",
})


class _TextParser(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.paragraphs: list[str] = []
        self._current: list[str] = []
        self._skipping = 0

    def handle_starttag(self, tag: str, attrs) -> None:
        if tag in _SKIP:
            self._skipping += 1
        elif tag in _BLOCK:
            self._end_paragraph()

    def handle_endtag(self, tag: str) -> None:
        if tag in _SKIP:
            self._skipping = max(0, self._skipping - 1)
        elif tag in _BLOCK:
            self._end_paragraph()

    def handle_startendtag(self, tag: str, attrs) -> None:
        if tag in _BLOCK:
            self._end_paragraph()

    def handle_data(self, data: str) -> None:
        if not self._skipping:
            self._current.append(data)

    def _end_paragraph(self) -> None:
        text = " ".join("".join(self._current).split())
        if text:
            self.paragraphs.append(text)
        self._current = []


def html_paragraphs(page: str) -> list[str]:
    """The readable paragraphs of an HTML page, whitespace collapsed.

    >>> html_paragraphs("<html><head><title>T</title></head><body><nav>Menu</nav><p>One &amp; <b>two</b>"
    ...                 "<sup>[1]</sup>.</p><script>x()</script><li>three</li></body></html>")
    ['One & two.', 'three']
    """
    parser = _TextParser()
    parser.feed(page)
    parser.close()
    parser._end_paragraph()
    return parser.paragraphs


class PageRefused(DataWarning):
    """A result's page was not fetched: the address policy refused its URL or a redirect."""


class PageUnreadable(SearchRLError):
    """A page that gives no text: an error status, a kind that is no text (a PDF), a timeout,
    an address the policy refuses (`refused`)."""

    def __init__(self, message: str, refused: bool = False) -> None:
        super().__init__(message)
        self.refused = refused


def read_page(client: httpx.Client, url: str, max_bytes: int) -> str:
    """The text of the page at `url` (paragraphs on lines), at most `max_bytes` of it read;
    `PageUnreadable` says why there is none."""
    try:
        with client.stream("GET", url) as resp:
            kind = resp.headers.get("content-type", "").split(";")[0].strip().lower()
            if resp.status_code >= 400:
                raise PageUnreadable(f"{url} answered HTTP {resp.status_code}")
            if kind and kind not in _READABLE:
                raise PageUnreadable(f"{url} is {kind}, not a readable page")
            body = bytearray()
            for chunk in resp.iter_bytes():
                body += chunk
                if len(body) >= max_bytes:
                    break
            text = bytes(body[:max_bytes]).decode(resp.encoding or "utf-8", errors="replace")
    except OutboundRefused as exc:
        raise PageUnreadable(str(exc), refused=True) from None
    except (httpx.HTTPError, httpx.InvalidURL, httpx.StreamError, OSError, LookupError, ValueError) as exc:
        # InvalidURL: a URL httpx's own parser rejects though urlsplit took it (a model or a result wrote it)
        raise PageUnreadable(f"{url} could not be read ({type(exc).__name__})") from None
    paragraphs = [" ".join(p.split()) for p in text.splitlines()] if kind == "text/plain" else html_paragraphs(text)
    text = "\n".join(p for p in paragraphs if p)
    if not text:
        raise PageUnreadable(f"{url} has no readable text")
    return text


def _check_url(url: str, allow_private: bool) -> None:
    try:
        check_public_url(url, allow_private)
    except OutboundRefused as exc:
        raise PageUnreadable(str(exc), refused=True) from None


# The web cache's pages by the address policy they were fetched under (`allow_private`): a page
# fetched with private addresses allowed (its URL or a redirect hop may have been one) is never
# served to a run that refuses them; that run fetches it under its own policy. `_OLD_PAGES`:
# pages cached before the policy was recorded. They may come from either policy (or from none:
# before `allow_private` existed no address was refused), so only runs allowing private
# addresses read them; a public run fetches such a page again once and records it as public.
# Nothing is discarded, and pages cost no search request: only the fetch is repeated.
_PAGES = {False: "page/public", True: "page/private"}
_OLD_PAGES = "page"


class PageReader:
    """Pages read under the address policy (`cfg.allow_private`, `cfg.timeout_s`,
    `cfg.max_page_bytes`) through the web cache, counted in a run's web `budget` (None: not
    counted): the result pages of web search and the URLs the `open` tool reads share it.
    `store`: the web cache already open (None: this reader opens `cfg.cache` and closes it);
    `record`: where every read's outcome, text or failure, is written (None: nowhere)."""

    def __init__(self, cfg: WebConfig, store: SqliteStore | None = None, budget: Budget | None = None,
                 record: WebRecord | None = None) -> None:
        from searchrl.paths import cache_dir

        self.cfg, self.budget, self.record, self._owns_store = cfg, budget, record, store is None
        self.store = store or SqliteStore(cfg.cache or cache_dir() / "web-cache.sqlite", SCHEMA)
        self.client = outbound.client(cfg.timeout_s, cfg.max_page_bytes, public_only=not cfg.allow_private,
                                      follow_redirects=True, headers={"User-Agent": USER_AGENT})

    def read(self, url: str) -> tuple[str, bool]:
        """(the page's text, whether it was fetched now rather than found in the cache);
        `PageUnreadable` when it cannot be read (not cached: it may be readable next time).
        Only a page this reader's address policy would have fetched comes from the cache."""
        try:
            text, fetched = self._read(url)
        except PageUnreadable as exc:
            if self.record is not None:
                self.record.put("page", url, url, {"error": str(exc), "refused": exc.refused})
            raise
        if self.record is not None:
            self.record.put("page", url, url, {"text": text})
        return text, fetched

    def _read(self, url: str) -> tuple[str, bool]:
        try:
            _check_url(url, self.cfg.allow_private)  # cached or not: the clear message, before anything
            cached = self._cached(url)
            if cached is not None:
                # Cut to this run's cap when cached under a larger one: the text of n bytes is at
                # most n characters, so the cap bounds what a run holds of a page.
                return cached[: self.cfg.max_page_bytes], False
            text = read_page(self.client, url, self.cfg.max_page_bytes)
        except PageUnreadable:
            self._count(page_failures=1)
            raise
        self._count(pages=1)
        self.store.put(_PAGES[self.cfg.allow_private], url, text)
        return text, True

    def _cached(self, url: str) -> str | None:
        for ns in (_PAGES[False], _PAGES[True], _OLD_PAGES) if self.cfg.allow_private else (_PAGES[False],):
            if (text := self.store.get(ns, url)) is not None:
                return text
        return None

    def text(self, url: str) -> str | None:
        """A search result's page text; None when it cannot be read: its snippet stands in
        (refusals said once a process: every result of an intranet search would repeat it)."""
        global _refusals_said
        try:
            return self.read(url)[0]
        except PageUnreadable as exc:
            if exc.refused and not _refusals_said:
                _refusals_said = True
                warnings.warn(PageRefused(f"result pages the address policy refuses are not read, their snippets "
                                          f"stand in (first: {exc})"), stacklevel=2)
            return None

    def _count(self, **counts: int) -> None:
        if self.budget is not None:
            self.budget.add(**counts)

    def close(self) -> None:
        self.client.close()
        if self._owns_store:
            self.store.close()


_refusals_said = False  # PageReader.text says a refusal once a process


def _terms(text: str) -> set[str]:
    return {w for w in _WORD.findall(text.lower()) if w not in _STOP}


def best_passage(text: str, query: str, words: int) -> str:
    """The window of about `words` words of `text` (whole paragraphs, long ones cut) that shares
    the most distinct terms with `query`; the earliest wins a tie, so a page that does not match
    gives its opening.

    >>> page = "Intro about towns.\\nThe river Tessaly flows through Quellbridge.\\nOther things."
    >>> best_passage(page, "Which river flows through Quellbridge?", 6)
    'The river Tessaly flows through Quellbridge.'
    """
    pieces: list[list[str]] = []  # paragraphs cut to at most `words` words
    for paragraph in text.splitlines():
        tokens = paragraph.split()
        pieces += [tokens[i : i + words] for i in range(0, len(tokens), words)]
    windows, current = [], []
    for piece in pieces:
        if current and len(current) + len(piece) > words:
            windows.append(current)
            current = []
        current = current + piece
    windows.append(current)
    wanted = _terms(query)
    best = max(windows, key=lambda w: len(wanted & _terms(" ".join(w))))  # max keeps the first of equals
    return " ".join(best)


CONDENSE_PROMPT = (
    "You condense web pages for a search engine. Given a search query and the text of one page, write the "
    "facts from the page that help answer the query, in at most {words} words of plain prose, without "
    "commentary. If nothing on the page is relevant, summarise the page in that many words."
)


class LLMCondenser:
    """Condenses a page with a chat model (the paper: gpt-4o-mini); None when the reply is no text."""

    def __init__(self, chat: ChatClient, words: int, max_input_chars: int) -> None:
        self.chat, self.words, self.max_input_chars = chat, words, max_input_chars

    def __call__(self, client: httpx.Client, query: str, title: str, text: str) -> str | None:
        messages = [
            {"role": "system", "content": CONDENSE_PROMPT.format(words=self.words)},
            {"role": "user", "content": f"Query: {query}\nPage title: {title}\nPage text:\n{text[: self.max_input_chars]}"},
        ]
        reply = " ".join((self.chat.complete(client, messages, max_tokens=2 * self.words) or "").split())
        return reply or None
