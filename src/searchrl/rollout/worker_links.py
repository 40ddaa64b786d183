"""How the trainer reaches its rollout workers (`rollout.async_worker`): a process it starts on
this machine (`LocalLink`), or a server a user started elsewhere with `searchrl rollout serve`
(`RemoteLink`, `serve`), over `multiprocessing.connection` (docs/guides/async.md).

Every link forwards what its worker sends, tagged with the link's index, into the trainer's one
inbox (a thread per link), so the trainer waits on one queue for N workers; a worker that dies or
hangs up becomes a `Lost` message in that queue, after whatever it sent before.

The connection pickles, so it is authenticated with the key in `SEARCHRL_WORKER_KEY` (an HMAC
challenge both ways, multiprocessing's own); without a key only loopback addresses are allowed.
"""

from __future__ import annotations

import ipaddress
import multiprocessing as mp
import os
import queue
import shutil
import tempfile
import threading
import time
import traceback
from dataclasses import dataclass, replace
from multiprocessing.connection import Client, Connection, Listener
from pathlib import Path

from searchrl.errors import SearchRLError
from searchrl.rollout.weight_broadcast import GroupAddress
from searchrl.rollout.weights import published_path
from searchrl.rollout.worker_config import WorkerConfig
from searchrl.rollout.worker_process import Failed, worker_main

KEY_ENV = "SEARCHRL_WORKER_KEY"


@dataclass(frozen=True)
class Lost:
    """A worker gone: `why` completes "the rollout worker ... <why>"."""

    why: str


@dataclass(frozen=True)
class Hello:
    """The trainer's first message to a remote worker: the config the worker runs, and with
    `weight_transport: broadcast` the group it joins to receive the weights."""

    cfg: WorkerConfig
    group: GroupAddress | None = None


@dataclass(frozen=True)
class Weights:
    """Policy `version`'s published file, for a worker without the trainer's filesystem; versions
    below `drop_below` are no order's any more and may go."""

    version: int
    data: bytes
    drop_below: int


