"""Dense indexes at scale, on small synthetic data: shards merged exactly, chunked adds from a
memory map, resumable encoding, trained factories, nprobe/efSearch, embedder prefixes."""

from __future__ import annotations

import json

import faiss
import numpy as np
import pytest
from test_indexes import CORPUS, DENSE_QUERIES, ids, scores
from typer.testing import CliRunner

from searchrl.cli import app
from searchrl.errors import SearchRLError
from searchrl.retrieval import open_retriever
from searchrl.retrieval.dense import DenseIndex
from searchrl.retrieval.encoding import (
    BGE_INSTRUCTION,
    BGE_INSTRUCTION_ZH,
    EMBEDDINGS,
    PROGRESS,
    default_prefixes,
    encode_corpus,
)
from searchrl.retrieval.faiss_index import (
    add_vectors,
    apply_search_settings,
    combine_shards,
    new_faiss_index,
    read_faiss,
    shard_bounds,
    train_index,
)
from searchrl.retrieval.index import build_index, open_index
from searchrl.retrieval.kinds import SearchSettings
from searchrl.retrieval.store import MemoryPassages, read_manifest


def clustered(n: int, d: int, seed: int = 0, clusters: int = 20) -> np.ndarray:
    """Unit vectors around `clusters` random centres: neighbours are meaningful, as in text."""
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((clusters, d))
    x = centres[rng.integers(0, clusters, n)] + 0.5 * rng.standard_normal((n, d))
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


def recall_at(found: np.ndarray, exact: np.ndarray) -> float:
    return float(np.mean([len(set(f) & set(e)) / len(e) for f, e in zip(found, exact)]))


class CountingEncoder:
    """The real MiniLM encoder, counting the texts it encodes; raises KeyboardInterrupt on
    call number `stop_at` (a user pressing Ctrl-C in the middle of a build)."""

    def __init__(self, stop_at: int | None = None) -> None:
        from searchrl.assets import load_embedder

        self.model = load_embedder("minilm")
        self.calls, self.texts, self.stop_at = 0, [], stop_at

    def encode(self, texts, **kwargs):
        self.calls += 1
        if self.calls == self.stop_at:
            raise KeyboardInterrupt
        self.texts.extend(texts)
        return self.model.encode(texts, **kwargs)

    def __getattr__(self, name):
        return getattr(self.model, name)


@pytest.fixture
def encoder(monkeypatch):
    def install(stop_at: int | None = None) -> CountingEncoder:
        spy = CountingEncoder(stop_at)
        monkeypatch.setattr("searchrl.retrieval.dense.load_embedder", lambda name: spy)
        return spy

    return install


# --- shards ----------------------------------------------------------------------------


@pytest.mark.parametrize("metric", [faiss.METRIC_INNER_PRODUCT, faiss.METRIC_L2])
def test_sharded_search_equals_unsharded_exact_search(metric):
    x, q = clustered(600, 16), clustered(7, 16, seed=1)
    whole = new_faiss_index(16, "Flat", metric)
    whole.add(x)
    parts = []
    for start, stop in shard_bounds(600, 4):  # 150 rows each
        part = new_faiss_index(16, "Flat", metric)
        part.add(x[start:stop])
        parts.append(part)
    sharded = combine_shards(parts)
    for k in (10, 400):  # k larger than a shard: the merge must interleave all four
        want_scores, want_ids = whole.search(q, k)
        got_scores, got_ids = sharded.search(q, k)
        np.testing.assert_array_equal(got_ids, want_ids)
        np.testing.assert_allclose(got_scores, want_scores, rtol=1e-6, atol=1e-6)
        rows_per_shard = np.bincount(
            np.searchsorted([150, 300, 450], got_ids.ravel(), side="right")
        )
        assert (rows_per_shard > 0).all()  # every shard contributed
    # Best first: descending similarity for inner product, ascending distance for L2.
    order = np.diff(got_scores, axis=1)
    assert (order <= 0).all() if metric == faiss.METRIC_INNER_PRODUCT else (order >= 0).all()


