"""One training step, in the paper's order: `collect → score → prepare → update → record`.

1. **collect**: the rollout worker generates `samples_per_prompt` trajectories per question with
   the current weights, searching as it goes;
2. **score**: each trajectory gets the stage's outcome reward; its group is its question;
3. **prepare**: trajectories become padded tensors with the loss mask on policy tokens;
   reference log-probs (kl_coef > 0), old log-probs, and advantages with the group baseline;
4. **update**: the actor's clipped updates; then the worker receives the new weights;
5. **record**: the metrics line and the sampled trajectories.

Old log-probs come from one no-grad pass of the current weights (the sampler's log-probs come
from another code path, possibly another engine; their gap is logged as `logprob_mismatch`) —
or, when the batch makes exactly one optimizer step, from that step's own forward, which runs on
the same weights (`prepare` then leaves them to the update).
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass

import numpy as np
import torch

from searchrl.data.trajectory import STOP_REASONS, Trajectory
from searchrl.data.types import Question
from searchrl.metrics import ANSWER_METRICS
from searchrl.rewards import FORMAT_RULES, RewardBreakdown, compute_reward
from searchrl.rl.actor import Actor, UpdateStats
from searchrl.rl.advantages import compute_advantages
from searchrl.rl.batch import RolloutBatch, make_batch
from searchrl.rl.config import StageConfig
from searchrl.rl.losses import kl_penalty, masked_mean
from searchrl.rl.rollout_worker import RolloutWorker

# Keys of a step record that measure time, not learning (they differ between identical runs).
TIMING_KEYS = ("step_seconds", "rollout_seconds", "logprob_seconds", "update_seconds", "tokens_per_s")


@dataclass(frozen=True)
class StepIndex:
    stage: int
    step: int  # of the run, from 1
    stage_step: int  # of the stage, from 0
    seed: int  # sampling seed of this step (see `trainer.step_seed`)


@dataclass
class Scored:
    """A step's trajectories with their rewards; rollout i answers question `group_ids[i]`."""

    questions: list[Question]  # one per rollout
    trajectories: list[Trajectory]
    rewards: list[RewardBreakdown]
    group_ids: list[int]


@dataclass(frozen=True)
class Timing:
    rollout_seconds: float
    logprob_seconds: float
    update_seconds: float
    step_seconds: float


def train_step(actor: Actor, worker: RolloutWorker, stage_cfg: StageConfig, questions: list[Question],
               at: StepIndex, progress: bool = False) -> tuple[dict, list[dict]]:
    """One rollout batch and its policy updates -> (metrics record, sample records)."""
    t0 = time.perf_counter()
    trajectories = worker.collect(questions, stage_cfg.samples_per_prompt, at.seed, progress)
    worker.sleep()  # a colocated engine frees its memory for the update
    t1 = time.perf_counter()
    scored = score(trajectories, questions, stage_cfg, worker)
    batch = prepare(actor, scored)
    old_from_update = batch.old_logp is None
    t2 = time.perf_counter()
    stats = actor.update(batch, at.stage_step, stage_cfg.steps, torch.Generator().manual_seed(at.seed ^ 0x5EED))
    worker.wake()
    worker.sync_weights(actor)
    t3 = time.perf_counter()
    # Left to the update, the old log-probs exist only if an update ran.
    have_old = not old_from_update or stats.updates > 0
    return record(at, scored, batch, stats, have_old, Timing(t1 - t0, t2 - t1, t3 - t2, t3 - t0)), samples(at, scored)


