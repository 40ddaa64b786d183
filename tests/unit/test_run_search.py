"""The rollout layer's hold on the run's retriever (`rollout.run_search`): the preflight check
and the step's retrieval metrics."""

from __future__ import annotations

import socket

import pytest

from searchrl.errors import SearchRLError
from searchrl.retrieval import RetrievalConfig
from searchrl.rollout.run_search import RetrievalCounts, RunSearch, retrieval_record


def test_retrieval_record_sums_queries_over_ranks_and_takes_the_slowest_ranks_seconds():
    ranks = [RetrievalCounts(4, 1, 0.5, True), RetrievalCounts(2, 2, 1.5, True)]
    # (1 + 2) hits of (4 + 2) queries; rank 1 searched longest
    assert retrieval_record(ranks) == {"retrieval_s": 1.5, "retrieval_queries": 6, "retrieval_cache_hit_rate": 0.5}
    # one rank with a cache is enough for a rate: the other's repeats in a batched call still count
    assert retrieval_record([RetrievalCounts(4, 1, 0.5, False), RetrievalCounts(4, 3, 0.2, True)])["retrieval_cache_hit_rate"] == 0.5
    assert retrieval_record([RetrievalCounts(4, 1, 0.5, False)])["retrieval_cache_hit_rate"] is None  # no cache anywhere
    assert retrieval_record([RetrievalCounts(cached=True)]) == {"retrieval_s": 0.0, "retrieval_queries": 0, "retrieval_cache_hit_rate": None}


def test_open_queries_the_retriever_once_and_names_the_setting_when_it_fails(tmp_path):
    search = RunSearch.open(RetrievalConfig(index="toyworld"), tmp_path)
    counts = search.retriever.counts()
    assert (counts.queries, counts.cache_hits) == (1, 0)  # the check's query, through the run's cache
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    down = RetrievalConfig(url=url, retry={"retries": 0, "backoff_s": 0})
    with pytest.raises(SearchRLError, match=rf"^retrieval\.url={url}: "):
        RunSearch.open(down, tmp_path)
    with pytest.raises(SearchRLError, match=r"^retrieval\.index=no-such-index: "):
        RunSearch.open(RetrievalConfig(index="no-such-index"), tmp_path)
