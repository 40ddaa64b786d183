"""From search results to passages: the linked pages are read, their text extracted and condensed
to passage size (plain extraction, or an LLM as the paper does); pages that cannot be read give
their snippet. Against loopback servers."""

from __future__ import annotations

import doctest

import pytest
from loopback import PAGES, FakeOpenAI, FakeWeb

from searchrl.retrieval.web import pages
from searchrl.retrieval.web.config import WebConfig
from searchrl.retrieval.web.pages import html_paragraphs
from searchrl.retrieval.web.retriever import WebRetriever

Q = "Which river flows through Quellbridge?"


@pytest.fixture
def web(monkeypatch, tmp_path):
    server = FakeWeb()
    monkeypatch.setenv("SEARXNG_URL", server.base)
    monkeypatch.setenv("SEARCHRL_HOME", str(tmp_path))
    monkeypatch.setenv("SEARCHRL_KEY_HOSTS", "127.0.0.1")  # the loopback condenser may get keys
    yield server
    server.close()


def _retriever(**kw) -> WebRetriever:
    """The loopback web's pages are at 127.0.0.1: private addresses allowed unless said otherwise."""
    return WebRetriever(WebConfig(provider="searxng", budget={"requests_per_s": 0}, **{"allow_private": True, **kw}))


def test_pages_are_read_and_cut_to_the_window_that_matches_the_query(web):
    with _retriever() as r:
        quell, orrin, gone = r.search([Q], 3)[0]
        assert r.usage() == {"requests": 1, "cache_hits": 0, "cost_usd": 0.0, "pages": 2, "page_failures": 1}
    assert "Quellbridge is a market town on the river Tessaly. The Tessaly flows into Orrin Bay." in quell.text
    assert len(quell.text.split()) <= 100
    for junk in ("Main menu", "[1]", "var river", "Privacy policy", "color:red"):
        assert junk not in quell.text
    assert orrin.text == "Orrin Optics is a camera maker founded by Dagny Halvorsen."
    assert gone.text == "A page that is gone; its snippet stands in."  # HTTP 404
    assert sorted(web.pages_read()) == ["/wiki/Gone", "/wiki/Orrin_Optics", "/wiki/Quellbridge"]
    with _retriever() as r:  # another query: its pages come from the cache, the unreadable one is tried again
        r.search(["Quellbridge market"], 3)
        assert (r.usage()["pages"], r.usage()["page_failures"]) == (0, 1)
    assert sorted(web.pages_read()) == ["/wiki/Gone", "/wiki/Gone", "/wiki/Orrin_Optics", "/wiki/Quellbridge"]


def test_pages_at_private_addresses_are_not_read_unless_allowed(web, monkeypatch):
    monkeypatch.setattr(pages, "_refusals_said", False)
    with _retriever(allow_private=False) as r:
        with pytest.warns(pages.PageRefused, match="127.0.0.1 is a loopback address"):
            found = r.search([Q], 3)[0]
        assert (r.usage()["pages"], r.usage()["page_failures"]) == (0, 3)
    assert [p.text for p in found] == [snippet.replace("<strong>", "").replace("</strong>", "") for _, snippet, _ in PAGES.values()]
    assert web.pages_read() == [] and len(web.searches()) == 1  # the provider, the user's own endpoint, was asked


def test_a_page_that_is_not_text_gives_its_snippet(web):
    web.override = lambda seen: (200, b"%PDF-1.7 ...", "application/pdf") if seen.path.startswith("/wiki/") else None
    with _retriever() as r:
        assert r.search([Q], 1)[0][0].text == "Quellbridge is a market town."


def test_passage_size_follows_condense_words(web):
    with _retriever(condense={"words": 12}) as r:
        text = r.search([Q], 1)[0][0].text
    assert text == "Quellbridge is a market town on the river Tessaly. The Tessaly flows into Orrin Bay."[: len(text)]
    assert len(text.split()) <= 12


def test_an_llm_condenses_each_page_once(web, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-condense")
    llm = FakeOpenAI()
    llm.reply = "  Quellbridge lies on the Tessaly.\n"
    try:
        condense = {"method": "llm", "url": llm.url, "model": "mini", "words": 40}
        with _retriever(condense=condense) as r:
            first = r.search([Q], 2)[0]
            again = r.search([Q], 2)[0]
    finally:
        llm.close()
    assert [p.text for p in first] == ["Quellbridge lies on the Tessaly."] * 2 and again == first
    assert len(llm.requests) == 2  # one per page; the repeat came from the cache
    asked = llm.requests[0].body
    assert asked["model"] == "mini" and "at most 40 words" in asked["messages"][0]["content"]
    user = next(r.body["messages"][1]["content"] for r in llm.requests if "Quellbridge -" in r.body["messages"][1]["content"])
    assert user.startswith(f"Query: {Q}\nPage title: Quellbridge - Wikipedia\nPage text:\n")
    assert "market town on the river Tessaly" in user and "Main menu" not in user
    assert llm.requests[0].headers["authorization"] == "Bearer sk-condense"


def test_llm_condenser_needs_a_url():
    with pytest.raises(ValueError, match="condense.method=llm needs condense.url"):
        WebConfig(provider="searxng", condense={"method": "llm"})


def test_html_paragraphs_keep_block_structure_and_drop_chrome():
    page = ("<div><h2>History</h2><p>Founded in <a href='#'>1901</a>,<br>it grew.</p><ul><li>one</li><li>two</li></ul>"
            "<aside>Related</aside><form><button>Go</button></form><noscript>Enable JS</noscript></div>")
    assert html_paragraphs(page) == ["History", "Founded in 1901,", "it grew.", "one", "two"]


def test_doctests_pass():
    assert doctest.testmod(pages).failed == 0
