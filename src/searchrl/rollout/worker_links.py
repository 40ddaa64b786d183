"""How the trainer reaches its rollout workers (`rollout.async_worker`): a process it starts on
this machine (`LocalLink`), or a server a user started elsewhere with `searchrl rollout serve`
(`RemoteLink`, `serve`), over a TCP connection that carries typed frames (`rollout.wire`:
JSON headers checked against a closed set of messages, the weights as raw safetensors bytes;
nothing is pickled) (docs/guides/async.md).

Every link forwards what its worker sends, tagged with the link's index, into the trainer's one
inbox (a thread per link), so the trainer waits on one queue for N workers; a worker that dies or
hangs up becomes a `Lost` message in that queue, after whatever it sent before.

The connection is authenticated with the key in `SEARCHRL_WORKER_KEY` (an HMAC challenge both
ways, `rollout.wire`). A server without a key starts only when told `--insecure-no-key`, and then
on a loopback address only; a trainer without a key reaches only loopback addresses. The server
handshakes with every connection in a thread of its own, each within `wire.HANDSHAKE_S`, so an
idle connection never holds the next trainer, and serves the trainers that said hello one at a time.
"""

from __future__ import annotations

import ipaddress
import multiprocessing as mp
import os
import queue
import shutil
import socket
import tempfile
import threading
import time
import traceback
from dataclasses import dataclass, replace
from pathlib import Path

from searchrl.errors import SearchRLError
from searchrl.rollout import wire
from searchrl.rollout.weight_broadcast import GroupAddress
from searchrl.rollout.weights import published_path, version_of
from searchrl.rollout.wire import Hello, Link, Weights, WireError
from searchrl.rollout.worker_config import WorkerConfig
from searchrl.rollout.worker_process import Failed, worker_main

KEY_ENV = "SEARCHRL_WORKER_KEY"
INSECURE_FLAG = "--insecure-no-key"
# Connections the server handshakes with at once; more wait in the listen backlog, which holds as many.
MAX_PENDING = 32


@dataclass(frozen=True)
class Lost:
    """A worker gone: `why` completes "the rollout worker ... <why>"."""

    why: str


