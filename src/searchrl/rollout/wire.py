"""What travels between a trainer and a rollout server (`searchrl rollout serve`,
`rollout.worker_links`): typed frames, nothing pickled, every one validated on read.

A frame is a fixed prefix — the magic `SRLW`, the header's length (4 bytes) and the blob's (8
bytes), big-endian — then a JSON header, then the blob: raw bytes, only in a `weights` message
(the published safetensors file, which the worker loads with safetensors). The header is one of a
closed set of messages, each with exact fields and types (`_MESSAGES`); anything else — another
format (a pickle), an unknown `type`, a missing, extra or mistyped field, JSON nested deeper
than the parser's limit, a header over its size limit, a blob where none belongs — is a
`WireError`, and the connection is dropped. Each side accepts only the messages meant for it.

A connection starts with a handshake: the server sends a challenge (a nonce, and whether it has
a key), the trainer answers with an HMAC-SHA256 of the nonce under `SEARCHRL_WORKER_KEY` and a
nonce of its own, and the server proves the key in turn (`server_handshake`, `client_handshake`).
A server started with `--insecure-no-key` says so in its challenge; a trainer with a key refuses
it, as it cannot prove it holds the key. The handshake and the trainer's hello must arrive within
`HANDSHAKE_S` (a deadline on the whole exchange, not on each read), so an idle or slow-dripping
connection cannot hold the server.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import socket
import struct
import threading
import time
from dataclasses import dataclass
from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError
from typing_extensions import Self

from searchrl.data.trajectory import Trajectory
from searchrl.data.types import Question
from searchrl.errors import SearchRLError
from searchrl.retrieval.querycache import RetrievalCounts
from searchrl.rollout.weight_broadcast import GroupAddress
from searchrl.rollout.worker_config import WorkerConfig
from searchrl.rollout.worker_process import Batch, Failed, Ready

PROTOCOL = "searchrl-rollout/1"
MAGIC = b"SRLW"
_PREFIX = struct.Struct(">4sIQ")  # magic, header bytes, blob bytes
MAX_HEADER = 1 << 30  # a batch of long trajectories is tens of MB
HANDSHAKE_HEADER = 1 << 20  # before and during the handshake: a challenge, an answer, a hello
HANDSHAKE_S = 10.0
_CHUNK = 1 << 20
_HEX64 = r"^[0-9a-f]{64}$"


class WireError(SearchRLError):
    """A frame this side refuses (module docstring), or a peer that is not a searchrl rollout peer."""


class AuthRefused(WireError):
    """The handshake failed: a key missing on one side, or not the same on both."""


# -- the messages ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Hello:
    """The trainer's first message to a remote worker: the config the worker runs (a `WorkerConfig`
    on the trainer's side, its JSON on the worker's: `served_config` validates it), and with
    `weight_transport: broadcast` the group it joins to receive the weights."""

    cfg: WorkerConfig | dict
    group: GroupAddress | None = None


@dataclass(frozen=True)
class Weights:
    """Policy `version`'s published file, for a worker without the trainer's filesystem; versions
    below `drop_below` are no order's any more and may go."""

    version: int
    data: bytes
    drop_below: int


@dataclass(frozen=True)
class Order:
    """One step's batch: `n` rollouts of each question, sampled with `seed` by policy `version`.
    Under torchrun a step has one order per training rank (`part`: the rank), collected in order."""

    step: int
    questions: list[Question]
    n: int
    seed: int
    version: int
    part: int = 0


class _Frame(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, ser_json_inf_nan="constants")


class _Challenge(_Frame):
    type: Literal["challenge"] = "challenge"
    protocol: str = Field(max_length=100)
    nonce: str = Field(pattern=_HEX64)
    auth: bool


class _Answer(_Frame):
    type: Literal["answer"] = "answer"
    protocol: str = Field(max_length=100)
    nonce: str | None = Field(None, pattern=_HEX64)
    mac: str | None = Field(None, pattern=_HEX64)


class _Welcome(_Frame):
    type: Literal["welcome"] = "welcome"
    mac: str | None = Field(None, pattern=_HEX64)


class _Refused(_Frame):
    type: Literal["refused"] = "refused"
    why: str = Field(max_length=2000)


class _Hello(_Frame):
    type: Literal["hello"] = "hello"
    cfg: dict[str, Any]
    group: GroupAddress | None


class _Weights(_Frame):
    type: Literal["weights"] = "weights"
    version: int = Field(ge=0)
    drop_below: int
    size: int = Field(ge=0)


