"""`rollout.weight_transport: broadcast` on the tiny-random model, with gloo: a version crosses the
group bit for bit, in several buckets; a worker with `partial: continue` takes a version broadcast
between two rounds; an async run whose weights go by broadcast (two local
workers, then a remote one and a local one, partial: continue too) is the run whose weights go by
file, metrics and final weights; a worker lost before a broadcast is named; what cannot form a
group is refused, naming the fix."""

from __future__ import annotations

import copy
import multiprocessing as mp
import threading
import time
from pathlib import Path

import pytest
import torch
from test_async import _assert_same_run, _published, _run
from test_async_workers import STALE, _served, _temporary_files_at_publish
from test_partial import _worker, models  # noqa: F401 - models: a fixture
from test_rollout import QUESTIONS, assert_matches_recompute

from searchrl import metric_names as mn
from searchrl.errors import SearchRLError
from searchrl.rl.config import TrainConfig
from searchrl.rollout import weight_broadcast, worker_links
from searchrl.rollout.async_worker import AsyncRollouts, check_broadcast
from searchrl.rollout.config import RolloutConfig
from searchrl.rollout.weight_broadcast import Receiver, Sender
from searchrl.rollout.worker_config import WorkerConfig
from searchrl.rollout.worker_process import load_version, newest_version
from searchrl.runlog import read_metrics


class _Weights(torch.nn.Module):
    """Parameters of several dtypes and sizes, none a multiple of the 16-byte alignment."""

    def __init__(self, seed: int) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.a = torch.nn.Parameter(torch.randn(7, 3, generator=g))
        self.b = torch.nn.Parameter(torch.randn(5, generator=g).to(torch.bfloat16), requires_grad=False)
        self.c = torch.nn.Parameter(torch.randn(40, 9, generator=g).double(), requires_grad=False)
        self.d = torch.nn.Parameter(torch.randn(1, generator=g))


def _bits(t: torch.Tensor) -> bytes:
    return t.detach().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


def _receive(address, versions, out) -> None:
    receiver = Receiver(address, "127.0.0.1", "cpu", RolloutConfig(worker_connect_s=10, worker_timeout_s=30))
    receiver.start()
    got = {}
    for v in versions:
        got[v] = [(name, str(t.dtype), list(t.shape), _bits(t)) for name, t in receiver.take(v)]  # plain values: the queue pickles
    out.put((got, receiver.newest()))


def test_a_version_crosses_the_group_bit_for_bit_in_buckets(monkeypatch):
    monkeypatch.setattr(weight_broadcast, "BUCKET_BYTES", 200)  # buckets a + b, c (alone: larger than a bucket), d
    ctx = mp.get_context("spawn")
    sender = Sender(2, "cpu", 30)
    out = ctx.Queue()
    procs = [ctx.Process(target=_receive, args=(sender.address(rank, "127.0.0.1"), [3, 5], out)) for rank in (1, 2)]
    for p in procs:
        p.start()
    sender.join()
    sent = {3: _Weights(0), 4: _Weights(1), 5: _Weights(2)}
    for v, m in sent.items():  # 4 is published but no order names it: dropped when 5 is taken
        sender.send(m, v)
    results = [out.get(timeout=60) for _ in procs]
    for p in procs:
        p.join(timeout=30)
    for got, newest in results:
        assert newest is None  # all taken or dropped
        for v in (3, 5):
            expected = [(name, str(t.dtype), list(t.shape), _bits(t)) for name, t in sent[v].named_parameters()]
            assert got[v] == expected


def test_continue_takes_the_version_broadcast_between_rounds(models):  # noqa: F811 - test_partial's fixture
    old, new, tok = models
    sender = Sender(1, "cpu", 30)
    receiver = Receiver(sender.address(1, "127.0.0.1"), "127.0.0.1", "cpu", RolloutConfig(worker_connect_s=10, worker_timeout_s=30))
    joining = threading.Thread(target=receiver.start)  # both sides block until the group is whole
    joining.start()
    sender.join()
    joining.join()
    sender.send(old, 3)
    worker = _worker(copy.deepcopy(new), tok, max_new_tokens=8, max_tokens_per_turn=4)  # other weights until it loads 3
    load_version(worker, receiver, 3)
    rounds = []

    def between_rounds() -> int:
        rounds.append(worker.version)
        if len(rounds) == 2:  # the trainer publishes its next version while round 1 was generating
            sender.send(new, 4)
            while receiver.newest() != 4:  # the worker's thread stages it a moment after the trainer's send returns
                time.sleep(0.01)
        return newest_version(worker, receiver)

    trajs = worker.collect(QUESTIONS[:2], 2, seed=5, between_rounds=between_rounds)
    assert worker.version == 4 and rounds[:2] == [3, 3] and receiver.newest() is None  # taken, nothing left staged
    two_rounds = [t for t in trajs if len(t.token_ids) == 8]
    assert len(two_rounds) >= 3  # a random model rarely writes EOS in its first 4 tokens
    for t in two_rounds:  # the behaviour log-probs are those of the weights broadcast for each part
        assert t.token_versions == [3] * 4 + [4] * 4
        assert_matches_recompute(old, t.prompt_ids, t.token_ids, [1] * 4 + [0] * 4, t.logprobs, greedy=False)
        assert_matches_recompute(new, t.prompt_ids, t.token_ids, [0] * 4 + [1] * 4, t.logprobs, greedy=False)


