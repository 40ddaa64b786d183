"""The paid services in every command: `eval run` with an LLM judge (ACC_L, verdicts cached) and
with web search (agent and rag, SearXNG at SEARXNG_URL), `ask --web`, and `train` with
`retrieval.web`, whose searches, cache hits and cost appear per step in metrics.jsonl.
Scripted policies give exact numbers; the tiny-random model runs the CLI plumbing."""

from __future__ import annotations

import io
import json

import pytest
from loopback import FakeOpenAI, FakeWeb
from rich.console import Console
from typer.testing import CliRunner

from searchrl.ask import AskConfig, ask
from searchrl.assets import load_tokenizer
from searchrl.cli import app
from searchrl.errors import SearchRLError
from searchrl.eval import resume as saved
from searchrl.eval.run import EvalConfig, run_eval
from searchrl.protocols.tags import SEARCH_R1_TAGS
from searchrl.retrieval.web.budget import BudgetExhausted
from searchrl.rollout import worker as rollout_worker
from searchrl.rollout.scripted import ScriptedBackend
from searchrl.runlog import read_metrics

Q1, Q2 = "Which river flows through Quellbridge?", "Who founded Orrin Optics?"
GOLD = {Q1: "Tessaly", Q2: "Dagny Halvorsen"}
# Only the pages say these (the result snippets do not): a policy that repeats the gold answer
# when they are in its documents shows that the pages were read.
FACT = {Q1: "market town on the river Tessaly", Q2: "camera maker founded by Dagny Halvorsen"}
QUERY = {Q1: "Quellbridge river", Q2: "Orrin Optics founder"}
runner = CliRunner()


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer("tiny-random")


@pytest.fixture
def files(tmp_path):
    (tmp_path / "q.jsonl").write_text("".join(
        json.dumps({"id": f"q{i}", "question": q, "answers": [GOLD[q]]}) + "\n" for i, q in enumerate((Q1, Q2), 1)))
    (tmp_path / "prompt.txt").write_text("Q: {question}\nA: {think_open}")
    return tmp_path


@pytest.fixture
def web(monkeypatch, tmp_path):
    server = FakeWeb()
    monkeypatch.setenv("SEARXNG_URL", server.base)
    monkeypatch.setenv("SEARCHRL_HOME", str(tmp_path / "home"))  # the web and verdict caches
    monkeypatch.setenv("OPENAI_API_KEY", "sk-judge")
    monkeypatch.setenv("SEARCHRL_KEY_HOSTS", "127.0.0.1")  # the loopback judge may get the key
    yield server
    server.close()


@pytest.fixture
def judge():
    server = FakeOpenAI()
    yield server
    server.close()


def _question(text: str) -> str:
    return next(q for q in GOLD if q in text)


def agent(text: str) -> str:
    """Searches once, then answers with the gold answer if the documents hold the fact."""
    q = _question(text)
    if SEARCH_R1_TAGS.docs_open not in text:
        return f" <search>{QUERY[q]}</search>"
    return f"</think>\n<answer>{GOLD[q] if FACT[q] in text else 'unknown'}</answer>"


def rag(text: str) -> str:
    q = _question(text)
    return (GOLD[q] if FACT[q] in text else "unknown") + "</answer>"


def _cfg(files, method, out, **kw) -> EvalConfig:
    # The loopback web's pages are at 127.0.0.1: private addresses allowed.
    retrieval = {} if method == "direct" else {"web": {"provider": "searxng", "allow_private": True, "budget": {"requests_per_s": 0}}}
    return EvalConfig(method=method, dataset=str(files / "q.jsonl"), protocol={"tags": "search-r1", "template": str(files / "prompt.txt")},
                      rollout={"k": 2}, retrieval=retrieval, out=str(files / out), **kw)