class _Order(_Frame):
    type: Literal["order"] = "order"
    step: int
    questions: list[Question]
    n: int = Field(ge=1)
    seed: int
    version: int = Field(ge=0)
    part: int = Field(ge=0)


class _Close(_Frame):
    type: Literal["close"] = "close"


class _Ready(_Frame):
    type: Literal["ready"] = "ready"
    tools: list[str]


class _Batch(_Frame):
    type: Literal["batch"] = "batch"
    key: tuple[int, int]
    trajectories: list[Trajectory]
    searched: RetrievalCounts
    spent: dict[str, float]


class _Failed(_Frame):
    type: Literal["failed"] = "failed"
    error: str


_MESSAGES = (_Challenge, _Answer, _Welcome, _Refused, _Hello, _Weights, _Order, _Close, _Ready, _Batch, _Failed)
_ANY = TypeAdapter(Annotated[Union[_MESSAGES], Field(discriminator="type")])  # noqa: UP007 (a tuple of classes)

# What each side reads: the trainer's link and the worker's server never take the other's messages.
TO_WORKER = ("hello", "weights", "order", "close")
TO_TRAINER = ("ready", "batch", "failed")


def _encode(msg) -> tuple[_Frame, bytes]:
    """(header, blob) of one of the messages above (None: the trainer is done)."""
    if msg is None:
        return _Close(), b""
    if isinstance(msg, _Frame):
        return msg, b""
    if isinstance(msg, Hello):
        cfg = msg.cfg.model_dump(mode="json") if isinstance(msg.cfg, WorkerConfig) else dict(msg.cfg)
        return _Hello(cfg=cfg, group=msg.group), b""
    if isinstance(msg, Weights):
        return _Weights(version=msg.version, drop_below=msg.drop_below, size=len(msg.data)), msg.data
    if isinstance(msg, Order):
        return _Order.model_construct(type="order", step=msg.step, questions=msg.questions, n=msg.n, seed=msg.seed,
                                      version=msg.version, part=msg.part), b""
    if isinstance(msg, Ready):
        return _Ready(tools=list(msg.tools)), b""
    if isinstance(msg, Batch):  # built by this process: not validated again on the way out
        return _Batch.model_construct(type="batch", key=tuple(msg.key), trajectories=msg.trajectories,
                                      searched=msg.searched, spent=dict(msg.spent)), b""
    if isinstance(msg, Failed):
        return _Failed(error=msg.error), b""
    raise TypeError(f"{type(msg).__name__} is not a rollout wire message")


def _decode(frame: _Frame, blob: bytes):
    """The message object of a validated header (and its blob)."""
    if isinstance(frame, _Close):
        return None
    if isinstance(frame, _Hello):
        return Hello(frame.cfg, frame.group)
    if isinstance(frame, _Weights):
        return Weights(frame.version, blob, frame.drop_below)  # the bytes as read (a bytearray)
    if isinstance(frame, _Order):
        return Order(frame.step, frame.questions, frame.n, frame.seed, frame.version, frame.part)
    if isinstance(frame, _Ready):
        return Ready(frame.tools)
    if isinstance(frame, _Batch):
        return Batch(frame.key, frame.trajectories, frame.searched, frame.spent)
    if isinstance(frame, _Failed):
        return Failed(frame.error)
    return frame  # the handshake's own


