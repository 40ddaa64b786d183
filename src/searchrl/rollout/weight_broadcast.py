"""`rollout.weight_transport: broadcast` (docs/guides/async.md): the trainer sends each policy
version to every rollout worker by a torch.distributed broadcast, instead of writing a file the
workers read (`rollout.weights.publish`).

- **The group.** Rank 0 is the trainer, ranks 1..N the workers; nccl when the trainer's weights
  are on CUDA, gloo on CPU. It is a group of their own, apart from any torchrun group the trainer
  is in and from the one vLLM makes in a worker: a TCPStore the trainer listens on (a free port,
  sent in each worker's start message) and the process-group class built on it directly, so
  neither side's default group is touched.
- **A version on the wire.** The trainer first sets a key in the store (`version-<n>`, its n-th
  broadcast): a worker waits for it there, on a socket, rather than in a collective posted ahead
  (which on NCCL would hold GPU threads the worker's engine uses, for as long as a step lasts).
  Then buckets of at most `BUCKET_BYTES`, each the bytes of whole tensors (any dtype, 16-byte
  aligned), preceded by its length and JSON header (the version; each tensor's name, dtype, shape,
  offset); a header of length 0 ends the version. The trainer gathers one tensor at a time
  (`named_weights`), so it holds at most about a bucket beyond its model.
- **The worker's side.** A thread of its own receives each version when the trainer publishes
  it, also while the worker generates with an older one (with `partial: finish` a batch is
  generated whole by the version its order names, so the new one cannot go into the engine yet,
  and the trainer must not wait for the batch to end). Received versions wait in the worker's
  RAM, as the file transport's wait in /dev/shm, until an order names one (`take`); older ones
  are dropped then.
"""

from __future__ import annotations

import itertools
import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from searchrl.errors import SearchRLError
from searchrl.rollout.weights import DTYPE_NAMES, DTYPES, named_weights

BUCKET_BYTES = 256 << 20
_ALIGN = 16
# A worker's receiving thread waits for the next version's key as long as the trainer takes to
# publish it (an evaluation, a checkpoint); the collectives are bounded by rollout.worker_timeout_s.
_IDLE = timedelta(days=7)


@dataclass(frozen=True)
class GroupAddress:
    """What a worker needs to join the trainer's broadcast group: `host` None = derived (loopback
    for a local worker; for a remote one, the address its server saw the trainer connect from)."""

    host: str | None
    port: int
    rank: int
    size: int
    backend: str  # nccl | gloo


def group_backend(device: str) -> str:
    """nccl for weights on CUDA, else gloo."""
    return "nccl" if torch.device(device).type == "cuda" else "gloo"


def _process_group(store: dist.Store, rank: int, size: int, backend: str, timeout: timedelta) -> dist.ProcessGroup:
    if backend == "nccl":
        if not hasattr(dist, "ProcessGroupNCCL"):
            raise SearchRLError("rollout.weight_transport=broadcast on CUDA needs torch built with NCCL; this one has none")
        opts = dist.ProcessGroupNCCL.Options()
        opts._timeout = timeout
        return dist.ProcessGroupNCCL(store, rank, size, opts)
    return dist.ProcessGroupGloo(store, rank, size, timeout)


def _broadcast(pg: dist.ProcessGroup, t: torch.Tensor) -> None:
    opts = dist.BroadcastOptions()
    opts.rootRank = 0
    pg.broadcast([t], opts).wait()


