"""`searchrl eval run` / `eval compare` / `ask`: scripted policies for exact numbers, the
tiny-random model through the CLI for the plumbing (files, keys, errors)."""

from __future__ import annotations

import contextlib
import io
import json
import re
import threading

import pytest
import yaml
from typer.testing import CliRunner

from searchrl.ask import AskConfig, StreamingBackend, ask
from searchrl.assets import load_tokenizer
from searchrl.cli import app
from searchrl.data.trajectory import Segment, Trajectory
from searchrl.data.types import Passage, Question
from searchrl.errors import RetrievalUnavailable, SearchRLError
from searchrl.eval import multihop
from searchrl.eval import result_names as rn
from searchrl.eval.answer_prompts import ANSWER_EXAMPLES, answer_protocol, documents_text
from searchrl.eval.compare import compare_markdown
from searchrl.eval.run import EvalConfig, answer_prompt, format_verdict, predict, run_eval
from searchrl.eval.score import score_file
from searchrl.protocols.tagged import TagProtocol
from searchrl.protocols.tags import SEARCH_R1_TAGS, format_documents
from searchrl.retrieval import RetrievalConfig
from searchrl.retrieval.index import build_index, open_index
from searchrl.rollout.backend import SamplingParams
from searchrl.rollout.scripted import ScriptedBackend

PASSAGES = [
    Passage("p1", "Quellbridge", "Quellbridge is a market town on the river Tessaly."),
    Passage("p2", "Tessaly", "The Tessaly flows into Orrin Bay after eighty kilometres."),
    Passage("p3", "Vantrel X2", "The Vantrel X2 is a compact camera made by Orrin Optics."),
    Passage("p4", "Orrin Optics", "Orrin Optics is a camera maker founded by Dagny Halvorsen."),
    Passage("p5", "Harbel Observatory", "Harbel Observatory opened in 1901 on Mount Harbel."),
    Passage("p6", "Dagny Halvorsen", "Dagny Halvorsen was an engineer born in the port of Velmar."),
]
QUESTIONS = [
    Question("q1", "Which river flows through Quellbridge?", ("Tessaly",), ("p1",)),
    Question("q2", "Who founded the maker of the Vantrel X2?", ("Dagny Halvorsen",), ("p3", "p4"), type="bridge"),
    Question("q3", "When did Harbel Observatory open?", ("1901",), ()),
]
EOS = "<|im_end|>"
runner = CliRunner()


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """A six-passage BM25 index and a three-question file."""
    root = tmp_path_factory.mktemp("world")
    build_index(PASSAGES, root / "index", "bm25", progress=False)
    questions = root / "questions.jsonl"
    questions.write_text("".join(json.dumps(q.to_dict()) + "\n" for q in QUESTIONS))
    return root / "index", questions


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer("tiny-random")


def _question_of(text: str) -> str:
    last = text.rsplit("User: ", 1)[1]
    return re.search(r"Question: (.*)\n", last).group(1) if last.startswith("Documents:") else last.split("\n")[0]


# The agent: q1 searches once and answers right; q2 searches twice and names the wrong entity;
# q3 answers from memory with an extra word (EM 0, F1 2/3, cover 1).
AGENT = {
    "Which river flows through Quellbridge?": [" <search>Quellbridge river</search>", " It is the Tessaly.</think>\n<answer>Tessaly</answer>"],
    "Who founded the maker of the Vantrel X2?": [" <search>Vantrel X2</search>", " <search>Orrin Optics</search>", "</think>\n<answer>Orrin Optics</answer>"],
    "When did Harbel Observatory open?": [" I recall it.</think>\n<answer>1901 AD</answer>"],
}


def agent_policy(text: str) -> str:
    turn = text.rsplit("User:", 1)[1].count(SEARCH_R1_TAGS.docs_open)
    return AGENT[_question_of(text)][turn]


def answer_policy(text: str) -> str:
    """rag/direct: answers from the documents when the prompt has them; q3 never closes the tag, adds
    a second line and goes on to write the next user turn."""
    q = _question_of(text)
    if q.startswith("When"):
        return "1901\nOn Mount Harbel.\nUser: And who built it?" + EOS
    if "Documents:" in text.rsplit("User: ", 1)[1]:
        return {"Which": "Tessaly", "Who": "Dagny Halvorsen"}[q.split()[0]] + "</answer>"
    return "Paris</answer>"


def _cfg(world, tmp_path, method, **kw):
    index, questions = world
    retrieval = {} if method == "direct" else {"index": str(index)}
    return EvalConfig(method=method, dataset=str(questions), protocol={"tags": "search-r1"}, rollout={"k": 2},
                      retrieval=retrieval, out=str(tmp_path / method), **kw)


