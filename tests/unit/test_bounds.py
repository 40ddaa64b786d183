"""Bounds that follow the model: documents blocks cut to the context at run time (and counted),
configs that cannot fit refused before the model runs, `--set` conflicts and tags reported,
samples_per_prompt=1 refused for RL."""

from __future__ import annotations

import dataclasses
import json
import re
import subprocess
import sys

import pytest
import torch
from typer.testing import CliRunner

import searchrl.eval.run
from searchrl.assets import load_model, load_tokenizer
from searchrl.cli import app
from searchrl.config import flag_overrides, load_config, parse_overrides
from searchrl.data.types import Passage, Question
from searchrl.errors import SearchRLError
from searchrl.eval.run import EvalConfig, records, run_eval
from searchrl.eval.summary import metrics_markdown, summarize
from searchrl.protocols.tagged import TagProtocol, document_block_ends
from searchrl.protocols.tags import SEARCH_R1_TAGS, format_documents
from searchrl.retrieval import RetrievalConfig
from searchrl.retrieval.base import Retriever
from searchrl.retrieval.store import MemoryPassages
from searchrl.rewards import RewardConfig, compute_reward
from searchrl.rl import step
from searchrl.rl.actor import UpdateStats
from searchrl.rl.config import TrainConfig
from searchrl.rl.preflight import preflight
from searchrl.rollout import hf_backend
from searchrl.rollout.backend import SamplingParams, context_window
from searchrl.rollout.bounds import check_rollout_fits, passage_tokens
from searchrl.rollout.config import RolloutConfig
from searchrl.rollout.engine import ANSWER_ROOM, RolloutEngine
from searchrl.rollout.hf_backend import HFBackend
from searchrl.rollout.scripted import ScriptedBackend

PASSAGES = [
    Passage(f"p{i}", f"Town {i}", f"Town {i} lies on the river R{i}; its market has sold wool, salt and iron since {1800 + i}.")
    for i in range(12)
]
QUESTION = Question("q1", "Which river flows through Town 3?", ("R3",))
PROMPT = "Q: Which river flows through Town 3?\nA: <think>"
QUERY = " <search>Town 3 river</search>"
PROTOCOL = TagProtocol.named("search-r1")
HEAD, TAIL = document_block_ends(SEARCH_R1_TAGS)


class ListRetriever(Retriever):
    """The first k passages for every query, and the passages as a local index has them."""

    def __init__(self) -> None:
        self.passages = MemoryPassages(PASSAGES)
        self.calls = 0

    def search(self, queries, k):
        self.calls += 1
        return [PASSAGES[:k] for _ in queries]


class ServerLike(Retriever):
    """A retriever that cannot list its passages (a server, web search)."""

    def search(self, queries, k):
        return [PASSAGES[:k] for _ in queries]


@pytest.fixture(scope="module")
def tiny():
    return load_model("tiny-random")


@pytest.fixture
def positions(tiny):
    """Every position id the model is fed, from a hook on its forward."""
    fed: list[int] = []

    def hook(module, args, kwargs):
        fed.extend(kwargs["position_ids"].flatten().tolist())

    handle = tiny[0].register_forward_pre_hook(hook, with_kwargs=True)
    yield fed
    handle.remove()


def agent_run(tiny, monkeypatch, context: int | None, **cfg):
    """One greedy rollout of the tiny model whose first turn is forced to write QUERY (a random
    model never searches), with its max positions set to `context`."""
    model, tok = tiny
    if context is not None:
        monkeypatch.setattr(model.config, "max_position_embeddings", context)
    forced = tok(QUERY, add_special_tokens=False)["input_ids"]
    real = hf_backend.sample_tokens

    def sample(logits, params, generator):
        tokens, logps = real(logits, params, generator)
        if forced:
            tokens = torch.full_like(tokens, forced.pop(0))
            logps = torch.log_softmax(logits.float(), -1).gather(1, tokens[:, None])[:, 0]
        return tokens, logps

    monkeypatch.setattr(hf_backend, "sample_tokens", sample)
    backend, retriever = HFBackend(model, tok), ListRetriever()
    engine = RolloutEngine(backend, retriever, PROTOCOL, RolloutConfig(greedy=True, **cfg))
    (traj,) = engine.run([QUESTION], [PROMPT], n=1)
    return traj, engine, retriever


def env_ids(traj) -> list[int]:
    return [t for t, m in zip(traj.token_ids, traj.loss_mask) if m == 0]