def parse_header(raw: bytes, accepts: tuple[str, ...]) -> _Frame:
    """The message in a frame's header `raw`, if it is one of `accepts`; `WireError` otherwise."""
    try:
        frame = _ANY.validate_json(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(map(str, first["loc"])) or "the header"
        raise WireError(f"a message that is not one of this side's ({where}: {first['msg']})") from None
    if frame.type not in accepts:
        raise WireError(f"a {frame.type} message where only {', '.join(accepts)} may come")
    return frame


class Link:
    """A connection that sends and receives the messages above. `deadline` (monotonic time, or
    None) bounds every read and write until it is cleared: the handshake's."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.deadline: float | None = None
        self._sending = threading.Lock()
        sock.settimeout(None)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()

    def _clock(self) -> None:
        if self.deadline is not None:
            left = self.deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("the handshake's deadline passed")
            self.sock.settimeout(left)

    def send(self, msg) -> None:
        header, blob = _encode(msg)
        raw = header.model_dump_json().encode()
        view = memoryview(blob)
        with self._sending:
            self._clock()
            self.sock.sendall(_PREFIX.pack(MAGIC, len(raw), len(blob)) + raw)
            for at in range(0, len(blob), _CHUNK):
                self._clock()
                self.sock.sendall(view[at:at + _CHUNK])

    def recv(self, accepts: tuple[str, ...], max_header: int = MAX_HEADER):
        """The next message, one of `accepts` (by type); EOFError when the peer has closed."""
        magic, size, blob_size = _PREFIX.unpack(self._read(_PREFIX.size, start=True))
        if magic != MAGIC:
            raise WireError("a peer that does not speak searchrl's rollout wire format (not a trainer or worker of "
                            "searchrl 0.1 or later: a pickle, HTTP, another program)")
        if size > max_header:
            raise WireError(f"a header of {size:,} bytes, over the limit of {max_header:,}")
        frame = parse_header(self._read(size), accepts)
        wanted = frame.size if isinstance(frame, _Weights) else 0
        if blob_size != wanted:
            raise WireError(f"a {frame.type} message with {blob_size:,} bytes of data where {wanted:,} belong")
        return _decode(frame, self._read(blob_size) if blob_size else b"")

    def _read(self, n: int, start: bool = False) -> bytearray:
        buf = bytearray()  # grown as bytes arrive: a size a peer claims is never allocated up front
        while len(buf) < n:
            self._clock()
            chunk = self.sock.recv(min(n - len(buf), _CHUNK))
            if not chunk:
                if start and not buf:
                    raise EOFError("end of stream")
                raise EOFError(f"the peer closed the connection mid-message ({len(buf)} of {n} bytes)")
            buf += chunk
        return buf


# -- the handshake ---------------------------------------------------------------------------------


def _mac(key: bytes, role: str, nonce: str) -> str:
    return hmac.new(key, f"{PROTOCOL} {role} {nonce}".encode(), hashlib.sha256).hexdigest()


def server_handshake(link: Link, key: bytes | None) -> None:
    """The worker's side: challenge the peer, check its answer (with a key), prove the key in turn."""
    nonce = secrets.token_hex(32)
    link.send(_Challenge(protocol=PROTOCOL, nonce=nonce, auth=key is not None))
    answer = link.recv(("answer",), HANDSHAKE_HEADER)
    if answer.protocol != PROTOCOL:
        why = f"this worker speaks {PROTOCOL}, the trainer {answer.protocol}: install the same searchrl on both machines"
        link.send(_Refused(why=why))
        raise WireError(why)
    if key is not None:
        if answer.mac is None or answer.nonce is None or not hmac.compare_digest(answer.mac, _mac(key, "trainer", nonce)):
            link.send(_Refused(why="wrong or missing key: set the worker's SEARCHRL_WORKER_KEY on the trainer"))
            raise AuthRefused("a peer without the key (its answer to the challenge is wrong)")
        link.send(_Welcome(mac=_mac(key, "worker", answer.nonce)))
    else:
        link.send(_Welcome())


def client_handshake(link: Link, key: bytes | None, address: str, key_env: str) -> None:
    """The trainer's side: answer the worker at `address`'s challenge, check its proof of the key."""
    try:
        challenge = link.recv(("challenge",), HANDSHAKE_HEADER)
    except WireError as exc:
        raise WireError(f"{address} is not a rollout worker this trainer can use: it sent {exc}") from None
    if challenge.protocol != PROTOCOL:
        raise WireError(f"the rollout worker at {address} speaks {challenge.protocol}, this trainer {PROTOCOL}: "
                        "install the same searchrl on both machines")
    if challenge.auth and key is None:
        raise AuthRefused(f"the rollout worker at {address} requires a key: set {key_env} here to the secret it was "
                          "started with")
    if not challenge.auth and key is not None:
        raise AuthRefused(f"the rollout worker at {address} runs without a key (--insecure-no-key), so it cannot prove "
                          f"it is yours: start it with {key_env} set to this trainer's secret")
    mine = secrets.token_hex(32) if key is not None else None
    link.send(_Answer(protocol=PROTOCOL, nonce=mine, mac=_mac(key, "trainer", challenge.nonce) if key else None))
    try:
        reply = link.recv(("welcome", "refused"), HANDSHAKE_HEADER)
    except WireError as exc:
        raise WireError(f"the rollout worker at {address} answered the handshake with {exc}") from None
    if isinstance(reply, _Refused):
        raise AuthRefused(f"the rollout worker at {address} refused the trainer: {reply.why}")
    if key is not None and (reply.mac is None or not hmac.compare_digest(reply.mac, _mac(key, "worker", mine))):
        raise AuthRefused(f"the rollout worker at {address} did not prove it holds the key in {key_env}: "
                          "set the same secret on both machines")