def parse_address(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise SearchRLError(f"{address!r} is not host:port (e.g. 127.0.0.1:7001)")
    return host, int(port)


def authkey(host: str, what: str) -> bytes | None:
    """The connection key from SEARCHRL_WORKER_KEY; refused when missing for a host that is not loopback."""
    key = os.environ.get(KEY_ENV)
    if key:
        return key.encode()
    try:
        loopback = host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = False
    if not loopback:
        raise SearchRLError(f"{what}: {host} is not a loopback address, and the connection pickles what it carries, so it "
                            f"must be authenticated: set the same secret in {KEY_ENV} on the trainer and the worker")
    return None


class IdleClock:
    """When a worker had no order in hand: intervals from its last batch to its next order."""

    def __init__(self) -> None:
        self.busy = 0  # orders sent, batches not yet received
        self._idle: list[list[float]] = [[time.monotonic(), float("inf")]]

    def sent(self) -> None:
        if self.busy == 0:
            self._idle[-1][1] = time.monotonic()
        self.busy += 1

    def received(self) -> None:
        self.busy -= 1
        if self.busy == 0:
            self._idle.append([time.monotonic(), float("inf")])

    def idle_within(self, start: float, end: float) -> float:
        """Seconds idle in [start, end]; forgets the intervals that ended before `start`."""
        self._idle = [iv for iv in self._idle if iv[1] > start]
        return sum(max(0.0, min(b, end) - max(a, start)) for a, b in self._idle)


class LocalLink:
    """A worker process on this machine, started with `target(cfg, folder, orders, results, group)`;
    it reads the published weights from `folder` itself, or receives them in `group` (`folder` None)."""

    def __init__(self, index: int, target, cfg: WorkerConfig, folder: Path | None, inbox: queue.Queue,
                 group: GroupAddress | None = None) -> None:
        ctx = mp.get_context("spawn")  # a fork would copy the trainer's threads and model
        # Admission bounds what a worker holds to max_staleness + 1 orders: these queues need no cap.
        self._orders, self._results = ctx.Queue(), ctx.Queue()
        self.proc = ctx.Process(target=target, args=(cfg, folder, self._orders, self._results, group),
                                name=f"searchrl-rollout-worker-{index}", daemon=True)
        self.proc.start()
        self.name = f"process {self.proc.name} (pid {self.proc.pid})"
        self.clock = IdleClock()
        self._closing = threading.Event()
        threading.Thread(target=self._forward, args=(index, inbox), daemon=True).start()

    def send(self, order, folder: Path | None, drop_below: int) -> None:
        self._orders.put(order)

    def _forward(self, index: int, inbox: queue.Queue) -> None:
        while not self._closing.is_set():
            try:
                inbox.put((index, self._results.get(timeout=0.5)))
            except queue.Empty:
                if not self.proc.is_alive() and self._results.empty() and not self._closing.is_set():
                    inbox.put((index, Lost(f"exited with code {self.proc.exitcode}")))
                    return
            except (OSError, ValueError):  # the queue closed under us: closing
                return

    def close(self) -> None:
        self._closing.set()
        if self.proc.is_alive():
            self._orders.put(None)
            self.proc.join(timeout=10)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join(timeout=10)
        for q in (self._orders, self._results):
            q.cancel_join_thread()
            q.close()


class RemoteLink:
    """A worker served at `address` (`serve`): it gets the config it runs, then orders, each preceded
    by its version's weights when the worker does not hold them yet (unless they come by `group`'s
    broadcast)."""

    def __init__(self, index: int, address: str, cfg: WorkerConfig, inbox: queue.Queue,
                 group: GroupAddress | None = None) -> None:
        host, port = parse_address(address)
        key = authkey(host, f"rollout.worker_addresses {address}")
        self.name = f"at {address}"
        self.clock = IdleClock()
        self._sent_version: int | None = None
        self._files = group is None
        self._closing = threading.Event()
        self._conn = _connect(address, (host, port), key, cfg.rollout.worker_connect_s)
        self._conn.send(Hello(cfg, group))
        threading.Thread(target=self._forward, args=(index, inbox), daemon=True).start()

    def send(self, order, folder: Path | None, drop_below: int) -> None:
        if self._files and order is not None and order.version != self._sent_version:
            self._conn.send(Weights(order.version, published_path(folder, order.version).read_bytes(), drop_below))
            self._sent_version = order.version
        self._conn.send(order)

    def _forward(self, index: int, inbox: queue.Queue) -> None:
        try:
            while True:
                inbox.put((index, self._conn.recv()))
        except (EOFError, OSError) as e:
            if not self._closing.is_set():
                inbox.put((index, Lost(f"closed the connection ({type(e).__name__}: {e or 'end of stream'})")))

    def close(self) -> None:
        self._closing.set()
        try:
            self._conn.send(None)
        except OSError:
            pass
        self._conn.close()


def _connect(address: str, where: tuple[str, int], key: bytes | None, patience_s: float) -> Connection:
    """A connection to the worker at `where`, retried each second for `patience_s` seconds."""
    deadline, tries = time.monotonic() + patience_s, 0
    while True:
        tries += 1
        try:
            return Client(where, authkey=key)
        except mp.AuthenticationError:
            raise SearchRLError(f"the rollout worker at {address} refused the trainer's key: set the same {KEY_ENV} "
                                "on both machines") from None
        except OSError as e:
            if time.monotonic() >= deadline:
                raise SearchRLError(
                    f"cannot reach the rollout worker at {address} ({e}) after {tries} tries in {patience_s:g} s "
                    f"(rollout.worker_connect_s): start it there with `searchrl rollout serve --listen {address}`, "
                    "or fix rollout.worker_addresses") from None
            time.sleep(1.0)


# -- the worker's side: `searchrl rollout serve` ----------------------------------------------------


class _Replies:
    """The worker loop's `results`: sent back over the connection; a trainer gone is no error here
    (its orders end with None)."""

    def __init__(self, conn: Connection) -> None:
        self._conn = conn

    def put(self, msg) -> None:
        try:
            self._conn.send(msg)
        except OSError:
            pass


def serve(listen: str, overrides: list[str]) -> None:
    """Serve trainers at `listen` (host:port; port 0 picks a free one), one at a time, until
    interrupted: each gets a rollout worker running the config it sends, with `overrides`
    (key=value of `WorkerConfig`: what is local to this machine, such as `device` or
    `rollout.worker_cpus`) applied."""
    host, port = parse_address(listen)
    key = authkey(host, f"--listen {listen}")
    with Listener((host, port), authkey=key) as listener:
        print(f"rollout worker listening on {host}:{listener.address[1]}", flush=True)
        while True:
            try:
                conn = listener.accept()
            except (mp.AuthenticationError, OSError) as e:
                print(f"rollout worker: refused a connection ({type(e).__name__}: {e})", flush=True)
                continue
            with conn:
                _serve_trainer(conn, overrides, listener.last_accepted[0])


def served_config(sent, overrides: list[str]) -> WorkerConfig:
    """The config a served worker runs: the one the trainer `sent`, as one worker with no
    placement of the trainer's machine, then this machine's `overrides` (key=value), validated."""
    from pydantic import ValidationError

    from searchrl.config import deep_merge, parse_overrides

    if not isinstance(sent, WorkerConfig):  # a trainer of another searchrl version (older ones sent their TrainConfig)
        raise SearchRLError(f"the trainer sent a {type(sent).__name__} where this rollout worker expects a WorkerConfig: "
                            "the two run different versions of searchrl; install the same one on both machines")
    placement = {"workers": 1, "worker_cpus": None, "worker_devices": None, "worker_addresses": []}
    data = deep_merge(sent.model_dump(mode="json"), {"rollout": placement})
    try:
        return WorkerConfig.model_validate(deep_merge(data, parse_overrides(overrides)))
    except ValidationError as e:
        raise SearchRLError(f"the worker's overrides {overrides} do not apply to the config the trainer sent (a WorkerConfig, "
                            f"of the keys {', '.join(WorkerConfig.model_fields)}): {e}") from None


def _serve_trainer(conn: Connection, overrides: list[str], trainer_host: str) -> None:

    try:
        hello = conn.recv()
    except (EOFError, OSError):  # a peer that hung up before saying anything
        return
    if not isinstance(hello, Hello):
        print(f"rollout worker: the peer sent {type(hello).__name__} first, not a trainer's hello; dropped", flush=True)
        return
    try:
        cfg = served_config(hello.cfg, overrides)
    except SearchRLError as e:
        _Replies(conn).put(Failed(str(e)))
        return
    # The weights come as files over the connection, or by broadcast (then no folder at all).
    folder = Path(tempfile.mkdtemp(prefix="searchrl-worker-weights-")) if hello.group is None else None
    orders: queue.Queue = queue.Queue()
    threading.Thread(target=_receive_orders, args=(conn, folder, orders), daemon=True).start()
    print(f"rollout worker: serving a trainer (run {cfg.run})", flush=True)
    try:
        group = hello.group
        if group is not None and group.host is None:  # the trainer as this server saw it connect
            group = replace(group, host=trainer_host)
        worker_main(cfg, folder, orders, _Replies(conn), group)
    except Exception:  # noqa: BLE001 - sent to the trainer already (Failed); the server waits for the next one
        traceback.print_exc()
    finally:
        if folder is not None:
            shutil.rmtree(folder, ignore_errors=True)
    print("rollout worker: the trainer is done; waiting for the next", flush=True)


def _receive_orders(conn: Connection, folder: Path | None, orders: queue.Queue) -> None:
    """The trainer's messages: weights become published files in `folder` (the trainer sends
    none when it broadcasts them), orders go to the loop; a trainer gone ends the loop as its None would."""
    try:
        while True:
            msg = conn.recv()
            if isinstance(msg, Weights):
                path = published_path(folder, msg.version)
                tmp = path.with_name(f".{path.name}.tmp")
                tmp.write_bytes(msg.data)
                tmp.replace(path)
                for old in folder.glob("weights-*.safetensors"):
                    if int(old.stem.split("-")[1]) < msg.drop_below:
                        old.unlink(missing_ok=True)
                continue
            orders.put(msg)
            if msg is None:
                return
    except (EOFError, OSError):
        orders.put(None)