def test_sharded_dense_index_matches_unsharded_and_survives_save_load(tmp_path):
    queries = [q for q, _ in DENSE_QUERIES]
    single = DenseIndex.build(CORPUS, progress=False)
    sharded = DenseIndex.build(CORPUS, shards=3, progress=False)
    assert [p.ntotal for p in sharded.parts] == [5, 6, 5]
    want = single.search(queries, k=12)  # 12 > any shard's 6 passages
    got = sharded.search(queries, k=12)
    assert ids(got) == ids(want)
    np.testing.assert_allclose(scores(got), scores(want), atol=1e-6)
    out = build_index(CORPUS, tmp_path / "idx", "dense", shards=3, progress=False)
    assert sorted(p.name for p in out.glob("*.faiss")) == [
        f"dense-00{i}-of-003.faiss" for i in range(3)
    ]
    assert read_manifest(out)["shards"] == [5, 6, 5]
    loaded = open_index(out)
    assert loaded.memory_mapped and len(loaded.parts) == 3
    assert ids(loaded.search(queries, k=12)) == ids(want)
    loaded.close()
    with pytest.raises(SearchRLError, match="cannot split 16 vectors into 17 shards"):
        DenseIndex.build(CORPUS, shards=17, progress=False)


# --- chunked add, training ----------------------------------------------------------------


@pytest.mark.parametrize("factory", ["Flat", "IVF8,PQ4"])
def test_chunked_add_from_memmap_equals_one_shot_add(tmp_path, factory):
    x = clustered(1000, 16)
    np.save(tmp_path / "vectors.npy", x)
    mapped = np.load(tmp_path / "vectors.npy", mmap_mode="r")
    template = new_faiss_index(16, factory)
    train_index(template, mapped, factory)
    chunked, whole = faiss.clone_index(template), faiss.clone_index(template)
    add_vectors(chunked, mapped, chunk=37)  # 27 adds, the last one short
    whole.add(x)
    assert chunked.ntotal == 1000
    assert bytes(faiss.serialize_index(chunked)) == bytes(faiss.serialize_index(whole))


def test_trained_factories_search_close_to_exact():
    x, q = clustered(2000, 16), clustered(50, 16, seed=1)
    exact = new_faiss_index(16, "Flat")
    exact.add(x)
    _, truth = exact.search(q, 10)
    recalls = {}
    for factory in ("IVF16,PQ8", "IVF16,SQ8", "HNSW16"):  # OPQ works too, but trains for seconds
        index = new_faiss_index(16, factory)
        train_index(index, x, factory)
        assert index.is_trained
        add_vectors(index, x, chunk=300)
        apply_search_settings(index, SearchSettings(), factory)  # default nprobe 32: all 16 lists
        recalls[factory] = recall_at(index.search(q, 10)[1], truth)
    assert recalls["IVF16,PQ8"] >= 0.7 and recalls["IVF16,SQ8"] >= 0.95, recalls
    assert recalls["HNSW16"] >= 0.8, recalls


def test_ivf_pq_dense_index_builds_and_finds_topics(tmp_path):
    index = DenseIndex.build(CORPUS, factory="IVF2,PQ8x4", progress=False)
    assert index.index.is_trained and index.index.ntotal == len(CORPUS)
    # 16 PQ centroids per sub-space for 16 passages: codes are nearly exact, so is the ranking.
    results = index.search([q for q, _ in DENSE_QUERIES], k=3)
    assert [ps[0].id for ps in results] == [want for _, want in DENSE_QUERIES]


def test_bad_factory_fails_before_encoding(encoder, tmp_path):
    spy = encoder()
    with pytest.raises(
        SearchRLError, match=r"FAISS cannot build factory 'IVF8,PQ7'.*PQ m must divide"
    ):
        build_index(CORPUS, tmp_path / "idx", "dense", factory="IVF8,PQ7", progress=False)
    with pytest.raises(SearchRLError, match=r"'IVF64,Flat' could not be trained on 16 vectors"):
        build_index(CORPUS, tmp_path / "idx", "dense", factory="IVF64,Flat", progress=False)
    assert spy.texts == []
    assert list(tmp_path.iterdir()) == []
    result = CliRunner().invoke(
        app,
        [
            "index",
            "build",
            "x.jsonl",
            "--out",
            str(tmp_path / "i"),
            "--kind",
            "dense",
            "--shards",
            "0",
        ],
    )
    assert result.exit_code == 2 and "--shards" in result.output


# --- resumable encoding ---------------------------------------------------------------------


