"""One training step, in the paper's order: `collect → score → prepare → update → record`.

1. **collect**: the rollout worker generates `samples_per_prompt` trajectories per question with
   the current weights, searching as it goes (async mode: the batch a rollout worker process
   generated ahead, `rollout.async_worker`, by weights at most `max_staleness` versions old);
2. **score**: each trajectory gets the stage's outcome reward; its group is its question;
3. **prepare**: trajectories become padded tensors with the loss mask on policy tokens;
   reference log-probs (kl_coef > 0), old log-probs, and advantages with the group baseline;
4. **update**: the actor's clipped updates; then the worker receives (async: is published) the new weights;
5. **record**: the metrics line and the sampled trajectories.

With several processes (torchrun) each rank collects, scores and prepares whole question groups of
its own, the update's statistics are global (`Actor`), and `record` sees every rank's rollouts.

Old log-probs come from one no-grad pass of the current weights (the sampler's log-probs come
from another code path, possibly another engine; their gap is logged as `logprob_mismatch`) —
or, when the batch makes exactly one optimizer step, from that step's own forward, which runs on
the same weights (`prepare` then leaves them to the update). The sampler's log-probs are the
behaviour policy's: `algorithm.off_policy` corrects the loss for their gap, and the record's
`is_ratio_*` and `staleness_*` say how far off-policy each step was.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import asdict, astuple, dataclass

import numpy as np
import torch

from searchrl import metric_names as mn
from searchrl.data.trajectory import STOP_REASONS, Trajectory
from searchrl.data.types import Question
from searchrl.eval import behaviour
from searchrl.eval.multihop import multihop_metrics, row_of_trajectory
from searchrl.metrics import ANSWER_METRICS
from searchrl.protocols.base import Protocol
from searchrl.protocols.format_rules import FORMAT_RULES, TAG_RULES
from searchrl.rewards import RewardBreakdown, compute_reward
from searchrl.rl.actor import Actor, UpdateStats
from searchrl.rl.advantages import compute_advantages
from searchrl.rl.async_ranks import AsyncRanks
from searchrl.rl.batch import RolloutBatch, make_batch
from searchrl.rl.config import StageConfig
from searchrl.rl.health_signals import echoes, flat_share, loops, repeated_ngram_share
from searchrl.rl.losses import behaviour_log_ratio, kl_penalty, masked_sum
from searchrl.rollout.run_search import retrieval_record
from searchrl.rollout.worker import RolloutWorker
from searchrl.tools.metrics import tool_metrics

# Keys of a step record that measure time or caching, not learning (they differ between identical
# runs: a resumed run starts with an empty query cache, and each rank has its own).
TIMING_KEYS = tuple(name for name, m in mn.SCHEMA.items() if m.kind == "timing" and m.slot is None) + tuple(mn.HEALTH.key(name) for name in mn.TIMING_HEALTH)


def is_timing(key: str) -> bool:
    """Whether a step record's `key` measures time or caching (`TIMING_KEYS`, tool latencies)."""
    return mn.is_timing(key)


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

    @classmethod
    def concat(cls, parts: list[Scored]) -> Scored:
        """The rollouts of several ranks, in rank order, groups renumbered to stay distinct."""
        out, groups = cls([], [], [], []), 0
        for p in parts:
            out.questions += p.questions
            out.trajectories += p.trajectories
            out.rewards += p.rewards
            out.group_ids += [groups + g for g in p.group_ids]
            groups += max(p.group_ids, default=-1) + 1
        return out


@dataclass(frozen=True)
class Timing:
    rollout_seconds: float
    logprob_seconds: float
    update_seconds: float
    step_seconds: float


