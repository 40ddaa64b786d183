"""The dataset/index catalog: spec resolution, errors, the atomic cache, the toy world, recall@k."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from searchrl.data import catalog
from searchrl.data.types import Passage, Question
from searchrl.errors import SearchRLError
from searchrl.eval.retrieval import recall_at_k
from searchrl.retrieval import catalog as index_catalog
from searchrl.retrieval import open_retriever
from searchrl.retrieval.base import Retriever
from searchrl.retrieval.http import HttpRetriever


@pytest.fixture()
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("SEARCHRL_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def test_unknown_dataset_lists_known_names():
    with pytest.raises(SearchRLError) as info:
        catalog.load_dataset("hotpot-typo")
    msg = str(info.value)
    assert "hotpot-typo" in msg
    for name in ("hotpotqa-ircot", "bamboogle", "r1s-stage2", "toyworld:train", "musique", "2wiki"):
        assert name in msg


def test_unknown_index_lists_known_names(home):
    with pytest.raises(SearchRLError, match="unknown index 'wiki'.*localwiki, localwiki-dense, toyworld"):
        open_retriever("wiki")


def test_open_retriever_takes_a_url_and_names_a_missing_directory(home, tmp_path):
    with open_retriever("http://127.0.0.1:1", api="search-r1") as http:  # connects on first search
        assert isinstance(http, HttpRetriever) and http.url == "http://127.0.0.1:1/retrieve"
    missing = tmp_path / "no-index"
    with pytest.raises(SearchRLError, match=re.escape(f"index directory {missing} does not exist; build one")):
        open_retriever(str(missing))


def test_path_spec_loads_any_format(tmp_path):
    path = tmp_path / "mine.jsonl"
    path.write_text(json.dumps({"idx": 3, "question": "Q?", "answer": ["A", "B"]}) + "\n", encoding="utf-8")
    (q,) = catalog.load_dataset(str(path))
    assert (q.id, q.answers, q.source) == ("3", ("A", "B"), "mine")


def test_hf_spec_is_parsed(monkeypatch):
    seen = []
    monkeypatch.setattr("searchrl.data.loaders.load_hf", lambda name, split, config: seen.append((name, split, config)) or [])
    catalog.load_dataset("hf:RUC-NLPIR/FlashRAG_datasets@hotpotqa:dev")
    catalog.load_dataset("hf:hotpotqa/hotpot_qa")
    assert seen == [("RUC-NLPIR/FlashRAG_datasets", "dev", "hotpotqa"), ("hotpotqa/hotpot_qa", "train", None)]
    with pytest.raises(SearchRLError, match="names no Hugging Face dataset"):
        catalog.load_dataset("hf:")


def test_cached_build_runs_once_and_cleans_up_failures(home):
    calls = []

    def build(tmp: Path) -> None:
        calls.append(tmp)
        (tmp / "x.txt").write_text("built")

    first = catalog.cached_build("things/a", build)
    again = catalog.cached_build("things/a", build)
    assert first == again == home / "things" / "a" and len(calls) == 1
    assert (first / "x.txt").read_text() == "built"

    def broken(tmp: Path) -> None:
        (tmp / "half").write_text("...")
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError):
        catalog.cached_build("things/b", broken)
    assert sorted(p.name for p in (home / "things").iterdir()) == ["a"]  # no half build, no temp dir


def test_cached_build_keeps_the_winner_of_a_race(home):
    final = home / "things" / "c"

    def racing(tmp: Path) -> None:
        (tmp / "mine").write_text("loser")
        final.mkdir(parents=True)  # another process renames its finished build in first
        (final / "theirs").write_text("winner")

    assert catalog.cached_build("things/c", racing) == final
    assert [p.name for p in final.iterdir()] == ["theirs"]
    assert sorted(p.name for p in final.parent.iterdir()) == ["c"]


@pytest.fixture(scope="module")
def toy_home(tmp_path_factory):
    """One cache for the toy-world tests: generating the world takes a few seconds."""
    mp = pytest.MonkeyPatch()
    home = tmp_path_factory.mktemp("toy-home")
    mp.setenv("SEARCHRL_HOME", str(home))
    yield home
    mp.undo()


def test_toyworld_datasets_are_generated_into_the_cache_once(toy_home):
    counted = {i.name: i.count for i in catalog.list_datasets() if i.name in ("toyworld:train", "toyworld:test")}
    train = catalog.load_dataset("toyworld:train")
    test = catalog.load_dataset("toyworld:test")
    assert counted == {"toyworld:train": len(train), "toyworld:test": len(test)}  # cheap count was exact
    assert len(train) > len(test) > 0
    assert all(q.answers and q.supporting_ids for q in train + test)
    assert not {q.question for q in train} & {q.question for q in test}
    (built,) = (toy_home / "datasets").glob("toyworld-*")
    assert {"corpus.jsonl", "train.jsonl", "test.jsonl"} <= {p.name for p in built.iterdir()}
    corpus_ids = {json.loads(line)["id"] for line in (built / "corpus.jsonl").open()}
    assert {s for q in train + test for s in q.supporting_ids} <= corpus_ids
    assert catalog.load_dataset("toyworld:train") == train  # read back from the cache, same ids


def test_shipped_selection_is_toyworld_train_as_generated_today(toy_home):
    # The file was written by `data select` + `data compose`: a changed generator must ship a new one.
    selected = catalog.load_dataset("toyworld:selected")
    train = {q.id: q for q in catalog.load_dataset("toyworld:train")}
    info = next(i for i in catalog.list_datasets() if i.name == "toyworld:selected")
    assert info.count == len(selected) == len({q.id for q in selected}) == 39
    for q in selected:
        assert (q.question, q.answers, q.supporting_ids) == (
            train[q.id].question, train[q.id].answers, train[q.id].supporting_ids
        )
        assert q.type in ("comparison", "bridge-comparison")


def test_toyworld_index_is_built_once_and_finds_gold_passages(toy_home):
    questions = catalog.load_dataset("toyworld:test")[:40]
    retriever = open_retriever("toyworld")
    try:
        out = recall_at_k(questions, retriever, k=5, progress=False)
        first = [p.id for p in retriever.search([questions[0].question], 3)[0]]
    finally:
        retriever.close()
    # Invented names are rare words, so BM25 finds the first hop of nearly every question
    # (measured: recall 0.76, any 0.975 on these 40); a broken id mapping gives 0.
    assert out["questions"] == 40 and out["any_found"] >= 0.8 and 0.5 <= out["recall"] <= 1
    (index_dir,) = (toy_home / "indexes").glob("toyworld-*")
    assert index_catalog.named_index_dir("toyworld") == index_dir  # second call: the cached folder
    assert ("toyworld", "BM25 over the toy world corpus", True) in index_catalog.list_indexes()
    reopened = open_retriever(str(index_dir))  # a directory path opens directly
    try:
        assert len(first) == 3 and [p.id for p in reopened.search([questions[0].question], 3)[0]] == first
    finally:
        reopened.close()


def test_cli_data_show_and_eval_retrieval(toy_home):
    from typer.testing import CliRunner

    from searchrl.cli import app

    runner = CliRunner()
    shown = runner.invoke(app, ["data", "show", "toyworld:test", "--limit", "2"])
    assert shown.exit_code == 0, shown.output
    assert "tw-test-00000" in shown.output and "tw-test-00002" not in shown.output
    res = runner.invoke(app, ["eval", "retrieval", "--dataset", "toyworld:test", "--index", "toyworld", "-k", "3", "--limit", "20", "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.output.strip().splitlines()[-1])
    assert out["k"] == 3 and out["questions"] == 20 and out["dataset"] == "toyworld:test"


class FakeRetriever(Retriever):
    """Returns fixed passage ids per query text."""

    def __init__(self, table: dict[str, list[str]]):
        self.table = table
        self.calls: list[tuple[list[str], int]] = []

    def search(self, queries: list[str], k: int) -> list[list[Passage]]:
        self.calls.append((list(queries), k))
        return [[Passage(pid, "t", "x", 1.0) for pid in self.table.get(q, [])[:k]] for q in queries]


def test_recall_at_k_hand_computed():
    qs = [
        Question("1", "q1", ("a",), ("p1", "p2")),  # top2 = p1, p9 -> 1/2, not all
        Question("2", "q2", ("a",), ("p3",)),  # top2 = p3 -> 1, all
        Question("3", "q3", ("a",), ("p4", "p5")),  # p4 is only at rank 3 -> 0
        Question("4", "q4", ("a",), ()),  # nothing to find: skipped
    ]
    retriever = FakeRetriever({"q1": ["p1", "p9", "p2"], "q2": ["p3", "p1"], "q3": ["p8", "p7", "p4"]})
    out = recall_at_k(qs, retriever, k=2, batch_size=2, progress=False)
    assert out == {"k": 2, "questions": 3, "skipped": 1, "recall": pytest.approx(0.5), "all_found": pytest.approx(1 / 3), "any_found": pytest.approx(2 / 3)}
    assert retriever.calls == [(["q1", "q2"], 2), (["q3"], 2)]  # batched, skipped question never sent
    out3 = recall_at_k(qs, retriever, k=3, progress=False)
    assert out3["recall"] == pytest.approx((1 + 1 + 0.5) / 3) and out3["all_found"] == pytest.approx(2 / 3)


def test_recall_needs_supporting_ids():
    with pytest.raises(SearchRLError, match="supporting_ids"):
        recall_at_k([Question("1", "q", ("a",))], FakeRetriever({}), k=5, progress=False)
    with pytest.raises(SearchRLError, match="k must be at least 1"):
        recall_at_k([Question("1", "q", ("a",), ("p",))], FakeRetriever({}), k=0, progress=False)


def test_data_show_previews_long_fields(tmp_path):
    from typer.testing import CliRunner

    from searchrl.cli import app

    path = tmp_path / "long.jsonl"
    row = {"id": "q[1]", "question": "word " * 40_000, "answers": ["a" * 5_000], "supporting_ids": ["p"] * 2_000}
    path.write_text(json.dumps(row) + "\n")
    shown = CliRunner().invoke(app, ["data", "show", str(path)])
    assert shown.exit_code == 0, shown.output
    assert len(shown.output) < 3_000
    assert "q[1]" in shown.output  # ids are shown as written, not read as markup
    text = " ".join(shown.output.split())  # the console wraps lines at its width
    assert "(199,699 more characters)" in text and "(4,700 more characters)" in text  # the question is stripped


def test_data_show_makes_control_characters_visible(tmp_path):
    from typer.testing import CliRunner

    from searchrl.cli import app

    path = tmp_path / "hostile.jsonl"
    row = {"id": "q\x1b]8;;http://x\x07", "question": "Who?\x1b[2J\u202eevil\nA: forged", "answers": ["[bold]a\x9b"]}
    path.write_text(json.dumps(row) + "\n")
    shown = CliRunner().invoke(app, ["data", "show", str(path)])
    assert shown.exit_code == 0, shown.output
    assert not re.search(r"[\x00-\x09\x0b-\x1f\x7f-\x9f\u202e]", shown.output)  # nothing reaches the terminal raw
    assert "q\\x1b]8;;http://x\\x07" in shown.output and "[bold]a\\x9b" in shown.output
    assert "Who?\\x1b[2J\\u202eevil\\nA: forged" in " ".join(shown.output.split())  # one line: no forged "A:" line


def test_a_directory_given_as_a_dataset_is_named_as_one(tmp_path):
    with pytest.raises(SearchRLError, match=re.escape(f"{tmp_path} is a directory, not a file; pass a file (one inside it?)")):
        catalog.load_dataset(str(tmp_path))


def test_index_search_takes_catalog_names_like_serve(toy_home, tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from searchrl.cli import app
    from searchrl.retrieval.serving import resolve_source

    built = index_catalog.named_index_dir("toyworld")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "toyworld").mkdir()  # e.g. `searchrl data toyworld --out toyworld`: no index in it
    (tmp_path / "toyworld" / "corpus.jsonl").write_text("{}\n")
    found = CliRunner().invoke(app, ["index", "search", "toyworld", "capital", "-k", "2", "--json"])
    assert found.exit_code == 0, found.output
    assert len(json.loads(found.stdout)) == 2
    assert resolve_source("toyworld") == str(built.resolve())  # the one resolver serve uses too
    missing = CliRunner().invoke(app, ["index", "search", "./nowhere/toyworld", "q"])
    message = str(missing.exception)
    assert message.startswith("index directory ./nowhere/toyworld does not exist; build one with `searchrl index build CORPUS --out DIR`")
    assert "--out ./nowhere" not in message and "--out toyworld" not in message


def test_a_file_given_as_an_index_directory_is_named_as_one(home, tmp_path):
    path = tmp_path / "index.jsonl"
    path.write_text("{}\n")
    with pytest.raises(SearchRLError, match=re.escape(f"{path} is a file, not an index directory")):
        open_retriever(str(path))


def test_data_show_of_a_number_question_is_one_error_line(tmp_path):
    from typer.testing import CliRunner

    from searchrl.cli import app
    from searchrl.errors import DataError

    path = tmp_path / "q.jsonl"
    path.write_text('{"id": "q1", "question": 123, "answers": ["a"]}\n')
    shown = CliRunner().invoke(app, ["data", "show", str(path)])
    assert isinstance(shown.exception, DataError), shown.output  # was a TypeError traceback
    assert str(shown.exception) == (
        f"{path}:1: field 'question' must be a non-empty string, got a number (format 'searchrl'); fix or drop this record"
    )
