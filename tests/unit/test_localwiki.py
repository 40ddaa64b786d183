"""localwiki on a tiny fake data folder: dedup, stable ids, supporting-id mapping, catalog use."""

from __future__ import annotations

import json

import pytest

from searchrl.data import localwiki
from searchrl.data.localwiki import dedup_key, read_corpus
from searchrl.data.types import Passage
from searchrl.errors import DataError


def _jsonl(path, rows):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")


def _json(path, obj):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj), encoding="utf-8")


def ircot(qid, answer, paras):
    return {
        "question_id": qid,
        "question_text": f"question {qid}?",
        "answers_objects": [{"spans": [answer]}],
        "contexts": [{"id": str(i), "title": t, "paragraph_text": x, "is_supporting": s} for i, (t, x, s) in enumerate(paras)],
    }


def musique(qid, paras):
    return {
        "id": qid,
        "question": f"q {qid}?",
        "answer": "ans",
        "answer_aliases": [],
        "paragraphs": [{"idx": i, "title": t, "paragraph_text": x, "is_supporting": s} for i, (t, x, s) in enumerate(paras)],
    }


def hotpot(qid, ctx, support, with_context=True):
    row = {"_id": qid, "question": f"h {qid}?", "answer": "a", "type": "bridge", "supporting_facts": [[t, 0] for t in support]}
    if with_context:
        row["context"] = [[t, sents] for t, sents in ctx]
    return row


@pytest.fixture()
def fake_data(tmp_path):
    root = tmp_path / "data"
    _jsonl(root / "hotpotqa/dev_subsampled.jsonl", [
        ircot("i1", "Paris", [("France", "Paris is the capital.", True), ("Spain", "Madrid  is big.", False)]),
        ircot("i2", "Rome", [("Italy", "Rome is old.", True), ("France", "Paris is the capital.", True)]),
    ])
    # Same France paragraph again, split into sentences with different spacing: must dedup.
    _jsonl(root / "hotpotqa/hotpot.json", [hotpot("h1", [("France", ["Paris is", " the capital."]), ("Peru", ["Lima."])], ["Peru"])])
    _json(root / "musique/musique.json", [musique("2hop__1_2", [("Kansas", "KU is in Lawrence.", True), ("Kansas", "KU engineering.", True)])])
    _json(root / "musique/musique_qa_100.json", [
        musique("2hop__1_2", [("Other", "duplicate question id, dropped.", True)]),
        musique("3hop1__5_6_7", [("Oslo", "Oslo is cold.", True), ("Kansas", "KU is in Lawrence.", False)]),
    ])
    _jsonl(root / "2wikimultihopqa/wikihop.json", [
        hotpot("w1", [("Film", ["A film."]), ("Film", ["A film."]), ("Director", ["Born 1950."])], ["Film", "Director"]),
        hotpot("w2", [], ["X"], with_context=False),
    ])
    _json(root / "hotpotqa/hotpotqa_train.json", [hotpot("t1", [("Alu", ["A demon."])], ["Alu"])])
    _json(root / "musique/musique_train.json", [musique("2hop__9_9", [("Hall", "G. Stanley Hall.", True)])])
    _json(root / "hotpotqa/hotpotqa_train_corpus.json", {"Alu": ["A demon."], "Lilu": ["A spirit", " of wind."]})
    _json(root / "musique/musique_train_corpus.json", [{"title": "Hall", "text": "G. Stanley Hall."}])
    _json(root / "2wikimultihopqa/2wikimultihopqa_corpus.json", [{"title": "Director", "text": "Born  1950."}])
    _jsonl(root / "wiki-passages/sample_data.jsonl", [{"id": "0", "contents": '"Evan Morris"\nEvan Morris was a lobbyist.'}])
    return root


def test_dedup_key_ignores_case_and_spacing():
    assert dedup_key("Teutberga", "Teutberga( died 875)") == dedup_key("teutberga", "Teutberga (died  875)")
    assert dedup_key("A", "x") != dedup_key("B", "x")


