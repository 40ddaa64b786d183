"""Several rollout workers (`rollout.workers`, `rollout.worker_addresses`) on the tiny-random model:
an order splits into whole question groups with seeds of their own; two local workers train
reproducibly and two remote servers give the same run; a dead or unreachable worker stops the
run naming it; `generation_idle_share` measures the workers' time without an order."""

from __future__ import annotations

import contextlib
import os
import queue
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_async import _assert_same_run, _run

from searchrl import metric_names as mn
from searchrl.data.types import Question
from searchrl.errors import SearchRLError
from searchrl.rl.config import TrainConfig
from searchrl.rollout import worker_links
from searchrl.rollout.async_worker import AsyncRollouts, Order, shards, worker_configs
from searchrl.rollout.worker_config import WorkerConfig
from searchrl.runlog import read_metrics

STALE = ("rollout.mode=async", "rollout.max_staleness=1")


def test_an_order_splits_into_whole_groups_in_question_order_with_seeds_of_their_own():
    questions = [Question(f"q{i}", f"question {i}", [f"a{i}"]) for i in range(5)]
    order = Order(step=4, questions=questions, n=3, seed=1234, version=2)
    two = shards(order, 2)
    assert [[q.id for q in s.questions] for s in two] == [["q0", "q1", "q2"], ["q3", "q4"]]
    assert all((s.step, s.n, s.version) == (4, 3, 2) for s in two)
    assert two[0].seed == 1234 and two[1].seed != 1234  # shard 0 keeps the order's: one worker samples as sync
    assert [s.seed for s in shards(order, 2)] == [s.seed for s in two]  # a function of (seed, shard)
    assert [s.seed for s in shards(order, 3)][:2] == [s.seed for s in two]
    assert shards(order, 1) == [order]
    sizes = [len(s.questions) for s in shards(Order(1, questions[:1], 2, 7, 0), 3)]
    assert sizes == [1, 0, 0]  # fewer questions than workers: the others get nothing to do


def test_the_workers_run_the_trainer_s_agent_device_dtype_and_run_and_nothing_else():
    train = TrainConfig(model="tiny-random", device="meta", dtype="bfloat16", seed=7, out="runs/x", tools=["search"],
                        rollout={"mode": "async", "k": 4, "backend": "hf"}, retrieval={"index": "toyworld"},
                        stage1={"steps": 3}, algorithm={"lr": 1e-5})
    cfg = train.worker_config()
    assert type(cfg) is WorkerConfig
    assert (cfg.model, cfg.device, cfg.dtype, cfg.run, cfg.tools) == ("tiny-random", "meta", "bfloat16", "runs/x", ["search"])
    assert (cfg.profile, cfg.protocol, cfg.rollout, cfg.retrieval) == (train.profile, train.protocol, train.rollout, train.retrieval)
    assert set(WorkerConfig.model_fields) == {"model", "profile", "protocol", "tools", "rollout", "retrieval", "device", "dtype", "run"}
    for rollout, why in [({"backend": "scripted"}, "rollout.backend=scripted is not supported there"),
                         ({"greedy": True}, "rollout.greedy must be false"),
                         ({"partial": "continue", "round_quorum": 0.5}, "round_quorum=0.5 some always are")]:
        with pytest.raises(ValueError, match=why):  # as the trainer's config refuses them (a served worker's overrides)
            WorkerConfig(run="runs/x", rollout=rollout, retrieval={"index": "toyworld"})
    with pytest.raises(ValueError, match="a rollout worker searches: set retrieval.index"):
        WorkerConfig(run="runs/x", retrieval={"index": None})


def test_local_workers_share_the_cores_and_devices_given():
    cfg = TrainConfig(out="runs/x", rollout={"mode": "async", "workers": 2, "worker_cpus": [3, 1, 2, 0], "worker_devices": ["cpu", "meta"]})
    placed = worker_configs(cfg.worker_config())
    assert [c.rollout.worker_cpus for c in placed] == [[3, 1], [2, 0]]
    assert [c.device for c in placed] == ["cpu", "meta"]
    three = TrainConfig(device="cpu", out="runs/x", rollout={"mode": "async", "workers": 3})
    assert [c.device for c in worker_configs(three.worker_config())] == ["cpu"] * 3