def test_a_block_that_fits_is_inserted_whole(tiny, monkeypatch):
    traj, _, _ = agent_run(tiny, monkeypatch, None, k=12, max_searches=1, max_new_tokens=40)
    assert traj.queries == ["Town 3 river"] and traj.truncated_documents == 0
    assert [s.text for s in traj.segments if s.source == "env"] == [format_documents(PASSAGES, SEARCH_R1_TAGS)]


def test_a_block_longer_than_the_context_is_cut_and_no_position_past_the_model_is_fed(tiny, monkeypatch, positions):
    context = 160
    traj, _, _ = agent_run(tiny, monkeypatch, context, k=12, max_searches=2, max_new_tokens=200)
    tok = tiny[1]
    prompt, query = len(traj.prompt_ids), len(tok(QUERY, add_special_tokens=False)["input_ids"])
    # The block fills what the context had left after the query, less ANSWER_ROOM for the answer.
    assert len(env_ids(traj)) == context - prompt - query - ANSWER_ROOM
    assert traj.truncated_documents == 1
    (seen,) = [s.text for s in traj.segments if s.source == "env"]
    assert seen.startswith(HEAD) and seen.endswith(TAIL)  # both tags whole
    body, whole = seen[len(HEAD) : -len(TAIL)], format_documents(PASSAGES, SEARCH_R1_TAGS)[len(HEAD) : -len(TAIL)]
    assert whole.startswith(body) and 0 < len(body) < len(whole)  # a prefix: whole passages, then one cut
    assert f"(1)Title: Town 0 Text: {PASSAGES[0].text}\n" in body
    # Then the policy generated exactly up to the context and stopped there.
    assert traj.stop_reason == "context_full"
    assert prompt + len(traj.token_ids) == context
    assert max(positions) == context - 2  # the last sampled token is never fed
    assert len(traj.token_ids) == len(traj.loss_mask) == len(traj.logprobs)


def test_no_room_for_even_the_tags_stops_without_searching(tiny, monkeypatch):
    model, tok = tiny
    prompt = len(HFBackend(model, tok).encode(PROMPT, prompt=True))
    query = len(tok(QUERY, add_special_tokens=False)["input_ids"])
    tags = sum(len(tok(part, add_special_tokens=False)["input_ids"]) for part in (HEAD, TAIL))
    context = prompt + query + ANSWER_ROOM + tags - 1
    traj, _, retriever = agent_run(tiny, monkeypatch, context, k=12, max_searches=2, max_new_tokens=200)
    assert (traj.stop_reason, traj.n_searches, retriever.calls) == ("context_full", 0, 0)
    assert 0 not in traj.loss_mask


def test_the_cut_and_full_stops_are_counted_in_eval_summaries_and_training_metrics(tiny, monkeypatch):
    traj, _, _ = agent_run(tiny, monkeypatch, 160, k=12, max_searches=2, max_new_tokens=200)
    cfg = EvalConfig(retrieval=RetrievalConfig(index="idx"))
    metrics = summarize(cfg, records(cfg, [QUESTION], [traj], TagProtocol.from_config(cfg.protocol)), {"seconds": 0.0})
    assert (metrics["truncated_documents"], metrics["stop_reasons"]) == (1, {"context_full": 1})
    assert "| documents blocks cut / rollouts stopped, context full | 1 / 1 |" in metrics_markdown(metrics)
    clean = summarize(cfg, [{**r, "truncated_documents": 0, "stop_reason": "answer"} for r in records(cfg, [QUESTION], [traj], TagProtocol.from_config(cfg.protocol))],
                      {"seconds": 0.0})
    assert "context full" not in metrics_markdown(clean)  # the row shows only when the context bounded the run

    plain = dataclasses.replace(traj, truncated_documents=0, stop_reason="answer")
    trajs = [traj, plain]
    rewards = [compute_reward(t, QUESTION.answers, RewardConfig(), SEARCH_R1_TAGS) for t in trajs]
    scored = step.Scored([QUESTION] * 2, trajs, rewards, [0, 0])
    sums = torch.ones((2, len(step._SUMS)), dtype=torch.float64)
    out = step.record(step.StepIndex(1, 1, 0, 0), scored, sums, UpdateStats(0, 0, 0, 0, 1, 0, 0, 1e-5), False, False,
                      step.Timing(1.0, 0.0, 0.0, 1.0), tools=["search"], protocol=TagProtocol(SEARCH_R1_TAGS))
    assert (out["truncated_documents"], out["stop_context_full"], out["stop_answer"]) == (0.5, 0.5, 0.5)