def test_build_dedups_and_maps_supporting_ids(fake_data):
    wiki = localwiki.build(fake_data)
    by_id = {p.id: p for p in wiki.passages}
    titles = [p.title for p in wiki.passages]
    # France, Spain, Italy, Peru, Kansas x2, Oslo, Film, Director, Alu, Hall, Lilu, Evan Morris
    assert len(wiki.passages) == 13
    assert titles.count("France") == 1 and titles.count("Kansas") == 2
    assert [p.id for p in wiki.passages] == [f"lw-{i:06d}" for i in range(1, 14)]
    assert wiki.passages[0] == Passage("lw-000001", "France", "Paris is the capital.")
    assert by_id["lw-000002"].text == "Madrid is big."  # whitespace collapsed

    i1, i2 = wiki.datasets["hotpotqa-ircot"]
    assert [by_id[s].title for s in i1.supporting_ids] == ["France"]
    assert [by_id[s].title for s in i2.supporting_ids] == ["Italy", "France"]
    assert i2.supporting_ids[1] == i1.supporting_ids[0]  # one passage, shared by both
    (h1,) = wiki.datasets["hotpotqa-distractor"]
    assert [by_id[s].title for s in h1.supporting_ids] == ["Peru"]

    mus = wiki.datasets["musique"]
    assert [q.id for q in mus] == ["2hop__1_2", "3hop1__5_6_7"]  # the repeated id kept once
    assert [by_id[s].text for s in mus[0].supporting_ids] == ["KU is in Lawrence.", "KU engineering."]
    assert [by_id[s].title for s in mus[1].supporting_ids] == ["Oslo"]

    (w1,) = wiki.datasets["2wiki"]  # w2 has no context: left out
    assert [by_id[s].title for s in w1.supporting_ids] == ["Film", "Director"]  # repeated paragraph once
    assert [q.source for q in wiki.datasets["2wiki"]] == ["2wiki"]
    # ircot 2+2, distractor 2, musique 2 + 2 (duplicate question skipped), 2wiki 3, trains 1+1, corpora 2+1+1+1
    assert wiki.n_paragraphs_seen == 20


def test_ids_are_stable_across_builds(fake_data):
    a, b = localwiki.build(fake_data), localwiki.build(fake_data)
    assert a.passages == b.passages and a.datasets == b.datasets


def test_write_and_read_back(fake_data, tmp_path):
    wiki = localwiki.build(fake_data)
    out = localwiki.write(wiki, tmp_path / "out")
    assert read_corpus(out / "corpus.jsonl") == wiki.passages
    meta = json.loads((out / "meta.json").read_text())
    assert meta["passages"] == 13 and meta["datasets"]["musique"] == 2
    from searchrl.data.loaders import load_questions

    assert load_questions(out / "2wiki.jsonl") == wiki.datasets["2wiki"]


def test_missing_file_is_named(fake_data):
    (fake_data / "musique/musique.json").unlink()
    with pytest.raises(DataError, match="musique/musique.json"):
        localwiki.build(fake_data)


def test_catalog_serves_mapped_datasets_from_cache(fake_data, tmp_path, monkeypatch):
    from searchrl.data import catalog

    monkeypatch.setenv("SEARCHRL_DATA", str(fake_data))
    monkeypatch.setenv("SEARCHRL_HOME", str(tmp_path / "home"))
    assert {i.name: i.count for i in catalog.list_datasets()}["musique"] == 2  # counted before any build
    qs = catalog.load_dataset("hotpotqa-ircot")
    assert [q.id for q in qs] == ["i1", "i2"] and qs[1].supporting_ids == ("lw-000003", "lw-000001")
    built = catalog.localwiki_dir()
    assert (built / "corpus.jsonl").is_file() and built.parent == tmp_path / "home" / "datasets"
    assert {i.name: i.count for i in catalog.list_datasets()}["2wiki"] == 1  # now read from the cache


def test_cli_writes_localwiki(fake_data, tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from searchrl.cli import app

    monkeypatch.setenv("SEARCHRL_DATA", str(fake_data))
    out = tmp_path / "lw"
    res = CliRunner().invoke(app, ["data", "localwiki", "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert "13 passages (from 20 paragraphs)" in res.output and "musique.jsonl: 2 questions" in res.output
    assert len(read_corpus(out / "corpus.jsonl")) == 13