def test_interrupted_build_resumes_without_reencoding_finished_chunks(encoder, tmp_path):
    out = tmp_path / "idx"
    work = tmp_path / ".idx.building"
    interrupted = encoder(stop_at=3)  # chunks of 4: two finish, the third is interrupted
    with pytest.raises(KeyboardInterrupt):
        build_index(CORPUS, out, "dense", encode_chunk=4, progress=False)
    assert len(interrupted.texts) == 8
    assert not out.exists() and json.loads((work / PROGRESS).read_text())["done"] == 8

    resumed = encoder()
    build_index(CORPUS, out, "dense", encode_chunk=4, progress=False)
    assert len(resumed.texts) == 8 and resumed.calls == 2  # only passages 8..15
    assert resumed.texts[0].startswith(CORPUS[8].title)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["idx"]  # build folder renamed into place
    assert not (out / EMBEDDINGS).exists() and not (out / PROGRESS).exists()

    fresh = DenseIndex.build(CORPUS, progress=False)
    queries = [q for q, _ in DENSE_QUERIES]
    loaded = open_index(out)
    assert ids(loaded.search(queries, k=5)) == ids(fresh.search(queries, k=5))
    np.testing.assert_allclose(
        scores(loaded.search(queries, k=5)), scores(fresh.search(queries, k=5)), atol=1e-5
    )
    loaded.close()


def test_resume_starts_over_for_another_corpus_or_prefix(encoder, tmp_path):
    spy = encoder()
    passages = MemoryPassages(CORPUS)
    key = {"embedder": "minilm", "prefix": "", "passages": "a"}
    first = encode_corpus(spy, passages, tmp_path, prefix="", key=key, chunk=4, progress=False)
    assert spy.calls == 4
    again = encode_corpus(spy, passages, tmp_path, prefix="", key=key, chunk=4, progress=False)
    assert spy.calls == 4  # everything was done: nothing encoded
    np.testing.assert_array_equal(again, first)
    encode_corpus(
        spy, passages, tmp_path, prefix="", key={**key, "passages": "b"}, chunk=4, progress=False
    )
    assert spy.calls == 8  # another corpus: from the start
    encode_corpus(
        spy,
        passages,
        tmp_path,
        prefix="passage: ",
        key={**key, "prefix": "passage: "},
        chunk=8,
        progress=False,
    )
    assert spy.calls == 10 and spy.texts[-1].startswith("passage: ")


# --- search-time settings ------------------------------------------------------------------


def test_nprobe_changes_recall_and_ef_search_is_applied():
    x, q = clustered(3000, 16, clusters=64), clustered(40, 16, seed=1, clusters=64)
    exact = new_faiss_index(16, "Flat")
    exact.add(x)
    _, truth = exact.search(q, 10)
    ivf = new_faiss_index(16, "IVF64,Flat")
    train_index(ivf, x, "IVF64,Flat")
    ivf.add(x)
    found = {}
    for nprobe in (1, 64):
        apply_search_settings(ivf, SearchSettings(nprobe=nprobe), "IVF64,Flat")
        assert faiss.extract_index_ivf(ivf).nprobe == nprobe
        found[nprobe] = recall_at(ivf.search(q, 10)[1], truth)
    assert found[64] == 1.0 and found[1] < 0.9, found  # all lists = exact; one list misses
    hnsw = new_faiss_index(16, "HNSW8")
    apply_search_settings(hnsw, SearchSettings(ef_search=123), "HNSW8")
    assert faiss.downcast_index(hnsw).hnsw.efSearch == 123
    apply_search_settings(hnsw, SearchSettings(), "HNSW8")
    assert faiss.downcast_index(hnsw).hnsw.efSearch == 64  # our default, not FAISS's 16
    with pytest.raises(SearchRLError, match="nprobe does not apply to FAISS index 'HNSW8'"):
        apply_search_settings(hnsw, SearchSettings(nprobe=4), "HNSW8")
    with pytest.raises(SearchRLError, match="efSearch does not apply to FAISS index 'IVF64,Flat'"):
        apply_search_settings(ivf, SearchSettings(ef_search=4), "IVF64,Flat")


