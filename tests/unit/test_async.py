"""Asynchronous rollouts (`rollout.mode: async`) on the tiny-random model: with max_staleness 0 the
run equals the synchronous one; with 1 it overlaps and lags by at most one version; a rollout
worker that dies stops the run with a clear error, and `--resume` loses no update; nor does it after
the trainer itself is killed, whose rollout worker ends with it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_trainer import _overrides, _weights, max_change

import searchrl
from searchrl import metric_names as mn
from searchrl.config import dump_config, load_config
from searchrl.errors import SearchRLError
from searchrl.rl import trainer
from searchrl.rl.async_ranks import AHEAD_FILE
from searchrl.rl.checkpoint import latest_checkpoint
from searchrl.rl.config import TrainConfig
from searchrl.rl.integrity import CHECKSUMS
from searchrl.rl.trainer import train_command
from searchrl.rollout.async_worker import AsyncRollouts
from searchrl.rollout.weights import weights_folder
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


def _assert_same_run(expected, run) -> None:
    """`run` learned as `expected` did: every step's learning metrics within 1e-6, the same final weights."""
    _assert_close(_learning(expected), _learning(run))
    final = latest_checkpoint(expected).name
    assert max_change(_weights(expected / "checkpoints" / final), _weights(run / "checkpoints" / final)) <= 1e-6


def test_async_with_staleness_0_equals_sync(world, tmp_path, varied_rewards):
    sync = _run(world, tmp_path / "sync")
    run = _run(world, tmp_path / "async", "rollout.mode=async", "rollout.max_staleness=0")
    _assert_same_run(sync, run)
    assert any(r[mn.PG_LOSS] != 0 for r in read_metrics(sync))  # the runs did learn
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
    _assert_same_run(full, crashed)

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
    _assert_same_run(full, mid)


# `searchrl train` in a process of its own, with the rewards of `vary_rewards`: once step HOLD is
# logged (its checkpoint not yet written) it writes its rollout workers' PIDs to MARK and stops
# still, for the test to SIGKILL it there.
_HELD_TRAINER = """
import multiprocessing, os, sys, time
import pytest
from conftest import vary_rewards
from searchrl.cli import main
from searchrl.runlog import RunLogger

hold, mark = int(sys.argv[1]), sys.argv[2]
patch = pytest.MonkeyPatch()
vary_rewards(patch)
log = RunLogger.log

def held(self, record):
    log(self, record)
    if record["step"] == hold:
        workers = [p.pid for p in multiprocessing.active_children() if p.name.startswith("searchrl-rollout-worker")]
        with open(mark + ".tmp", "w") as fh:
            fh.write(" ".join(map(str, workers)))
        os.replace(mark + ".tmp", mark)
        time.sleep(3600)

patch.setattr(RunLogger, "log", held)
sys.argv = ["searchrl", "train", *sys.argv[3:]]
main()
"""


def _published(run: Path) -> bool:
    """A folder of published weights of `run` exists (in /dev/shm, or in the run)."""
    return weights_folder(run, 0).exists() or (run / "rollout-weights").exists()


def _ended(pid: int) -> bool:
    """The process has ended (a zombie that nobody reaped has ended too)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except FileNotFoundError:
        return True


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads the worker's state in /proc")
def test_a_killed_trainer_resumes_without_losing_an_update_and_its_worker_ends(world, tmp_path, varied_rewards):
    # checkpoints after steps 2, 4 (Stage 1's end) and 5; the kill comes after step 3's update
    stale = ("rollout.mode=async", "rollout.max_staleness=1", "stage1.steps=4", "logging.checkpoint_every=2")
    full = _run(world, tmp_path / "full", *stale)
    assert [r[mn.STALENESS_MAX] for r in read_metrics(full)] == [0, 1, 1, 1, 0]
    assert not _published(full)  # a complete run keeps no published weights

    crashed, mark, log = tmp_path / "crashed", tmp_path / "held", tmp_path / "trainer.log"
    dump_config(load_config(TrainConfig, None, _overrides(world, crashed, *stale)), tmp_path / "crashed.yaml")
    paths = [str(Path(__file__).parent), str(Path(searchrl.__file__).parents[1]), os.environ.get("PYTHONPATH", "")]
    with log.open("w") as out:
        proc = subprocess.Popen([sys.executable, "-c", _HELD_TRAINER, "3", str(mark), "--config", str(tmp_path / "crashed.yaml")],
                                env={**os.environ, "PYTHONPATH": os.pathsep.join(paths)}, stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 900
        while not mark.exists():
            assert proc.poll() is None, f"the trainer ended (code {proc.returncode}) before step 3:\n{log.read_text()[-3000:]}"
            assert time.monotonic() < deadline, "the trainer did not reach step 3 in 15 minutes"
            time.sleep(0.2)
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == -signal.SIGKILL
    workers = [int(pid) for pid in mark.read_text().split()]
    assert len(workers) == 1
    deadline = time.monotonic() + 30
    while not all(_ended(pid) for pid in workers):  # a worker watches its trainer: no order comes any more
        assert time.monotonic() < deadline, f"the rollout worker (pid {workers}) outlived its killed trainer by 30 s"
        time.sleep(0.1)
    assert not _published(crashed)  # the worker removed the killed trainer's weights (/dev/shm: RAM)

    assert len(read_metrics(crashed)) == 3 and latest_checkpoint(crashed).name == "step_0002"
    # step 3's batch (version 1's) is in the step-2 checkpoint; step 4's is version 2's, the checkpoint's own
    assert AHEAD_FILE in json.loads((crashed / "checkpoints" / "step_0002" / CHECKSUMS).read_text())
    train_command(None, [], None, str(crashed), None)  # `searchrl train --resume RUN`
    _assert_same_run(full, crashed)
    assert not _published(crashed)

