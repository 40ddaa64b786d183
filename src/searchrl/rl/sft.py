"""The SFT baseline's training step (R1-Searcher Table 4: RL against supervised fine-tuning on
correct search trajectories), run by the trainer for a stage with `kind: sft` in place of
`step.train_step`: `build → prepare → update → record`.

1. **build**: the step's gold paths become trajectories exactly as the rollout engine records
   rollouts (`searchrl.rollout.gold`): same prompt ids, documents inserted by the engine's code;
2. **prepare**: one padded batch, loss mask 1 on what the agent writes, 0 on prompt, documents
   and padding;
3. **update**: the actor's update with the masked NLL (`losses.sft_loss`): the same optimizer,
   LR schedule, mini- and micro-batches as RL; the rollout worker then gets the new weights;
4. **record**: the metrics line (`sft_loss`, tokens, searches, update statistics) and samples.

A stage's examples are its questions that have a gold path, found once before training with the
run's retriever (`rollout.run_search.RunSearch.gold_examples`: the trainer searches only through
the rollout layer); the sampler draws `prompts_per_step` of them a step, in the seeded order RL uses.

With tool calls (`protocol.format: tool-calls`) the examples are chat conversations too: the run
writes them to `sft_messages.jsonl` (`write_messages`, one `{"id", "messages"}` a line, the shape
Hugging Face datasets use for tool calling), to train other trainers on the same data.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from searchrl import metric_names as mn
from searchrl.data.textio import iter_json_lines
from searchrl.rl.actor import Actor
from searchrl.rl.batch import make_batch
from searchrl.rl.config import StageConfig
from searchrl.rl.step import StepIndex
from searchrl.rollout.engine import RolloutEngine
from searchrl.rollout.gold import GoldPath, gold_messages, gold_trajectories
from searchrl.rollout.worker import RolloutWorker

MESSAGES_FILE = "sft_messages.jsonl"


def write_messages(
    run_dir: Path, engine: RolloutEngine, examples: Sequence[GoldPath]
) -> Path | None:
    """The examples' conversations in `run_dir/sft_messages.jsonl` (module docstring), with the
    results as the engine's search tool writes them; None for a protocol without chat messages
    (tags) and for a run without SFT stages. Examples the file already holds (a resumed run's
    earlier stage) are kept."""
    messages = {p.question.id: gold_messages(engine, p) for p in examples}
    if not messages or None in messages.values():
        return None
    path = run_dir / MESSAGES_FILE
    records = {rec["id"]: rec for _, rec in iter_json_lines(path)} if path.is_file() else {}
    for qid, conversation in messages.items():
        records.setdefault(qid, {"id": qid, "messages": conversation})
    tmp = path.with_name(f".{MESSAGES_FILE}.tmp")
    tmp.write_text(
        "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records.values()),
        encoding="utf-8",
    )
    os.replace(tmp, path)
    return path


def sft_step(
    actor: Actor,
    worker: RolloutWorker,
    stage_cfg: StageConfig,
    examples: list[GoldPath],
    at: StepIndex,
    progress: bool = False,
) -> tuple[dict, list[dict]]:
    """One batch of gold trajectories and its NLL updates -> (metrics record, sample records).
    `progress` is `train_step`'s (a rollout bar); building takes no time worth a bar."""
    t0 = time.perf_counter()
    trajectories = gold_trajectories(worker.engine, examples)
    # Every trajectory is its own group: rows of different prompts share micro-batches.
    batch = make_batch(
        trajectories,
        [0.0] * len(trajectories),
        list(range(len(trajectories))),
        actor.pad_id,
        actor.device,
    )
    t1 = time.perf_counter()
    stats = actor.update(
        batch,
        at.stage_step,
        stage_cfg.steps,
        torch.Generator().manual_seed(at.seed ^ 0x5EED),
        objective="sft",
        lr_scale=stage_cfg.lr_scale,
    )
    worker.sync_weights(actor.model, actor.version)
    t2 = time.perf_counter()
    parts = actor.dist.gather(
        ([(p.question, t) for p, t in zip(examples, trajectories)], (t1 - t0, t2 - t1, t2 - t0))
    )
    pairs = [pair for part in parts for pair in part[0]]
    build_s, update_s, step_s = np.max([p[1] for p in parts], axis=0).tolist()  # the slowest rank's
    trajs = [t for _, t in pairs]
    policy = [sum(t.loss_mask) for t in trajs]
    record = {
        mn.STAGE: at.stage,
        mn.STEP: at.step,
        mn.STAGE_STEP: at.stage_step + 1,
        mn.SFT_LOSS: stats.pg_loss,  # the masked NLL per policy token, as minimised (mean over optimizer steps)
        mn.SEARCHES: float(np.mean([t.n_searches for t in trajs])),
        mn.RESPONSE_TOKENS: float(np.mean(policy)),
        mn.ENV_TOKENS: float(np.mean([len(t.token_ids) - n for t, n in zip(trajs, policy)])),
        mn.GRAD_NORM: stats.grad_norm,
        mn.UPDATES: stats.updates,
        mn.LR: stats.lr,
        mn.ROLLOUTS: len(trajs),
        mn.BUILD_SECONDS: build_s,
        mn.UPDATE_SECONDS: update_s,
        mn.STEP_SECONDS: step_s,
    }
    samples = []
    for q, t in pairs:
        rec = t.to_dict(tokens=False)
        rec.update(
            id=q.id,
            answers=list(q.answers),
            prediction=t.answer,
            stage=at.stage,
            step=at.step,
            kind="sft",
        )
        samples.append(rec)
    return record, samples
