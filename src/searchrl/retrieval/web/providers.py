"""Web search APIs, registered by name: each knows its documented request and answer format, the
environment variables that hold its key and endpoint, its default price and pace.

Keys come only from the environment (never from a config file, which is copied into every run
directory); a variable may hold several keys separated by commas, used in turn. Every endpoint
can be moved with `{NAME}_URL` (or `retrieval.web.url`), which is how the tests point each
provider at a loopback server; keys go only over https to the provider's own host (that of its
default endpoint) or to a host listed in $SEARCHRL_KEY_HOSTS (`searchrl.outbound.key_allowed`).

Default prices (USD per request), from the providers' public pricing pages as read in 2026 —
check your plan and set `retrieval.web.budget.cost_per_request` when it differs:
- google  $5 per 1,000 queries (Custom Search JSON API; its 100 free queries a day not deducted)
- brave   $5 per 1,000 requests (Brave Search API)
- serper  $50 per 50,000 queries (Serper's starter credits)
- serpapi $75 a month for 5,000 searches (SerpAPI Developer plan)
- searxng free (self-hosted)
"""

from __future__ import annotations

import html
import os
import re
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, ClassVar
from urllib.parse import urlsplit

from searchrl.data.textio import loads
from searchrl.errors import SearchRLError
from searchrl.outbound import SCHEMES, OutboundRefused, key_allowed, split_url, withheld
from searchrl.registry import Registry

PROVIDERS: Registry[type[Provider]] = Registry("web search provider")
# Results asked for per request: one page of results at every provider, billed as one request.
NUM_RESULTS = 10


@dataclass(frozen=True)
class Hit:
    """One search result: the page it links to, its title and the provider's snippet."""

    url: str
    title: str
    snippet: str


@dataclass(frozen=True)
class HttpCall:
    method: str
    url: str
    params: dict[str, Any] = field(default_factory=dict)
    headers: dict[str, str] = field(default_factory=dict)
    json: dict[str, Any] | None = None


class Provider(ABC):
    """A search API. Subclasses set the class attributes and build/parse one request."""

    name: ClassVar[str]
    key_env: ClassVar[str | None]  # variable holding the API key(s); None: no key
    default_url: ClassVar[str | None]  # None: the user must say where (self-hosted)
    cost_usd: ClassVar[float]  # default price of one request (module docstring)
    requests_per_s: ClassVar[float]  # default pace, below the free/entry plans' limits
    results_key: ClassVar[str]  # where the result list sits in the answer
    fields: ClassVar[tuple[str, str, str]] = ("link", "title", "snippet")  # a result's url, title, snippet

    def __init__(self, url: str | None = None) -> None:
        self.url = url or os.environ.get(self.url_env) or self.default_url
        if not self.url:
            raise SearchRLError(f"web search provider {self.name} needs an endpoint: set {self.url_env} (or retrieval.web.url)")

    @property
    def url_env(self) -> str:
        return f"{self.name.upper()}_URL"

    def keys(self) -> list[str | None]:
        """The keys to rotate through; [None] for a provider without keys, or when the key policy
        withholds them from this endpoint (said once, as a warning)."""
        if self.key_env is None:
            return [None]
        keys = [k.strip() for k in os.environ.get(self.key_env, "").split(",") if k.strip()]
        own = urlsplit(self.default_url or "").hostname
        if not key_allowed(self.url, {own} if own else ()):
            if keys:
                withheld(f"web search provider {self.name}", self.key_env, self.url, f"only over https to {own}")
            return [None]
        if not keys:
            raise SearchRLError(
                f"web search provider {self.name} needs an API key: set {self.key_env} (several keys: comma-separated, used in turn)"
            )
        return keys

    @abstractmethod
    def call(self, query: str, key: str | None) -> HttpCall:
        """The documented request for `query`, asking for `NUM_RESULTS` results."""

    def read(self, body: str | bytes) -> list[Hit]:
        """The hits of an answer's body as the API sent it: `parse` of its JSON. What is not JSON,
        or nests deeper than any answer (`textio.MAX_DEPTH`), is a `SearchRLError` saying so."""
        try:
            text = body.decode("utf-8") if isinstance(body, bytes) else body
            data = loads(text, f"{self.name} at {self.url}")
        except (ValueError, RecursionError):  # JSONDecodeError and UnicodeDecodeError are ValueErrors
            shown = body[:200] if isinstance(body, str) else body[:200].decode("utf-8", "replace")
            raise SearchRLError(f"{self.name} at {self.url} answered non-JSON: {shown!r}") from None
        return self.parse(data)

    def parse(self, data: Any) -> list[Hit]:
        """The hits of an answer, best first. A result that is no JSON object, or whose link is
        not an http(s) URL that URL parsing accepts (`http://[::1:P/x`), is skipped; a title or
        snippet that is no string is empty."""
        if not isinstance(data, dict):
            raise SearchRLError(f"{self.name} at {self.url} answered {type(data).__name__}, not a JSON object of results")
        found = data
        for part in self.results_key.split("."):
            found = found.get(part) or {} if isinstance(found, dict) else {}
        results = found if isinstance(found, list) else []
        hits = [self.hit(r) for r in results[:100] if isinstance(r, dict)]
        return [h for h in hits if h.url]

    def hit(self, result: dict) -> Hit:
        """One result of the answer's list as a `Hit` (url "" when its link is refused)."""
        url, title, snippet = self.fields
        return Hit(result_url(result.get(url)), plain(result.get(title)), plain(result.get(snippet)))

    def refused_hint(self) -> str:
        return f"check the key(s) in {self.key_env}"


