"""`retrieval.web`: online web search in place of a local index (`--web PROVIDER`)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from searchrl.config import StrictModel
from searchrl.retrieval.http import RetryConfig
from searchrl.retrieval.web.providers import PROVIDERS


class BudgetConfig(StrictModel):
    """What one run may spend on web search, counted over all its processes and resumes."""

    max_requests: int | None = Field(None, ge=0, description="Most search requests the run may send (retries included); null = no cap.")
    max_cost_usd: float | None = Field(
        5.0, ge=0, description="Most dollars the run may spend on search requests; null = no cap. A training run at "
        "batch 128 x 8 samples makes thousands of searches a step: raise it knowingly.",
    )
    cost_per_request: float | None = Field(
        None, ge=0, description="USD per request; null = the provider's list price (retrieval/web/providers.py says where each comes from).",
    )
    requests_per_s: float | None = Field(
        None, ge=0, description="Most requests per second to the provider, over all processes on this machine; "
        "null = the provider's default (below its entry plan's limit), 0 = unpaced.",
    )


class CondenseConfig(StrictModel):
    """How a fetched page becomes passage-sized text."""

    method: Literal["extract", "llm"] = Field(
        "extract", description="extract: the ~`words`-word window of the page that best matches the query (free); "
        "llm: an OpenAI-compatible model writes it (the paper condenses pages with gpt-4o-mini).",
    )
    words: int = Field(100, ge=10, description="Passage size in words (the paper's corpus passages are 100 words).")
    url: str | None = Field(None, description="llm: OpenAI-compatible base URL (…/v1).")
    model: str = Field("gpt-4o-mini", description="llm: the condensing model.")
    api_key_env: str = Field("OPENAI_API_KEY", description="llm: environment variable holding its API key.")
    max_input_chars: int = Field(12000, ge=100, description="llm: the page text sent is cut to this many characters.")

    @model_validator(mode="after")
    def _llm_needs_url(self) -> CondenseConfig:
        if self.method == "llm" and not self.url:
            raise ValueError("condense.method=llm needs condense.url (an OpenAI-compatible base URL, e.g. https://api.openai.com/v1)")
        return self


class WebConfig(StrictModel):
    """Web search as the retriever: a provider's top results, each page fetched and condensed into
    one passage (id = its URL). Keys and endpoints come from environment variables named after
    the provider (BRAVE_API_KEY, SEARXNG_URL, ...; see docs/guides/web-search.md)."""

    provider: str | None = Field(None, description="google, brave, serper, serpapi or searxng; null = no web search.")
    url: str | None = Field(None, description="Endpoint of the provider; null = $<PROVIDER>_URL, else its public endpoint.")
    site: str | None = Field(
        None, description="Restrict results to one site, e.g. en.wikipedia.org (the paper restricts online search to Wikipedia).",
    )
    pages: bool = Field(True, description="Fetch each result's page; false = the provider's snippets are the passages.")
    condense: CondenseConfig = Field(default_factory=CondenseConfig, description="How a page becomes a passage.")
    cache: str | None = Field(
        None, description="SQLite file caching results, pages and the budget counters, shared by every process and run; "
        "null = $SEARCHRL_HOME/web-cache.sqlite.",
    )
    workers: int = Field(8, ge=1, description="Searches and page fetches in flight at once.")
    timeout_s: float = Field(20.0, gt=0, description="Seconds one search request or page fetch may take in all (redirects and body included).")
    allow_private: bool = Field(
        False, description="Fetch result pages at loopback, private and link-local addresses too (an intranet SearXNG's "
        "pages; `--web-allow-private`). Off, such pages are not read and their snippet stands in: a result or a redirect "
        "could point at this machine, the LAN or the cloud metadata service.",
    )
    max_page_bytes: int = Field(2_000_000, ge=1000, description="Bytes of a page read at most.")
    retry: RetryConfig = Field(
        default_factory=lambda: RetryConfig(total_s=120.0),
        description="How long a search failing with a rate limit (429) or a server error is retried, over all keys.",
    )
    budget: BudgetConfig = Field(default_factory=BudgetConfig, description="Caps, prices and pace.")
    record: bool = Field(
        True, description="`eval run`: write what every search, page read and condensed passage gave into the run "
        "folder's web_record/ (content-addressed: each distinct answer once), so the run can be replayed offline "
        "(`retrieval.web.replay`); false = no record. Not written by a replay.",
    )
    replay: str | None = Field(
        None, description="Answer every search and page read from the record of this run folder (or its web_record/ "
        "folder) instead of the web (`eval run --web-replay RUN`): no request is sent, nothing is spent, and a request "
        "the record lacks is reported, never sent (docs/guides/web-replay.md). The provider defaults to the record's.",
    )

    @model_validator(mode="before")
    @classmethod
    def _replayed_provider(cls, data):
        """A replay searches as its record's provider did; another provider's searches are not in it."""
        if isinstance(data, dict) and data.get("replay") is not None:
            from searchrl.retrieval.web.record import recorded_provider

            recorded = recorded_provider(str(data["replay"]))
            if data.get("provider") not in (None, recorded):
                raise ValueError(f"retrieval.web.provider={data['provider']}, but the web record of {data['replay']} holds "
                                 f"{recorded}'s searches: drop the provider (a replay uses its record's) or replay another run")
            data = {**data, "provider": recorded}
        return data

    @field_validator("provider")
    @classmethod
    def _known(cls, v: str | None) -> str | None:
        if v is not None and v not in PROVIDERS:
            raise ValueError(f"unknown web search provider {v!r}; choose one of: {', '.join(PROVIDERS.names())}")
        return v