def _lines(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_agent_run_numbers(world, tmp_path, tokenizer):
    metrics = run_eval(_cfg(world, tmp_path, "agent"), progress=False, backend=ScriptedBackend(tokenizer, agent_policy))
    recs = _lines(tmp_path / "agent" / "predictions.jsonl")
    assert [r["prediction"] for r in recs] == ["Tessaly", "Orrin Optics", "1901 AD"]
    assert [r["n_searches"] for r in recs] == [1, 2, 0]
    assert recs[1]["queries"] == ["Vantrel X2", "Orrin Optics"] and recs[1]["search_blocks"] == [0, 1]
    assert recs[1]["retrieved_ids"][0][0] == "p3" and recs[1]["retrieved_ids"][1][0] == "p4"
    assert all(r["format_ok"] and r["format_failed"] == [] for r in recs)
    assert recs[0]["scores"] == {"em": 1.0, "f1": 1.0, "cem": 1.0, "cem_substr": 1.0}
    assert metrics["em"] == pytest.approx(1 / 3)
    assert metrics["f1"] == pytest.approx((1 + 0 + 2 / 3) / 3)
    assert metrics["cover_em"] == pytest.approx(2 / 3)
    assert metrics["mean_searches"] == pytest.approx(1.0)
    assert metrics["search_rate"] == pytest.approx(2 / 3)
    assert metrics["retrieval_recall"] == pytest.approx(1.0)  # q3 has no supporting ids: not counted
    assert metrics["format_ok_rate"] == 1.0
    assert metrics["stop_reasons"] == {"answer": 3}
    assert metrics["mean_generated_tokens"] == pytest.approx(sum(r["n_policy_tokens"] for r in recs) / 3)
    assert "token_ids" not in recs[0]  # no --dump-tokens
    # Three distinct queries, none from the in-process cache; the time spent searching them.
    assert (metrics["retrieval_queries"], metrics["retrieval_cache_hits"], metrics["retrieval_cache_hit_rate"]) == (3, 0, 0.0)
    assert 0 < metrics["retrieval_s"] <= metrics["seconds"]
    assert "| queries searched (cache hit %), seconds in search | 3 (0.0), " in (tmp_path / "agent" / "metrics.md").read_text()
    # q2's second query names Orrin Optics, which only its first search's passage gave: a bridge step.
    # Supporting passages per search: q1 finds p1 with its one search; q2 p3, then p4 (q3 has none).
    assert {k: v for k, v in metrics.items() if k.startswith("multihop/")} == pytest.approx({
        "multihop/all/rollouts": 3, "multihop/all/searches": 1.0, "multihop/all/bridge_rate": 1 / 3,
        "multihop/all/support_hop1": 1.0, "multihop/all/support_hop2": 0.5, "multihop/all/support_hop3": 0.0,
        "multihop/all/em": 1 / 3, "multihop/all/f1": (1 + 0 + 2 / 3) / 3,
        "multihop/bridge/rollouts": 1, "multihop/bridge/searches": 2.0, "multihop/bridge/bridge_rate": 1.0,
        "multihop/bridge/support_hop1": 1.0, "multihop/bridge/support_hop2": 1.0, "multihop/bridge/support_hop3": 0.0,
        "multihop/bridge/em": 0.0, "multihop/bridge/f1": 0.0,
    })
    md = (tmp_path / "agent" / "metrics.md").read_text()  # the table docs/guides/evaluation.md shows
    assert "| all | 3 | 33.3 | 55.6 | 1.00 | 33.3 | 1.00 | 0.50 | 0.00 |" in md
    assert "| bridge | 1 | 0.0 | 0.0 | 2.00 | 100.0 | 1.00 | 1.00 | 0.00 |" in md


def test_metrics_json_keys_are_the_results_schema(world, tmp_path, tokenizer):
    """Every key agent, rag and direct runs write is described by `eval.result_names`, and every
    entry is written by one of them but those of the judge and web search (not run here)."""
    written = set()
    for method, policy in (("agent", agent_policy), ("rag", answer_policy), ("direct", answer_policy)):
        written |= set(run_eval(_cfg(world, tmp_path, method), progress=False, backend=ScriptedBackend(tokenizer, policy)))
    assert sorted(k for k in written if rn.describe(k) is None) == []
    unwritten = {m.name for m in rn.SCHEMA.values() if not any(m.matches(k) for k in written)}
    assert unwritten == {rn.JUDGE_REQUESTS, rn.JUDGE_CACHE_HITS, rn.JUDGE_MALFORMED, rn.WEB_COUNTER.name, rn.WEB}


def test_format_rate_follows_the_think_rule_the_model_trained_with(world, tmp_path, tokenizer):
    no_close = lambda text: agent_policy(text).replace("</think>", "")  # what a 135M model writes
    rates = {}
    for require in (True, False):
        cfg = _cfg(world, tmp_path / str(require), "agent", require_think=require)
        metrics = run_eval(cfg, progress=False, backend=ScriptedBackend(tokenizer, no_close))
        rates[require] = metrics["format_ok_rate"]
        assert metrics["cover_em"] == pytest.approx(2 / 3)  # the answers are the same either way
    assert rates == {True: 0.0, False: 1.0}


def test_rag_and_direct_numbers_and_fallback(world, tmp_path, tokenizer):
    rag = run_eval(_cfg(world, tmp_path, "rag"), progress=False, backend=ScriptedBackend(tokenizer, answer_policy))
    recs = _lines(tmp_path / "rag" / "predictions.jsonl")
    # The answer tag is opened by the prompt; q3 never closes it -> its first line, cut at the turn end.
    assert [r["prediction"] for r in recs] == ["Tessaly", "Dagny Halvorsen", "1901"]
    assert [r["format_ok"] for r in recs] == [True, True, False]
    assert "answer" in recs[2]["format_failed"]
    assert [r["stop_reason"] for r in recs] == ["answer", "answer", "turn_end"]
    assert recs[2]["segments"][0]["text"] == "1901\nOn Mount Harbel.\nUser:"  # nothing past the turn end
    # One retrieval with the question as query, recorded like a search.
    assert [r["queries"] for r in recs] == [[q.question] for q in QUESTIONS]
    assert [r["retrieved_ids"] for r in recs] == [[["p1", "p2"]], [["p3", "p4"]], [["p5"]]]  # BM25: matches only
    assert all(r["n_searches"] == 1 for r in recs)
    assert (rag["em"], rag["search_rate"], rag["mean_searches"]) == (1.0, 1.0, 1.0)
    assert rag["format_ok_rate"] == pytest.approx(2 / 3)
    assert all(s["source"] == "policy" for r in recs for s in r["segments"])

    direct = run_eval(_cfg(world, tmp_path, "direct"), progress=False, backend=ScriptedBackend(tokenizer, answer_policy))
    recs = _lines(tmp_path / "direct" / "predictions.jsonl")
    assert [r["prediction"] for r in recs] == ["Paris", "Paris", "1901"]
    assert all(r["n_searches"] == 0 and r["retrieved_ids"] == [] for r in recs)
    assert direct["em"] == pytest.approx(1 / 3)
    assert (direct["search_rate"], direct["retrieval_recall"]) == (0.0, None)
    # rag's one retrieval with the question is no bridge step; direct finds no passage
    assert (rag["multihop/bridge/bridge_rate"], rag["multihop/bridge/support_hop1"], rag["multihop/bridge/em"]) == (0.0, 2.0, 1.0)
    assert (direct["multihop/all/searches"], direct["multihop/all/support_hop1"]) == (0.0, 0.0)


def test_answer_prompts_show_their_own_worked_examples_whatever_the_template(tmp_path, tokenizer):
    docs_prompt = answer_prompt("Q?", PASSAGES[:2], SEARCH_R1_TAGS, "base")
    assert docs_prompt.endswith(
        "User: Documents:\n(1) Title: Quellbridge\nQuellbridge is a market town on the river Tessaly.\n"
        "(2) Title: Tessaly\nThe Tessaly flows into Orrin Bay after eighty kilometres.\n\n"
        "Question: Q?\nAssistant: <answer>"
    )
    assert "using the documents" in docs_prompt
    # Each example with its own passages, answered between the tags, before the question.
    assert docs_prompt.count("User: Documents:\n") == 1 + len(ANSWER_EXAMPLES)
    for question, passages, answer in ANSWER_EXAMPLES:
        shown = f"{documents_text(passages)}\n\nQuestion: {question}\nAssistant: <answer>{answer}</answer>\n\n"
        assert shown in docs_prompt
    direct = answer_prompt("Q?", None, SEARCH_R1_TAGS, "base")
    assert "Documents" not in direct and "documents" not in direct and "Title:" not in direct
    assert direct.count("User: ") == 1 + len(ANSWER_EXAMPLES) and direct.endswith("User: Q?\nAssistant: <answer>")
    # The agent's template picks the form only: completion ones and files give the same prompt...
    agent_file = tmp_path / "agent.txt"
    agent_file.write_text("{instruction}\n\nUser: {question}\nAssistant: {think_open}")
    for template in ("oneshot", "fewshot", str(agent_file)):
        assert answer_prompt("Q?", PASSAGES[:2], SEARCH_R1_TAGS, template) == docs_prompt
    # ... a chat one the tokenizer's chat template, examples as earlier turns.
    chat = answer_prompt("Q?", PASSAGES[:2], SEARCH_R1_TAGS, "fewshot-chat", tokenizer)
    assert chat.endswith("Question: Q?<|im_end|>\n<|im_start|>assistant\n<answer>")
    assert chat.count("<|im_start|>assistant\n<answer>Velmar</answer><|im_end|>") == 1 and "User:" not in chat


def test_answer_protocol_stops_at_the_answer_and_the_turn_end(tmp_path):
    agent_file = tmp_path / "agent.txt"
    agent_file.write_text("{instruction}\n\nUser: {question}\nAssistant: {think_open}")
    for template in ("base", "oneshot", str(agent_file)):  # a file's own turns are not rag's
        stops = answer_protocol(TagProtocol.named("search-r1", template)).stop_strings()
        assert "</answer>" in stops and "\nUser:" in stops
    assert "\nUser:" not in answer_protocol(TagProtocol.named("search-r1", "fewshot-chat")).stop_strings()  # EOS ends it


def _answered(text: str, stop_reason: str):
    """Prediction and format verdict of a rag response the model wrote after the prompt's `<answer>`."""
    t = Trajectory("q", "Q?", [], [], [], [], [Segment(text, "policy")] if text else [], stop_reason=stop_reason)
    verdict = format_verdict(t, "rag", TagProtocol.named("search-r1", "oneshot"), require_think=False)
    return predict(t, "rag", TagProtocol(SEARCH_R1_TAGS)), verdict.ok


def test_rag_answers_are_read_from_what_the_model_wrote():
    # What SmolLM2-135M writes with the worked examples: the tag closed, or one line and its turn ended.
    assert _answered("Velmar</answer>", "answer") == ("Velmar", True)
    assert _answered(" Harbel 35 </answer>", "answer") == ("Harbel 35", True)
    assert _answered("Boubedale\n\nUser:", "turn_end") == ("Boubedale", True)
    assert _answered("Boubedale", "eos") == ("Boubedale", True)  # a chat turn ends with EOS
    no = "No, the directors of Night over Trigend and Beyond Broulsei are citizens of the same country."
    assert _answered(no + "\n\nUser:", "turn_end") == (no, True)  # a sentence is an answer too
    assert _answered("<answer>Velmar</answer>", "answer") == ("Velmar", False)  # read; the tag twice is no format
    # What it wrote without them (the old prompt): its turn ended at once -> no answer, not "User:".
    assert _answered("\n\nUser:", "turn_end") == (None, False)
    # Garbage is never format-ok: an answer it went on explaining, a run-on the budget cut, a copied
    # passage, nothing, mangled bytes, protocol tags.
    assert _answered("Selma\nSelma is a film studio founded in 1922.\n\nUser:", "turn_end") == ("Selma", False)
    assert _answered("Selma\nSelma is a film studio founded in", "length") == ("Selma", False)
    run_on = "Nedornia's son is Nedornia's son is Nedornia's son is"
    assert _answered(run_on, "length") == (run_on, False)
    assert _answered("Velmar", "length") == ("Velmar", False)  # cut: more was coming
    copied = "\n\n(2) Title: The Mounmym Inheritance\nWritten by Zhenella Somsen"
    assert _answered(copied, "length") == ("(2) Title: The Mounmym Inheritance", False)
    assert _answered("", "eos") == (None, False) and _answered("  </answer>", "answer") == (None, False)
    assert _answered("\ufffd\ufffd</answer>", "answer")[1] is False
    assert _answered("\ufffd\ufffd\nUser:", "turn_end")[1] is False
    assert _answered("<search>Velmar</search></answer>", "answer")[1] is False
    assert _answered("<search>Velmar\nUser:", "turn_end")[1] is False


def test_agent_prediction_rules():
    def traj(text, answer=None):
        return Trajectory("q", "Q?", [], [], [], [], [Segment(text, "policy")], answer=answer)

    assert predict(traj("thinking only"), "agent", TagProtocol(SEARCH_R1_TAGS)) is None
    assert predict(traj("</think><answer> Velmar\nport"), "agent", TagProtocol(SEARCH_R1_TAGS)) == "Velmar"  # budget cut
    assert predict(traj("...", answer="Velmar"), "agent", TagProtocol(SEARCH_R1_TAGS)) == "Velmar"


def test_config_errors(world):
    index, _ = world
    with pytest.raises(ValueError, match="not both"):
        EvalConfig(retrieval={"index": str(index), "url": "http://127.0.0.1:1"})
    with pytest.raises(ValueError, match="give an index"):
        EvalConfig(method="rag")
    with pytest.raises(SearchRLError, match="unknown prompt template"):
        EvalConfig(method="direct", protocol={"template": "nope"})
    with pytest.raises(ValueError, match="samples_per_question must be 1"):
        EvalConfig(method="direct", rollout={"samples_per_question": 2})
    assert EvalConfig(method="direct").retrieval.source is None  # direct needs no retriever


def test_eval_rollout_defaults_hold_when_only_some_keys_are_given():
    expected = {"greedy": True, "k": 5, "max_searches": 8, "max_new_tokens": 512, "batch_size": 16}
    assert EvalConfig(method="direct").rollout.model_dump(include=set(expected)) == expected
    partial = EvalConfig(method="direct", rollout={"k": 3}).rollout
    assert partial.model_dump(include=set(expected)) == {**expected, "k": 3}  # not RolloutConfig's training defaults


# -------------------------------------------------------------------------------- the CLI


def _cli_run(world, out, method, *extra):
    index, questions = world
    args = ["eval", "run", "--method", method, "--model", "tiny-random", "--dataset", str(questions),
            "--limit", "3", "--max-new-tokens", "12", "--answer-max-new-tokens", "12", "--tags", "search-r1", "--out", str(out), "--json", *extra]
    if method != "direct":
        args += ["--index", str(index)]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, (result.output, result.exception)
    return json.loads(result.stdout.strip().splitlines()[-1])


METRIC_KEYS = {"n", "em", "f1", "cover_em", "cover_em_substring", "mean_searches", "mean_generated_tokens",
               "format_ok_rate", "search_rate", "retrieval_recall", "seconds", "model", "method", "dataset"}
RECORD_KEYS = {"question_id", "question", "segments", "queries", "retrieved_ids", "search_blocks", "n_searches", "answer",
               "stop_reason", "answers", "prediction", "method", "scores", "format_ok", "format_failed", "supporting_ids",
               "type"}
# The multi-hop keys of these questions: every rollout (`all`) and q2's type; q1 and q3 have none.
MULTIHOP_KEYS = {family.key(t) for family in multihop.STATS for t in ("all", "bridge")}


@pytest.mark.parametrize("method", ["agent", "rag", "direct"])
def test_cli_tiny_random_writes_four_files(world, tmp_path, method):
    out = tmp_path / method
    printed = _cli_run(world, out, method, "--dump-tokens")
    assert sorted(p.name for p in out.iterdir()) == ["config.yaml", "console.log", "metrics.json", "metrics.md", "predictions.jsonl",
                                                     "run.json", "run.lock", "run_info.json"]
    assert (out / "run.lock").read_text() == ""  # released
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics == printed and METRIC_KEYS <= set(metrics)
    assert (metrics["n"], metrics["model"], metrics["method"]) == (3, "tiny-random", method)
    recs = _lines(out / "predictions.jsonl")
    assert len(recs) == 3 and all(RECORD_KEYS <= set(r) for r in recs)
    assert [r["answers"] for r in recs] == [list(q.answers) for q in QUESTIONS]
    for r in recs:  # --dump-tokens: the exact tokens, policy budget respected
        assert len(r["token_ids"]) == len(r["loss_mask"]) == len(r["logprobs"]) and r["prompt_ids"]
        assert sum(r["loss_mask"]) == r["n_policy_tokens"] <= 12
    scores = score_file(out / "predictions.jsonl")
    for key in ("n", "em", "f1", "cover_em", "cover_em_substring"):
        assert metrics[key] == scores[key]
    assert metrics["mean_searches"] == sum(r["n_searches"] for r in recs) / 3
    assert metrics["format_ok_rate"] == sum(r["format_ok"] for r in recs) / 3
    config = yaml.safe_load((out / "config.yaml").read_text())
    assert (config["method"], config["limit"], config["rollout"]["max_new_tokens"], config["dump_tokens"]) == (method, 3, 12, True)
    assert (config["protocol"]["tags"], config["rollout"]["greedy"]) == ("search-r1", True)
    assert config["retrieval"]["index"] == (None if method == "direct" else str(world[0]))
    md = (out / "metrics.md").read_text()
    assert md.startswith("| metric | value |") and f"| method | {method} |" in md
    # the multi-hop behaviour of every question and of q2's type, the only one these questions have
    assert {k for k in metrics if k.startswith("multihop/")} == MULTIHOP_KEYS
    assert metrics["multihop/bridge/rollouts"] == 1 and [r["type"] for r in recs] == ["", "bridge", ""]
    assert "| type | n | EM % |" in md and "| bridge | 1 |" in md


def test_cli_config_file_and_overrides(world, tmp_path):
    _, questions = world
    cfg = tmp_path / "eval.yaml"
    cfg.write_text(yaml.safe_dump({"method": "direct", "model": "tiny-random", "dataset": str(questions), "limit": 1,
                                   "rollout": {"max_new_tokens": 20, "k": 4}}))
    result = runner.invoke(app, ["eval", "run", "--config", str(cfg), "--set", "rollout.max_new_tokens=4",
                                 "--limit", "2", "--out", str(tmp_path / "o"), "--json"])
    assert result.exit_code == 0, result.output
    saved = yaml.safe_load((tmp_path / "o" / "config.yaml").read_text())
    assert (saved["method"], saved["limit"], saved["rollout"]["max_new_tokens"]) == ("direct", 2, 4)
    assert (saved["rollout"]["k"], saved["rollout"]["batch_size"], saved["rollout"]["greedy"]) == (4, 16, True)
    assert json.loads((tmp_path / "o" / "metrics.json").read_text())["n"] == 2


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--method", "agent"], "give an index"),
        (["--index", "x", "--retriever-url", "http://127.0.0.1:9"], "not both"),
        (["--method", "search"], "method"),
        (["--method", "direct", "--template", "nope"], "unknown prompt template"),
        (["--method", "direct", "--dataset", "no-such-set"], "unknown dataset"),
        (["--method", "direct"], "--out"),
        (["--method", "direct", "--set", "tempreature=1"], "tempreature"),
    ],
)
def test_cli_errors(tmp_path, extra, message):
    out = [] if extra[-1] == "direct" and message == "--out" else ["--out", str(tmp_path / "o")]
    result = runner.invoke(app, ["eval", "run", "--model", "tiny-random", *extra, *out])
    assert isinstance(result.exception, SearchRLError), (result.output, result.exception)
    assert message in str(result.exception)
    assert not (tmp_path / "o" / "metrics.json").exists()