def train_step(actor: Actor, worker: RolloutWorker | AsyncRanks, stage_cfg: StageConfig, questions: list[Question],
               at: StepIndex, progress: bool = False, pool: Sequence[Question] = ()) -> tuple[dict, list[dict]]:
    """One rollout batch and its policy updates -> (metrics record, sample records); `pool`: the
    stage's questions, which refill groups without signal (`stage.refill_flat_groups`)."""
    t0 = time.perf_counter()
    version = actor.version  # of the policy this step's update starts from (the proximal one)
    scored, drawn = collect_with_signal(worker, stage_cfg, questions, at, pool, progress)
    worker.sleep()  # a colocated engine frees its memory for the update
    actor.dist.barrier()  # the rollout phase ends with the slowest rank's (its wait is not log-prob time)
    t1 = time.perf_counter()
    batch = prepare(actor, scored)
    old_from_update = batch.old_logp is None
    t2 = time.perf_counter()
    stats = actor.update(batch, at.stage_step, stage_cfg.steps, torch.Generator().manual_seed(at.seed ^ 0x5EED),
                         lr_scale=stage_cfg.lr_scale)
    worker.wake()
    worker.sync_weights(actor.model, actor.version)
    t3 = time.perf_counter()
    # Left to the update, the old log-probs exist only if an update ran.
    have_old = not old_from_update or stats.updates > 0
    parts = actor.dist.gather((scored, token_sums(batch, actor.cfg.algorithm.is_cap), Timing(t1 - t0, t2 - t1, t3 - t2, t3 - t0),
                               worker.searched(), drawn))
    everyone = Scored.concat([p[0] for p in parts])
    drawn = Drawn(*np.sum([astuple(p[4]) for p in parts], axis=0).tolist())
    sums = torch.cat([p[1] for p in parts])
    timing = Timing(*np.max([astuple(p[2]) for p in parts], axis=0).tolist())  # the slowest rank's
    has_ref = batch.ref_logp is not None
    searched = retrieval_record([p[3] for p in parts])
    line = record(at, everyone, sums, stats, have_old, has_ref, timing, tools=worker.tools,
                  protocol=worker.protocol)
    if stage_cfg.refill_flat_groups:  # flat_groups counts every group drawn, the dropped ones too
        line.update({mn.FLAT_GROUPS: drawn.flat / max(drawn.groups, 1), mn.REFILL_ROUNDS: drawn.rounds,
                     mn.FLAT_DROPPED: drawn.dropped})
    return ({**line, **staleness_record(everyone.trajectories, version), **searched, **worker.spent(), **worker.pipeline(timing.step_seconds)},
            samples(at, everyone))


def staleness_record(trajectories: Sequence[Trajectory], version: int) -> dict:
    """How many policy versions each rollout is behind the policy its update starts from
    (`version` − `Trajectory.policy_version`): mean and max over the step's rollouts. 0 and 0 in
    sync mode, where every rollout is sampled by the weights it then trains."""
    lags = [version - t.policy_version for t in trajectories]
    return {mn.STALENESS_MEAN: _mean(lags) if lags else 0.0, mn.STALENESS_MAX: max(lags, default=0)}


@dataclass(frozen=True)
class Drawn:
    """What `collect_with_signal` drew: question groups, flat ones among them, flat ones left out
    of the batch, refill rounds run."""

    groups: int
    flat: int
    dropped: int
    rounds: int


def refill_questions(pool: Sequence[Question], used: set[str], n: int, seed: int) -> list[Question]:
    """`n` questions of `pool` whose ids are not in `used`, in an order seeded by `seed` (fewer when
    the pool runs out): a refill round's questions follow from the step alone, so a resumed run
    draws them again.

    >>> qs = [Question(id=str(i), question="?", answers=["a"]) for i in range(5)]
    >>> [q.id for q in refill_questions(qs, {"0", "1"}, 2, seed=3)] == [q.id for q in refill_questions(qs, {"0", "1"}, 2, seed=3)]
    True
    >>> sorted(q.id for q in refill_questions(qs, {"0", "1"}, 9, seed=3))
    ['2', '3', '4']
    """
    free = [q for q in pool if q.id not in used]
    order = np.random.default_rng(seed).permutation(len(free))
    return [free[int(i)] for i in order[:n]]


def _with_signal(scored: Scored) -> tuple[Scored, int]:
    """The groups of `scored` whose rewards are not all equal, renumbered from 0, and how many
    groups were flat."""
    totals: dict[int, set[float]] = {}
    for r, g in zip(scored.rewards, scored.group_ids):
        totals.setdefault(g, set()).add(r.total)
    spread = sorted(g for g, values in totals.items() if len(values) > 1)
    keep, new_id = [i for i, g in enumerate(scored.group_ids) if g in spread], {g: k for k, g in enumerate(spread)}
    return (Scored([scored.questions[i] for i in keep], [scored.trajectories[i] for i in keep],
                   [scored.rewards[i] for i in keep], [new_id[scored.group_ids[i]] for i in keep]), len(totals) - len(spread))


