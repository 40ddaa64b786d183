"""The RL trainer on the tiny-random model: resume equals an uninterrupted run, masked tokens get
no gradient, batches without policy tokens are harmless, every shipped config validates."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from searchrl.assets import resolve_model
from searchrl.cli import app
from searchrl.config import load_config
from searchrl.data.trajectory import Segment, Trajectory
from searchrl.data.types import Question
from searchrl.errors import SearchRLError
from searchrl.protocols.format_rules import FORMAT_RULES
from searchrl.protocols.tagged import TagProtocol
from searchrl.retrieval.querycache import RetrievalCounts
from searchrl.rl import actor as actor_module
from searchrl.rl import logprobs, preflight, step, trainer
from searchrl.rl.actor import Actor
from searchrl.rl.checkpoint import complete_checkpoints, latest_checkpoint
from searchrl.rl.config import TrainConfig
from searchrl.rl.policy import load_policy
from searchrl.rl.sampler import PromptSampler
from searchrl.rollout.worker import RolloutWorker
from searchrl.runlog import read_metrics

CONFIGS = Path(__file__).resolve().parents[2] / "configs"


def _overrides(world: Path, out: Path, *extra: str) -> list[str]:
    return [
        "model=tiny-random", f"retrieval.index={world / 'index'}", f"out={out}",
        f"protocol.template={world / 'prompt.txt'}",
        f"stage1.dataset={world / 'q.jsonl'}", f"stage2.dataset={world / 'q.jsonl'}",
        "stage1.steps=3", "stage2.steps=1",
        "stage1.prompts_per_step=2", "stage2.prompts_per_step=2",
        "stage1.samples_per_prompt=2", "stage2.samples_per_prompt=2",
        # top_p=1: a random model's flat distribution would make top-p sort the whole vocabulary
        "rollout.max_new_tokens=10", "rollout.top_p=1.0",
        "algorithm.lr=1e-3", "algorithm.kl_coef=0.05", "algorithm.ppo_epochs=1",
        "algorithm.mini_batch_size=2", "algorithm.micro_batch_size=2",
        "logging.checkpoint_every=1", "logging.keep_last=2", "logging.progress=false",
        *extra,
    ]


def _question_ids(run: Path) -> dict[int, list[str]]:
    return {
        int(f.stem.split("_")[1]): [json.loads(line)["id"] for line in f.read_text().splitlines()]
        for f in sorted((run / "samples").glob("step_*.jsonl"))
    }


def _weights(folder: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(folder / "model.safetensors")


def max_change(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    """The largest change of any weight between two `_weights` of one model."""
    return max(float((a[k] - b[k]).abs().max()) for k in a)


def test_resume_after_crash_equals_uninterrupted_run(world, tmp_path, varied_rewards):
    full = trainer.train(load_config(TrainConfig, None, _overrides(world, tmp_path / "full")))

    crashed = tmp_path / "crashed"
    cfg = load_config(TrainConfig, None, _overrides(world, crashed, "debug_crash_after_step=3"))
    with pytest.raises(RuntimeError, match="simulated crash"):
        trainer.train(cfg)
    assert len(read_metrics(crashed)) == 3  # step 3 was logged, but its checkpoint never came
    assert latest_checkpoint(crashed).name == "step_0002"  # mid-Stage 1: optimizer state matters
    resumed_from = _weights(crashed / "checkpoints" / "step_0002")
    (crashed / "checkpoints" / ".step_0003.tmp-dead").mkdir()  # a half-written checkpoint: ignored
    result = CliRunner().invoke(app, ["train", "--resume", str(crashed), "debug_crash_after_step=null"])
    assert result.exit_code == 0, result.output
    assert not (crashed / "checkpoints" / ".step_0003.tmp-dead").exists()

    a, b = read_metrics(full), read_metrics(crashed)
    assert [(r["stage"], r["step"]) for r in a] == [(1, 1), (1, 2), (1, 3), (2, 4)]
    assert [(r["stage"], r["step"]) for r in b] == [(r["stage"], r["step"]) for r in a]
    assert _question_ids(full) == _question_ids(crashed)  # same data order, step by step
    # Rollouts carry the policy version that sampled them, counted on over the resume (step k: k - 1).
    for run in (full, crashed):
        versions = {int(f.stem.split("_")[1]): {json.loads(line)["policy_version"] for line in f.read_text().splitlines()}
                    for f in sorted((run / "samples").glob("step_*.jsonl"))}
        assert versions == {1: {0}, 2: {1}, 3: {2}, 4: {3}}, run
    # Same seeds, restored optimizer/RNG/data position, exact fp32 weights from safetensors on
    # CPU: the resumed run reproduces the uninterrupted one to float rounding (1e-6).
    for ra, rb in zip(a, b):
        for key, value in ra.items():
            if step.is_timing(key) or value is None:
                assert step.is_timing(key) or rb[key] is None
                continue
            assert rb[key] == pytest.approx(value, abs=1e-6, rel=1e-6), (ra["step"], key)
    # Learning happened (so the comparison means something) and the weights agree at the end.
    assert sum(r["updates"] for r in a) > 0 and any(r["grad_norm"] > 0 for r in a)
    assert a[1]["kl"] > 0 and a[2]["kl"] > 0  # drifting from the reference during Stage 1
    assert a[3]["kl"] == 0  # Stage 2 starts a new reference: the Stage-1 weights
    wa, wb = _weights(full / "checkpoints" / "step_0004"), _weights(crashed / "checkpoints" / "step_0004")
    assert all(torch.allclose(wa[k], wb[k], atol=1e-6) for k in wa)
    # ... and the weights moved before and after the checkpoint resumed from (a tiny-random run
    # without reward spread never updates, and would 'reproduce' anything).
    start = _weights(Path(resolve_model("tiny-random")))
    assert max_change(start, resumed_from) > 1e-4 and max_change(resumed_from, wb) > 1e-4
    # keep_last=2; step_0003 ended Stage 1 and would be kept even beyond that
    assert [p.name for _, p in complete_checkpoints(full)] == ["step_0003", "step_0004"]
    assert (full / "checkpoints" / "latest").read_text().strip() == "step_0004"
    assert (full / "config.yaml").is_file()
    assert list((full / "tb").glob("events.out.tfevents.*"))  # TensorBoard mirror of metrics.jsonl
    assert {f"format_failed_{rule}" for rule in FORMAT_RULES} <= set(a[0])  # why format_ok is low
    assert (a[0]["retrieval_queries"], a[0]["retrieval_cache_hit_rate"]) == (0, None)  # a random model never searches
    rec = json.loads((full / "samples" / "step_0001.jsonl").read_text().splitlines()[0])
    assert {"segments", "answers", "prediction", "reward", "format_ok", "question"} <= set(rec)
    assert "token_ids" not in rec and set(rec["reward"]) >= {"total", "retrieve", "format", "answer"}


def _actor(cfg: TrainConfig) -> Actor:
    actor = Actor.load(cfg)
    actor.start_stage(None)
    return actor


def _step(actor: Actor, trajs: list[Trajectory], questions: list[Question]):
    """A Stage-2 step whose rollout worker hands back fixed trajectories (so tests control the
    tokens) -> (record, samples)."""
    cfg = actor.cfg

    class FixedWorker(RolloutWorker):
        def __init__(self):
            pass

        protocol = TagProtocol.from_config(cfg.protocol)
        tools = ["search"]

        def collect(self, questions, n, seed, progress=False):
            return trajs

        def sync_weights(self, model, version):
            pass

        def sleep(self):
            pass

        def wake(self):
            pass

        def spent(self):
            return {}

        def searched(self):
            return RetrievalCounts()

    at = step.StepIndex(stage=2, step=1, stage_step=0, seed=1)
    return step.train_step(actor, FixedWorker(), cfg.stage2, questions, at)


def _traj(qid: str, prompt: list[int], tokens: list[int], mask: list[int]) -> Trajectory:
    return Trajectory(qid, "Which river?", prompt, tokens, mask, [0.0] * len(tokens), [Segment("x", "policy")])


PASSES = {
    "shared-prompt+policy-head": {"checkpointing": False, "full_logits": False},
    "plain+checkpointing+policy-head": {"checkpointing": True, "full_logits": False},
    "shared-prompt+full-logits": {"checkpointing": False, "full_logits": True},
}


@pytest.mark.parametrize("variant", PASSES)
def test_environment_tokens_get_no_gradient_and_one_step_moves_weights(tmp_path, monkeypatch, world, variant):
    opts = PASSES[variant]
    cfg = load_config(TrainConfig, None, _overrides(
        world, tmp_path, "algorithm.micro_batch_size=8", "algorithm.ppo_epochs=1", "algorithm.mini_batch_size=null",
        "algorithm.kl_coef=0", "stage2.samples_per_prompt=4", f"algorithm.gradient_checkpointing={opts['checkpointing']}"))
    if opts["full_logits"]:  # what models with soft-capped logits get
        monkeypatch.setattr(logprobs, "_split_head", lambda model: None)
    # Rollouts of 8 response tokens; tokens 2-4 of each were inserted by the environment.
    env_mask = [1, 1, 0, 0, 0, 1, 1, 1]
    trajs = [_traj("q0", [5, 6, 7], [100 + i + j for j in range(8)], env_mask) for i in range(4)]
    rewards = iter([0.0, 1.0, 0.5, 2.0])
    monkeypatch.setattr(step, "compute_reward", lambda *a, **k: _fixed(next(rewards)))
    actor = _actor(cfg)
    before = {k: v.detach().clone() for k, v in actor.model.state_dict().items()}

    # Capture the logits scored in the update, and the loss mask of the same micro-batch.
    captured = []
    real_micro, real_scores = actor_module.micro_logprobs, logprobs._scores

    def spy_micro(model, mb, *args, **kwargs):
        captured.append({"mask": mb.mask})
        return real_micro(model, mb, *args, **kwargs)

    def spy_scores(logits, labels, *args):
        logits.retain_grad()
        captured[-1].update(logits=logits, labels=labels)
        return real_scores(logits, labels, *args)

    monkeypatch.setattr(actor_module, "micro_logprobs", spy_micro)
    monkeypatch.setattr(logprobs, "_scores", spy_scores)
    record, samples = _step(actor, trajs, [Question("q0", "Which river?", ("R0",))])

    assert record["updates"] == 1 and len(captured) == 1
    mask, logits = captured[0]["mask"], captured[0]["logits"]
    grad = logits.grad.abs().sum(dim=-1)
    if opts["full_logits"]:  # [b, T]: column j predicts response token j
        assert torch.all(grad[mask == 0] == 0)  # environment tokens: no gradient at all
        assert torch.all(grad[mask == 1] > 0)
    else:  # [1, N]: the output head ran on policy tokens only
        assert grad.shape == (1, int(mask.sum())) and torch.all(grad > 0)
        assert captured[0]["labels"].tolist() == [[t for tr in trajs for t, m in zip(tr.token_ids, env_mask) if m]]
    after = actor.model.state_dict()
    assert any(not torch.equal(before[k], after[k]) for k in before)
    assert record["response_tokens"] == 5 and record["env_tokens"] == 3
    # One update per batch: the update's own forward supplied the old log-probs (ratio 1).
    assert record["ratio_mean"] == pytest.approx(1.0) and record["clip_frac"] == 0.0
    assert len(samples) == 4 and samples[0]["reward"]["total"] == 0.0


def test_logprob_passes_agree_in_values_and_gradients():
    """Shared prompt pass, plain pass and full logits: same log-probs and parameter gradients."""
    from searchrl.assets import load_model
    from searchrl.rl.batch import make_batch

    model, tok = load_model("tiny-random")
    prompt = [5, 6, 7, 8]
    trajs = [_traj("q", prompt, [100 + i + j for j in range(6 + 2 * i)], [1, 1, 0, 0] + [1] * (2 + 2 * i)) for i in range(3)]
    batch = make_batch(trajs, [0.0] * 3, [0] * 3, tok.pad_token_id, "cpu")
    results = []
    for fn, split in [(logprobs.shared_prompt_logprobs, True), (logprobs.response_logprobs, True),
                      (logprobs.response_logprobs, False)]:
        model.zero_grad()
        real_split = logprobs._split_head
        logprobs._split_head = real_split if split else (lambda m: None)
        try:
            logp, ent = fn(model, batch, 0.7, True)
        finally:
            logprobs._split_head = real_split
        logp = torch.where(batch.mask.bool(), logp, torch.zeros_like(logp))
        logp.sum().backward()
        results.append((logp.detach(), ent.detach() * batch.mask, {n: p.grad.clone() for n, p in model.named_parameters()}))
    for logp, ent, grads in results[1:]:
        assert torch.allclose(logp, results[0][0], atol=1e-5)
        assert torch.allclose(ent, results[0][1], atol=1e-5)
        assert all(torch.allclose(grads[n], results[0][2][n], atol=1e-4) for n in grads)
    assert torch.all(results[0][0][batch.mask == 0] == 0) and torch.all(results[0][0][batch.mask == 1] < 0)


def _fixed(total: float):
    from searchrl.rewards import RewardBreakdown

    return RewardBreakdown(total, 0.0, 0.0, total, False, ["think"], 0.0)


def test_batch_without_policy_tokens_changes_nothing(tmp_path, monkeypatch, world):
    cfg = load_config(TrainConfig, None, _overrides(world, tmp_path, "algorithm.entropy_coef=0.1"))
    trajs = [_traj("q0", [5, 6], [], []), _traj("q0", [5, 6, 7], [9, 9], [0, 0])]  # empty; env only
    totals = iter([0.0, 1.0])
    monkeypatch.setattr(step, "compute_reward", lambda *a, **k: _fixed(next(totals)))
    actor = _actor(cfg)
    before = {k: v.detach().clone() for k, v in actor.model.state_dict().items()}
    record, _ = _step(actor, trajs, [Question("q0", "Which river?", ("R0",))])
    assert record["updates"] == 0 and record["response_tokens"] == 0
    assert all(math.isfinite(v) for v in record.values() if isinstance(v, float))
    assert all(torch.equal(before[k], v) for k, v in actor.model.state_dict().items())


def test_prompt_sampler_epochs_are_seeded_permutations():
    qs = [Question(f"q{i}", "?", ("a",)) for i in range(5)]
    s = PromptSampler(qs, seed=3, stage=1)
    first = [q.id for q in s.take(5)]
    second = [q.id for q in s.take(5)]
    assert sorted(first) == sorted(second) == [q.id for q in qs] and first != second
    resumed = PromptSampler(qs, seed=3, stage=1, position=7)
    assert [q.id for q in resumed.take(3)] == second[2:]


def test_lr_schedule_warmup_then_cosine(world, tmp_path):
    cfg = load_config(TrainConfig, None, _overrides(world, tmp_path, "algorithm.warmup_steps=1", "algorithm.lr_schedule=cosine",
                                                    "algorithm.min_lr_ratio=0.0", "stage2.steps=3"))
    actor = Actor(cfg, None, None)
    # 3 steps x 2 updates: warm-up over updates 0-1 (1/2, 1), then cosine over the remaining 4.
    got = [actor.lr_factor(u, steps=3, updates_per_step=2) for u in range(6)]
    want = [0.5, 1.0, 1.0, 0.5 * (1 + math.cos(math.pi / 4)), 0.5, 0.5 * (1 + math.cos(3 * math.pi / 4))]
    assert got == pytest.approx(want)


def test_stage_lr_scale_sets_each_stages_learning_rate(world, tmp_path):
    run = trainer.train(load_config(TrainConfig, None, _overrides(world, tmp_path / "run", "stage1.steps=1",
                                                                  "stage2.lr_scale=0.25")))
    assert [(r["stage"], r["lr"]) for r in read_metrics(run)] == [(1, pytest.approx(1e-3)), (2, pytest.approx(2.5e-4))]


def test_stage_micro_batch_size_splits_only_that_stages_update(world, tmp_path, monkeypatch, varied_rewards):
    sizes = []  # rows per forward of every update pass
    real = actor_module.group_chunks

    def spy(rows, group_ids, size):
        sizes.append(size)
        return real(rows, group_ids, size)

    monkeypatch.setattr(actor_module, "group_chunks", spy)
    run = trainer.train(load_config(TrainConfig, None, _overrides(world, tmp_path / "run", "stage1.steps=1",
                                                                  "stage2.micro_batch_size=1")))
    updates = [r["updates"] for r in read_metrics(run)]
    assert updates == [2, 2]  # two mini-batches a step in both stages, each split into micro-batches
    assert sizes == [2, 2, 1, 1]  # Stage 1 keeps algorithm.micro_batch_size, Stage 2 its own


@pytest.mark.parametrize("path", sorted(CONFIGS.glob("*.yaml")), ids=lambda p: p.name)
def test_shipped_configs_validate(path):
    cfg = load_config(TrainConfig, path)
    assert cfg.stage1.reward.stage == "stage1" and cfg.stage2.reward.stage == "stage2"


def test_fresh_run_refuses_an_existing_run_dir(world, tmp_path):
    (tmp_path / "metrics.jsonl").write_text("")

    with pytest.raises(SearchRLError, match="--resume"):
        trainer.train(load_config(TrainConfig, None, _overrides(world, tmp_path)))


def test_lora_without_peft_says_how_to_get_it(world, tmp_path, monkeypatch):
    import sys


    monkeypatch.setitem(sys.modules, "peft", None)  # makes `import peft` fail
    cfg = load_config(TrainConfig, None, _overrides(world, tmp_path, "algorithm.lora.enabled=true"))
    with pytest.raises(SearchRLError, match="pip install peft"):
        load_policy(cfg)


def test_lora_trains_the_adapter_and_uses_the_base_as_reference(world, tmp_path, varied_rewards):
    pytest.importorskip("peft", reason="LoRA is optional: pip install peft to run this test")
    cfg = load_config(TrainConfig, None, _overrides(
        world, tmp_path / "run", "algorithm.lora.enabled=true", "algorithm.lora.r=4",
        "stage1.steps=2", "stage2.enabled=false"))
    run = trainer.train(cfg)
    records = read_metrics(run)
    assert [r["updates"] for r in records] == [2, 2] and records[0]["kl"] == 0 < records[1]["kl"]
    saved = {p.name for p in (run / "checkpoints" / "step_0002").iterdir()}
    assert "adapter_model.safetensors" in saved and "model.safetensors" not in saved


def test_micro_batches_keep_groups_together_and_sort_by_length():
    from searchrl.rl.batch import group_chunks, group_order

    group_ids = [0, 0, 0, 1, 1, 1, 1]
    lengths = torch.tensor([9, 3, 5, 1, 8, 2, 7])
    order = group_order(group_ids, lengths)  # no generator: groups in order
    assert order.tolist() == [1, 2, 0, 3, 5, 6, 4]
    chunks = [c.tolist() for c in group_chunks(order, group_ids, 2)]
    assert chunks == [[1, 2], [0], [3, 5], [6, 4]]
    shuffled = group_order(group_ids, lengths, torch.Generator().manual_seed(1))
    assert sorted(shuffled.tolist()) == list(range(7))


def test_stage_questions_narrow_to_the_configured_types(tmp_path):
    path = tmp_path / "typed.jsonl"
    rows = [{"id": f"q{i}", "question": f"q {i}?", "answers": ["a"], "type": t}
            for i, t in enumerate(["comparison", "bridge-2hop", "comparison", "inference"])]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    stage = TrainConfig().stage2.model_copy(update={"dataset": str(path)})
    assert [q.id for q in preflight.stage_questions(stage, "stage2")] == ["q0", "q1", "q2", "q3"]
    narrowed = stage.model_copy(update={"question_types": ["comparison", "inference"]})
    assert [q.id for q in preflight.stage_questions(narrowed, "stage2")] == ["q0", "q2", "q3"]
    with pytest.raises(SearchRLError, match=r"its types are \['bridge-2hop', 'comparison', 'inference'\]"):
        preflight.stage_questions(stage.model_copy(update={"question_types": ["yes-no"]}), "stage2")


def test_a_config_extends_another_and_overrides_only_what_it_sets(tmp_path):
    long = load_config(TrainConfig, CONFIGS / "toyworld-cpu-long.yaml")
    demo = load_config(TrainConfig, CONFIGS / "demo-cpu.yaml")
    assert long.stage2.reward.retrieve_weight == 0.5 and demo.stage2.reward.retrieve_weight == 0.0
    assert long.stage2.reward.require_think is False  # merged into the base's reward mapping, not replacing it
    assert (long.stage2.steps, long.algorithm.lr_schedule) == (24, "cosine")
    assert long.protocol == demo.protocol and long.stage1 == demo.stage1 and long.rollout == demo.rollout
    (tmp_path / "a.yaml").write_text("extends: b.yaml\n")
    (tmp_path / "b.yaml").write_text("extends: a.yaml\n")
    with pytest.raises(SearchRLError, match="extends itself"):
        load_config(TrainConfig, tmp_path / "a.yaml")
    (tmp_path / "c.yaml").write_text("extends: missing.yaml\n")
    with pytest.raises(SearchRLError, match="missing.yaml does not exist"):
        load_config(TrainConfig, tmp_path / "c.yaml")


def test_steps_log_retrieval_time_and_the_query_cache_hit_rate(world, tmp_path, monkeypatch):
    """Two steps on one question, two samples each, both searching the same query: step 1 searches
    it once for both (hit rate 1/2), step 2 finds it in the in-process cache (1)."""
    from searchrl.protocols.tags import SEARCH_R1_TAGS
    from searchrl.rollout import worker as rollout_worker
    from searchrl.rollout.scripted import ScriptedBackend

    real_create = rollout_worker.RolloutWorker.create

    def scripted(cls, actor, retriever, protocol):
        worker = real_create(actor, retriever, protocol)
        worker.engine.backend = ScriptedBackend(actor.tokenizer, lambda text: (
            " <search>Town 0 river</search>" if SEARCH_R1_TAGS.docs_open not in text else "</think>\n<answer>R0</answer>"))
        return worker

    monkeypatch.setattr(rollout_worker.RolloutWorker, "create", classmethod(scripted))
    run = tmp_path / "run"
    trainer.train(load_config(TrainConfig, None, _overrides(
        world, run, "protocol.tags=search-r1", "stage1.steps=2", "stage2.enabled=false", "stage1.prompts_per_step=1",
        "rollout.max_new_tokens=24", "algorithm.kl_coef=0", "logging.report_to=[]")))
    steps = read_metrics(run)
    assert [(r["retrieval_queries"], r["retrieval_cache_hit_rate"]) for r in steps] == [(2, 0.5), (2, 1.0)]
    assert all(0 < r["retrieval_s"] < r["rollout_seconds"] for r in steps)
    assert {"retrieval_s", "retrieval_cache_hit_rate"} <= set(step.TIMING_KEYS)  # differ in a resumed run