class Sender:
    """The trainer's side (rank 0). It listens from construction, so workers may connect while it
    starts them; `join` forms the group once they all have (it waits for them)."""

    def __init__(self, workers: int, device: str, timeout_s: float) -> None:
        self.backend, self.device, self.size = group_backend(device), torch.device(device), workers + 1
        self._timeout = timedelta(seconds=timeout_s)
        self._store = dist.TCPStore("0.0.0.0", 0, world_size=self.size, is_master=True, timeout=self._timeout,
                                    wait_for_workers=False)
        self.port = self._store.port
        self._pg: dist.ProcessGroup | None = None
        self._sent = 0

    def address(self, rank: int, host: str | None) -> GroupAddress:
        return GroupAddress(host, self.port, rank, self.size, self.backend)

    def join(self) -> None:
        """Form the group with every worker (each joins right after it reports ready)."""
        try:
            self._pg = _process_group(self._store, 0, self.size, self.backend, self._timeout)
        except (RuntimeError, dist.DistStoreError) as e:
            raise SearchRLError(
                f"the rollout workers did not all join the weight broadcast group (port {self.port}) within "
                f"rollout.worker_timeout_s: {e}. Each worker must reach the trainer at that port and the workers one "
                "another; set rollout.broadcast_host, or use rollout.weight_transport=file") from None

    def send(self, model: torch.nn.Module, version: int) -> None:
        """Broadcast `model`'s weights as `version`, bucket by bucket."""
        self._store.set(f"version-{self._sent}", str(version))
        self._sent += 1
        bucket: list[tuple[str, torch.Tensor, int]] = []  # (name, tensor, its offset in the bucket)
        size = 0  # the bucket's bytes, each tensor's aligned
        for name, w in named_weights(model):
            nbytes = _aligned(w.numel() * w.element_size())
            if bucket and size + nbytes > BUCKET_BYTES:
                self._bucket(version, bucket, size)
                bucket, size = [], 0
            bucket.append((name, w.detach(), size))
            size += nbytes
        if bucket:
            self._bucket(version, bucket, size)
        _broadcast(self._pg, torch.zeros(1, dtype=torch.int64, device=self.device))  # the version's end

    def _bucket(self, version: int, tensors: list[tuple[str, torch.Tensor, int]], size: int) -> None:
        """One bucket: its header's length, the header, then its `size` bytes, each tensor at its offset."""
        entries = [[name, DTYPE_NAMES[w.dtype], list(w.shape), offset] for name, w, offset in tensors]
        header = json.dumps({"version": version, "bytes": size, "tensors": entries}).encode()
        data = torch.empty(size, dtype=torch.uint8, device=self.device)
        for _, w, offset in tensors:
            raw = w.to(self.device).contiguous().reshape(-1).view(torch.uint8)
            data[offset:offset + raw.numel()].copy_(raw)
        _broadcast(self._pg, torch.tensor([len(header)], dtype=torch.int64, device=self.device))
        _broadcast(self._pg, torch.frombuffer(bytearray(header), dtype=torch.uint8).to(self.device))
        _broadcast(self._pg, data)

    def close(self) -> None:
        """Let go of the group and the store: the workers' waits for a next version end."""
        self._pg = self._store = None


