"""BM25 and dense indexes, the passage store and index folders, on a small synthetic corpus."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
from typer.testing import CliRunner

from searchrl.cli import app
from searchrl.data.types import Passage
from searchrl.errors import DataError, SearchRLError
from searchrl.retrieval.bm25 import BM25Index, stemmer_available
from searchrl.retrieval.dense import DenseIndex
from searchrl.retrieval.index import build_index, index_kinds, open_index
from searchrl.retrieval.store import PassageStore, read_manifest

# Each passage has one topic and one word no other passage uses (the query's key term).
TOPICS = [
    (
        "penguin",
        "Emperor Penguin",
        "The emperor penguin is a flightless bird that breeds in Antarctica during winter.",
    ),
    (
        "volcano",
        "Mount Etna",
        "Mount Etna is an active volcano in Sicily whose eruptions pour lava down its slopes.",
    ),
    (
        "violin",
        "Stradivarius",
        "Antonio Stradivari built violins in Cremona; a Stradivarius violin sells for millions.",
    ),
    (
        "chess",
        "Chess Openings",
        "In chess the Sicilian Defence answers the king's pawn opening with the c-pawn.",
    ),
    (
        "photosynthesis",
        "Photosynthesis",
        "Plants use photosynthesis to turn sunlight, water and carbon dioxide into sugar.",
    ),
    (
        "glacier",
        "Aletsch Glacier",
        "The Aletsch glacier is the largest glacier of the Alps, a river of slow ice.",
    ),
    (
        "submarine",
        "Nautilus",
        "USS Nautilus was the first nuclear-powered submarine to travel under the North Pole.",
    ),
    (
        "espresso",
        "Espresso",
        "Espresso is coffee brewed by forcing hot water through finely ground beans.",
    ),
    (
        "tornado",
        "Tornado Alley",
        "Tornado Alley in the central United States sees violent spinning windstorms each spring.",
    ),
    (
        "origami",
        "Origami",
        "Origami is the Japanese art of folding a single sheet of paper into shapes like cranes.",
    ),
]
FILLER = [
    Passage(
        f"f{i}",
        f"Filler {i}",
        f"A general note number {i} about towns, rivers, people and ordinary history.",
    )
    for i in range(6)
]
CORPUS = [Passage(f"p{i}", title, text) for i, (_, title, text) in enumerate(TOPICS)] + FILLER
BM25_QUERIES = [(f"the {word} facts", f"p{i}") for i, (word, _, _) in enumerate(TOPICS)]
DENSE_QUERIES = [
    ("Which bird cannot fly and lives near the South Pole?", "p0"),
    ("Where is an erupting mountain in Italy?", "p1"),
    ("Who made famous string instruments?", "p2"),
    ("How do leaves make food from light?", "p4"),
    ("What is a strong Italian coffee?", "p7"),
]


@pytest.fixture(scope="module")
def bm25() -> BM25Index:
    return BM25Index.build(CORPUS, progress=False)


@pytest.fixture(scope="module")
def dense() -> DenseIndex:
    return DenseIndex.build(CORPUS, progress=False)


def ids(results: list[list[Passage]]) -> list[list[str]]:
    return [[p.id for p in ps] for ps in results]


def scores(results: list[list[Passage]]) -> list[list[float]]:
    return [[p.score for p in ps] for ps in results]


# --- BM25 ------------------------------------------------------------------------------


def test_bm25_unique_term_ranks_first_and_batch_order_kept(bm25):
    queries = [q for q, _ in BM25_QUERIES]
    results = bm25.search(queries, k=3)
    assert [ps[0].id for ps in results] == [want for _, want in BM25_QUERIES]
    # The key term occurs in one passage only, so nothing else matches.
    assert all(len(ps) == 1 for ps in results)
    # Reversed batch -> reversed answers: each query's result does not depend on its neighbours.
    assert ids(bm25.search(queries[::-1], k=3)) == ids(results)[::-1]
    assert bm25.search([queries[3]], k=3)[0] == results[3]


def test_bm25_scores_filled_and_descending(bm25):
    (hits,) = bm25.search(["bird coffee water sicily towns"], k=5)
    assert len(hits) == 5  # of 10 matching: p0, p1, p4, p7 and the six filler notes
    s = [p.score for p in hits]
    assert all(isinstance(x, float) and x > 0 for x in s)
    assert s == sorted(s, reverse=True)
    assert hits[0].title and hits[0].text  # materialised from the store


def test_bm25_blank_and_unmatched_queries(bm25):
    results = bm25.search(["", "   ", "volcano", "the of and", "xylophonequux"], k=4)
    assert [len(ps) for ps in results] == [0, 0, 1, 0, 0]
    assert results[2][0].id == "p1"
    assert bm25.search([], k=3) == []
    assert bm25.search(["volcano"], k=0) == [[]]


def test_bm25_k_larger_than_corpus(bm25):
    (hits,) = bm25.search(["the towns people bird"], k=1000)
    assert len(hits) == len(FILLER) + 1  # the six filler notes and the penguin passage
    assert len({p.id for p in hits}) == len(hits)


def test_bm25_stemming_only_with_pystemmer():
    if not stemmer_available():
        assert BM25Index.build(CORPUS, progress=False).stemmer_language is None
        with pytest.raises(SearchRLError, match="needs PyStemmer"):
            BM25Index.build(CORPUS, stem=True, progress=False)
        return
    stemmed = BM25Index.build(CORPUS, progress=False)
    assert stemmed.stemmer_language == "english"
    assert stemmed.search(["penguins erupted"], k=2)[0][0].id in {"p0", "p1"}  # plural/tense folded


@pytest.mark.parametrize("mmap", [True, False])
def test_bm25_save_load_roundtrip(bm25, tmp_path, mmap):
    bm25.save(tmp_path / "idx")
    manifest = read_manifest(tmp_path / "idx")
    assert manifest["kind"] == "bm25" and manifest["count"] == len(CORPUS)
    loaded = BM25Index.load(tmp_path / "idx", mmap=mmap)
    assert isinstance(loaded.model.scores["data"], np.memmap) == mmap
    queries = [q for q, _ in BM25_QUERIES] + ["bird coffee water sicily towns"]
    assert loaded.search(queries, k=5) == bm25.search(queries, k=5)  # ids, texts and scores
    assert isinstance(open_index(tmp_path / "idx"), BM25Index)
    loaded.close()


# --- dense -----------------------------------------------------------------------------


def test_dense_finds_the_right_topic(dense):
    results = dense.search([q for q, _ in DENSE_QUERIES], k=3)
    assert [ps[0].id for ps in results] == [want for _, want in DENSE_QUERIES]
    for ps in results:
        assert len(ps) == 3
        s = [p.score for p in ps]
        assert s == sorted(s, reverse=True) and -1.0 <= s[-1] <= s[0] <= 1.0  # cosine similarity


def test_dense_batch_order_and_blank_queries(dense):
    q = [q for q, _ in DENSE_QUERIES]
    batch = dense.search(["", q[0], " ", q[1], q[2]], k=2)
    assert batch[0] == [] and batch[2] == []
    assert ids(batch)[1::2] == ids(dense.search([q[0], q[1]], k=2))
    assert ids(batch)[4] == ids(dense.search([q[2]], k=2))[0]
    assert len(dense.search([q[0]], k=100)[0]) == len(CORPUS)


def test_dense_exact_scores_are_inner_products(dense):
    (hits,) = dense.search(["volcanic eruption"], k=len(CORPUS))
    qv = dense.model.encode(["volcanic eruption"], normalize_embeddings=True)
    pv = dense.model.encode([f"{p.title}\n{p.text}" for p in hits], normalize_embeddings=True)
    np.testing.assert_allclose([p.score for p in hits], (pv @ qv[0]), atol=1e-4)


@pytest.mark.parametrize("mmap", [True, False])
def test_dense_save_load_roundtrip(dense, tmp_path, mmap):
    dense.save(tmp_path / "idx")
    manifest = read_manifest(tmp_path / "idx")
    assert (manifest["kind"], manifest["embedder"], manifest["factory"], manifest["dim"]) == (
        "dense",
        "minilm",
        "Flat",
        384,
    )
    loaded = DenseIndex.load(tmp_path / "idx", mmap=mmap)
    assert loaded.memory_mapped == mmap
    queries = [q for q, _ in DENSE_QUERIES]
    before, after = dense.search(queries, k=4), loaded.search(queries, k=4)
    assert ids(after) == ids(before)
    np.testing.assert_allclose(scores(after), scores(before), atol=1e-6)
    loaded.close()


@pytest.mark.parametrize("factory", ["HNSW16", "IVF2,Flat"])
def test_dense_other_factories(tmp_path, factory):
    index = DenseIndex.build(CORPUS, factory=factory, progress=False)  # IVF needs training first
    assert index.index.is_trained and index.index.ntotal == len(CORPUS)
    results = index.search([q for q, _ in DENSE_QUERIES], k=3)
    assert [ps[0].id for ps in results] == [want for _, want in DENSE_QUERIES]
    index.save(tmp_path / "idx")
    loaded = open_index(tmp_path / "idx")  # mmap by default
    assert loaded.memory_mapped
    assert ids(loaded.search([DENSE_QUERIES[0][0]], k=3)) == ids(
        index.search([DENSE_QUERIES[0][0]], k=3)
    )


def test_dense_bad_factories_are_clear_errors():
    with pytest.raises(SearchRLError, match="FAISS cannot build factory 'Bogus42'"):
        DenseIndex.build(CORPUS, factory="Bogus42", progress=False)
    with pytest.raises(SearchRLError, match=r"'IVF64,Flat' could not be trained on 16 vectors"):
        DenseIndex.build(CORPUS, factory="IVF64,Flat", progress=False)


# --- passage store and index folders ---------------------------------------------------


def test_passage_store_roundtrip(tmp_path):
    passages = CORPUS + [Passage("u", "Ünïcode — title", 'text with "quotes"\nand a newline')]
    store = PassageStore.write(passages, tmp_path, progress=False)
    assert len(store) == len(passages)
    offsets = np.load(tmp_path / "offsets.npy")
    assert offsets.dtype == np.int64 and offsets.shape == (len(passages) + 1,)
    assert store.get([16, 0, 3]) == [passages[16], passages[0], passages[3]]
    assert list(PassageStore(tmp_path)) == passages
    with pytest.raises(IndexError):
        store.get([len(passages)])
    store.close()
    with pytest.raises(DataError, match="no passages"):
        PassageStore.write([], tmp_path / "empty", progress=False)


@pytest.mark.parametrize("kind", ["bm25", "dense"])
def test_build_index_and_open_index(tmp_path, kind):
    out = build_index(iter(CORPUS), tmp_path / "idx", kind, progress=False, source="unit-test")
    assert out == tmp_path / "idx"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["idx"]  # no temp folders left behind
    manifest = json.loads((out / "manifest.json").read_text())
    assert (
        manifest["kind"] == kind
        and manifest["count"] == len(CORPUS)
        and manifest["source"] == "unit-test"
    )
    assert {"created", "searchrl_version", "embedder", "factory"} <= set(manifest)
    assert (out / "passages.jsonl").is_file() and (out / "offsets.npy").is_file()
    retriever = open_index(out)
    query, want = (BM25_QUERIES if kind == "bm25" else DENSE_QUERIES)[0]
    assert retriever.search([query], k=1)[0][0].id == want
    retriever.close()


def test_build_index_refuses_to_clobber_and_cleans_up(tmp_path):
    out = build_index(CORPUS[:3], tmp_path / "idx", "bm25", progress=False)
    with pytest.raises(SearchRLError, match="already exists and is not empty; pass --overwrite"):
        build_index(CORPUS, out, "bm25", progress=False)
    assert read_manifest(out)["count"] == 3
    build_index(CORPUS, out, "bm25", overwrite=True, progress=False)
    assert read_manifest(out)["count"] == len(CORPUS)
    with pytest.raises(DataError, match="no passages"):
        build_index([], tmp_path / "empty", "bm25", progress=False)
    with pytest.raises(
        SearchRLError, match="unknown index kind 'splade'; choose one of: bm25, dense"
    ):
        build_index(CORPUS, tmp_path / "x", "splade", progress=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["idx"]
    assert index_kinds() == ["bm25", "dense"]


def test_open_index_on_something_else_names_it(tmp_path):
    (tmp_path / "random").mkdir()
    (tmp_path / "random" / "notes.txt").write_text("hello")
    with pytest.raises(SearchRLError, match=r"random is not an index: it has no manifest\.json"):
        open_index(tmp_path / "random")
    with pytest.raises(SearchRLError, match=r"missing is not an index: no such directory"):
        open_index(tmp_path / "missing")
    (tmp_path / "random" / "manifest.json").write_text("{not json")
    with pytest.raises(SearchRLError, match="unreadable manifest"):
        open_index(tmp_path / "random")


def test_build_index_rejects_duplicate_passage_ids(tmp_path):
    dupes = [*CORPUS, Passage("p1", "Other", "Another passage"), Passage("f0", "F", "x"), Passage("p1", "Third", "y")]
    with pytest.raises(DataError, match=r"corpus\.jsonl: 2 passage id\(s\) occur more than once: 'p1', 'f0'"):
        build_index(dupes, tmp_path / "idx", "bm25", progress=False, source="corpus.jsonl")
    assert list(tmp_path.iterdir()) == []  # nothing half-built left behind
    # The command names the corpus file: chunking a document whose id another record repeats.
    corpus = tmp_path / "c.jsonl"
    corpus.write_text('{"id": "d1", "text": "a b"}\n{"id": "d2", "text": "c d"}\n{"id": "d1", "text": "e f"}\n')
    result = CliRunner().invoke(app, ["index", "build", str(corpus), "--out", str(tmp_path / "i")])
    assert isinstance(result.exception, DataError)
    assert f"{corpus}: 1 passage id(s) occur more than once: 'd1'" in str(result.exception)


def test_index_search_shows_passage_text_with_control_characters_escaped(tmp_path):
    hostile = Passage("p\x1b[31m", "Title\x1b]8;;http://evil\x07[bold]", "volcano lava\x1b[2J and more \u202etext")
    out = build_index([hostile, *CORPUS], tmp_path / "idx", "bm25", progress=False)
    shown = CliRunner().invoke(app, ["index", "search", str(out), "volcano \x1b[5m lava", "-k", "1"], env={"COLUMNS": "300"})
    assert shown.exit_code == 0, shown.output
    assert not re.search(r"[\x00-\x09\x0b-\x1f\x7f-\x9f\u202e]", shown.output)
    for text in ("Title\\x1b]8;;http://evil\\x07[bold] (p\\x1b[31m)", "volcano lava\\x1b[2J and more \\u202etext", "'volcano \\x1b[5m lava'"):
        assert text in shown.output


def test_open_index_on_a_file_says_it_is_a_file(tmp_path):
    (tmp_path / "idx").write_text("not a folder")
    with pytest.raises(SearchRLError, match=r"idx is not an index: a file, not a directory; build one"):
        open_index(tmp_path / "idx")