def collect_with_signal(worker: RolloutWorker | AsyncRanks, stage_cfg: StageConfig, questions: list[Question],
                        at: StepIndex, pool: Sequence[Question], progress: bool) -> tuple[Scored, Drawn]:
    """The step's rollouts, scored. With `stage.refill_flat_groups` = R: the groups whose rewards
    are all equal are dropped and up to R rounds of other questions from `pool` refill the step
    to as many groups with signal as it drew questions; if no group has signal the first draw is
    kept (its update is skipped as any flat batch's is)."""
    n = stage_cfg.samples_per_prompt
    first = score(worker.collect(questions, n, at.seed, progress), questions, stage_cfg, worker)
    kept, flat = _with_signal(first)
    if not stage_cfg.refill_flat_groups:
        return first, Drawn(len(questions), flat, 0, 0)
    groups, used, rounds = len(questions), {q.id for q in questions}, 0
    while rounds < stage_cfg.refill_flat_groups and len(set(kept.group_ids)) < len(questions):
        seed = at.seed + 7919 * (rounds + 1)  # a round's own questions and samples, from the step alone
        extra = refill_questions(pool, used, len(questions) - len(set(kept.group_ids)), seed)
        if not extra:
            break
        rounds, groups, used = rounds + 1, groups + len(extra), used | {q.id for q in extra}
        more, more_flat = _with_signal(score(worker.collect(extra, n, seed, progress), extra, stage_cfg, worker))
        kept, flat = Scored.concat([kept, more]), flat + more_flat
    if not kept.trajectories:
        return first, Drawn(groups, flat, 0, rounds)
    return kept, Drawn(groups, flat, flat, rounds)