def test_compare_two_runs(world, tmp_path, tokenizer):
    run_eval(_cfg(world, tmp_path, "agent"), progress=False, backend=ScriptedBackend(tokenizer, agent_policy))
    run_eval(_cfg(world, tmp_path, "direct"), progress=False, backend=ScriptedBackend(tokenizer, answer_policy))
    folders = [tmp_path / "agent", tmp_path / "direct"]
    md = compare_markdown(folders)
    lines = md.strip().splitlines()
    assert lines[0] == "|  | agent | direct |"
    assert lines[2:5] == ["| model | smollm2-135m | smollm2-135m |", "| method | agent | direct |",
                          "| dataset | questions.jsonl | questions.jsonl |"]
    assert "| EM % | 33.3 | 33.3 |" in lines and "| recall % | 100.0 | n/a |" in lines  # direct measured no recall
    blank = lines.index("")  # then the per-type table: two types per run
    assert lines[blank + 1].startswith("| run | type | n | EM % |") and len(lines) == blank + 3 + 4
    assert lines[blank + 4::2] == ["| agent | bridge | 1 | 0.0 | 0.0 | 2.00 | 100.0 | 1.00 | 1.00 | 0.00 |",
                                   "| direct | bridge | 1 | 0.0 | 0.0 | 0.00 | 0.0 | 0.00 | 0.00 | 0.00 |"]
    result = runner.invoke(app, ["eval", "compare", *map(str, folders), "--out", str(tmp_path / "cmp.md")],
                           env={"COLUMNS": "250"})
    assert result.exit_code == 0, result.output
    assert (tmp_path / "cmp.md").read_text() == md
    assert "agent" in result.stdout and "direct" in result.stdout
    result = runner.invoke(app, ["eval", "compare", str(tmp_path / "nothing")])
    assert isinstance(result.exception, SearchRLError) and "metrics.json" in str(result.exception)