def test_worker_settings_that_cannot_hold_are_refused():
    with pytest.raises(ValueError, match=r"worker_cpus=\[0, 1, 2\] cannot be split evenly across rollout.workers=2"):
        TrainConfig(rollout={"mode": "async", "workers": 2, "worker_cpus": [0, 1, 2]})
    with pytest.raises(ValueError, match="lists 1 devices for rollout.workers=2"):
        TrainConfig(rollout={"mode": "async", "workers": 2, "worker_devices": ["cuda:1"]})
    with pytest.raises(ValueError, match="workers=0 leaves no rollout worker"):
        TrainConfig(rollout={"mode": "async", "workers": 0})
    with pytest.raises(ValueError, match="'node7' is not host:port"):
        TrainConfig(rollout={"mode": "async", "worker_addresses": ["node7"]})


def test_a_remote_address_needs_a_key_and_an_unreachable_one_is_named(monkeypatch):
    monkeypatch.delenv(worker_links.KEY_ENV, raising=False)
    with pytest.raises(SearchRLError, match="10.0.0.2 is not a loopback address.*SEARCHRL_WORKER_KEY"):
        worker_links.authkey("10.0.0.2", "rollout.worker_addresses 10.0.0.2:7001")
    assert worker_links.authkey("127.0.0.1", "x") is None
    monkeypatch.setenv(worker_links.KEY_ENV, "s3cret")
    assert worker_links.authkey("10.0.0.2", "x") == b"s3cret"
    port = _free_port()
    cfg = TrainConfig(out="runs/x", rollout={"mode": "async", "workers": 0, "worker_addresses": [f"127.0.0.1:{port}"],
                                             "worker_connect_s": 1.5})
    with pytest.raises(SearchRLError, match=rf"cannot reach the rollout worker at 127.0.0.1:{port} .* after [23] tries"):
        worker_links.RemoteLink(0, f"127.0.0.1:{port}", cfg.worker_config(), queue.Queue())


def test_a_served_worker_runs_the_trainer_s_config_with_its_machine_s_placement():
    trainer_cfg = TrainConfig(seed=11, device="cpu", out="runs/x", rollout={"mode": "async", "workers": 2, "worker_cpus": [0, 1],
                                                                           "worker_addresses": ["127.0.0.1:7001"], "k": 4})
    sent = trainer_cfg.worker_config()
    plain = worker_links.served_config(sent, [])
    assert (plain.run, plain.rollout.k, plain.device, plain.rollout.worker_cpus) == ("runs/x", 4, "cpu", None)
    assert (plain.rollout.workers, plain.rollout.worker_addresses) == (1, [])  # a server is one worker
    placed = worker_links.served_config(sent, ["device=meta", "rollout.worker_cpus=[1]"])
    assert (placed.device, placed.rollout.worker_cpus, placed.rollout.k) == ("meta", [1], 4)
    with pytest.raises(SearchRLError, match=r"overrides \['rollout.k=0'\] do not apply"):
        worker_links.served_config(sent, ["rollout.k=0"])
    with pytest.raises(SearchRLError, match=r"(?s)overrides \['stage1.steps=3'\] do not apply.*keys model, .*run\).*stage1"):  # the trainer's own
        worker_links.served_config(sent, ["stage1.steps=3"])
    with pytest.raises(SearchRLError, match="sent a TrainConfig where this rollout worker expects a WorkerConfig.*same one on both"):
        worker_links.served_config(trainer_cfg, [])  # an older trainer's hello