def test_async_runs_by_broadcast_equal_runs_by_file(world, tmp_path, varied_rewards, monkeypatch):
    published = {}  # by run: whether a folder of published weights existed at each publish
    publish = AsyncRollouts.sync_weights

    def sync_weights(self, model, v):
        publish(self, model, v)
        published.setdefault(Path(self.cfg.run).name, []).append(_published(Path(self.cfg.run)))

    monkeypatch.setattr(AsyncRollouts, "sync_weights", sync_weights)
    by_file = _run(world, tmp_path / "file", *STALE, "rollout.workers=2")
    broadcast = _run(world, tmp_path / "broadcast", *STALE, "rollout.workers=2", "rollout.weight_transport=broadcast")
    records = read_metrics(broadcast)
    assert any(r[mn.PG_LOSS] != 0 for r in records)  # the runs did learn
    assert [r[mn.STALENESS_MAX] for r in records] == [0, 1, 1, 0]
    _assert_same_run(by_file, broadcast)
    assert published == {"file": [True] * 4, "broadcast": [False] * 4}  # no folder for weights, not even an empty one

    # a remote worker (rank 2, its host derived from the trainer's connection) beside a local one
    monkeypatch.setenv(worker_links.KEY_ENV, "test-key")
    server_tmp = tmp_path / "server-tmp"
    server_tmp.mkdir()
    held = _temporary_files_at_publish(monkeypatch, server_tmp)
    with _served(tmp_path / "server.log", server_tmp) as address:
        mixed = _run(world, tmp_path / "mixed", *STALE, "rollout.workers=1", f"rollout.worker_addresses=[{address}]",
                     "rollout.weight_transport=broadcast")
        assert held == [[]] * 4  # the server made no folder for weights either
        # a trainer the remote worker cannot reach: the worker says so as it starts, and the run stops
        with pytest.raises(SearchRLError, match=r"(?s)at 127.0.0.1:\d+ failed.*cannot reach the trainer's weight broadcast at "
                                                r"192\.0\.2\.1:\d+ within 2 s.*rollout.broadcast_host"):
            _run(world, tmp_path / "unreachable", *STALE, "rollout.workers=0", f"rollout.worker_addresses=[{address}]",
                 "rollout.weight_transport=broadcast", "rollout.broadcast_host=192.0.2.1", "rollout.worker_connect_s=2")
    _assert_same_run(by_file, mixed)


def test_a_worker_lost_before_a_broadcast_stops_the_run_naming_it(world, tmp_path, monkeypatch):
    publish = AsyncRollouts.sync_weights

    def sync_weights(self, model, v):
        if v == 2:  # gone before the trainer broadcasts version 2: the broadcast fails, the worker is named
            self._links[1].proc.kill()
            self._links[1].proc.join()
        publish(self, model, v)

    monkeypatch.setattr(AsyncRollouts, "sync_weights", sync_weights)
    with pytest.raises(SearchRLError, match=r"rollout worker process searchrl-rollout-worker-1 \(pid \d+\) exited with code -9 "
                                            r"while the trainer waited to broadcast policy version 2.*--resume"):
        _run(world, tmp_path / "killed", *STALE, "rollout.workers=2", "rollout.weight_transport=broadcast")


def test_what_cannot_form_a_broadcast_group_is_refused_naming_the_fix():
    def cfg(**rollout) -> WorkerConfig:
        return TrainConfig(device="cuda:0", out="runs/x", rollout={"mode": "async", "weight_transport": "broadcast",
                                                                  **rollout}).worker_config()

    # NCCL: one GPU per process (the workers default to the trainer's device)
    for bad in (cfg(), cfg(workers=2, worker_devices=["cuda:1", "cuda:1"]), cfg(workers=1, worker_devices=["cpu"])):
        with pytest.raises(SearchRLError, match=r"NCCL, which needs a GPU of its own for each process.*rollout.worker_devices"):
            check_broadcast(bad)
    check_broadcast(cfg(workers=2, worker_devices=["cuda:1", "cuda:2"]))
    check_broadcast(cfg().model_copy(update={"device": "cpu"}))  # gloo on CPU
    with pytest.raises(SearchRLError, match="broadcasts its weights with NCCL.*this rollout worker's device is cpu"):
        Receiver(weight_broadcast.GroupAddress("127.0.0.1", 1, 1, 2, "nccl"), "127.0.0.1", "cpu", RolloutConfig())

    unreachable = weight_broadcast.GroupAddress("192.0.2.1", 29999, 1, 2, "gloo")  # TEST-NET-1: nobody there
    with pytest.raises(SearchRLError, match=r"cannot reach the trainer's weight broadcast at 192\.0\.2\.1:29999 within 1 s"
                                            r".*rollout.broadcast_host"):
        Receiver(unreachable, "192.0.2.1", "cpu", RolloutConfig(worker_connect_s=1))