# -------------------------------------------------------------------------------- ask


def test_ask_json_is_a_trajectory(world):
    index, _ = world
    result = runner.invoke(app, ["ask", "Which river flows through Quellbridge?", "--model", "tiny-random",
                                 "--index", str(index), "--max-new-tokens", "10", "--json"])
    assert result.exit_code == 0, (result.output, result.exception)
    traj = Trajectory.from_dict(json.loads(result.stdout))
    assert traj.question == "Which river flows through Quellbridge?"
    assert 0 < sum(traj.loss_mask) <= 10 and len(traj.token_ids) == len(traj.loss_mask)


def test_ask_live_view_shows_queries_titles_and_answer(world, tokenizer):
    from rich.console import Console

    index, _ = world
    console = Console(file=io.StringIO(), width=100, color_system=None)
    cfg = AskConfig(retrieval={"index": str(index)}, protocol={"tags": "search-r1"}, rollout={"k": 2})
    traj = ask("Who founded the maker of the Vantrel X2?", cfg, console=console,
               backend=ScriptedBackend(tokenizer, agent_policy), chunk=10_000)
    shown = console.file.getvalue()
    assert traj.answer == "Orrin Optics" and traj.n_searches == 2
    for piece in ("search 1", "Vantrel X2", "search 2", "1. Vantrel X2", "1. Orrin Optics", "[p3]", "answer", "2 searches ·"):
        assert piece in shown, piece
    assert shown.index("search 1") < shown.index("search 2") < shown.rindex("Orrin Optics")
    assert "<information>" not in shown  # documents are shown as titles, not inserted text


