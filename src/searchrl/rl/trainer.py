"""The two-stage outcome-based RL trainer (R1-Searcher, SPEC §4-5).

One training step, in the paper's order (`train_step`):

1. sample questions (seeded order; the position in it is all the data state),
2. roll out `samples_per_prompt` trajectories per question with the current policy, searching
   as it goes (the engine and the optimizer share ONE model object),
3. score each trajectory with the stage's outcome reward,
4. pad into [B, P + T] tensors; the loss mask covers policy tokens only,
5. recompute old log-probs with the current policy in one no-grad pass (the sampler's
   log-probs come from a different code path; their gap is logged as `logprob_mismatch`) --
   or, when the batch makes exactly one optimizer step, take them from that step's own
   forward, which runs on the same weights -- and reference log-probs when kl_coef > 0,
6. advantages with the group = the question's samples,
7. `ppo_epochs` passes of clipped updates in mini-batches, micro-batched with gradient
   accumulation, AdamW, gradient clipping, LR schedule,
8. metrics, sampled trajectories, checkpoint.

Stage 2 continues from Stage 1's weights in the same process (or, resumed, from the Stage-1
checkpoint) with a fresh optimizer, its own data and reward, as the authors launch it.
"""

from __future__ import annotations

import json
import math
import shutil
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import numpy as np
import torch

from searchrl.config import dump_config
from searchrl.data.trajectory import STOP_REASONS
from searchrl.data.types import Question
from searchrl.errors import SearchRLError
from searchrl.metrics import ANSWER_METRICS
from searchrl.protocol import Protocol
from searchrl.rewards import FORMAT_RULES, compute_reward
from searchrl.rl import checkpoint as ckpt
from searchrl.rl.advantages import compute_advantages
from searchrl.rl.batch import RolloutBatch, group_chunks, group_order, make_batch
from searchrl.rl.config import TrainConfig
from searchrl.rl.logprobs import batched_logprobs, micro_logprobs
from searchrl.rl.losses import kl_loss, kl_penalty, masked_mean, policy_loss
from searchrl.rl.policy import autocast, load_policy, make_reference, set_update_mode
from searchrl.rl.sampler import PromptSampler
from searchrl.runlog import RunLogger, truncate_metrics

# Keys of a step record that measure time, not learning (they differ between identical runs).
TIMING_KEYS = ("step_seconds", "rollout_seconds", "logprob_seconds", "update_seconds", "tokens_per_s")


@dataclass
class Learner:
    """What a step needs: the shared policy, its optimizer, the rollout engine, the reference."""

    cfg: TrainConfig
    stage: int
    model: object
    tokenizer: object
    engine: object
    protocol: Protocol
    optimizer: torch.optim.Optimizer
    reference: object | None  # frozen model, "adapter-off" (LoRA), or None when kl_coef == 0
    updates_per_step: int

    def lr_factor(self, update: int) -> float:
        """LR multiplier at optimizer update `update` of the stage (warm-up, then the schedule)."""
        alg, steps = self.cfg.algorithm, self.cfg.stage(self.stage).steps
        warm, total = alg.warmup_steps * self.updates_per_step, max(steps * self.updates_per_step, 1)
        if update < warm:
            return (update + 1) / warm
        progress = min((update - warm) / max(total - warm, 1), 1.0)
        if alg.lr_schedule == "cosine":
            return alg.min_lr_ratio + (1 - alg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))
        if alg.lr_schedule == "linear":
            return 1.0 - (1 - alg.min_lr_ratio) * progress
        return 1.0


def stage_questions(stage_cfg) -> list[Question]:
    """The stage's training questions: its dataset, narrowed to `question_types` when set."""
    from searchrl.data.catalog import load_dataset

    questions = load_dataset(stage_cfg.dataset)
    if stage_cfg.question_types is None:
        return questions
    wanted = set(stage_cfg.question_types)
    kept = [q for q in questions if q.type in wanted]
    if not kept:
        found = sorted({q.type for q in questions if q.type})
        raise SearchRLError(
            f"no question of {stage_cfg.dataset} has a type in question_types={sorted(wanted)}; its types are {found}"
        )
    return kept