# Longest result link kept (browsers and servers cap URLs near 8 KB; search APIs never send longer).
MAX_URL_CHARS = 8192


def result_url(value: Any) -> str:
    """A result's link, or "" (the result is skipped) when it is no string, too long, or not an
    http(s) URL with a host that URL parsing accepts.

    >>> result_url("https://example.org/a"), result_url("http://[::1:P/x"), result_url(["http://a"]), result_url("javascript:x")
    ('https://example.org/a', '', '', '')
    """
    if not isinstance(value, str) or not value.strip() or len(value) > MAX_URL_CHARS:
        return ""
    url = value.strip()
    try:
        parts = split_url(url)
    except OutboundRefused:
        return ""
    return url if parts.scheme.lower() in SCHEMES and parts.hostname else ""


def plain(text: Any) -> str:
    """Snippets carry HTML (Brave marks matches with <strong>) and entities; keep the text. A value
    that is no string (a provider's JSON may hold anything) is no text.

    >>> plain("The <strong>Nile</strong> &amp; its delta"), plain({"nested": [1]})
    ('The Nile & its delta', '')
    """
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        text = str(text)
    if not isinstance(text, str):
        return ""
    return html.unescape(re.sub(r"<[^>]+>", "", text)).strip()


@PROVIDERS.register("google")
class Google(Provider):
    """Google Programmable Search (Custom Search JSON API): GET ?key&cx&q&num -> items[]."""

    name, key_env, cost_usd, requests_per_s = "google", "GOOGLE_API_KEY", 0.005, 1.0
    default_url, results_key = "https://www.googleapis.com/customsearch/v1", "items"

    @property
    def url_env(self) -> str:
        return "GOOGLE_CSE_URL"

    def __init__(self, url: str | None = None) -> None:
        super().__init__(url)
        self.cx = os.environ.get("GOOGLE_CSE_ID", "").strip()
        if not self.cx:
            raise SearchRLError("web search provider google needs a search engine id: set GOOGLE_CSE_ID (the cx of your Programmable Search Engine)")

    def call(self, query: str, key: str | None) -> HttpCall:
        return HttpCall("GET", self.url, params={"key": key, "cx": self.cx, "q": query, "num": NUM_RESULTS})



