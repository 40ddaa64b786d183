"""The off-policy bookkeeping around the loss (the math is in test_losses.py): behaviour log-probs
in the batch, policy versions on trajectories, the step's IS-ratio and staleness metrics, and an
update with `algorithm.off_policy` on the tiny-random model."""

from __future__ import annotations

import contextlib
import math
from types import SimpleNamespace

import pytest
import torch
from test_trainer import _actor, _fixed, _overrides, _step, _traj

from searchrl import metric_names as mn
from searchrl.config import load_config
from searchrl.data.trajectory import Segment, Trajectory
from searchrl.data.types import Question
from searchrl.errors import SearchRLError
from searchrl.retrieval.querycache import RetrievalCounts
from searchrl.rl import step
from searchrl.rl.batch import make_batch
from searchrl.rl.config import TrainConfig
from searchrl.rollout.config import RolloutConfig
from searchrl.rollout.worker import RolloutWorker

# Rollouts of 8 response tokens; tokens 2-4 of each were inserted by the environment.
ENV_MASK = [1, 1, 0, 0, 0, 1, 1, 1]
# The sampler's log-probs: −50 at two policy tokens (π_old / μ far over any cap), 0 (μ = 1, so
# π_old / μ = π_old < 1) at the other three, and a value at the inserted tokens that must not count.
BEHAVIOUR = [-50.0, 0.0, -7.0, -7.0, -7.0, 0.0, -50.0, 0.0]


def test_batch_carries_the_behaviour_logprobs_masked_and_cut_with_the_rows():
    trajs = [_traj("q", [5, 6], [10, 11, 12], [1, 0, 1]), _traj("q", [5], [10], [1])]
    trajs[0].logprobs, trajs[1].logprobs = [-0.5, -9.0, -1.5], [-2.0]  # -9: an inserted token's value
    batch = make_batch(trajs, [0.0, 1.0], [0, 0], 0, "cpu")
    assert batch.behaviour_logp.tolist() == [[-0.5, 0.0, -1.5], [-2.0, 0.0, 0.0]]  # 0 wherever mask is 0
    assert batch.rows(torch.tensor([1])).behaviour_logp.tolist() == [[-2.0]]  # cut to its own length


def test_trajectories_save_their_policy_version_and_old_files_load_as_zero():
    t = Trajectory("q", "?", [1], [2, 3], [1, 1], [-0.1, -0.2], [Segment("x", "policy")], policy_version=4)
    assert t.versions() == [4, 4]  # every token by policy_version unless recorded one by one
    back = Trajectory.from_dict(t.to_dict())
    assert (back.policy_version, back.token_versions) == (4, [])
    assert t.to_dict(tokens=False)["policy_version"] == 4 and "token_versions" not in t.to_dict(tokens=False)
    mixed = Trajectory.from_dict({**t.to_dict(), "token_versions": [4, 5]})
    assert mixed.versions() == [4, 5]  # a rollout that went on with new weights
    old = t.to_dict()
    del old["policy_version"], old["token_versions"]
    assert (Trajectory.from_dict(old).policy_version, Trajectory.from_dict(old).versions()) == (0, [0, 0])


def test_rollout_worker_stamps_the_version_of_the_weights_it_last_received():
    trajs = [_traj("q", [1], [2], [1]), _traj("q", [1], [3], [1])]
    engine = SimpleNamespace(cfg=RolloutConfig(), run=lambda qs, n, progress, between_rounds: trajs,
                             backend=SimpleNamespace(sync_weights=lambda model: None), retriever=None)
    agent = SimpleNamespace(engine=engine, retriever=SimpleNamespace(usage=lambda: None, counts=lambda: RetrievalCounts()))
    worker = RolloutWorker(agent, contextlib.nullcontext, version=2)
    assert [t.policy_version for t in worker.collect([], 2, seed=0)] == [2, 2]
    worker.sync_weights(None, 3)
    assert [t.policy_version for t in worker.collect([], 2, seed=0)] == [3, 3]


def test_staleness_is_the_trainers_version_minus_the_rollouts():
    trajs = [_traj("q", [1], [2], [1]) for _ in range(3)]
    for t, v in zip(trajs, [3, 2, 3]):
        t.policy_version = v
    # the update starts from version 3: lags [0, 1, 0] -> mean 1/3, max 1
    assert step.staleness_record(trajs, 3) == {mn.STALENESS_MEAN: pytest.approx(1 / 3), mn.STALENESS_MAX: 1}


def test_unknown_correction_is_refused_at_load():
    with pytest.raises(SearchRLError, match="unknown off-policy correction 'vtrace'; choose one of: decoupled, none, tis"):
        TrainConfig(algorithm={"off_policy": "vtrace"})
    with pytest.raises(ValueError, match="is_cap"):
        TrainConfig(algorithm={"is_cap": 0.5})


def _off_policy_step(world, tmp_path, monkeypatch, kind: str):
    cfg = load_config(TrainConfig, None, _overrides(
        world, tmp_path, "algorithm.micro_batch_size=8", "algorithm.mini_batch_size=null", "algorithm.kl_coef=0",
        "stage2.samples_per_prompt=4", f"algorithm.off_policy={kind}", "algorithm.is_cap=2.0"))
    trajs = [_traj("q0", [5, 6, 7], [100 + i + j for j in range(8)], ENV_MASK) for i in range(4)]
    for t in trajs:
        t.logprobs = list(BEHAVIOUR)
    rewards = iter([0.0, 1.0, 0.5, 2.0])
    monkeypatch.setattr(step, "compute_reward", lambda *a, **k: _fixed(next(rewards)))
    actor = _actor(cfg)
    before = {k: v.detach().clone() for k, v in actor.model.state_dict().items()}
    record, _ = _step(actor, trajs, [Question("q0", "Which river?", ("R0",))])
    moved = any(not torch.equal(before[k], v) for k, v in actor.model.state_dict().items())
    return record, moved, actor


@pytest.mark.parametrize("kind", ["tis", "decoupled"])
def test_a_corrected_update_trains_a_step_on_the_tiny_model(world, tmp_path, monkeypatch, kind):
    record, moved, actor = _off_policy_step(world, tmp_path / kind, monkeypatch, kind)
    assert record[mn.UPDATES] == 1 and moved and math.isfinite(record[mn.PG_LOSS]) and record[mn.GRAD_NORM] > 0
    assert actor.version == 1  # one update applied: the next rollouts are sampled by version 1
    # 2 of the 5 policy tokens of every rollout have π_old / μ = π_old·e^50, far over the cap
    # (tis weighs them 2, decoupled leaves them out); the other 3 have π_old / μ = π_old < 1
    assert record[mn.IS_CLIP_FRAC] == pytest.approx(2 / 5) and record[mn.IS_RATIO_MAX] > 1e6
    assert record[mn.IS_RATIO_MEAN] > 2.0
    assert (record[mn.STALENESS_MEAN], record[mn.STALENESS_MAX]) == (0.0, 0)  # sync: no lag
    plain, _, _ = _off_policy_step(world, tmp_path / f"{kind}-none", monkeypatch, "none")
    # the same step, weights and advantages: only the token weights differ
    assert plain[mn.PG_LOSS] != pytest.approx(record[mn.PG_LOSS])
    assert plain[mn.IS_CLIP_FRAC] == record[mn.IS_CLIP_FRAC]  # measured whatever the correction
