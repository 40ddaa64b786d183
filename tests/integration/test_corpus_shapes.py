"""Every real corpus shape in ../shared/data read by `read_passages`, with the record counts of
SOURCES.md (chunk_words=0) and the passage counts after ~100-word chunking; then both index
kinds built and searched over the FlashRAG wiki sample."""

from __future__ import annotations

import itertools
import warnings

import pytest

from searchrl.retrieval.corpus import CorpusWarning, detect_format, read_passages
from searchrl.retrieval.index import build_index, open_index

pytestmark = pytest.mark.integration

# file -> (format, records as in SOURCES.md, passages at chunk_words=100, first (id, title))
SHAPES = {
    "2wikimultihopqa/2wikimultihopqa_corpus.json": ("json-list", 6119, 7268, ("0", "Teutberga")),
    "musique/musique_train_corpus.json": (
        "json-list",
        1890,
        2045,
        ("0", "Journal of Mathematical Physics"),
    ),
    "hotpotqa/hotpotqa_train_corpus.json": ("json-dict", 994, 1127, ("0", "Demon Dice")),
    "r1-searcher-wiki-samples/filtered_kilt_sample_100.jsonl": ("kilt", 99, 2321, ("0-0", "A")),
    "r1-searcher-wiki-samples/train_kilt_full_page_sample_100.tsv": ("tsv", 93, 93, ("0", "A")),
    "r1-searcher-wiki-samples/train_np_title_abs_sample_100.tsv": (
        "tsv",
        100,
        101,
        ("0", "Professional Football League of Ukraine"),
    ),
    "wiki-passages/sample_data.jsonl": ("flashrag", 1000, 1000, ("0", "Evan Morris")),
}
TRUNCATED = "r1-searcher-wiki-samples/train_kilt_full_page_sample_100.tsv"


@pytest.mark.parametrize("rel", list(SHAPES))
def test_real_corpus_shapes(shared_data, rel):
    fmt, records, passages, (first_id, first_title) = SHAPES[rel]
    path = shared_data / rel
    assert detect_format(path) == fmt
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        whole = list(read_passages(path, chunk_words=0))
        chunked = list(read_passages(path))
    assert len(whole) == records
    assert len(chunked) == passages
    assert (chunked[0].id, chunked[0].title) == (first_id, first_title)
    assert all(p.text.strip() for p in chunked)
    assert len({p.id for p in chunked}) == passages  # ids unique after chunking
    assert max(len(p.text.split()) for p in chunked) < 150
    corpus_warnings = [str(w.message) for w in caught if issubclass(w.category, CorpusWarning)]
    if rel == TRUNCATED:
        # Cut off upstream mid-row: reported with its line, kept, nothing crashes.
        assert len(corpus_warnings) == 2 and all(
            ":93: the last row has no line ending" in m for m in corpus_warnings
        )
        assert (whole[-1].title, whole[-1].text) == ("Allan Dwan", "Allan Dwan Allan D")
    else:
        assert corpus_warnings == []


@pytest.mark.parametrize("kind", ["bm25", "dense"])
def test_index_the_flashrag_sample(shared_data, tmp_path, kind):
    # Dense encodes 200 passages only (~12 CPU-seconds with MiniLM); BM25 takes all 1000.
    passages = read_passages(shared_data / "wiki-passages/sample_data.jsonl")
    out = build_index(
        itertools.islice(passages, 200 if kind == "dense" else None),
        tmp_path / kind,
        kind,
        progress=False,
    )
    retriever = open_index(out)
    results = retriever.search(
        ["Evan Morris lobbyist for Genentech", "", "Guybrush Threepwood pirate video game"], k=3
    )
    assert results[0][0].id == "0" and results[1] == []
    assert results[2][0].title == "Guybrush Threepwood"
    retriever.close()
