"""`searchrl train` for the multi-process tests, run as `python tests/dist_driver.py ARGS` or under
`torchrun`, with two changes that make 1 and N processes comparable rollout for rollout:

- every question is generated on its own, seeded by the step and the question's id, so its
  samples do not depend on which rank (or which batch) generates it;
- a random model never searches or answers, so every reward would be flat: a deterministic
  function of the sampled tokens is added, as in tests/unit/test_trainer.py.

Each rank writes the advantages of every step to `$DUMP_DIR/advantages_rank<R>.pt`.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import zlib
from pathlib import Path

import torch

from searchrl.cli import main
from searchrl.rl import step, trainer
from searchrl.rollout import worker as rollout_worker

real_reward, real_collect, real_seed, real_advantages = (
    step.compute_reward, rollout_worker.RolloutWorker.collect, trainer.step_seed, step.compute_advantages
)
advantages: list[torch.Tensor] = []


def reward(traj, golds, cfg, tags, **kw):
    r = real_reward(traj, golds, cfg, tags, **kw)
    return dataclasses.replace(r, total=r.total + (sum(traj.token_ids) % 7) / 7)


def collect(self, questions, n, seed, progress=False, **kw):  # kw: the async worker's between_rounds
    return [t for q in questions for t in real_collect(self, [q], n, seed ^ zlib.crc32(q.id.encode()), progress, **kw)]


def compute_advantages(*args, **kwargs):
    adv = real_advantages(*args, **kwargs)
    advantages.append(adv.detach().cpu())
    torch.save(advantages, Path(os.environ["DUMP_DIR"]) / f"advantages_rank{os.environ.get('RANK', '0')}.pt")
    return adv


step.compute_reward = reward
step.compute_advantages = compute_advantages
rollout_worker.RolloutWorker.collect = collect
trainer.step_seed = lambda seed, stage, step_, rank=0, rollbacks=0: real_seed(seed, stage, step_, 0, rollbacks)  # the same on every rank

if __name__ == "__main__":
    sys.argv[0] = "searchrl"
    main()