def test_the_idle_clock_counts_the_time_between_a_batch_and_the_next_order(monkeypatch):
    now = [100.0]
    monkeypatch.setattr(worker_links.time, "monotonic", lambda: now[0])
    clock = worker_links.IdleClock()  # idle from 100
    now[0] = 102.0
    clock.sent()  # busy from 102
    now[0] = 103.0
    clock.sent()  # a second order in hand: still busy
    now[0] = 105.0
    clock.received()
    now[0] = 106.0
    clock.received()  # idle again from 106
    assert clock.busy == 0
    assert clock.idle_within(101.0, 108.0) == pytest.approx(1.0 + 2.0)
    assert clock.idle_within(104.0, 108.0) == pytest.approx(2.0)  # the interval before 104 is forgotten
    assert clock.idle_within(90.0, 108.0) == pytest.approx(2.0)


def test_two_local_workers_train_reproducibly_and_two_remote_servers_give_the_same_run(world, tmp_path, varied_rewards, monkeypatch):
    two = _run(world, tmp_path / "two", *STALE, "rollout.workers=2")
    again = _run(world, tmp_path / "again", *STALE, "rollout.workers=2")
    records = read_metrics(two)
    assert any(r[mn.PG_LOSS] != 0 for r in records)  # the runs did learn
    assert [r[mn.STALENESS_MAX] for r in records] == [0, 1, 1, 0]
    assert all(0 <= r[mn.GENERATION_IDLE_SHARE] <= 1 for r in records)
    _assert_same_run(two, again)

    monkeypatch.setenv(worker_links.KEY_ENV, "test-key")  # the trainer's; the servers get it in their environment
    server_tmp = tmp_path / "server-tmp"
    server_tmp.mkdir()
    held = _temporary_files_at_publish(monkeypatch, server_tmp)
    with _served(tmp_path / "server0.log", server_tmp) as first, _served(tmp_path / "server1.log") as second:
        remote = _run(world, tmp_path / "remote", *STALE, "rollout.workers=0", f"rollout.worker_addresses=[{first}, {second}]")
    _assert_same_run(two, remote)
    assert held and all(len(names) == 1 and names[0].startswith("searchrl-worker-weights-") for names in held)  # the files it was sent


def test_a_killed_worker_among_two_stops_the_run_naming_it(world, tmp_path, monkeypatch):
    publish = AsyncRollouts.sync_weights

    def sync_weights(self, model, v):
        publish(self, model, v)
        if v == 1:
            os.kill(self._links[1].proc.pid, signal.SIGKILL)

    monkeypatch.setattr(AsyncRollouts, "sync_weights", sync_weights)
    with pytest.raises(SearchRLError, match=r"rollout worker process searchrl-rollout-worker-1 \(pid \d+\) exited with code -9 .*--resume"):
        _run(world, tmp_path / "killed", *STALE, "rollout.workers=2")


def _temporary_files_at_publish(monkeypatch, folder: Path) -> list[list[str]]:
    """What `folder` holds each time the trainer publishes a version (after the publish), in a list
    that fills as the runs go."""
    held, publish = [], AsyncRollouts.sync_weights

    def sync_weights(self, model, v):
        publish(self, model, v)
        held.append(sorted(p.name for p in folder.iterdir()))

    monkeypatch.setattr(AsyncRollouts, "sync_weights", sync_weights)
    return held


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def _served(log: Path, tmp: Path | None = None) -> Iterator[str]:
    """`searchrl rollout serve` on a free loopback port, in a process of its own (its temporary
    files in `tmp`, if given), killed on exit: yields its address."""
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": str(root / "src"), "OMP_NUM_THREADS": "1", **({"TMPDIR": str(tmp)} if tmp else {})}
    proc = subprocess.Popen([sys.executable, "-m", "searchrl", "rollout", "serve", "--listen", "127.0.0.1:0"],
                            stdout=subprocess.PIPE, stderr=log.open("w"), text=True, env=env)
    try:
        line = proc.stdout.readline()
        if "listening on" not in line:
            raise AssertionError(f"the rollout server did not start: {line!r}; {log.read_text()}")
        yield line.split("listening on ")[1].strip()
    finally:
        proc.kill()
        proc.wait(timeout=30)