def test_streaming_backend_matches_one_call(tokenizer):
    """Pieces of 3 tokens add up to the same greedy continuation, stop string included, and the
    text handed out is exactly the decoded continuation."""
    from searchrl.rollout.hf_backend import HFBackend

    backend = HFBackend.from_model_name("tiny-random")
    prompts = [backend.encode("User: Which river?\nAssistant: <think>", prompt=True), backend.encode("Hello there", prompt=True)]
    greedy = SamplingParams(greedy=True)
    whole = backend.generate(backend.start(prompts, greedy), 40)
    # A stop string that the model will write: a piece of its own greedy output.
    stop = backend.decode(whole[0].token_ids[20:23])
    whole = backend.generate(backend.start(prompts, greedy), 40, [stop])
    seen: dict[int, str] = {}
    streaming = StreamingBackend(backend, lambda h, text: seen.__setitem__(h, seen.get(h, "") + text), chunk=3)
    handles = streaming.start(prompts, greedy)
    pieces = streaming.generate(handles, 40, [stop])
    for a, b, h in zip(whole, pieces, handles):
        assert (b.token_ids, b.finish_reason, b.stop_string) == (a.token_ids, a.finish_reason, a.stop_string)
        assert b.logprobs == pytest.approx(a.logprobs, abs=1e-4)
        eos = backend.eos_token_ids
        assert seen.get(h, "") == backend.decode([t for t in b.token_ids if t not in eos])
    assert whole[0].finish_reason == "stop"