def step_seed(seed: int, stage: int, step: int) -> int:
    """Sampling seed of one step: fixed by (seed, stage, step), so a resumed run samples the same."""
    return int(np.random.SeedSequence([seed, stage, step]).generate_state(1)[0])


def train_step(learner: Learner, questions: list[Question], step: int, stage_step: int) -> tuple[dict, list[dict]]:
    """One rollout batch and its policy updates -> (metrics record, sample records)."""
    cfg, alg, stage_cfg = learner.cfg, learner.cfg.algorithm, learner.cfg.stage(learner.stage)
    model, n = learner.model, stage_cfg.samples_per_prompt
    t_start = time.perf_counter()

    # --- 1. rollouts: the current policy reasons and searches -----------------------------
    model.eval()
    learner.engine.cfg = cfg.rollout.model_copy(update={"seed": step_seed(cfg.seed, learner.stage, step), "samples_per_question": n})
    with autocast(cfg):
        trajs = learner.engine.run(questions, n=n, progress=cfg.logging.progress)
    t_rollout = time.perf_counter()

    # --- 2. outcome rewards, one per rollout ---------------------------------------------------
    golds = [q.answers for q in questions for _ in range(n)]
    rewards = [
        compute_reward(t, g, stage_cfg.reward, learner.protocol.tags, think_opened_in_prompt=learner.protocol.think_opened_in_prompt)
        for t, g in zip(trajs, golds)
    ]
    group_ids = [i // n for i in range(len(trajs))]  # the group is the question's n samples

    # --- 3. tensors: prompt + response, loss mask on policy tokens ----------------------------
    pad_id = learner.tokenizer.pad_token_id if learner.tokenizer.pad_token_id is not None else 0
    device = next(model.parameters()).device
    batch = make_batch(trajs, [r.total for r in rewards], group_ids, pad_id, device)
    mask = batch.mask  # [B, T]

    # --- 4. reference log-probs; old log-probs from the weights the update starts from ---------
    # With exactly one optimizer step per batch the update's own forward runs on those same
    # weights, so its detached log-probs ARE the old ones: the separate pass would compute the
    # same numbers and is skipped, unless the advantage needs them first (k1 KL in the reward).
    temp, b = cfg.rollout.temperature, len(batch)
    mini = alg.mini_batch_size or b
    kl_in_reward = alg.kl_kind == "k1-reward" and learner.reference is not None
    old_from_update = alg.ppo_epochs == 1 and mini >= b and not kl_in_reward
    with autocast(cfg):
        if learner.reference is not None:
            batch.ref_logp = _reference_logprobs(learner, batch, temp)
        if old_from_update:
            batch.old_logp, entropy = torch.zeros_like(batch.sample_logp), torch.zeros_like(batch.sample_logp)
        else:
            batch.old_logp, entropy = batched_logprobs(model, batch, alg.micro_batch_size, temp, with_entropy=True)
    t_logprob = time.perf_counter()

    # --- 5. advantages (group baseline; k1 KL as a per-token reward when configured) ----------
    kl_tokens = kl_penalty(batch.old_logp, batch.ref_logp, "k1") if kl_in_reward else None
    batch.advantages = compute_advantages(
        alg.advantage, batch.rewards, group_ids, mask, kl=kl_tokens, kl_coef=alg.kl_coef if kl_in_reward else 0.0
    )

    # --- 6. clipped policy updates -------------------------------------------------------------
    g = torch.Generator().manual_seed(step_seed(cfg.seed, learner.stage, step) ^ 0x5EED)
    has_signal = bool(batch.advantages.abs().sum() > 0) or alg.entropy_coef > 0 or (alg.kl_kind == "k3-loss" and batch.ref_logp is not None)
    sums = {"pg_loss": 0.0, "clip_frac": 0.0, "approx_kl": 0.0, "ratio_mean": 0.0, "kl_loss": 0.0}
    n_tok, grad_norms, n_updates = 0, [], 0
    params = [p for p in model.parameters() if p.requires_grad]
    # Checkpointed layers drop a passed-in cache, so the shared-prompt pass needs it off.
    share_prompt = not alg.gradient_checkpointing
    for epoch in range(alg.ppo_epochs):
        order = group_order(group_ids, batch.response_lengths(), g).to(device)
        for u, start in enumerate(range(0, b, mini)):
            mb_idx = order[start : start + mini]
            units = _loss_units(mask[mb_idx], alg.loss_agg)
            update = stage_step * learner.updates_per_step + epoch * math.ceil(b / mini) + u
            for group in learner.optimizer.param_groups:
                group["lr"] = alg.lr * learner.lr_factor(update)
            if not has_signal or units == 0:
                continue  # nothing to learn from: no policy token, or every advantage is 0
            learner.optimizer.zero_grad(set_to_none=True)
            set_update_mode(model, alg.gradient_checkpointing)
            for idx in group_chunks(mb_idx, group_ids, alg.micro_batch_size):
                if not bool(mask[idx].any()):
                    continue
                mb = batch.rows(idx)
                with autocast(cfg):  # the backward follows the dtypes autocast chose
                    logp, ent = micro_logprobs(model, mb, temp, True, share_prompt, entropy_grad=alg.entropy_coef > 0)
                if old_from_update:
                    mb.old_logp = logp.detach()
                    batch.old_logp[idx, : logp.shape[1]] = mb.old_logp
                    entropy[idx, : ent.shape[1]] = ent.detach()
                pg_loss, stats = policy_loss(logp, mb.old_logp, mb.advantages, mb.mask, alg.clip_eps, alg.clip_eps_high, alg.loss_agg)
                loss = pg_loss
                if alg.kl_kind == "k3-loss" and mb.ref_logp is not None:
                    kl_term = kl_loss(logp, mb.ref_logp, mb.mask, "k3", alg.loss_agg)
                    loss = loss + alg.kl_coef * kl_term
                    sums["kl_loss"] += float(kl_term.detach()) * int(mb.mask.sum())
                if alg.entropy_coef > 0:
                    loss = loss - alg.entropy_coef * masked_mean(ent, mb.mask)
                # Each micro-batch's mean, weighted by its share of the mini-batch's units, sums
                # to the mini-batch mean: micro-batching never changes the gradient.
                (loss * (_loss_units(mb.mask, alg.loss_agg) / units)).backward()
                tokens = int(mb.mask.sum())
                n_tok += tokens
                sums["pg_loss"] += float(pg_loss.detach()) * tokens
                for key in ("clip_frac", "approx_kl", "ratio_mean"):
                    sums[key] += float(stats[key]) * tokens
            norm = torch.nn.utils.clip_grad_norm_(params, alg.max_grad_norm or float("inf"))
            grad_norms.append(float(norm))
            learner.optimizer.step()
            n_updates += 1
    model.eval()
    t_end = time.perf_counter()

    # --- 7. metrics ------------------------------------------------------------------------------
    have_old = not old_from_update or n_updates > 0  # else no forward pass ran on this batch
    f1 = ANSWER_METRICS.get("f1")
    predictions = [t.answer for t in trajs]
    policy_tokens = mask.sum(dim=-1).float()  # [B]
    n_policy = int(mask.sum())
    record = {
        "stage": learner.stage,
        "step": step,
        "stage_step": stage_step + 1,
        "reward": float(batch.rewards.mean()),
        "reward_retrieve": float(np.mean([r.retrieve for r in rewards])),
        "reward_format": float(np.mean([r.format for r in rewards])),
        "reward_answer": float(np.mean([r.answer for r in rewards])),
        "reward_std": float(batch.rewards.std(unbiased=False)),
        "search_rate": float(np.mean([t.n_searches >= 1 for t in trajs])),
        "searches": float(np.mean([t.n_searches for t in trajs])),
        "format_ok": float(np.mean([r.format_ok for r in rewards])),
        "answer_f1": float(np.mean([f1(p, gold) for p, gold in zip(predictions, golds)])),
        "answer_rate": float(np.mean([p is not None for p in predictions])),
        "response_tokens": float(policy_tokens.mean()),
        "env_tokens": float((batch.response_lengths().float() - policy_tokens).mean()),
        "kl": float(masked_mean(kl_penalty(batch.old_logp, batch.ref_logp, "k3"), mask)) if have_old and batch.ref_logp is not None else None,
        "entropy": float(masked_mean(entropy, mask)) if have_old else None,
        "logprob_mismatch": float(masked_mean((batch.sample_logp - batch.old_logp).abs(), mask)) if have_old else None,
        "pg_loss": sums["pg_loss"] / n_tok if n_tok else 0.0,
        "kl_loss": sums["kl_loss"] / n_tok if n_tok else 0.0,
        "clip_frac": sums["clip_frac"] / n_tok if n_tok else 0.0,
        "approx_kl": sums["approx_kl"] / n_tok if n_tok else 0.0,
        "ratio_mean": sums["ratio_mean"] / n_tok if n_tok else 1.0,
        "grad_norm": float(np.mean(grad_norms)) if grad_norms else 0.0,
        "updates": n_updates,
        "lr": learner.optimizer.param_groups[0]["lr"],
        "rollouts": b,
        "tokens_per_s": n_policy / max(t_rollout - t_start, 1e-9),
        "rollout_seconds": t_rollout - t_start,
        "logprob_seconds": t_logprob - t_rollout,
        "update_seconds": t_end - t_logprob,
        "step_seconds": t_end - t_start,
    }
    for reason in STOP_REASONS:
        record[f"stop_{reason}"] = float(np.mean([t.stop_reason == reason for t in trajs]))
    for rule in FORMAT_RULES:  # which rule holds format_ok down
        record[f"format_failed_{rule}"] = float(np.mean([rule in r.failed_rules for r in rewards]))
    samples = []
    for t, q, r, gid in zip(trajs, [q for q in questions for _ in range(n)], rewards, group_ids):
        rec = t.to_dict(tokens=False)
        rec.update(id=q.id, answers=list(q.answers), prediction=t.answer, reward=r.to_dict(),
                   format_ok=r.format_ok, format_failed=list(r.failed_rules), stage=learner.stage, step=step, group=gid)
        samples.append(rec)
    return record, samples


def _loss_units(mask: torch.Tensor, agg: str) -> int:
    """What the aggregation averages over: policy tokens (token-mean) or rollouts with one."""
    return int(mask.sum()) if agg == "token-mean" else int(mask.any(dim=-1).sum())


def _reference_logprobs(learner: Learner, batch: RolloutBatch, temp: float) -> torch.Tensor:
    if learner.reference == "adapter-off":  # LoRA: the base model is the reference
        with learner.model.disable_adapter():
            return batched_logprobs(learner.model, batch, learner.cfg.algorithm.micro_batch_size, temp)[0]
    return batched_logprobs(learner.reference, batch, learner.cfg.algorithm.micro_batch_size, temp)[0]


# ------------------------------------------------------------------------------------------------
# The run: stages, resume, checkpoints


def _stage_plan(cfg: TrainConfig, stages: list[int] | None) -> list[int]:
    wanted = stages or [1, 2]
    for s in wanted:
        if s not in (1, 2):
            raise SearchRLError(f"there is no stage {s}; stages are 1 and 2")
    plan = [s for s in (1, 2) if s in wanted and cfg.stage(s).enabled and cfg.stage(s).steps > 0]
    if not plan:
        raise SearchRLError("nothing to train: every selected stage is disabled or has steps: 0")
    return plan


def _open_run(cfg: TrainConfig, resume: Path | None) -> tuple[Path, dict | None, Path | None]:
    """(run dir, trainer state to resume from or None, its checkpoint folder)."""
    if resume is None:
        run_dir = Path(cfg.out or f"runs/train-{datetime.now():%Y%m%d-%H%M%S}")
        if (run_dir / "metrics.jsonl").exists() or (run_dir / "checkpoints").exists():
            raise SearchRLError(f"{run_dir} already holds a run; continue it with --resume {run_dir} or choose another --out")
        run_dir.mkdir(parents=True, exist_ok=True)
        return run_dir, None, None
    run_dir = Path(resume)
    if not run_dir.is_dir():
        raise SearchRLError(f"cannot resume: {run_dir} is not a run directory")
    ckpt.clean_temp(run_dir)
    folder = ckpt.latest_checkpoint(run_dir)
    if folder is None:
        raise SearchRLError(f"cannot resume {run_dir}: it has no complete checkpoint (checkpoints/step_XXXX with {ckpt.STATE_FILE})")
    state = ckpt.load_state(folder)
    truncate_metrics(run_dir, state["metrics_lines"])
    for f in (run_dir / "samples").glob("step_*.jsonl") if (run_dir / "samples").is_dir() else []:
        if int(f.stem.split("_")[1]) > state["step"]:
            f.unlink()
    return run_dir, state, folder


def train(cfg: TrainConfig, resume: Path | None = None, stages: list[int] | None = None) -> Path:
    """Run (or resume) the stages of `cfg`; returns the run directory.

    `stages`: which of [1, 2] to run (default both; disabled or zero-step stages are skipped).
    `resume`: a run directory; training continues after its newest complete checkpoint with the
    saved optimizer, RNG and data position, so the finished run equals an uninterrupted one.
    """
    from searchrl.retrieval import open_retriever
    from searchrl.rollout.engine import RolloutEngine
    from searchrl.rollout.hf_backend import HFBackend

    run_dir, state, state_dir = _open_run(cfg, resume)
    plan = state["plan"] if state is not None and stages is None else _stage_plan(cfg, stages)
    cfg = cfg.model_copy(update={"out": str(run_dir)})
    dump_config(cfg, run_dir / "config.yaml")
    torch.manual_seed(cfg.seed)
    offsets = {s: sum(cfg.stage(x).steps for x in plan[: plan.index(s)]) for s in plan}

    # Where each stage starts: the configured model, or the checkpoint that ended the previous stage.
    stage_ends: dict[int, str] = dict(state["stage_ends"]) if state else {}
    first = 0
    if state is not None:
        first = plan.index(state["stage"]) + (state["stage_step"] >= cfg.stage(state["stage"]).steps)
        if first >= len(plan):
            print(f"{run_dir}: every stage is already complete", flush=True)
            return run_dir
    model, tokenizer = load_policy(cfg, state_dir, lora_resume=bool(state and state.get("lora")))
    if state is not None:
        ckpt.set_rng_state(state["rng"])
    retriever = open_retriever(cfg.retrieval.url or cfg.retrieval.index, cfg.retrieval.api)
    protocol = Protocol.from_config(cfg.protocol)
    engine = RolloutEngine(HFBackend(model, tokenizer), retriever, protocol, cfg.rollout)
    logger = RunLogger(run_dir, cfg.logging.tensorboard, purge_step=state["step"] + 1 if state else None, echo=cfg.logging.progress)
    metrics_lines = state["metrics_lines"] if state else 0
    try:
        for stage in plan[first:]:
            stage_cfg = cfg.stage(stage)
            resuming = state is not None and state["stage"] == stage
            start_step = state["stage_step"] if resuming else 0
            sampler = PromptSampler(stage_questions(stage_cfg), cfg.seed, stage, state["data_position"] if resuming else 0)
            b = stage_cfg.prompts_per_step * stage_cfg.samples_per_prompt
            alg = cfg.algorithm
            optimizer = torch.optim.AdamW(
                [p for p in model.parameters() if p.requires_grad], lr=alg.lr, betas=alg.betas, weight_decay=alg.weight_decay
            )
            if resuming:
                optimizer.load_state_dict(state["optimizer"])
            prev = plan[plan.index(stage) - 1] if plan.index(stage) > 0 else None
            ref_source = run_dir / "checkpoints" / stage_ends[prev] if prev is not None else None
            reference = make_reference(cfg, ref_source)
            learner = Learner(cfg, stage, model, tokenizer, engine, protocol, optimizer, reference,
                              alg.ppo_epochs * math.ceil(b / (alg.mini_batch_size or b)))
            for k in range(start_step, stage_cfg.steps):
                step = offsets[stage] + k + 1
                record, samples = train_step(learner, sampler.take(stage_cfg.prompts_per_step), step, k)
                logger.log(record)
                metrics_lines += 1
                _write_samples(run_dir, step, samples, cfg)
                if cfg.debug_crash_after_step == step:  # dies as a kill would: logged, not saved
                    raise RuntimeError(f"debug_crash_after_step={step}: simulated crash")
                last = k + 1 == stage_cfg.steps
                every = cfg.logging.checkpoint_every
                if last or (every and (k + 1) % every == 0):
                    if last:
                        stage_ends[stage] = ckpt.checkpoint_name(step)
                    state_out = {
                        "plan": plan, "stage": stage, "stage_step": k + 1, "step": step,
                        "data_position": sampler.position, "optimizer": optimizer.state_dict(),
                        "scheduler": {"updates_done": (k + 1) * learner.updates_per_step},
                        "rng": ckpt.rng_state(), "metrics_lines": metrics_lines, "stage_ends": stage_ends,
                        "lora": alg.lora.enabled,
                    }
                    ckpt.save_checkpoint(run_dir, step, model, tokenizer, state_out)
                    ckpt.prune(run_dir, cfg.logging.keep_last, protected=set(stage_ends.values()))
            del reference, learner, optimizer
    finally:
        logger.close()
    return run_dir


def _write_samples(run_dir: Path, step: int, samples: list[dict], cfg: TrainConfig) -> None:
    every = cfg.logging.sample_every
    if not every or step % every:
        return
    folder = run_dir / "samples"
    folder.mkdir(exist_ok=True)
    keep = samples[: cfg.logging.samples_per_dump] if cfg.logging.samples_per_dump else samples
    tmp = folder / f".step_{step:04d}.jsonl.tmp"
    with tmp.open("w", encoding="utf-8") as fh:
        for rec in keep:
            fh.write(json.dumps(rec, ensure_ascii=False) + "\n")
    shutil.move(tmp, folder / f"step_{step:04d}.jsonl")


def train_command(config: str | None, overrides: list[str], stage: int | None, resume: str | None, out: str | None) -> Path:
    """`searchrl train`: a config file (or a run's own config.yaml when resuming) plus overrides."""
    from searchrl.config import load_config

    if resume is not None:
        run = Path(resume)
        config = config or str(run / "config.yaml")
    elif config is None:
        raise SearchRLError("give --config FILE (e.g. configs/demo-cpu.yaml) or --resume RUN_DIR")
    pairs = list(overrides) + ([f"out={json.dumps(out)}"] if out else [])
    cfg = load_config(TrainConfig, config, pairs)
    run_dir = train(cfg, Path(resume) if resume else None, [stage] if stage else None)
    print(f"run directory: {run_dir}  (plot it: searchrl plot {run_dir})", flush=True)
    return run_dir