def test_hf_backend_never_generates_past_its_max_positions(tiny, monkeypatch):
    model, tok = tiny
    monkeypatch.setattr(model.config, "max_position_embeddings", 24)
    be = HFBackend(model, tok)
    assert be.max_context == 24
    (out,) = be.generate(be.start([list(range(1, 11))], SamplingParams(greedy=True)), 1000)
    assert (len(out.token_ids), out.finish_reason) == (14, "length")
    (more,) = be.generate([0], 5)
    assert more.token_ids == []


def test_context_window_reads_what_is_real():
    class Tok:
        model_max_length = int(1e30)  # what a tokenizer without a limit says

    class Cfg:
        max_position_embeddings = 2048

    assert context_window(Tok()) is None and context_window(Tok(), Cfg()) == 2048
    Tok.model_max_length = 1024
    assert context_window(Tok(), Cfg()) == 1024 and context_window(None, None) is None


# ---------------------------------------------------------------------------------------------
# Before the model runs


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer("tiny-random")


def test_k_larger_than_the_local_index_is_refused(tokenizer):
    with pytest.raises(SearchRLError, match=r"^rollout.k=13 is more than the 12 passages of index idx; set rollout.k to 12 or less$"):
        check_rollout_fits(RolloutConfig(k=13), PROTOCOL, tokenizer, 8192, [QUESTION], ListRetriever(), "idx")
    check_rollout_fits(RolloutConfig(k=12, max_searches=2), PROTOCOL, tokenizer, 8192, [QUESTION], ListRetriever(), "idx")


def test_a_budget_that_cannot_fit_is_refused_with_its_numbers_and_the_k_that_fits(tokenizer):
    retriever, context = ListRetriever(), 1024
    cfg = RolloutConfig(k=12, max_searches=4, max_new_tokens=100)
    with pytest.raises(SearchRLError) as err:
        check_rollout_fits(cfg, PROTOCOL, tokenizer, context, [QUESTION], retriever, "idx")
    msg = str(err.value)
    assert "\n" not in msg and "the model's context holds 1,024" in msg and "max_searches=4" in msg
    assert "lower rollout.k (to " in msg and "rollout.max_searches, rollout.max_new_tokens" in msg
    fits = int(msg.split("(to ")[1].split(" ")[0])
    # The estimate: longest prompt + searches x (tags + k x mean passage line) + new tokens.
    tags, per = passage_tokens(retriever.passages, PROTOCOL, tokenizer)
    assert tags == sum(len(tokenizer(p, add_special_tokens=False)["input_ids"]) for p in (HEAD, TAIL))
    # An index of 12 passages is read whole, so a block of all 12 is estimated exactly.
    assert tags + 12 * per == pytest.approx(len(tokenizer(format_documents(PASSAGES, SEARCH_R1_TAGS), add_special_tokens=False)["input_ids"]))
    assert 1 <= fits < 12
    check_rollout_fits(cfg.model_copy(update={"k": fits}), PROTOCOL, tokenizer, context, [QUESTION], retriever, "idx")
    with pytest.raises(SearchRLError):
        check_rollout_fits(cfg.model_copy(update={"k": fits + 1}), PROTOCOL, tokenizer, context, [QUESTION], retriever, "idx")
    # A server's passages are unknown: only the prompt and the policy's budget are counted.
    check_rollout_fits(cfg, PROTOCOL, tokenizer, context, [QUESTION], ServerLike(), None)
    with pytest.raises(SearchRLError, match=r"longest prompt \d+ \+ max_new_tokens=1,100; lower rollout.max_new_tokens$"):
        check_rollout_fits(cfg.model_copy(update={"max_new_tokens": 1100}), PROTOCOL, tokenizer, context, [QUESTION], ServerLike(), None)


def test_train_preflight_and_eval_refuse_before_generating(world, tmp_path):
    index, questions = str(world / "index"), str(world / "q.jsonl")
    base = [f"retrieval.index={index}", f"stage1.dataset={questions}", f"stage2.dataset={questions}",
            "model=tiny-random", f"out={tmp_path / 'run'}"]
    with pytest.raises(SearchRLError, match="rollout.k=13 is more than the 12 passages"):
        preflight(load_config(TrainConfig, None, [*base, "rollout.k=13"]), [1], "tiny-random")
    with pytest.raises(SearchRLError, match=r"context holds 8,192: .* \+ max_new_tokens=8,000; lower rollout.k"):
        preflight(load_config(TrainConfig, None, [*base, "rollout.max_new_tokens=8000"]), [1], "tiny-random")
    cfg = EvalConfig(dataset=questions, retrieval=RetrievalConfig(index=index), rollout={"k": 13}, out=str(tmp_path / "eval"))
    backend = ScriptedBackend(load_tokenizer("tiny-random"), lambda text: pytest.fail("nothing may be generated"))
    with pytest.raises(SearchRLError, match="rollout.k=13 is more than the 12 passages"):
        run_eval(cfg, progress=False, backend=backend)