def test_env_segments_of_agent_are_documents(world, tmp_path, tokenizer):
    """--dump-tokens on the scripted agent: mask-0 runs decode to the documents blocks."""
    index, _ = world
    run_eval(_cfg(world, tmp_path, "agent", dump_tokens=True), progress=False, backend=ScriptedBackend(tokenizer, agent_policy))
    retriever = open_index(index)
    for r in _lines(tmp_path / "agent" / "predictions.jsonl"):
        runs, prev = [], 1
        for t, m in zip(r["token_ids"], r["loss_mask"]):
            if m == 0:
                if prev == 1:
                    runs.append([])
                runs[-1].append(t)
            prev = m
        expected = [format_documents(retriever.search([q], 2)[0], SEARCH_R1_TAGS) for q in r["queries"]]
        assert [tokenizer.decode(run) for run in runs] == expected


@pytest.mark.parametrize("api", ["native", "search-r1"])
def test_rag_through_a_retrieval_server_matches_the_local_index(world, tmp_path, tokenizer, api):
    from searchrl.retrieval.server import serve_in_background

    index, _ = world
    local = run_eval(_cfg(world, tmp_path / "local", "rag"), progress=False, backend=ScriptedBackend(tokenizer, answer_policy))
    with serve_in_background(open_index(index)) as url:
        cfg = _cfg(world, tmp_path / "http", "rag").model_copy(update={"retrieval": RetrievalConfig(url=url, api=api)})
        remote = run_eval(cfg, progress=False, backend=ScriptedBackend(tokenizer, answer_policy))
    ids = [[r["retrieved_ids"] for r in _lines(tmp_path / where / "rag" / "predictions.jsonl")] for where in ("local", "http")]
    assert ids[0] == ids[1]
    assert remote["retriever"] == url and remote["em"] == local["em"] == 1.0


# -------------------------------------------------------------------------------- nothing lost


def _stable(path):
    """Predictions without their timings (wall clock differs between any two runs)."""
    return [{k: v for k, v in r.items() if k != "timing"} for r in _lines(path)]


def _batches_of(cfg, size):
    return cfg.model_copy(update={"rollout": cfg.rollout.model_copy(update={"batch_size": size})})


def test_agent_eval_rides_out_a_retrieval_server_restart(world, tmp_path, tokenizer):
    """The server stops when q2 starts and is back 4 s later (the old fixed retries gave up after
    3.5 s): every prediction is written, the same as against the local index."""
    from searchrl.retrieval.server import create_app, free_port, serve_in_background

    index, _ = world
    local = _batches_of(_cfg(world, tmp_path / "local", "agent"), 1)
    run_eval(local, progress=False, backend=ScriptedBackend(tokenizer, agent_policy))
    app, port = create_app(open_index(index)), free_port()
    retry = {"backoff_s": 0.1, "max_backoff_s": 0.5, "total_s": 20}
    cfg = local.model_copy(update={"out": str(tmp_path / "http"), "retrieval": RetrievalConfig(url=f"http://127.0.0.1:{port}", retry=retry)})
    with contextlib.ExitStack() as server:
        server.enter_context(serve_in_background(app, port=port))
        restart = threading.Timer(4.0, lambda: server.enter_context(serve_in_background(app, port=port)))

        def policy(text):
            if _question_of(text).startswith("Who") and not restart.is_alive() and not restart.finished.is_set():
                server.close()  # down before q2's search
                restart.start()
            return agent_policy(text)

        metrics = run_eval(cfg, progress=False, backend=ScriptedBackend(tokenizer, policy))
        restart.join()
    assert restart.finished.is_set() and metrics["n"] == 3 and metrics["seconds"] >= 4
    assert _stable(tmp_path / "http" / "predictions.jsonl") == _stable(tmp_path / "local" / "agent" / "predictions.jsonl")