class Receiver:
    """A worker's side (rank ≥ 1): connects to the trainer's store at `host` at once (an
    unreachable trainer is reported while the worker starts, within `rollout.worker_connect_s`),
    joins the group with `start`, then receives every version in a thread, on `device` (the
    worker's; CPU buffers for gloo). `rollout.worker_timeout_s` bounds the wait for the other
    workers to join and for a version an order names."""

    def __init__(self, address: GroupAddress, host: str, device: str, rollout) -> None:
        connect_s, self._timeout_s = rollout.worker_connect_s, rollout.worker_timeout_s
        if address.backend == "nccl" and torch.device(device).type != "cuda":
            raise SearchRLError(f"the trainer broadcasts its weights with NCCL (its weights are on CUDA), and this rollout "
                                f"worker's device is {device}: give the worker a GPU of its own (device=cuda:N), or use "
                                "rollout.weight_transport=file")
        self._address, self._where = address, f"{host}:{address.port}"
        self._device = torch.device(device) if address.backend == "nccl" else torch.device("cpu")
        try:
            self._store = dist.TCPStore(host, address.port, world_size=address.size, is_master=False,
                                        timeout=timedelta(seconds=connect_s))
        except (RuntimeError, dist.DistStoreError) as e:
            raise SearchRLError(
                f"this rollout worker cannot reach the trainer's weight broadcast at {self._where} within "
                f"{connect_s:g} s ({type(e).__name__}: {str(e).splitlines()[0]}): rollout.weight_transport=broadcast needs "
                "every worker to reach the trainer at that port; open it, set rollout.broadcast_host to an address of "
                "the trainer the workers reach, or use rollout.weight_transport=file") from None
        self._store.set_timeout(timedelta(seconds=self._timeout_s))  # the other workers may take minutes to start
        self._versions: dict[int, list[tuple[str, torch.Tensor]]] = {}
        self._error: str | None = None
        self._changed = threading.Condition()

    def start(self) -> None:
        """Join the group (with the trainer and every other worker), then receive in a thread."""
        pg = _process_group(self._store, self._address.rank, self._address.size, self._address.backend,
                            timedelta(seconds=self._timeout_s))
        threading.Thread(target=self._receive, args=(pg,), name="weights-broadcast", daemon=True).start()

    def take(self, version: int) -> list[tuple[str, torch.Tensor]]:
        """Version `version`'s (name, tensor) pairs, once received; it and older versions are dropped here."""
        deadline = time.monotonic() + self._timeout_s
        with self._changed:
            while version not in self._versions:
                if self._error is not None:
                    raise SearchRLError(f"the weight broadcast from the trainer at {self._where} failed: {self._error}")
                if not self._changed.wait(timeout=max(0.0, deadline - time.monotonic())) and time.monotonic() >= deadline:
                    raise SearchRLError(f"policy version {version} did not arrive by the weight broadcast from "
                                        f"{self._where} within rollout.worker_timeout_s={self._timeout_s:g} s")
            weights = self._versions[version]
            for v in [v for v in self._versions if v <= version]:
                del self._versions[v]
        return weights

    def newest(self) -> int | None:
        """The newest version received and not yet taken."""
        with self._changed:
            return max(self._versions, default=None)

    def _receive(self, pg: dist.ProcessGroup) -> None:
        if self._device.type == "cuda":  # this thread's current device; the engine's thread keeps its own
            torch.cuda.set_device(self._device)
        try:
            for n in itertools.count():
                self._store.wait([f"version-{n}"], _IDLE)
                version, weights = self._version(pg)
                with self._changed:
                    self._versions[version] = weights
                    self._changed.notify_all()
        except Exception as e:  # noqa: BLE001 - reported to the worker loop by `take`
            with self._changed:
                self._error = f"{type(e).__name__}: {e}"
                self._changed.notify_all()

    def _version(self, pg: dist.ProcessGroup) -> tuple[int, list[tuple[str, torch.Tensor]]]:
        version, weights = None, []
        for header, data in self._buckets(pg):
            version = header["version"]
            weights += [(name, t) for name, t in _unpack(header, data)]
        if version is None:
            raise RuntimeError("the trainer broadcast a version without tensors")
        return version, weights

    def _buckets(self, pg: dist.ProcessGroup) -> Iterator[tuple[dict, torch.Tensor]]:
        while True:
            n = torch.zeros(1, dtype=torch.int64, device=self._device)
            _broadcast(pg, n)
            length = int(n.item())
            if length == 0:
                return
            raw = torch.empty(length, dtype=torch.uint8, device=self._device)
            _broadcast(pg, raw)
            header = json.loads(raw.cpu().numpy().tobytes())
            data = torch.empty(header["bytes"], dtype=torch.uint8, device=self._device)
            _broadcast(pg, data)
            yield header, data.cpu()  # kept in RAM: the worker's GPU memory is its engine's


def _unpack(header: dict, data: torch.Tensor) -> Iterator[tuple[str, torch.Tensor]]:
    """The tensors of a received bucket, as views of its bytes."""
    for name, dtype, shape, offset in header["tensors"]:
        t = DTYPES[dtype]
        n = torch.Size(shape).numel() * t.itemsize
        yield name, data[offset:offset + n].view(t).view(shape)


def _aligned(nbytes: int) -> int:
    return (nbytes + _ALIGN - 1) // _ALIGN * _ALIGN