def test_nprobe_recorded_at_build_and_overridden_at_open(tmp_path):
    corpus = tmp_path / "c.jsonl"
    corpus.write_text(
        "".join(json.dumps({"id": p.id, "title": p.title, "text": p.text}) + "\n" for p in CORPUS)
    )
    out = tmp_path / "idx"
    args = [
        "index",
        "build",
        str(corpus),
        "--out",
        str(out),
        "--kind",
        "dense",
        "--factory",
        "IVF2,Flat",
    ]
    result = CliRunner().invoke(app, [*args, "--nprobe", "1", "--shards", "2"])
    assert result.exit_code == 0, result.output
    assert "dense, minilm, IVF2,Flat, 2 shards" in result.output
    assert read_manifest(out)["nprobe"] == 1
    nprobes = lambda index: [faiss.extract_index_ivf(p).nprobe for p in index.parts]
    assert nprobes(open_index(out)) == [1, 1]
    assert nprobes(open_retriever(str(out), settings=SearchSettings(nprobe=2))) == [2, 2]
    result = CliRunner().invoke(
        app, ["index", "search", str(out), "volcano", "--nprobe", "2", "--json", "-k", "16"]
    )
    assert result.exit_code == 0 and len(json.loads(result.output)) == 16  # both lists probed: all
    with pytest.raises(SearchRLError, match="efSearch does not apply"):
        open_index(out, settings=SearchSettings(ef_search=10))
    build_index(CORPUS, tmp_path / "bm25", "bm25", progress=False)
    with pytest.raises(
        SearchRLError,
        match="is a bm25 index: nprobe, efSearch, k-factor and FAISS GPU search apply to dense",
    ):
        open_index(tmp_path / "bm25", settings=SearchSettings(nprobe=2))
    with pytest.raises(SearchRLError, match="set them there"):
        open_retriever("http://127.0.0.1:9", settings=SearchSettings(nprobe=2))


# --- embedders -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("embedder", "prefixes"),
    [
        ("minilm", ("", "")),
        ("sentence-transformers/all-MiniLM-L6-v2", ("", "")),
        ("e5-base", ("query: ", "passage: ")),
        ("intfloat/e5-large-v2", ("query: ", "passage: ")),
        ("intfloat/multilingual-e5-large", ("query: ", "passage: ")),
        ("/models/E5-base-v2/", ("query: ", "passage: ")),
        ("bge-large", (BGE_INSTRUCTION, "")),
        ("BAAI/bge-large-en-v1.5", (BGE_INSTRUCTION, "")),
        ("BAAI/bge-base-zh-v1.5", (BGE_INSTRUCTION_ZH, "")),
        ("BAAI/bge-m3", ("", "")),
    ],
)
def test_embedder_prefixes(embedder, prefixes):
    assert default_prefixes(embedder) == prefixes


def test_prefixes_reach_the_encoder_and_the_manifest(encoder, tmp_path):
    spy = encoder()
    out = build_index(
        CORPUS, tmp_path / "idx", "dense", query_prefix="Q: ", passage_prefix="P: ", progress=False
    )
    assert len(spy.texts) == len(CORPUS) and all(t.startswith("P: ") for t in spy.texts)
    manifest = read_manifest(out)
    assert (manifest["query_prefix"], manifest["passage_prefix"]) == ("Q: ", "P: ")
    index = open_index(out)
    index._model = spy
    index.search(["volcano"], k=1)
    assert spy.texts[-1] == "Q: volcano"
    assert BGE_INSTRUCTION.startswith("Represent this sentence for searching relevant passages")


def test_refine_stage_reranks_with_mapped_vectors(tmp_path):
    x, q = clustered(3000, 16, clusters=64), clustered(40, 16, seed=1, clusters=64)
    exact = new_faiss_index(16, "Flat")
    exact.add(x)
    _, truth = exact.search(q, 10)
    factory = "IVF16,PQ8x4fs,RFlat"
    index = new_faiss_index(16, factory)
    train_index(index, x, factory)
    add_vectors(index, x)
    faiss.write_index(index, str(tmp_path / "r.faiss"))
    loaded, mapped = read_faiss(tmp_path / "r.faiss", True, factory)
    assert mapped
    recalls = {}
    for k_factor in (1, 32):
        apply_search_settings(loaded, SearchSettings(nprobe=16, k_factor=k_factor), factory)
        assert faiss.downcast_index(loaded).k_factor == k_factor
        recalls[k_factor] = recall_at(loaded.search(q, 10)[1], truth)
    # 4-byte codes alone rank poorly; re-ranking 320 candidates with the full vectors is exact.
    assert recalls[1] < 0.6 and recalls[32] == 1.0, recalls
    with pytest.raises(SearchRLError, match="k_factor does not apply to FAISS index 'Flat'"):
        apply_search_settings(exact, SearchSettings(k_factor=4), "Flat")