def _lines(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_agent_and_rag_search_the_web_and_read_the_linked_pages(web, files, tokenizer):
    metrics = run_eval(_cfg(files, "agent", "agent"), progress=False, backend=ScriptedBackend(tokenizer, agent))
    recs = _lines(files / "agent" / "predictions.jsonl")
    assert [r["prediction"] for r in recs] == ["Tessaly", "Dagny Halvorsen"] and metrics["em"] == 1.0
    assert sorted(s.query["q"] for s in web.searches()) == sorted(QUERY.values())
    assert recs[0]["retrieved_ids"] == [[f"{web.base}/wiki/Quellbridge", f"{web.base}/wiki/Orrin_Optics"]]
    inserted = "".join(s["text"] for s in recs[0]["segments"] if s["source"] == "env")
    assert "Title: Quellbridge - Wikipedia" in inserted and FACT[Q1] in inserted
    assert (metrics["retriever"], metrics["web_requests"], metrics["web_cache_hits"]) == ("web:searxng", 2, 0)
    assert (metrics["web_pages"], metrics["web_page_failures"], metrics["web_cost_usd"]) == (2, 0, 0.0)
    assert "| web search requests (served from cache) | 2 (0) |" in (files / "agent" / "metrics.md").read_text()

    metrics = run_eval(_cfg(files, "rag", "rag"), progress=False, backend=ScriptedBackend(tokenizer, rag))
    assert metrics["em"] == 1.0 and sorted(s.query["q"] for s in web.searches()[2:]) == sorted(GOLD)
    assert (metrics["web_requests"], metrics["web_pages"]) == (2, 0)  # the pages came from the cache


def _scripted_model(monkeypatch, tokenizer, policy):
    """The CLI's model is a scripted policy: the command runs whole, nothing is loaded."""
    import searchrl.rollout.backend

    monkeypatch.setattr(searchrl.rollout.backend, "make_backend", lambda *a, **k: ScriptedBackend(tokenizer, policy))


@pytest.mark.parametrize(("method", "policy"), [("agent", agent), ("rag", rag)])
def test_cli_with_searxng_at_searxng_url(web, files, tokenizer, monkeypatch, method, policy):
    _scripted_model(monkeypatch, tokenizer, policy)
    result = runner.invoke(app, [
        "eval", "run", "--method", method, "--web", "searxng", "--web-site", "en.wikipedia.org", "--web-allow-private",
        "--dataset", str(files / "q.jsonl"),
        "--tags", "search-r1", "--template", str(files / "prompt.txt"), "-k", "2",
        "--set", "retrieval.web.budget.requests_per_s=0", "--out", str(files / method), "--json"])
    assert result.exit_code == 0, (result.output, result.exception)
    metrics = json.loads((files / method / "metrics.json").read_text())
    assert (metrics["retriever"], metrics["em"], metrics["web_requests"], metrics["web_pages"]) == ("web:searxng", 1.0, 2, 2)
    assert all(s.query["q"].endswith(" site:en.wikipedia.org") for s in web.searches())
    assert sorted(web.pages_read()) == ["/wiki/Orrin_Optics", "/wiki/Quellbridge"]


def test_cli_names_an_unknown_provider(files):
    result = runner.invoke(app, ["eval", "run", "--method", "rag", "--web", "bing", "--out", str(files / "x")])
    assert isinstance(result.exception, SearchRLError) and "unknown web search provider 'bing'" in str(result.exception)


def test_a_run_stopped_by_its_budget_resumes_with_a_higher_cap(web, files, tokenizer):
    cfg = _cfg(files, "agent", "capped")
    cfg.rollout.batch_size = 1
    cfg.retrieval.web.budget.max_requests = 1
    with pytest.raises(BudgetExhausted, match="max_requests=1"):
        run_eval(cfg, progress=False, backend=ScriptedBackend(tokenizer, agent))
    out = files / "capped"
    assert [r["id"] for r in _lines(out / "predictions.jsonl")] == ["q1"]
    cfg = saved.resumed_config(EvalConfig, out, None, ["retrieval.web.budget.max_requests=5"], {})  # allowed to change
    metrics = run_eval(cfg, progress=False, resume=True, backend=ScriptedBackend(tokenizer, agent))
    assert metrics["em"] == 1.0 and metrics["web_requests"] == 2 and len(web.searches()) == 2


def direct(text: str) -> str:
    return {Q1: "Tessaly", Q2: "Paris"}[_question(text)] + "</answer>"


def test_eval_run_with_a_judge_reports_acc_l_and_a_second_run_asks_nothing(web, files, tokenizer, judge):
    cfg = _cfg(files, "direct", "judged", judge={"url": judge.url, "model": "judge-mini"})
    first = run_eval(cfg, progress=False, backend=ScriptedBackend(tokenizer, direct))
    assert first["acc_l"] == 0.5 and [r["judge"] for r in _lines(files / "judged" / "predictions.jsonl")] == [True, False]
    assert (first["judge_requests"], first["judge_cache_hits"], first["judge_malformed"]) == (2, 0, 0)
    assert len(judge.requests) == 2 and judge.requests[0].body["model"] == "judge-mini"
    md = (files / "judged" / "metrics.md").read_text()
    assert "| ACC_L % (LLM judge) | 50.0 |" in md and "| judge requests (verdicts from cache, replies without one) | 2 (0, 0) |" in md

    again = run_eval(cfg.model_copy(update={"out": str(files / "again")}), progress=False, backend=ScriptedBackend(tokenizer, direct))
    assert again["acc_l"] == 0.5 and (again["judge_requests"], again["judge_cache_hits"]) == (0, 2)
    assert len(judge.requests) == 2  # nothing asked the second time


def test_cli_judge_flags_put_acc_l_in_metrics_json(web, files, judge, tokenizer, monkeypatch):
    _scripted_model(monkeypatch, tokenizer, direct)
    result = runner.invoke(app, ["eval", "run", "--method", "direct", "--dataset", str(files / "q.jsonl"),
                                 "--judge-url", judge.url, "--judge-model", "m", "--out", str(files / "o")])
    assert result.exit_code == 0, (result.output, result.exception)
    assert json.loads((files / "o" / "metrics.json").read_text())["acc_l"] == 0.5
    assert [r.body["model"] for r in judge.requests] == ["m", "m"] and "ACC_L % (LLM judge)" in result.output


def test_ask_searches_the_web_and_says_what_it_cost(web, files, tokenizer):
    cfg = AskConfig(protocol={"tags": "search-r1", "template": str(files / "prompt.txt")}, rollout={"k": 1},
                    retrieval={"web": {"provider": "searxng", "allow_private": True,
                                       "budget": {"requests_per_s": 0, "cost_per_request": 0.01}}})
    shown = io.StringIO()
    traj = ask(Q1, cfg, console=Console(file=shown, width=200), backend=ScriptedBackend(tokenizer, agent))
    assert traj.answer == "Tessaly" and traj.retrieved_ids == [[f"{web.base}/wiki/Quellbridge"]]
    assert "web: 1 requests, 0 from cache, $0.010" in shown.getvalue()


def test_train_with_web_search_logs_requests_cache_hits_and_cost_per_step(web, world, tmp_path, monkeypatch):
    """Two steps on one question, two samples each: step 1 searches (one request for the two
    samples' equal queries), step 2 finds it in the cache."""
    real_create = rollout_worker.RolloutWorker.create

    def scripted(cls, actor, retriever, protocol):
        worker = real_create(actor, retriever, protocol)
        worker.engine.backend = ScriptedBackend(actor.tokenizer, lambda text: (
            " <search>Town river</search>" if SEARCH_R1_TAGS.docs_open not in text else "</think>\n<answer>R0</answer>"))
        return worker

    monkeypatch.setattr(rollout_worker.RolloutWorker, "create", classmethod(scripted))
    (tmp_path / "one.jsonl").write_text(json.dumps({"id": "q0", "question": "Which river flows through Town 0?", "answers": ["R0"]}) + "\n")
    run, config = tmp_path / "run", tmp_path / "train.yaml"
    config.write_text("model: tiny-random\n")
    result = runner.invoke(app, [
        "train", "--config", str(config), "retrieval.web.provider=searxng", "retrieval.web.allow_private=true",
        "retrieval.index=null", f"out={run}",
        "retrieval.web.budget.requests_per_s=0", "retrieval.web.budget.cost_per_request=0.25",
        f"protocol.template={world / 'prompt.txt'}", "protocol.tags=search-r1", f"stage1.dataset={tmp_path / 'one.jsonl'}",
        "stage1.steps=2", "stage2.enabled=false", "stage1.prompts_per_step=1", "stage1.samples_per_prompt=2",
        "rollout.max_new_tokens=24", "rollout.top_p=1.0", "rollout.k=2", "algorithm.ppo_epochs=1",
        "algorithm.mini_batch_size=2", "algorithm.micro_batch_size=2", "algorithm.kl_coef=0", "logging.progress=false", "logging.report_to=[]"])
    assert result.exit_code == 0, (result.output, result.exception)
    steps = read_metrics(run)
    assert [r["search_rate"] for r in steps] == [1.0, 1.0]
    assert [(r["web_requests"], r["web_cache_hits"], r["web_cost_usd"], r["web_pages"]) for r in steps] == [(1, 0, 0.25, 1), (0, 1, 0.0, 0)]
    assert [r["web_cost_usd_total"] for r in steps] == [0.5, 0.5]  # the preflight's search is the run's first


@pytest.mark.parametrize(("flags", "allowed"), [([], False), (["--web-allow-private"], True)])
def test_ask_takes_web_allow_private(monkeypatch, flags, allowed):
    import searchrl.ask

    seen = []
    monkeypatch.setattr(searchrl.ask, "ask", lambda question, cfg, **kw: seen.append(cfg))
    result = runner.invoke(app, ["ask", Q1, "--web", "searxng", *flags])
    assert result.exit_code == 0, (result.output, result.exception)
    assert seen[0].retrieval.web.allow_private is allowed