def score(trajectories: list[Trajectory], questions: list[Question], stage_cfg: StageConfig, worker: RolloutWorker) -> Scored:
    """The stage's outcome reward of every rollout; the group is the question's samples."""
    n, protocol = stage_cfg.samples_per_prompt, worker.protocol
    per_rollout = [q for q in questions for _ in range(n)]
    rewards = [
        compute_reward(t, q.answers, stage_cfg.reward, protocol.tags, think_opened_in_prompt=protocol.think_opened_in_prompt)
        for t, q in zip(trajectories, per_rollout)
    ]
    return Scored(per_rollout, trajectories, rewards, [i // n for i in range(len(trajectories))])


def prepare(actor: Actor, scored: Scored) -> RolloutBatch:
    """Tensors, reference and old log-probs, advantages (see the module docstring for when the
    old log-probs are left to the update)."""
    alg = actor.cfg.algorithm
    batch = make_batch(scored.trajectories, [r.total for r in scored.rewards], scored.group_ids, actor.pad_id, actor.device)
    kl_in_reward = alg.kl_kind == "k1-reward" and actor.reference is not None
    one_update = alg.ppo_epochs == 1 and (alg.mini_batch_size or len(batch)) >= len(batch)
    batch.ref_logp = actor.reference_logprobs(batch)
    if not one_update or kl_in_reward:  # the k1 reward needs the old log-probs before the update
        batch.old_logp, batch.entropy = actor.logprobs(batch)
    kl_tokens = kl_penalty(batch.old_logp, batch.ref_logp, "k1") if kl_in_reward else None
    batch.advantages = compute_advantages(
        alg.advantage, batch.rewards, batch.group_ids, batch.mask, kl=kl_tokens, kl_coef=alg.kl_coef if kl_in_reward else 0.0
    )
    return batch


def record(at: StepIndex, scored: Scored, batch: RolloutBatch, stats: UpdateStats, have_old: bool, timing: Timing) -> dict:
    """The step's line of metrics.jsonl; `have_old`: the batch's old log-probs were computed."""
    trajs, rewards, mask = scored.trajectories, scored.rewards, batch.mask
    f1 = ANSWER_METRICS.get("f1")
    policy_tokens = mask.sum(dim=-1).float()  # [B]
    out = {
        "stage": at.stage,
        "step": at.step,
        "stage_step": at.stage_step + 1,
        "reward": float(batch.rewards.mean()),
        "reward_retrieve": _mean(r.retrieve for r in rewards),
        "reward_format": _mean(r.format for r in rewards),
        "reward_answer": _mean(r.answer for r in rewards),
        "reward_std": float(batch.rewards.std(unbiased=False)),
        "search_rate": _mean(t.n_searches >= 1 for t in trajs),
        "searches": _mean(t.n_searches for t in trajs),
        "format_ok": _mean(r.format_ok for r in rewards),
        "answer_f1": _mean(f1(t.answer, q.answers) for t, q in zip(trajs, scored.questions)),
        "answer_rate": _mean(t.answer is not None for t in trajs),
        "response_tokens": float(policy_tokens.mean()),
        "env_tokens": float((batch.response_lengths().float() - policy_tokens).mean()),
        "kl": float(masked_mean(kl_penalty(batch.old_logp, batch.ref_logp, "k3"), mask)) if have_old and batch.ref_logp is not None else None,
        "entropy": float(masked_mean(batch.entropy, mask)) if have_old else None,
        "logprob_mismatch": float(masked_mean((batch.sample_logp - batch.old_logp).abs(), mask)) if have_old else None,
        **asdict(stats),
        "rollouts": len(batch),
        "tokens_per_s": int(mask.sum()) / max(timing.rollout_seconds, 1e-9),
        **asdict(timing),
    }
    for reason in STOP_REASONS:
        out[f"stop_{reason}"] = _mean(t.stop_reason == reason for t in trajs)
    for rule in FORMAT_RULES:  # which rule holds format_ok down
        out[f"format_failed_{rule}"] = _mean(rule in r.failed_rules for r in rewards)
    return out


def samples(at: StepIndex, scored: Scored) -> list[dict]:
    """The step's trajectories as they are written to samples/step_XXXX.jsonl."""
    out = []
    for t, q, r, gid in zip(scored.trajectories, scored.questions, scored.rewards, scored.group_ids):
        rec = t.to_dict(tokens=False)
        rec.update(id=q.id, answers=list(q.answers), prediction=t.answer, reward=r.to_dict(),
                   format_ok=r.format_ok, format_failed=list(r.failed_rules), stage=at.stage, step=at.step, group=gid)
        out.append(rec)
    return out


def _mean(values) -> float:
    return float(np.mean(list(values)))