def test_absurd_k_and_searches_are_refused_at_load():
    with pytest.raises(SearchRLError, match=r"rollout.k: Input should be less than or equal to 100"):
        load_config(EvalConfig, None, ["rollout.k=1000000000", "retrieval.index=idx"])
    with pytest.raises(SearchRLError, match=r"rollout.max_searches: Input should be less than or equal to 64"):
        load_config(TrainConfig, None, ["rollout.max_searches=1000"])


# ---------------------------------------------------------------------------------------------
# --set: conflicts with flags, YAML tags


def test_a_set_that_a_flag_contradicts_is_an_error_naming_both():
    for value in ("abc", "-1", "4"):
        with pytest.raises(SearchRLError, match=rf'^--set rollout.k={json.dumps(parse_overrides([f"k={value}"])["k"])} conflicts with '
                                                r"the flag that sets rollout.k=3: give the value once"):
            flag_overrides({"rollout.k": 3, "limit": None}, [f"rollout.k={value}"])
    assert flag_overrides({"rollout.k": 3}, ["rollout.k=3", "limit=2"]) == ["rollout.k=3"]  # agreeing values are fine
    with pytest.raises(SearchRLError, match=r'--set retrieval.web="brave" conflicts with the flag that sets retrieval.web.site'):
        flag_overrides({"retrieval.web.site": "x"}, ["retrieval.web=brave"])


def test_eval_and_train_commands_report_the_conflict(monkeypatch, tmp_path):
    monkeypatch.setattr(searchrl.eval.run, "run_eval", lambda *a, **kw: pytest.fail("must not run"))
    result = CliRunner().invoke(app, ["eval", "run", "--index", "idx", "--out", "o", "-k", "3", "--set", "rollout.k=abc"])
    assert isinstance(result.exception, SearchRLError) and "--set rollout.k=\"abc\" conflicts" in str(result.exception)
    result = CliRunner().invoke(app, ["train", "--config", "configs/demo-cpu.yaml", "--out", str(tmp_path / "a"), f"out={tmp_path / 'b'}"])
    assert isinstance(result.exception, SearchRLError) and "conflicts with the flag that sets out=" in str(result.exception)


def test_a_yaml_tag_in_set_is_one_line():
    with pytest.raises(SearchRLError, match=r"^override 'k=!!python/object/apply:os.system \[\"true\"\]': YAML tags \(!!\.\.\.\) are "
                                            r"not accepted; quote the value to give it as a string$"):
        parse_overrides(['k=!!python/object/apply:os.system ["true"]'])
    with pytest.raises(SearchRLError, match=r"^override 'k=\[1, 2': the value is not valid YAML \(expected ',' or '\]', [^\n]+\); quote it"):
        parse_overrides(["k=[1, 2"])
    # And on the terminal: exit code 2, no traceback.
    run = subprocess.run([sys.executable, "-m", "searchrl", "eval", "run", "--set", "rollout.k=!!python/name:os.system"],
                         check=False, capture_output=True, text=True, timeout=120)
    assert run.returncode == 2 and "Traceback" not in run.stderr and "YAML tags" in run.stderr


def test_a_broken_config_file_names_its_line(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("model: tiny-random\nrollout: {k: 3\n")
    with pytest.raises(SearchRLError, match=rf"^config file {re.escape(str(path))}:\d is not valid YAML: [^\n]+$"):
        load_config(TrainConfig, path)


# ---------------------------------------------------------------------------------------------
# A group of one has no baseline


@pytest.mark.parametrize("advantage", ["grpo", "reinforce_pp", "rloo"])
def test_rl_with_one_sample_per_prompt_is_refused(advantage):
    with pytest.raises(SearchRLError, match=rf"stage2.samples_per_prompt=1 cannot learn: algorithm.advantage={advantage} .* "
                                            r"every advantage is 0; set stage2.samples_per_prompt to 2 or more"):
        load_config(TrainConfig, None, [f"algorithm.advantage={advantage}", "stage2.samples_per_prompt=1"])
    # A disabled stage, or an SFT stage (one gold sequence per question), may have one.
    load_config(TrainConfig, None, [f"algorithm.advantage={advantage}", "stage2.samples_per_prompt=1", "stage2.enabled=false"])
    load_config(TrainConfig, None, ["stage2.kind=sft", "stage2.samples_per_prompt=1", "retrieval.index=toyworld"])
