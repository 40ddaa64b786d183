"""Asynchronous rollouts (`rollout.mode: async`) on the tiny-random model: with max_staleness 0 the
run equals the synchronous one; with 1 it overlaps and lags by at most one version; a rollout
worker that dies stops the run with a clear error, and `--resume` loses no update."""

from __future__ import annotations

import json
import os
import signal

import pytest
from test_trainer import _overrides, _weights, max_change

from searchrl import metric_names as mn
from searchrl.config import load_config
from searchrl.errors import SearchRLError
from searchrl.rl import trainer
from searchrl.rl.async_ranks import AHEAD_FILE
from searchrl.rl.checkpoint import latest_checkpoint
from searchrl.rl.config import TrainConfig
from searchrl.rl.integrity import CHECKSUMS
from searchrl.rollout.async_worker import AsyncRollouts
from searchrl.runlog import read_metrics

PIPELINE = (mn.BUFFER_DEPTH, mn.DROPPED_GROUPS, mn.TRAINER_IDLE_SHARE)


def _run(world, out, *extra):
    return trainer.train(load_config(TrainConfig, None, _overrides(world, out, *extra)))


def _learning(run) -> list[dict]:
    """Each step's record without what measures time or the async pipeline."""
    return [{k: v for k, v in r.items() if not mn.is_timing(k) and k not in PIPELINE} for r in read_metrics(run)]


def _assert_close(a: list[dict], b: list[dict]) -> None:
    assert len(a) == len(b) and [r.keys() for r in a] == [r.keys() for r in b]
    for ra, rb in zip(a, b):
        for k, v in ra.items():
            if isinstance(v, float):
                assert rb[k] == pytest.approx(v, abs=1e-6), k
            else:
                assert rb[k] == v, k


def test_async_with_staleness_0_equals_sync(world, tmp_path, varied_rewards):
    sync = _run(world, tmp_path / "sync")
    run = _run(world, tmp_path / "async", "rollout.mode=async", "rollout.max_staleness=0")
    _assert_close(_learning(sync), _learning(run))
    assert any(r[mn.PG_LOSS] != 0 for r in read_metrics(sync))  # the runs did learn
    final = latest_checkpoint(sync).name
    assert max_change(_weights(sync / "checkpoints" / final), _weights(run / "checkpoints" / final)) <= 1e-6
    records = read_metrics(run)
    assert all(r[mn.STALENESS_MAX] == 0 and r[mn.DROPPED_GROUPS] == 0 for r in records)
    assert all(0 <= r[mn.TRAINER_IDLE_SHARE] <= 1 for r in records)
    assert mn.BUFFER_DEPTH not in read_metrics(sync)[0]  # sync runs keep their records


def test_async_mode_refuses_what_it_cannot_run_yet():
    with pytest.raises(ValueError, match="rollout.backend=scripted is not supported there"):
        TrainConfig(rollout={"mode": "async", "backend": "scripted"})
    assert TrainConfig(rollout={"mode": "async", "backend": "vllm"}).rollout.backend == "vllm"
    with pytest.raises(ValueError, match="stage2 is an sft stage"):
        TrainConfig(rollout={"mode": "async"}, stage2={"kind": "sft", "samples_per_prompt": 1})
    with pytest.raises(ValueError, match="max_staleness"):
        TrainConfig(rollout={"mode": "async", "max_staleness": -1})


def _kill_worker_after(monkeypatch, version: int) -> None:
    """SIGKILL the rollout worker process right after policy `version` is published."""
    publish = AsyncRollouts.sync_weights

    def sync_weights(self, model, v):
        publish(self, model, v)
        if v == version:
            os.kill(self._links[0].proc.pid, signal.SIGKILL)

    monkeypatch.setattr(AsyncRollouts, "sync_weights", sync_weights)


def test_staleness_1_overlaps_and_a_killed_worker_resumes_without_losing_an_update(world, tmp_path, varied_rewards, monkeypatch):
    stale = ("rollout.mode=async", "rollout.max_staleness=1")
    full = _run(world, tmp_path / "full", *stale)
    records = read_metrics(full)
    assert [r[mn.STALENESS_MAX] for r in records] == [0, 1, 1, 0]  # each stage's first batch: its start weights
    assert all(r[mn.STALENESS_MEAN] in (0, 1) and r[mn.DROPPED_GROUPS] == 0 for r in records)

    crashed = tmp_path / "crashed"
    _kill_worker_after(monkeypatch, 2)
    with pytest.raises(SearchRLError, match=r"rollout worker process .* exited with code -9 .*--resume"):
        _run(world, crashed, *stale)
    monkeypatch.undo()
    from conftest import vary_rewards

    vary_rewards(monkeypatch)
    # step 3's batch (by version 1) may have been generated before the kill: the run stops at step 3 or 4
    assert latest_checkpoint(crashed).name in ("step_0002", "step_0003") and len(read_metrics(crashed)) < 4
    trainer.train(load_config(TrainConfig, str(crashed / "config.yaml"), []), resume=crashed)
    # the resumed run regenerates step 3's batch with the same seed and version: nothing is lost
    _assert_close(_learning(full), _learning(crashed))
    final = latest_checkpoint(full).name
    assert max_change(_weights(full / "checkpoints" / final), _weights(crashed / "checkpoints" / final)) <= 1e-6

    # Mid-stage: the checkpoint of step 1 holds version 1, but step 2's batch is version 0's. It
    # is kept in the checkpoint (and its checksums), and the resumed run trains on it.
    mid = tmp_path / "mid"
    with pytest.raises(RuntimeError, match="simulated crash"):
        _run(world, mid, *stale, "debug_crash_after_step=2")
    first = mid / "checkpoints" / "step_0001"
    assert latest_checkpoint(mid) == first and AHEAD_FILE in json.loads((first / CHECKSUMS).read_text())
    ahead = json.loads((first / AHEAD_FILE).read_text())
    assert list(ahead) == ["2"] and {t["policy_version"] for s in ahead["2"]["shares"] for t in s["trajectories"]} == {0}
    trainer.train(load_config(TrainConfig, str(mid / "config.yaml"), ["debug_crash_after_step=null"]), resume=mid)
    _assert_close(_learning(full), _learning(mid))
    assert max_change(_weights(full / "checkpoints" / final), _weights(mid / "checkpoints" / final)) <= 1e-6
