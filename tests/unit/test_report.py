"""`searchrl eval report`: a scripted policy over a six-passage corpus, one open-book and one
closed-book question file, for exact table cells; resume, refusals, charts; the CLI on tiny-random."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from loopback import FakeOpenAI
from typer.testing import CliRunner

from searchrl.assets import load_model, load_tokenizer
from searchrl.checkpoint_meta import write_checkpoint_agent
from searchrl.cli import app
from searchrl.data.types import Passage, Question
from searchrl.errors import DataWarning, SearchRLError
from searchrl.eval import resume as saved
from searchrl.eval.report import ReportConfig, run_report
from searchrl.protocols.config import ProtocolConfig
from searchrl.protocols.tags import SEARCH_R1_TAGS as TAGS
from searchrl.retrieval.index import build_index
from searchrl.rollout.scripted import ScriptedBackend

PASSAGES = [
    Passage("p1", "Quellbridge", "Quellbridge is a market town on the river Tessaly."),
    Passage("p2", "Tessaly", "The Tessaly flows into Orrin Bay after eighty kilometres."),
    Passage("p3", "Vantrel X2", "The Vantrel X2 is a compact camera made by Orrin Optics."),
    Passage("p4", "Orrin Optics", "Orrin Optics is a camera maker founded by Dagny Halvorsen."),
    Passage("p5", "Harbel Observatory", "Harbel Observatory opened in 1901 on Mount Harbel."),
    Passage("p6", "Dagny Halvorsen", "Dagny Halvorsen was an engineer born in the port of Velmar."),
]
OPEN = [  # supporting ids: their paragraphs are in the corpus
    Question("h1", "Which river flows through Quellbridge?", ("Tessaly",), ("p1",)),
    Question("h2", "Who founded Orrin Optics?", ("Dagny Halvorsen",), ("p4",)),
]
CLOSED = [
    Question("b1", "When did Harbel Observatory open?", ("1901",)),
    Question("b2", "Where was Halvorsen born?", ("Velmar",)),
]
# question -> (agent query, passage text holding the answer)
SCRIPT = {
    OPEN[0].question: ("Quellbridge river", PASSAGES[0].text),
    OPEN[1].question: ("Orrin Optics founder", PASSAGES[3].text),
    CLOSED[0].question: ("Harbel Observatory", PASSAGES[4].text),
    CLOSED[1].question: ("Halvorsen", PASSAGES[5].text),
}
GOLD = {q.question: q.answers[0] for q in OPEN + CLOSED}
runner = CliRunner()


def policy(text: str, asked: list[str] | None = None) -> str:
    """Agent (its prompt teaches the search tag): one search, then the gold answer when the documents
    hold it. Rag/direct: the gold answer when a passage holding it is in the prompt; from memory only
    for b1."""
    question = max(SCRIPT, key=text.rfind)  # the question asked last
    if asked is not None:
        asked.append(question)
    query, fact = SCRIPT[question]
    tail = text[text.rfind(question) :]
    if TAGS.query_open in text:
        if TAGS.docs_open not in tail:
            return f" <search>{query}</search>"
        return f"</think>\n<answer>{GOLD[question] if fact in tail else 'unknown'}</answer>"
    known = fact in text or question == CLOSED[0].question
    answer = GOLD[question] if known else "Paris"
    return (
        f"{answer}{TAGS.answer_close}"
        if text.endswith(TAGS.answer_open)
        else f"{TAGS.answer_open}{answer}{TAGS.answer_close}"
    )


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("report")
    build_index(PASSAGES, root / "index", "bm25", progress=False)
    for name, qs in (("hotpot-mini", OPEN), ("bamboogle-mini", CLOSED)):
        (root / f"{name}.jsonl").write_text("".join(json.dumps(q.to_dict()) + "\n" for q in qs))
    return root


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer("tiny-random")


def _cfg(world: Path, out: Path, **kw) -> ReportConfig:
    fields = {
        "model": "tiny-random",
        "datasets": [str(world / "hotpot-mini.jsonl"), str(world / "bamboogle-mini.jsonl")],
        "retrievers": ["bm25", "alt"],
        "indexes": {"bm25": str(world / "index"), "alt": str(world / "index")},
        "limit": 2,
        "rollout": {"k": 2, "batch_size": 1},
        "protocol": {"tags": "search-r1", "template": "oneshot"},  # what the scripted policy speaks
        "out": str(out),
    }
    return ReportConfig(**{**fields, **kw})


def _table(md: str, heading: str) -> list[dict]:
    """The rows of the first Markdown table after `heading`, as dicts by column header."""
    lines = md.split(heading, 1)[1].split("\n\n")[1].splitlines()
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    return [
        dict(zip(header, (c.strip() for c in line.strip("|").split("|")))) for line in lines[2:]
    ]


def _png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    return int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")


def _ours(rows: list[dict]) -> dict:
    return {
        (r["dataset"].split(" ")[0], r["method"], r["retriever"]): r
        for r in rows
        if r["dataset"] != "*paper*"
    }


def test_report_rows_paper_numbers_and_charts(world, tmp_path, tokenizer):
    path = run_report(
        _cfg(world, tmp_path), backend=ScriptedBackend(tokenizer, policy), progress=False
    )
    md = path.read_text()
    assert md.startswith("# Real-benchmark report: tiny-random (3.2M parameters)")
    assert "not comparable to the paper" in md and "closed-book (direct only" in md
    rows = _table(md, "## Results")
    ours = _ours(rows)
    # The closed-book file runs direct only; the open-book one every method x retriever.
    assert sorted(ours) == sorted(
        [
            ("hotpot-mini", "direct", "—"),
            ("hotpot-mini", "rag", "bm25"),
            ("hotpot-mini", "rag", "alt"),
            ("hotpot-mini", "agent", "bm25"),
            ("hotpot-mini", "agent", "alt"),
            ("bamboogle-mini", "direct", "—"),
        ]
    )
    assert (
        next(r["dataset"] for r in rows if r["dataset"].startswith("bamboogle"))
        == "bamboogle-mini (closed-book)"
    )
    assert "ACC_L %" not in rows[0]  # no judge, no column
    direct, rag, agent = (
        ours[("hotpot-mini", "direct", "—")],
        ours[("hotpot-mini", "rag", "bm25")],
        ours[("hotpot-mini", "agent", "alt")],
    )
    assert (direct["EM %"], direct["searches/q"], direct["recall %"]) == ("0.0", "0.00", "n/a")
    assert (rag["EM %"], rag["CEM %"], rag["F1 %"], rag["searches/q"], rag["recall %"]) == (
        "100.0",
        "100.0",
        "100.0",
        "1.00",
        "100.0",
    )
    assert (agent["EM %"], agent["searches/q"], agent["recall %"], agent["format %"]) == (
        "100.0",
        "1.00",
        "100.0",
        "100.0",
    )
    assert ours[("bamboogle-mini", "direct", "—")]["EM %"] == "50.0" and all(
        r["n"] == "2" for r in ours.values()
    )
    # The paper's rows follow the benchmark each file is named after (docs/guides/evaluation.md).
    paper = {
        (r["benchmark"], r["method"], r["retriever"]): r for r in rows if r["dataset"] == "*paper*"
    }
    qwen = paper[
        (
            "HotpotQA",
            "R1-Searcher, Qwen-2.5-7B-Base",
            "KILT Wikipedia, 29M passages, BGE-large, k=5",
        )
    ]
    assert (qwen["n"], qwen["EM %"], qwen["CEM %"], qwen["F1 %"], qwen["searches/q"]) == (
        "500",
        "58.0",
        "65.4",
        "71.9",
        "—",
    )
    assert paper[("Bamboogle", "Search-o1, QwQ-32B", "online web search")]["CEM %"] == "56.0"
    assert {b for b, _, _ in paper} == {"HotpotQA", "Bamboogle"}
    assert not any("ReARTeR" in m for _, m, _ in paper)  # ACC_L only: nothing to show without a judge
    layout = {r["system"]: r for r in _table(md, "## In the paper's layout")}
    assert layout["tiny-random · agent · bm25"]["hotpot-mini"] == "100.0"
    assert layout["tiny-random · agent · bm25"]["bamboogle-mini"] == "—"
    row = layout[
        "*paper*: R1-Searcher, Llama-3.1-8B-Instruct (KILT Wikipedia, 29M passages, BGE-large, k=5)"
    ]
    assert (row["hotpot-mini"], row["bamboogle-mini"]) == ("64.8", "50.4")
    # One panel per metric: cover-EM, F1, EM (ACC_L only with a judge), 320 px each.
    assert (
        _png_size(tmp_path / "plots" / "scores.png")[1] == 3 * 320
        and "![scores](plots/scores.png)" in md
    )


def test_rerun_keeps_finished_runs_continues_stopped_ones_and_grown_limits(
    world, tmp_path, tokenizer
):
    cfg = _cfg(world, tmp_path, limit=1, methods=["direct", "rag"], retrievers=["bm25"])
    asked: list[str] = []
    run_report(cfg, backend=ScriptedBackend(tokenizer, lambda t: policy(t, asked)), progress=False)
    assert len(set(asked)) == 2 and len(list((tmp_path / "runs").iterdir())) == 3
    first = (tmp_path / "report.md").read_text()

    def fail(text: str) -> str:
        raise AssertionError("a finished run generated again")

    assert (
        run_report(cfg, backend=ScriptedBackend(tokenizer, fail), progress=False).read_text()
        == first
    )
    # limit 1 -> 2: each run answers its second question only.
    asked.clear()
    run_report(
        _cfg(world, tmp_path, methods=["direct", "rag"], retrievers=["bm25"]),
        backend=ScriptedBackend(tokenizer, lambda t: policy(t, asked)),
        progress=False,
    )
    assert sorted(set(asked)) == sorted([OPEN[1].question, CLOSED[1].question])
    done = (tmp_path / "report.md").read_text()
    # A run stopped after its first question continues with the second alone.
    run = tmp_path / "runs" / "hotpot-mini__rag__bm25"
    lines = (run / "predictions.jsonl").read_text().splitlines()
    (run / "predictions.jsonl").write_text(lines[0] + "\n")
    (run / "metrics.json").unlink()
    saved.save_progress(run, {"seconds": 0.0})
    asked.clear()
    run_report(
        _cfg(world, tmp_path, methods=["direct", "rag"], retrievers=["bm25"]),
        backend=ScriptedBackend(tokenizer, lambda t: policy(t, asked)),
        progress=False,
    )
    assert set(asked) == {OPEN[1].question}
    assert (
        _ours(_table((tmp_path / "report.md").read_text(), "## Results"))[
            ("hotpot-mini", "rag", "bm25")
        ]["EM %"]
        == "100.0"
    )
    assert (
        _table(done, "## Results")[0]["EM %"]
        == _table((tmp_path / "report.md").read_text(), "## Results")[0]["EM %"]
    )


def test_rerun_refuses_other_settings_and_a_smaller_limit(world, tmp_path, tokenizer):
    run_report(
        _cfg(world, tmp_path, methods=["direct"]),
        backend=ScriptedBackend(tokenizer, policy),
        progress=False,
    )
    with pytest.raises(SearchRLError, match="protocol.template"):
        run_report(
            _cfg(
                world,
                tmp_path,
                methods=["direct"],
                protocol={"tags": "search-r1", "template": "fewshot"},
            ),
            backend=ScriptedBackend(tokenizer, policy),
            progress=False,
        )
    with pytest.raises(SearchRLError, match="limit 1 is smaller"):
        run_report(
            _cfg(world, tmp_path, methods=["direct"], limit=1),
            backend=ScriptedBackend(tokenizer, policy),
            progress=False,
        )
    with pytest.raises(SearchRLError, match="nothing to run"):
        run_report(
            _cfg(
                world,
                tmp_path / "b",
                methods=["agent"],
                datasets=[str(world / "bamboogle-mini.jsonl")],
            ),
            backend=ScriptedBackend(tokenizer, policy),
            progress=False,
        )
    with pytest.raises(ValueError, match="retrievers"):
        _cfg(world, tmp_path, retrievers=["dense"])


def test_judge_adds_acc_l_column_paper_acc_l_and_chart(world, tmp_path, tokenizer, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-judge")
    judge = FakeOpenAI()
    try:
        cfg = _cfg(
            world,
            tmp_path,
            methods=["direct", "rag"],
            retrievers=["bm25"],
            judge={
                "url": judge.url,
                "model": "judge-mini",
                "cache": str(tmp_path / "verdicts.sqlite"),
            },
        )
        md = run_report(cfg, backend=ScriptedBackend(tokenizer, policy), progress=False).read_text()
    finally:
        judge.close()
    rows = _table(md, "## Results")
    ours = _ours(rows)
    assert (
        ours[("hotpot-mini", "rag", "bm25")]["ACC_L %"] == "100.0"
        and ours[("hotpot-mini", "direct", "—")]["ACC_L %"] == "0.0"
    )
    assert next(r for r in rows if r["method"] == "ReARTeR, GPT-4o-mini")["ACC_L %"] == "50.6"
    layout = {r["system"]: r for r in _table(md, "## In the paper's layout")}
    assert layout["tiny-random · rag · bm25"]["hotpot-mini"] == "100.0 / 100.0"
    assert _png_size(tmp_path / "plots" / "scores.png")[1] == 4 * 320


def test_cli_tiny_random_direct(world, tmp_path):
    out = tmp_path / "r"
    result = runner.invoke(
        app,
        [
            "eval",
            "report",
            "--model",
            "tiny-random",
            "--datasets",
            str(world / "hotpot-mini.jsonl"),
            "--methods",
            "direct",
            "--limit",
            "1",
            "--tags",
            "r1searcher",
            "--out",
            str(out),
        ],
    )
    assert result.exit_code == 0, result.output
    assert [p.name for p in (out / "runs").iterdir()] == ["hotpot-mini__direct"]
    metrics = json.loads((out / "runs" / "hotpot-mini__direct" / "metrics.json").read_text())
    assert (metrics["n"], metrics["model"], metrics["tags"], metrics["template"]) == (
        1,
        "tiny-random",
        "r1searcher",
        "base",  # the model profile's, tiny-random's
    )
    assert (
        "| HotpotQA | hotpot-mini | direct | — | 1 |" in result.output
        and (out / "report.md").is_file()
    )


def test_a_checkpoints_protocol_and_tools_are_the_reports(world, tmp_path, tokenizer):
    """A checkpoint (tiny-random's weights with an agent.yaml; the scripted policy answers) is
    reported with the protocol it was trained with; another one set is used, and warned about."""
    checkpoint = tmp_path / "run" / "checkpoints" / "step_0002"
    load_model("tiny-random")[0].save_pretrained(checkpoint)
    trained = ProtocolConfig(tags="search-r1", template="oneshot", doc_style="title-lines")
    write_checkpoint_agent(checkpoint, {"protocol": trained.model_dump(mode="json"), "tools": ["search"]})
    cfg = _cfg(world, tmp_path / "report", model=str(checkpoint), protocol={}, methods=["direct", "agent"],
               retrievers=["bm25"])
    assert (cfg.profile, cfg.protocol, cfg.tools) == ("checkpoint", trained, ["search"])
    path = run_report(cfg, backend=ScriptedBackend(tokenizer, policy), progress=False)
    for run in (tmp_path / "report" / "runs").iterdir():
        saved = yaml.safe_load((run / "config.yaml").read_text())
        assert (saved["profile"], saved["protocol"]["doc_style"], saved["tools"]) == ("checkpoint", "title-lines", ["search"])
    assert "- protocol: tags `search-r1`, template `oneshot` (agent; model profile checkpoint)" in path.read_text()
    agent = _ours(_table(path.read_text(), "## Results"))[("hotpot-mini", "agent", "bm25")]
    assert agent["searches/q"] == "1.00"  # the scripted policy searched: it was prompted with the search-r1 tags
    with pytest.warns(DataWarning, match=r"protocol.tags='r1searcher' \(trained: 'search-r1'\)"):
        other = _cfg(world, tmp_path / "other", model=str(checkpoint), protocol={"tags": "r1searcher"})
    assert (other.protocol.tags, other.protocol.template, other.protocol.doc_style) == ("r1searcher", "oneshot", "title-lines")