@PROVIDERS.register("brave")
class Brave(Provider):
    """Brave Search API: GET ?q&count with X-Subscription-Token -> web.results[]."""

    name, key_env, cost_usd, requests_per_s = "brave", "BRAVE_API_KEY", 0.005, 1.0
    default_url, results_key = "https://api.search.brave.com/res/v1/web/search", "web.results"
    fields = ("url", "title", "description")

    def call(self, query: str, key: str | None) -> HttpCall:
        headers = {"Accept": "application/json", **({"X-Subscription-Token": key} if key else {})}
        return HttpCall("GET", self.url, params={"q": query, "count": NUM_RESULTS}, headers=headers)



@PROVIDERS.register("serper")
class Serper(Provider):
    """Serper (Google results): POST {q, num} with X-API-KEY -> organic[]."""

    name, key_env, cost_usd, requests_per_s = "serper", "SERPER_API_KEY", 0.001, 5.0
    default_url, results_key = "https://google.serper.dev/search", "organic"

    def call(self, query: str, key: str | None) -> HttpCall:
        return HttpCall("POST", self.url, headers={"X-API-KEY": key} if key else {}, json={"q": query, "num": NUM_RESULTS})



@PROVIDERS.register("serpapi")
class SerpApi(Provider):
    """SerpAPI's Google engine: GET ?engine=google&q&api_key&num -> organic_results[]."""

    name, key_env, cost_usd, requests_per_s = "serpapi", "SERPAPI_API_KEY", 0.015, 1.0
    default_url, results_key = "https://serpapi.com/search.json", "organic_results"

    def call(self, query: str, key: str | None) -> HttpCall:
        return HttpCall("GET", self.url, params={"engine": "google", "q": query, "api_key": key, "num": NUM_RESULTS})

    def parse(self, data: Any) -> list[Hit]:
        # SerpAPI answers 200 with only an `error` when Google found nothing, and for some failures.
        if isinstance(data, dict) and "error" in data and "organic_results" not in data:
            error = plain(data["error"]) or type(data["error"]).__name__
            if "hasn't returned any results" in error:
                return []
            raise SearchRLError(f"serpapi at {self.url} answered: {error[:300]}")
        return super().parse(data)



@PROVIDERS.register("searxng")
class SearXNG(Provider):
    """A SearXNG instance: GET {SEARXNG_URL}/search?q&format=json -> results[]."""

    name, key_env, cost_usd, requests_per_s = "searxng", None, 0.0, 2.0
    default_url, results_key = None, "results"
    fields = ("url", "title", "content")

    def call(self, query: str, key: str | None) -> HttpCall:
        return HttpCall("GET", self.url.rstrip("/") + "/search", params={"q": query, "format": "json"})


    def refused_hint(self) -> str:
        return "SearXNG refuses format=json unless its settings.yml lists json under search.formats"


_QUOTA = re.compile(r"quota|credit|run out of", re.IGNORECASE)
_SHORT_WINDOW = re.compile(r"per (second|minute)", re.IGNORECASE)


def classify(status: int, text: str) -> str:
    """What an HTTP answer means: "ok"; "retry" (rate limit, server trouble); "exhausted" (this
    key's quota or credit is spent); "refused" (this key is not accepted); "error" (the request).

    >>> [classify(s, t) for s, t in [(200, ""), (503, ""), (429, "Request rate limit exceeded"),
    ...  (429, "Your account has run out of searches."), (400, "Not enough credits"),
    ...  (429, "Quota exceeded for quota metric 'Queries' and limit 'Queries per minute'"), (401, ""), (400, "bad q")]]
    ['ok', 'retry', 'retry', 'exhausted', 'exhausted', 'retry', 'refused', 'error']
    """
    if status < 300:
        return "ok"
    if (status == 402 or status in (400, 403, 429)) and _QUOTA.search(text) and not _SHORT_WINDOW.search(text):
        return "exhausted"
    if status in (408, 425, 429) or status >= 500:
        return "retry"
    if status in (401, 403):
        return "refused"
    return "error"