def test_interrupted_eval_resumes_without_redoing_finished_questions(world, tmp_path, tokenizer):
    reference = run_eval(_batches_of(_cfg(world, tmp_path / "ref", "agent"), 1), progress=False,
                         backend=ScriptedBackend(tokenizer, agent_policy))
    cfg = _batches_of(_cfg(world, tmp_path / "run", "agent"), 1)
    out = tmp_path / "run" / "agent"

    def dies_at_q3(text):
        if _question_of(text).startswith("When"):
            raise RuntimeError("killed")
        return agent_policy(text)

    with pytest.raises(RuntimeError, match="killed"):
        run_eval(cfg, progress=False, backend=ScriptedBackend(tokenizer, dies_at_q3))
    assert [r["id"] for r in _lines(out / "predictions.jsonl")] == ["q1", "q2"]  # written as they finished
    assert (out / "progress.json").is_file() and not (out / "metrics.json").exists()
    asked = []
    metrics = run_eval(cfg, progress=False, resume=True,
                       backend=ScriptedBackend(tokenizer, lambda text: asked.append(_question_of(text)) or agent_policy(text)))
    assert set(asked) == {QUESTIONS[2].question}
    assert _stable(out / "predictions.jsonl") == _stable(tmp_path / "ref" / "agent" / "predictions.jsonl")
    clock = {"seconds": 0, "retrieval_s": 0, "tools/search/latency_s": 0}
    assert {**metrics, **clock} == {**reference, **clock}
    assert sorted(p.name for p in out.iterdir()) == ["config.yaml", "console.log", "metrics.json", "metrics.md", "predictions.jsonl",
                                                     "run.json", "run.lock", "run_info.json"]


def test_torn_last_line_is_dropped_and_its_batch_run_again(world, tmp_path, tokenizer):
    """Killed while writing q2's record (batches [q1, q2], [q3]): q1 is kept, its batch runs whole
    again so that q2 is generated beside q1 exactly as before, and only q2 is appended."""
    cfg = _batches_of(_cfg(world, tmp_path, "agent"), 2)
    run_eval(cfg, progress=False, backend=ScriptedBackend(tokenizer, agent_policy))
    out = tmp_path / "agent"
    whole = (out / "predictions.jsonl").read_text()
    lines = whole.splitlines(keepends=True)
    (out / "predictions.jsonl").write_text(lines[0] + lines[1][:40])
    (out / "progress.json").write_text('{"seconds": 100.0}')
    asked = []
    metrics = run_eval(cfg, progress=False, resume=True,
                       backend=ScriptedBackend(tokenizer, lambda text: asked.append(_question_of(text)) or agent_policy(text)))
    assert set(asked) == {q.question for q in QUESTIONS}
    assert [r["id"] for r in _lines(out / "predictions.jsonl")] == ["q1", "q2", "q3"]
    assert _stable(out / "predictions.jsonl") == [{k: v for k, v in json.loads(x).items() if k != "timing"} for x in lines]
    assert metrics["seconds"] >= 100  # the interrupted run's time counts


def test_cli_resume_refuses_another_config_and_keeps_an_unfinished_run(world, tmp_path, monkeypatch):
    import searchrl.rollout.backend

    out = tmp_path / "o"
    first = _cli_run(world, out, "direct")
    # A finished run resumed: nothing left to generate, so no model is loaded.
    monkeypatch.setattr(searchrl.rollout.backend, "make_backend", lambda *a, **k: pytest.fail("the model was loaded"))
    result = runner.invoke(app, ["eval", "run", "--resume", str(out), "--json"])
    assert result.exit_code == 0, (result.output, result.exception)
    assert json.loads(result.stdout.strip().splitlines()[-1]) == first
    result = runner.invoke(app, ["eval", "run", "--resume", str(out), "--limit", "2", "--model", "tiny-random"])
    assert isinstance(result.exception, SearchRLError) and result.exit_code != 0
    assert "cannot resume" in str(result.exception) and "limit: 3 -> 2" in str(result.exception)
    result = runner.invoke(app, ["eval", "run", "--resume", str(tmp_path / "nothing")])
    assert "does not exist" in str(result.exception)
    (out / "progress.json").write_text('{"seconds": 1.0}')  # as a stopped run leaves it
    result = runner.invoke(app, ["eval", "run", "--method", "direct", "--model", "tiny-random", "--out", str(out)])
    assert isinstance(result.exception, SearchRLError) and f"--resume {out}" in str(result.exception)
    assert len(_lines(out / "predictions.jsonl")) == 3  # not overwritten


def test_agent_eval_without_a_server_fails_before_loading_the_model(world, tmp_path, monkeypatch):
    import searchrl.rollout.backend
    from searchrl.retrieval.server import free_port

    monkeypatch.setattr(searchrl.rollout.backend, "make_backend", lambda *a, **k: pytest.fail("the model was loaded"))
    url = f"http://127.0.0.1:{free_port()}"
    result = runner.invoke(app, ["eval", "run", "--method", "agent", "--model", "tiny-random", "--dataset", str(world[1]),
                                 "--retriever-url", url, "--out", str(tmp_path / "o")])
    assert result.exit_code != 0 and isinstance(result.exception, RetrievalUnavailable), (result.output, result.exception)
    assert f"no retrieval server answers at {url}/search" in str(result.exception)
    assert "searchrl serve" in str(result.exception)


# -------------------------------------------------------------------------------- the output folder


def _fake_model(monkeypatch, tokenizer, policy=agent_policy):
    """`eval run` through the CLI with the scripted agent standing in for the model it loads."""
    import searchrl.rollout.backend

    monkeypatch.setattr(searchrl.rollout.backend, "make_backend", lambda *a, **k: ScriptedBackend(tokenizer, policy))


def _agent_args(world, out, *extra):
    index, questions = world
    return ["eval", "run", "--method", "agent", "--model", "tiny-random", "--dataset", str(questions), "--index", str(index),
            "--tags", "search-r1", "-k", "2", "--batch-size", "1", "--out", str(out), "--json", *extra]


