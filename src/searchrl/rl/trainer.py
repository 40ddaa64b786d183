"""The two-stage outcome-based RL run (R1-Searcher, docs/concepts/algorithms.md): stages, data order, resume,
checkpoints. A step is `searchrl.rl.step.train_step`; the policy and its optimizer are the
`Actor`, generation is the `RolloutWorker`'s.

Stage 2 continues from Stage 1's weights in the same process (or, resumed, from the Stage-1
checkpoint) with a fresh optimizer, its own data and reward, as the authors launch it.

Launched by `torchrun`, every rank runs this same loop: the step's questions are the seeded
sequence of one process, split across ranks in contiguous whole groups; the policy is sharded
with FSDP2; rank 0 alone opens the run directory, logs, and writes samples. In async mode rank 0's
rollout worker process generates every rank's share (`searchrl.rl.async_ranks`).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
from pathlib import Path

import numpy as np
import torch

from searchrl import metric_names as mn
from searchrl import runinfo
from searchrl.config import dump_config
from searchrl.errors import SearchRLError
from searchrl.profiles import announce
from searchrl.rl import checkpoint as ckpt
from searchrl.rl import disk_use, rollback, rundir
from searchrl.rl.actor import Actor
from searchrl.rl.async_ranks import AsyncRanks
from searchrl.rl.config import TrainConfig
from searchrl.rl.distributed import Dist, close_distributed, init_distributed
from searchrl.rl.health import HealthStop, HealthWatch, report
from searchrl.rl.preflight import Prepared, preflight
from searchrl.rl.sampler import PromptSampler
from searchrl.rl.sft import sft_step, write_messages
from searchrl.rl.step import StepIndex, train_step
from searchrl.rollout.async_worker import Order
from searchrl.rollout.gold import gold_trajectories
from searchrl.rollout.worker import RolloutWorker
from searchrl.runlock import RunLock
from searchrl.runlog import ROLLBACKS_FILE, RunLogger, read_events, read_metrics
from searchrl.trackers import check_installed


def step_seed(seed: int, stage: int, step: int, rank: int = 0, rollbacks: int = 0) -> int:
    """Sampling seed of one step (and rank, for ranks past 0): fixed by (seed, stage, step), so a
    resumed run samples the same; a run that rolled back samples anew."""
    extra = ([rank] if rank or rollbacks else []) + ([rollbacks] if rollbacks else [])
    return int(np.random.SeedSequence([seed, stage, step, *extra]).generate_state(1)[0])


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


def _check_world(cfg: TrainConfig, plan: list[int], d: Dist, state: ckpt.TrainerState | None, run_dir: Path) -> None:
    """Every rank rolls out at least one whole question group; a sharded run resumes on as many
    ranks and from stage ends that hold a whole-model export. Refused up front otherwise."""
    for s in plan:
        if cfg.stage(s).prompts_per_step < d.world:
            raise SearchRLError(f"stage{s}.prompts_per_step={cfg.stage(s).prompts_per_step} is fewer than the {d.world} processes; "
                                f"give each rank at least one question (or launch fewer processes)")
    if state is None:
        return
    if state.world_size != d.world:
        raise SearchRLError(f"{run_dir} was trained by {state.world_size} process(es); resume it with as many "
                            f"(torchrun --nproc_per_node {state.world_size})")
    for name in state.stage_ends.values():
        if d.sharded and not (run_dir / "checkpoints" / name / "config.json").is_file():
            raise SearchRLError(f"{name} would end a stage, but a torchrun checkpoint holds the whole model only at a stage's "
                                f"configured end; resume with that stage's steps unchanged")


def train(cfg: TrainConfig, resume: Path | None = None, stages: list[int] | None = None, trust_unverified: bool = False) -> Path:
    """Run (or resume) the stages of `cfg`; returns the run directory.

    `stages`: which of [1, 2] to run (default both; disabled or zero-step stages are skipped).
    `resume`: a run directory; training continues after its newest complete checkpoint with the
    saved optimizer, RNG and data position, so the finished run equals an uninterrupted one.
    `trust_unverified`: resume from a checkpoint whose files cannot all be checked (no checksums,
    an older searchrl's pickled state), which is otherwise refused.
    The run directory is locked (`RunLock`, by rank 0 for all) while the run trains. Under
    torchrun, one process per device (`cuda:LOCAL_RANK`, NCCL; gloo on CPU).
    """
    d, device = init_distributed(cfg.device)
    try:
        run_dir = d.broadcast(rundir.run_dir_for(cfg, resume) if d.main else None)  # a dated name, once
        cfg = cfg.model_copy(update={"out": str(run_dir), "device": device})
        with RunLock(run_dir) if d.main else contextlib.nullcontext():
            while True:
                try:
                    return _train(cfg, resume, stages, d, trust_unverified)
                except rollback.RollbackRequested:
                    resume = run_dir  # go on from the checkpoint the rollback kept
    finally:
        close_distributed(d)


def _train(cfg: TrainConfig, resume: Path | None, stages: list[int] | None, d: Dist, trust_unverified: bool) -> Path:
    run_dir, state, state_dir = d.broadcast(rundir.open_run(cfg, resume, stages, trust_unverified) if d.main else None)
    # Once the folder is this run's (open_run refuses another's): run_info.json and console.log.
    with runinfo.recorded_run(run_dir, "train", device=cfg.device, extra=runinfo.retrieval_record(cfg.retrieval), enabled=d.main):
        return _train_opened(cfg, stages, d, run_dir, state, state_dir)


def _train_opened(cfg: TrainConfig, stages: list[int] | None, d: Dist, run_dir: Path, state: ckpt.TrainerState | None,
                  state_dir: Path | None) -> Path:
    plan = state.plan if state is not None and stages is None else _stage_plan(cfg, stages)
    _check_world(cfg, plan, d, state, run_dir)
    torch.manual_seed(cfg.seed)
    offsets = {s: sum(cfg.stage(x).steps for x in plan[: plan.index(s)]) for s in plan}

    # Where each stage starts: the configured model, or the checkpoint that ended the previous stage.
    stage_ends: dict[int, str] = dict(state.stage_ends) if state else {}
    first = 0
    if state is not None:
        first = plan.index(state.stage) + (state.stage_step >= cfg.stage(state.stage).steps)
        if first >= len(plan):
            if d.main:
                print(f"{run_dir}: every stage is already complete", flush=True)
            return run_dir
    check_installed(cfg.logging.report_to)  # before any model loads
    # A torchrun checkpoint inside a stage holds shards and the tokenizer, no model folder: its
    # tokenizer and context are the configured model's.
    whole = state_dir is not None and (state_dir / "config.json").is_file()
    prepared = preflight(cfg, plan[first:], str(state_dir if whole else cfg.model))
    if d.main:
        announce(cfg)  # after the checks: a rejected config prints its error alone
        dump_config(cfg, run_dir / "config.yaml")  # after the checks: a rejected config never replaces the run's
    rollbacks = d.broadcast(len(read_events(run_dir, ROLLBACKS_FILE)) if d.main else None)
    if rollbacks:  # after dump_config: config.yaml keeps the configured rate, resume scales it again
        alg = cfg.algorithm
        cfg = cfg.model_copy(update={"algorithm": alg.model_copy(update={"lr": alg.lr * rollback.lr_scale(cfg.health, rollbacks)})})
    actor = Actor.load(cfg, state_dir, lora_resume=bool(state and state.lora), dist=d)
    if state is not None:
        ckpt.restore_rng(state_dir, state, d.rank)
        actor.version = state.step  # one update per step: the policy version goes on where it was saved
    worker = _rollout_source(cfg, actor, prepared, state_dir if state is not None else None)
    sft = [p for s in plan[first:] if cfg.stage(s).kind == "sft" for p in prepared.questions[s]]
    if sft:  # a gold trajectory over the policy-token budget stops the run now, not at its step
        gold_trajectories(worker.engine, sft)
    if d.main and sft:  # tool calls: the SFT examples as chat messages, for other trainers
        write_messages(run_dir, worker.engine, sft)
    logger = RunLogger(run_dir, cfg.logging.report_to, purge_step=state.step + 1 if state else None,
                       echo=cfg.logging.progress, config=cfg.model_dump(mode="json"),
                       stages={s: (offsets[s], cfg.stage(s).steps) for s in plan}) if d.main else None
    metrics_lines = state.metrics_lines if state else 0
    watch = HealthWatch(cfg.health, read_metrics(run_dir)) if d.main else None  # a resumed run's windows go on
    try:
        for stage in plan[first:]:
            stage_cfg = cfg.stage(stage)
            resuming = state is not None and state.stage == stage
            start_step = state.stage_step if resuming else 0
            sampler = PromptSampler(prepared.questions[stage], cfg.seed, stage, state.data_position if resuming else 0)
            prev = plan[plan.index(stage) - 1] if plan.index(stage) > 0 else None
            actor.start_stage(run_dir / "checkpoints" / stage_ends[prev] if prev is not None else None,
                              (state_dir, state) if resuming else None, stage_cfg.micro_batch_size)
            steps = _plan_steps(cfg, stage, offsets[stage], start_step, sampler, d, rollbacks, actor.version)
            worker.begin([order for *_, order in steps])  # async: the worker starts what admission allows
            for at, questions, position, _ in steps:
                step, k = at.step, at.stage_step
                progress = cfg.logging.progress and d.main
                if stage_cfg.kind == "sft":  # sft: questions are gold paths
                    record, samples = sft_step(actor, worker, stage_cfg, questions, at, progress)
                else:
                    record, samples = train_step(actor, worker, stage_cfg, questions, at, progress, pool=prepared.questions[stage])
                metrics_lines += 1
                stop = rolled = None
                if d.main:
                    values, alarms = watch.observe(record)
                    record.update({mn.HEALTH.key(name): v for name, v in values.items()})
                    logger.log(record)
                    _write_samples(run_dir, step, samples, cfg, logger)
                    report(run_dir, alarms)
                    stop, rolled = rollback.respond(run_dir, alarms, cfg.health, rollbacks)
                stop, rolled = d.broadcast((stop, rolled))  # every rank saves and ends, or rolls back, together
                if rolled:
                    print(f"health: {rolled['monitor']} fired at step {step}: rolled back to step {rolled['to_step']}, "
                          f"learning rate x{rolled['lr_scale']:g} (rollback {rolled['rollback']} of "
                          f"{cfg.health.rollback.max_rollbacks}; {run_dir}/{ROLLBACKS_FILE})", flush=True)
                    raise rollback.RollbackRequested(f"rolled back to step {rolled['to_step']}")
                if cfg.debug_crash_after_step == step:  # dies as a kill would: logged, not saved
                    raise RuntimeError(f"debug_crash_after_step={step}: simulated crash")
                last = k + 1 == stage_cfg.steps
                every = cfg.logging.checkpoint_every
                if last or stop or (every and (k + 1) % every == 0):
                    if last:
                        stage_ends[stage] = ckpt.checkpoint_name(step)
                    saved = actor.save(run_dir, step, ckpt.TrainerState(
                        plan=plan, stage=stage, stage_step=k + 1, step=step, data_position=position,
                        metrics_lines=metrics_lines, stage_ends=stage_ends, lora=cfg.algorithm.lora.enabled, world_size=d.world,
                    ), export=last, also=worker.write_ahead if isinstance(worker, AsyncRanks) else None)
                    if d.main:
                        keep = rollback.protected_for_rollback(run_dir, step, rollback.rollback_window(cfg.health))
                        ckpt.prune(run_dir, cfg.logging.keep_last, protected=set(stage_ends.values()) | keep)
                        freed = disk_use.drop_old_optimizers(run_dir) if cfg.logging.optimizer_in_latest_only else 0
                        print(disk_use.disk_line(run_dir, saved, freed), flush=True)
                if stop:
                    raise HealthStop(
                        f"health monitor {stop.monitor} stopped the run at step {step}: {stop.message} "
                        f"(value {stop.value:.3g}, threshold {stop.threshold:g}; every alarm is in {run_dir}/alarms.jsonl). "
                        f"Checkpoint {ckpt.checkpoint_name(step)} is saved: `searchrl train --resume {run_dir}` goes on "
                        f"(this alarm does not fire again until {stop.monitor} falls quiet), or set health.{stop.monitor}.action=warn"
                        + (f"; it had already rolled back {rollbacks} time(s), health.rollback.max_rollbacks" if stop.action == "rollback" else "")
                    )
            actor.end_stage()
    finally:
        worker.close()
        if logger is not None:
            logger.close()
    return run_dir


def _rollout_source(cfg: TrainConfig, actor: Actor, prepared: Prepared, checkpoint: Path | None) -> RolloutWorker | AsyncRanks:
    """Where the steps' rollouts come from: the worker in this process (sync), or a rollout
    worker process that generates ahead (async; rank 0's, for every rank), starting from the
    actor's current weights and the batches `checkpoint` (resumed from) generated ahead."""
    if cfg.rollout.mode == "async":
        return AsyncRanks(actor, prepared.protocol, checkpoint)
    return RolloutWorker.create(actor, prepared.search.retriever, prepared.protocol)


def _plan_steps(cfg: TrainConfig, stage: int, offset: int, start_step: int, sampler: PromptSampler, d: Dist,
                rollbacks: int, version: int) -> list[tuple[StepIndex, list, int, Order]]:
    """The stage's steps from `start_step` on: (index, questions, the sampler's position after
    them, the rollout order). Step i's update starts from policy `version` + i, so its batch is
    generated by max(that − max_staleness, `version`) (sync: the source ignores the version)."""
    stage_cfg, out = cfg.stage(stage), []
    for i, k in enumerate(range(start_step, stage_cfg.steps)):
        step = offset + k + 1
        at = StepIndex(stage, step, k, step_seed(cfg.seed, stage, step, d.rank, rollbacks))
        questions = d.rank_slice(sampler.take(stage_cfg.prompts_per_step))
        by = max(version + i - cfg.rollout.max_staleness, version)
        out.append((at, questions, sampler.position, Order(step, questions, stage_cfg.samples_per_prompt, at.seed, by)))
    return out


def _write_samples(run_dir: Path, step: int, samples: list[dict], cfg: TrainConfig, logger: RunLogger) -> None:
    """samples/step_XXXX.jsonl every `sample_every` steps, and the same rows as a tracker table."""
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
    logger.log_samples(step, keep)


def train_command(config: str | None, overrides: list[str], stage: int | None, resume: str | None, out: str | None,
                  trust_unverified: bool = False) -> Path:
    """`searchrl train`: a config file (or a run's own config.yaml when resuming) plus overrides."""
    from searchrl.config import flag_overrides, load_config
    from searchrl.runkind import check_kind

    if resume is not None:
        run = Path(resume)
        check_kind(run, "train", "--resume")  # before its config.yaml is read as a training config
        config = config or str(run / "config.yaml")
    elif config is None:
        raise SearchRLError("give --config FILE (e.g. configs/demo-cpu.yaml) or --resume RUN_DIR")
    given = list(overrides) + flag_overrides({"out": out}, overrides)
    runinfo.note_overrides(given)
    cfg = load_config(TrainConfig, config, given)
    run_dir = train(cfg, Path(resume) if resume else None, [stage] if stage else None, trust_unverified)
    if os.environ.get("RANK", "0") == "0":  # torchrun: rank 0 speaks for the run
        print(f"run directory: {run_dir}  (plot it: searchrl plot {run_dir})", flush=True)
    return run_dir