def score(trajectories: list[Trajectory], questions: list[Question], stage_cfg: StageConfig, worker: RolloutWorker) -> Scored:
    """The stage's outcome reward of every rollout; the group is the question's samples."""
    n, protocol = stage_cfg.samples_per_prompt, worker.protocol
    per_rollout = [q for q in questions for _ in range(n)]
    rewards = [
        compute_reward(t, q.answers, stage_cfg.reward, protocol)
        for t, q in zip(trajectories, per_rollout)
    ]
    return Scored(per_rollout, trajectories, rewards, [i // n for i in range(len(trajectories))])


def prepare(actor: Actor, scored: Scored) -> RolloutBatch:
    """Tensors, reference and old log-probs, advantages (see the module docstring for when the
    old log-probs are left to the update)."""
    alg = actor.cfg.algorithm
    batch = make_batch(scored.trajectories, [r.total for r in scored.rewards], scored.group_ids, actor.pad_id, actor.device)
    kl_in_reward = alg.kl_kind == "k1-reward" and actor.reference is not None
    one_update = alg.ppo_epochs == 1 and actor.mini_batches(len(batch)) == 1
    batch.ref_logp = actor.reference_logprobs(batch)
    if not one_update or kl_in_reward:  # the k1 reward needs the old log-probs before the update
        batch.old_logp, batch.entropy = actor.logprobs(batch)
    kl_tokens = kl_penalty(batch.old_logp, batch.ref_logp, "k1") if kl_in_reward else None
    batch.advantages = compute_advantages(
        alg.advantage, batch.rewards, batch.group_ids, batch.mask, kl=kl_tokens, kl_coef=alg.kl_coef if kl_in_reward else 0.0,
        moments=actor.dist.moments,
    )
    return batch


# Per-rollout sums over policy tokens that the step's record needs, columns of `token_sums`
# (is_ratio_max: the rollout's largest ratio, 0 without a policy token).
_SUMS = ("policy_tokens", "response_tokens", "kl", "entropy", "mismatch", "is_ratio", "is_clipped", "is_ratio_max")


def token_sums(batch: RolloutBatch, is_cap: float) -> torch.Tensor:  # -> [B, len(_SUMS)] float64, CPU
    """What `record` reads from the batch tensors, summed per rollout, so that the means over
    every rank's tokens are sums of these (gathered) divided by the policy tokens. Columns whose
    log-probs were never computed are 0 (`record` then writes None). The importance ratio
    π_old / π_sampler is measured whatever `algorithm.off_policy` is; `is_clipped` counts tokens
    whose ratio is over `is_cap` (truncated by tis, left out by decoupled)."""
    mask, zero = batch.mask, torch.zeros(len(batch))
    have_old = batch.old_logp is not None
    kl = masked_sum(kl_penalty(batch.old_logp, batch.ref_logp, "k3"), mask, -1) if have_old and batch.ref_logp is not None else zero
    if have_old:  # in float64: a ratio far over the cap must not overflow to inf
        log_ratio = behaviour_log_ratio(batch.old_logp.double(), batch.behaviour_logp.double(), mask)
        ratio = torch.where(mask.bool(), torch.exp(log_ratio), 0.0)  # [B, T]
        is_cols = [ratio.sum(-1), masked_sum((ratio > is_cap).double(), mask, -1), ratio.amax(-1)]
    else:
        is_cols = [zero, zero, zero]
    cols = [
        mask.sum(dim=-1), batch.response_lengths(), kl,
        masked_sum(batch.entropy, mask, -1) if have_old else zero,
        masked_sum((batch.behaviour_logp - batch.old_logp).abs(), mask, -1) if have_old else zero,
        *is_cols,
    ]
    return torch.stack([c.detach().double().cpu() for c in cols], dim=1)


def record(at: StepIndex, scored: Scored, sums: torch.Tensor, stats: UpdateStats, have_old: bool, has_ref: bool,
           timing: Timing, tools: Sequence[str], protocol: Protocol) -> dict:
    """The step's line of metrics.jsonl from every rollout of the step (`sums`: their
    `token_sums`); `have_old`: the old log-probs were computed; `has_ref`: a reference ran;
    `tools`: the run's (each gets its `tools/<name>/...` metrics); `protocol`: the rollouts' (it
    reads their reasoning)."""
    trajs, rewards = scored.trajectories, scored.rewards
    thinking = [protocol.think_text(t) for t in trajs]
    f1 = ANSWER_METRICS.get("f1")
    col = dict(zip(_SUMS, sums.unbind(dim=1)))
    tokens = float(col["policy_tokens"].sum())

    def per_token(name: str) -> float:
        return float(col[name].sum()) / max(tokens, 1.0)

    out = {
        mn.STAGE: at.stage,
        mn.STEP: at.step,
        mn.STAGE_STEP: at.stage_step + 1,
        mn.REWARD: _mean(r.total for r in rewards),
        mn.REWARD_RETRIEVE: _mean(r.retrieve for r in rewards),
        mn.REWARD_FORMAT: _mean(r.format for r in rewards),
        mn.REWARD_ANSWER: _mean(r.answer for r in rewards),
        mn.REWARD_STD: float(np.std([r.total for r in rewards])),
        mn.SEARCH_RATE: _mean(t.n_searches >= 1 for t in trajs),
        mn.SEARCHES: _mean(t.n_searches for t in trajs),
        mn.TRUNCATED_DOCUMENTS: _mean(t.truncated_documents for t in trajs),  # blocks cut to fit the context, per rollout
        mn.FORMAT_OK: _mean(r.format_ok for r in rewards),
        mn.MALFORMED_TAGS: _mean(any(rule in r.failed_rules for rule in TAG_RULES) for r in rewards),
        mn.ANSWER_F1: _mean(f1(t.answer, q.answers) for t, q in zip(trajs, scored.questions)),
        mn.ANSWER_RATE: _mean(t.answer is not None for t in trajs),
        mn.ECHO_RATE: _mean_known(echoes(t.answer, q.question, q.answers, q.type) for t, q in zip(trajs, scored.questions)),
        mn.FLAT_GROUPS: flat_share([r.total for r in rewards], scored.group_ids),
        mn.THINK_REPEAT_RATE: _mean_known(repeated_ngram_share(x) for x in thinking),
        mn.THINK_LOOP_RATE: _mean_known(loops(x) for x in thinking),
        mn.RESPONSE_TOKENS: float(col["policy_tokens"].mean()),
        mn.ENV_TOKENS: float((col["response_tokens"] - col["policy_tokens"]).mean()),
        mn.KL: per_token("kl") if have_old and has_ref else None,
        mn.ENTROPY: per_token("entropy") if have_old else None,
        mn.LOGPROB_MISMATCH: per_token("mismatch") if have_old else None,
        mn.IS_RATIO_MEAN: per_token("is_ratio") if have_old else None,
        mn.IS_RATIO_MAX: float(col["is_ratio_max"].max()) if have_old and tokens else None,
        mn.IS_CLIP_FRAC: per_token("is_clipped") if have_old else None,
        **asdict(stats),
        mn.ROLLOUTS: len(trajs),
        mn.TOKENS_PER_S: tokens / max(timing.rollout_seconds, 1e-9),
        **asdict(timing),
        **tool_metrics([t.tool_calls for t in trajs], [t.timing for t in trajs], tools),
        **multihop_metrics([row_of_trajectory(t, q) for t, q in zip(trajs, scored.questions)]),  # per question type
        **behaviour.behaviour_metrics([behaviour.of_trajectory(t, q.answers) for t, q in zip(trajs, scored.questions)]),
    }
    for name in dict.fromkeys(n for r in rewards for n in r.terms):  # the stage's terms, weighted
        out[mn.REWARD_TERM.key(name)] = _mean(r.terms[name] for r in rewards)
    for reason in STOP_REASONS:
        out[mn.STOP.key(reason)] = _mean(t.stop_reason == reason for t in trajs)
    for rule in FORMAT_RULES:  # which rule holds format_ok down
        out[mn.FORMAT_FAILED.key(rule)] = _mean(rule in r.failed_rules for r in rewards)
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


def _mean_known(values) -> float | None:
    """The mean of the values that are not None (None when all are)."""
    known = [v for v in values if v is not None]
    return _mean(known) if known else None