def test_a_second_eval_on_a_folder_in_use_is_refused_and_the_first_finishes_intact(world, tmp_path, tokenizer):
    reference = tmp_path / "ref" / "agent"
    run_eval(_batches_of(_cfg(world, tmp_path / "ref", "agent"), 1), progress=False, backend=ScriptedBackend(tokenizer, agent_policy))
    cfg = _batches_of(_cfg(world, tmp_path, "agent"), 1)
    at_q2, go_on = threading.Event(), threading.Event()

    def waits_at_q2(text):
        if _question_of(text).startswith("Who"):
            at_q2.set()
            assert go_on.wait(30)
        return agent_policy(text)

    failed = []
    first = threading.Thread(target=lambda: _record_failure(failed, run_eval, cfg, progress=False,
                                                            backend=ScriptedBackend(tokenizer, waits_at_q2)))
    first.start()
    try:
        assert at_q2.wait(30)  # the first run holds the folder, q1 written
        for again in ({}, {"overwrite": True}, {"resume": True}):
            with pytest.raises(SearchRLError, match=r"agent is in use by another searchrl process \(PID \d+ on host"):
                run_eval(cfg, progress=False, backend=ScriptedBackend(tokenizer, lambda text: pytest.fail("generated")), **again)
        assert [r["id"] for r in _lines(tmp_path / "agent" / "predictions.jsonl")] == ["q1"]
    finally:
        go_on.set()
        first.join(30)
    assert not failed, failed
    assert _stable(tmp_path / "agent" / "predictions.jsonl") == _stable(reference / "predictions.jsonl")


def _record_failure(failed, fn, *args, **kw):
    try:
        fn(*args, **kw)
    except BaseException as exc:  # noqa: BLE001  (reported by the test's assertion)
        failed.append(exc)


def test_an_eval_over_a_finished_run_is_refused_without_resume_or_overwrite(world, tmp_path, tokenizer, monkeypatch):
    from searchrl.retrieval.server import free_port

    out = tmp_path / "o"
    _fake_model(monkeypatch, tokenizer)
    assert runner.invoke(app, _agent_args(world, out)).exit_code == 0
    before = {name: (out / name).read_text() for name in ("predictions.jsonl", "metrics.json", "config.yaml")}
    _fake_model(monkeypatch, tokenizer, lambda text: pytest.fail("the model generated"))
    result = runner.invoke(app, _agent_args(world, out, "--limit", "1"))
    assert result.exit_code != 0 and isinstance(result.exception, SearchRLError)
    message = str(result.exception)
    assert f"{out} already holds an evaluation" in message and f"--resume {out}" in message and "--overwrite" in message
    # --overwrite with a dead server: the check fails before anything of the old run is touched.
    index_args = _agent_args(world, out, "--overwrite", "--limit", "1")
    index_args[index_args.index("--index"):index_args.index("--index") + 2] = ["--retriever-url", f"http://127.0.0.1:{free_port()}"]
    result = runner.invoke(app, index_args)
    assert isinstance(result.exception, RetrievalUnavailable), (result.output, result.exception)
    assert {name: (out / name).read_text() for name in before} == before
    result = runner.invoke(app, _agent_args(world, out, "--overwrite", "--resume", str(out)))
    assert "give one of them" in str(result.exception)
    # --overwrite starts over: one question now.
    _fake_model(monkeypatch, tokenizer)
    result = runner.invoke(app, _agent_args(world, out, "--overwrite", "--limit", "1"))
    assert result.exit_code == 0, (result.output, result.exception)
    assert [r["id"] for r in _lines(out / "predictions.jsonl")] == ["q1"]
    assert json.loads((out / "metrics.json").read_text())["n"] == 1


def test_an_existing_file_for_out_is_refused_before_the_model_loads(world, tmp_path, monkeypatch):
    import searchrl.rollout.backend

    monkeypatch.setattr(searchrl.rollout.backend, "make_backend", lambda *a, **k: pytest.fail("the model was loaded"))
    target = tmp_path / "results.txt"
    target.write_text("keep me\n")
    result = runner.invoke(app, _agent_args(world, target))
    assert isinstance(result.exception, SearchRLError), (result.output, result.exception)
    assert str(result.exception) == (f"--out {target} is a file; give a folder "
                                     "(eval run writes predictions.jsonl, metrics.json and config.yaml into it)")
    assert target.read_text() == "keep me\n"


def test_ctrl_c_says_how_to_resume_and_resuming_finishes_the_run(world, tmp_path, tokenizer, monkeypatch):
    out = tmp_path / "o"

    def stopped_at_q3(text):
        if _question_of(text).startswith("When"):
            raise KeyboardInterrupt
        return agent_policy(text)

    _fake_model(monkeypatch, tokenizer, stopped_at_q3)
    result = runner.invoke(app, _agent_args(world, out))
    assert result.exit_code == 130, (result.output, result.exception)
    assert result.stderr.strip().splitlines()[-1] == (
        f"interrupted: 2 answer(s) are saved in {out}; continue with: searchrl eval run --resume {out}")
    _fake_model(monkeypatch, tokenizer)
    result = runner.invoke(app, ["eval", "run", "--resume", str(out), "--json"])
    assert result.exit_code == 0, (result.output, result.exception)
    assert [r["id"] for r in _lines(out / "predictions.jsonl")] == ["q1", "q2", "q3"]


def test_protocol_label_names_native_tool_calls():
    from searchrl.eval.summary import protocol_label

    tags = {"format": "tags", "tags": "search-r1", "template": "oneshot", "tools": ["search"]}
    assert protocol_label(tags) == "search-r1 / oneshot"
    native = {"format": "tool-calls", "tags": "r1searcher", "template": "tools-fewshot", "tools": ["search", "open"]}
    assert protocol_label(native) == "tool calls (search, open) / tools-fewshot"
