"""Every command that prints a table prints it through `searchrl.tables.print_table`: piped, a
Markdown table of whole cells; in a narrow terminal, lines that fit and cells never cut in two
(the columns left out named). One test per command, on the `world` of conftest.py."""

from __future__ import annotations

import json

import pytest
from test_health import _run_with_metrics, _series
from typer.testing import CliRunner

from searchrl.cli import app
from searchrl.data import catalog
from searchrl.retrieval import catalog as index_catalog

NARROW = 60


def _shown(args: list[str], width: int | None = None, code: int = 0) -> str:
    """The output of `searchrl ARGS` piped (`width` None) or in a terminal `width` columns wide
    (TERM=dumb: no colour codes)."""
    env = {"TTY_COMPATIBLE": "0"} if width is None else {"TTY_COMPATIBLE": "1", "TERM": "dumb", "COLUMNS": str(width),
                                                        "LINES": "40"}
    result = CliRunner().invoke(app, args, env=env)
    assert result.exit_code == code, result.output
    return result.stdout


def _markdown_rows(text: str) -> list[list[str]]:
    return [[c.strip() for c in line.strip("|").split(" | ")] for line in text.splitlines() if line.startswith("| ")]


def _fits(text: str, *cells: str) -> None:
    lines = text.splitlines()
    assert all(len(line) <= NARROW for line in lines), text
    for cell in cells:  # each on one line, whole
        assert any(cell in line for line in lines), (cell, text)


@pytest.fixture
def catalog_of_three(monkeypatch):
    infos = [catalog.DatasetInfo("hotpotqa-r1searcher-stage2", "HotpotQA questions of R1-Searcher's stage 2 " * 2,
                                 "shared/data/r1searcher/hotpotqa_stage2.jsonl", 8148),
             catalog.DatasetInfo("toyworld:test", "the toy world's test split", "generated", 200),
             catalog.DatasetInfo("2wiki", "2WikiMultihopQA dev", "shared/data/2wiki/dev.jsonl", None, "no data folder")]
    monkeypatch.setattr(catalog, "list_datasets", lambda: infos)
    monkeypatch.setattr(index_catalog, "list_indexes", lambda: [("localwiki", "BM25 over the benchmarks' paragraphs", True)])


def test_data_list(catalog_of_three):
    piped = _markdown_rows(_shown(["data", "list"]))
    assert piped[0] == ["name", "questions", "source", "description"]
    assert piped[1][:3] == ["hotpotqa-r1searcher-stage2", "8,148", "shared/data/r1searcher/hotpotqa_stage2.jsonl"]
    assert piped[3][1] == "n/a" and piped[3][3] == "2WikiMultihopQA dev (no data folder)"
    assert ["name", "built", "description"] in piped and ["localwiki", "yes", "BM25 over the benchmarks' paragraphs"] in piped
    narrow = _shown(["data", "list"], NARROW)
    _fits(narrow, "hotpotqa-r1searcher-stage2", "8,148")
    assert "1 more column(s) not shown (source)" in narrow


def test_eval_score(tmp_path):
    path = tmp_path / "predictions.jsonl"
    path.write_text(json.dumps({"answers": ["Paris"], "prediction": "paris"}) + "\n")
    piped = _markdown_rows(_shown(["eval", "score", str(path)]))
    assert piped[0] == ["metric", "%"] and ["Cover-EM (substring, FlashRAG acc)", "100.0"] in piped
    _fits(_shown(["eval", "score", str(path)], NARROW), "100.0", "n/a")


def test_index_search(world):
    args = ["index", "search", str(world / "index"), "river R3 founded", "-k", "2"]
    piped = _markdown_rows(_shown(args))
    assert piped[0] == ["#", "score", "title", "text"] and piped[1][2] == "Town 3 (p3)"
    assert piped[1][3] == "Town 3 lies on the river R3 and was founded in 1803."
    _fits(_shown(args, NARROW), "Town 3", "(p3)")


def test_data_toyworld(tmp_path):
    args = ["data", "toyworld", "--out", str(tmp_path), "--seed", "2", "--passages", "300", "--train", "60",
            "--test", "20"]
    piped = _markdown_rows(_shown(args))
    assert piped[0] == ["type", "train", "test"] and piped[-1] == ["total", "60", "20"]
    _fits(_shown(args, 30), "bridge-comparison")


def test_data_compose(world, tmp_path):
    out = tmp_path / "a-stage-dataset-with-a-long-name" / "stage1.jsonl"
    args = ["data", "compose", "--take", f"{world / 'q.jsonl'}=4", "--out", str(out)]
    piped = _markdown_rows(_shown(args))
    assert piped[0] == ["part", "available", "taken"] and piped[1][1:] == ["6", "4"]
    _fits(_shown(args, NARROW), "available")


def test_eval_retrieval(world, tmp_path):
    questions = tmp_path / "supported.jsonl"
    questions.write_text("".join(json.dumps({"id": f"q{i}", "question": f"Which river flows through Town {i}?",
                                             "answers": [f"R{i}"], "supporting_ids": [f"p{i}"]}) + "\n" for i in range(3)))
    args = ["eval", "retrieval", "--dataset", str(questions), "--index", str(world / "index"), "-k", "2"]
    piped = _markdown_rows(_shown(args))
    assert piped[0] == ["metric", "value"] and piped[1][0] == "recall@2" and ["questions scored", "3"] in piped
    _fits(_shown(args, 40), "recall@2", "questions scored")


def test_health(tmp_path):
    run = _run_with_metrics(tmp_path, _series("search_rate", [1.0] * 20 + [0.0] * 3))
    piped = _markdown_rows(_shown(["health", str(run)], code=1))
    assert piped[0] == ["monitor", "stage", "step", "value", "threshold", "action", "message"]
    assert piped[1][:3] == ["search_collapse", "1", "21"]
    narrow = _shown(["health", str(run)], NARROW, code=1)
    _fits(narrow, "search_collapse")
    assert "2 more column(s) not shown (value, threshold)" in narrow


def test_eval_run(world, tmp_path):
    args = ["eval", "run", "--model", "tiny-random", "--method", "direct", "--dataset", str(world / "q.jsonl"),
            "--limit", "1", "--answer-max-new-tokens", "2"]
    piped = _markdown_rows(_shown([*args, "--out", str(tmp_path / "piped")]))
    assert piped[0] == ["metric", "value"] and ["model", "tiny-random"] in piped
    assert piped == _markdown_rows((tmp_path / "piped" / "metrics.md").read_text())
    # The folder's path is wider than the terminal: the lines of the Markdown table, never a value alone.
    _fits(_shown([*args, "--out", str(tmp_path / "narrow")], NARROW), "| model | tiny-random |", "| format OK % |")