def parse_address(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise SearchRLError(f"{address!r} is not host:port (e.g. 127.0.0.1:7001)")
    return host, int(port)


def _loopback(host: str) -> bool:
    try:
        return host == "localhost" or ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def authkey(host: str, what: str) -> bytes | None:
    """The connection key from SEARCHRL_WORKER_KEY; refused when missing for a host that is not loopback."""
    key = os.environ.get(KEY_ENV)
    if key:
        return key.encode()
    if not _loopback(host):
        raise SearchRLError(f"{what}: {host} is not a loopback address, so the connection must be authenticated: "
                            f"set the same secret in {KEY_ENV} on the trainer and the worker")
    return None


def server_key(host: str, listen: str, insecure_no_key: bool) -> bytes | None:
    """The key `rollout serve` authenticates trainers with. Without one it refuses to start unless
    told `--insecure-no-key`, and even then off loopback: any local user could then drive it."""
    key = os.environ.get(KEY_ENV)
    if key:
        return key.encode()
    if not insecure_no_key:
        raise SearchRLError(f"rollout serve --listen {listen}: no key: set {KEY_ENV} to a secret (the same on the trainer) "
                            f"so that only your trainers can drive this worker, or pass {INSECURE_FLAG} to let any "
                            "local user connect")
    if not _loopback(host):
        raise SearchRLError(f"rollout serve --listen {listen}: {INSECURE_FLAG} serves loopback addresses only; "
                            f"set {KEY_ENV} to listen on {host}")
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
        try:
            self._conn.send(Hello(cfg, group))
        except OSError as e:
            self._conn.close()
            raise SearchRLError(f"the rollout worker at {address} closed the connection after the handshake ({e})") from None
        threading.Thread(target=self._forward, args=(index, inbox), daemon=True).start()

    def send(self, order, folder: Path | None, drop_below: int) -> None:
        if self._files and order is not None and order.version != self._sent_version:
            self._conn.send(Weights(order.version, published_path(folder, order.version).read_bytes(), drop_below))
            self._sent_version = order.version
        self._conn.send(order)

    def _forward(self, index: int, inbox: queue.Queue) -> None:
        try:
            while True:
                inbox.put((index, self._conn.recv(wire.TO_TRAINER)))
        except WireError as e:
            if not self._closing.is_set():
                inbox.put((index, Lost(f"sent what the trainer refuses ({e}); the connection is dropped")))
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


def _connect(address: str, where: tuple[str, int], key: bytes | None, patience_s: float) -> Link:
    """An authenticated connection to the worker at `where`, retried each second for `patience_s` seconds."""
    deadline, tries = time.monotonic() + patience_s, 0
    while True:
        tries += 1
        try:
            link = Link(socket.create_connection(where, timeout=wire.HANDSHAKE_S))
        except OSError as e:
            failure: Exception = e
        else:
            link.deadline = time.monotonic() + wire.HANDSHAKE_S
            try:
                wire.client_handshake(link, key, address, KEY_ENV)
            except WireError:  # refused, or a peer that is no rollout worker: no retry helps
                link.close()
                raise
            except (EOFError, OSError) as e:  # a server busy or restarting: tried again
                link.close()
                failure = e
            else:
                link.deadline = None
                link.sock.settimeout(None)
                return link
        if time.monotonic() >= deadline:
            raise SearchRLError(
                f"cannot reach the rollout worker at {address} ({failure}) after {tries} tries in {patience_s:g} s "
                f"(rollout.worker_connect_s): start it there with `searchrl rollout serve --listen {address}`, "
                "or fix rollout.worker_addresses") from None
        time.sleep(1.0)


# -- the worker's side: `searchrl rollout serve` ----------------------------------------------------


class _Replies:
    """The worker loop's `results`: sent back over the connection; a trainer gone is no error here
    (its orders end with None)."""

    def __init__(self, conn: Link) -> None:
        self._conn = conn

    def put(self, msg) -> None:
        try:
            self._conn.send(msg)
        except OSError:
            pass


def _say(line: str) -> None:
    print(f"rollout worker: {line}", flush=True)


class WorkerServer:
    """Trainers' connections at (`host`, `port`): each is handshaken (`wire.server_handshake` with
    `key`) and its hello read in a thread of its own, within `handshake_s` in all, at most
    `MAX_PENDING` at once (the listen backlog holds more); those that said hello wait in `hellos`
    as (link, hello, the trainer's host), to be served one at a time. A connection that fails the
    handshake, sends anything else or stays silent is dropped with a line saying why."""

    def __init__(self, host: str, port: int, key: bytes | None, handshake_s: float = wire.HANDSHAKE_S) -> None:
        family = socket.AF_INET6 if ":" in host.strip("[]") else socket.AF_INET
        self._sock = socket.create_server((host.strip("[]"), port), family=family, backlog=MAX_PENDING)
        self.address: tuple[str, int] = self._sock.getsockname()[:2]
        self.key, self.handshake_s = key, handshake_s
        self.hellos: queue.Queue[tuple[Link, Hello, str]] = queue.Queue()
        self._slots = threading.BoundedSemaphore(MAX_PENDING)
        self._closed = threading.Event()
        threading.Thread(target=self._accept, name="rollout-serve-accept", daemon=True).start()

    def _accept(self) -> None:
        while not self._closed.is_set():
            self._slots.acquire()
            try:
                sock, peer = self._sock.accept()
            except OSError:  # the listening socket closed
                self._slots.release()
                return
            threading.Thread(target=self._greet, args=(sock, peer[0]), name="rollout-serve-handshake", daemon=True).start()

    def _greet(self, sock: socket.socket, peer: str) -> None:
        link = Link(sock)
        link.deadline = time.monotonic() + self.handshake_s
        try:
            wire.server_handshake(link, self.key)
            hello = link.recv(("hello",), wire.HANDSHAKE_HEADER)
            link.deadline = None
            link.sock.settimeout(None)
            self.hellos.put((link, hello, peer))
        except (WireError, EOFError, OSError) as e:
            why = f"no handshake within {self.handshake_s:g} s" if isinstance(e, TimeoutError) else f"{type(e).__name__}: {e}"
            _say(f"refused a connection from {peer} ({why})")
            link.close()
        finally:
            self._slots.release()

    def close(self) -> None:
        self._closed.set()
        self._sock.close()


def serve(listen: str, overrides: list[str], insecure_no_key: bool = False) -> None:
    """Serve trainers at `listen` (host:port; port 0 picks a free one), one at a time, until
    interrupted: each gets a rollout worker running the config it sends, with `overrides`
    (key=value of `WorkerConfig`: what is local to this machine, such as `device` or
    `rollout.worker_cpus`) applied. Without SEARCHRL_WORKER_KEY it refuses to start unless
    `insecure_no_key` (`--insecure-no-key`), on a loopback address."""
    host, port = parse_address(listen)
    key = server_key(host, listen, insecure_no_key)
    try:
        server = WorkerServer(host, port, key)
    except OSError as e:
        raise SearchRLError(f"rollout serve --listen {listen}: cannot listen there ({e})") from None
    print(f"rollout worker listening on {host}:{server.address[1]}", flush=True)
    if key is None:
        _say(f"serving without a key ({INSECURE_FLAG}): any user of this machine can connect")
    try:
        while True:
            link, hello, trainer_host = server.hellos.get()
            with link:
                _serve_trainer(link, hello, overrides, trainer_host)
    finally:
        server.close()


def served_config(sent, overrides: list[str]) -> WorkerConfig:
    """The config a served worker runs: the one the trainer `sent` (a WorkerConfig, or its JSON as
    it came over the wire), as one worker with no placement of the trainer's machine, then this
    machine's `overrides` (key=value), validated."""
    from pydantic import ValidationError

    from searchrl.config import deep_merge, parse_overrides

    if isinstance(sent, dict):
        try:
            sent = WorkerConfig.model_validate(sent)
        except ValidationError as e:
            first = e.errors()[0]
            raise SearchRLError(f"the trainer sent a config this rollout worker cannot run ({'.'.join(map(str, first['loc']))}: "
                                f"{first['msg']}): do the two run different versions of searchrl? Install the same one on "
                                "both machines") from None
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


def _serve_trainer(conn: Link, hello: Hello, overrides: list[str], trainer_host: str) -> None:
    try:
        cfg = served_config(hello.cfg, overrides)
    except SearchRLError as e:
        _Replies(conn).put(Failed(str(e)))
        return
    # The weights come as files over the connection, or by broadcast (then no folder at all).
    folder = Path(tempfile.mkdtemp(prefix="searchrl-worker-weights-")) if hello.group is None else None
    orders: queue.Queue = queue.Queue()
    threading.Thread(target=_receive_orders, args=(conn, folder, orders), daemon=True).start()
    _say(f"serving a trainer from {trainer_host} (run {cfg.run})")
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
    _say("the trainer is done; waiting for the next")


def _receive_orders(conn: Link, folder: Path | None, orders: queue.Queue) -> None:
    """The trainer's messages: weights become published files in `folder` (the trainer sends
    none when it broadcasts them), orders go to the loop; a trainer gone, or one that sends what
    this side refuses, ends the loop as its None would."""
    try:
        while True:
            msg = conn.recv(("weights", "order", "close"))
            if isinstance(msg, Weights):
                if folder is None:
                    raise WireError("weights over the connection, which this run receives by broadcast")
                path = published_path(folder, msg.version)
                tmp = path.with_name(f".{path.name}.tmp")
                tmp.write_bytes(msg.data)
                tmp.replace(path)
                for old in folder.glob("weights-*.safetensors"):
                    if version_of(old) < msg.drop_below:
                        old.unlink(missing_ok=True)
                continue
            orders.put(msg)
            if msg is None:
                return
    except WireError as e:
        _say(f"dropped the trainer: it sent {e}")
        conn.close()
        orders.put(None)
    except (EOFError, OSError):
        orders.put(None)
