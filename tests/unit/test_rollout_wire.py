"""`searchrl rollout serve` and its wire (`rollout.wire`): typed frames, nothing unpickled; a key
required unless `--insecure-no-key`; a handshake deadline, and connections handshaken side by
side so that an idle one never holds the next trainer."""

from __future__ import annotations

import json
import math
import os
import pickle
import queue
import re
import socket
import struct
import threading
import time
from multiprocessing.connection import Client
from pathlib import Path

import pytest

from searchrl import cli
from searchrl.data.trajectory import Segment, Trajectory
from searchrl.data.types import Question
from searchrl.errors import EXIT_USAGE, SearchRLError
from searchrl.retrieval.querycache import RetrievalCounts
from searchrl.rl.config import TrainConfig
from searchrl.rollout import wire
from searchrl.rollout import worker_links as links
from searchrl.rollout.weight_broadcast import GroupAddress
from searchrl.rollout.wire import Hello, Link, Order, Weights, WireError
from searchrl.rollout.worker_process import Batch, Failed, Ready

ROOT = Path(__file__).resolve().parents[2]
KEY = b"test-key"


class Payload:
    """What a hostile client sends: unpickling it would create `path`."""

    def __init__(self, path: Path) -> None:
        self.path = str(path)

    def __reduce__(self):
        return (os.system, (f"touch {self.path}",))


def _worker_cfg(address: str = "127.0.0.1:7001"):
    return TrainConfig(out="runs/x", rollout={"mode": "async", "workers": 0, "worker_addresses": [address]}).worker_config()


@pytest.fixture
def server(request):
    """A `WorkerServer` in this process (no worker behind it: the test reads its hellos), with a key
    unless the test is parametrized with None, and a 1 s handshake deadline."""
    key = getattr(request, "param", KEY)
    srv = links.WorkerServer("127.0.0.1", 0, key, handshake_s=1.0)
    yield srv
    srv.close()


def _address(srv) -> str:
    return f"127.0.0.1:{srv.address[1]}"


def _pair() -> tuple[Link, Link]:
    a, b = socket.socketpair()
    return Link(a), Link(b)


def _trajectory() -> Trajectory:
    return Trajectory("q1", "Which river?", [1, 2, 3], [4, 5, 6, 7], [1, 1, 0, 1], [-0.25, -1e-9, 0.0, -math.inf],
                      [Segment("<search>x</search>", "policy"), Segment("docs", "env")], queries=["x"],
                      retrieved_ids=[["p1", "p2"]], search_blocks=[0], n_searches=1, answer="Tessaly", stop_reason="answer",
                      tool_calls=[{"name": "search", "arguments": {"query": "x", "deep": [[{"a": None}]]}, "ok": True, "error": None}],
                      timing={"tools/search_s": 0.5}, policy_version=3, token_versions=[3, 3, 3, 4])


# -- the format ------------------------------------------------------------------------------------


def test_every_message_goes_over_the_wire_and_comes_back_equal():
    trainer, worker = _pair()
    questions = [Question("q1", "Which river?", ("Tessaly", "the Tessaly"), ("p1",), "bridge", "toy", ("It flows.",))]
    cfg = _worker_cfg()
    sent_to_worker = [Hello(cfg, GroupAddress(None, 29500, 1, 2, "gloo")), Weights(2, b"\x00safetensors\xff" * 1000, 1),
                      Order(4, questions, 3, 1234, 2, 1), None]
    for msg in sent_to_worker:
        trainer.send(msg)
    got = [worker.recv(wire.TO_WORKER) for _ in sent_to_worker]
    assert got[0].cfg == cfg.model_dump(mode="json") and got[0].group == sent_to_worker[0].group
    assert links.served_config(got[0].cfg, []).run == "runs/x"  # what the server validates and runs
    assert (got[1].version, bytes(got[1].data), got[1].drop_below) == (2, sent_to_worker[1].data, 1)
    assert got[2] == sent_to_worker[2] and got[3] is None

    sent_to_trainer = [Ready(["search", "open"]), Batch((4, 1), [_trajectory()], RetrievalCounts(2, 1, 0.5, True), {"usd": 0.01}),
                       Failed("Traceback ...\nValueError: x")]
    for msg in sent_to_trainer:
        worker.send(msg)
    back = [trainer.recv(wire.TO_TRAINER) for _ in sent_to_trainer]
    assert back[0] == sent_to_trainer[0] and back[2] == sent_to_trainer[2]
    assert back[1].key == (4, 1) and back[1].searched == sent_to_trainer[1].searched and back[1].spent == {"usd": 0.01}
    assert back[1].trajectories[0].to_dict() == _trajectory().to_dict()  # -inf log-probs and nested arguments too
    worker.close()
    with pytest.raises(EOFError):
        trainer.recv(wire.TO_TRAINER)


def _frame(header: bytes, blob: bytes = b"", magic: bytes = wire.MAGIC) -> bytes:
    return struct.pack(">4sIQ", magic, len(header), len(blob)) + header + blob


@pytest.mark.parametrize(("raw", "why"), [
    (_frame(b'{"type": "order", "step": "4", "questions": [], "n": 1, "seed": 0, "version": 0, "part": 0}'), "order.step"),
    (_frame(b'{"type": "order", "step": true, "questions": [], "n": 1, "seed": 0, "version": 0, "part": 0}'), "order.step"),
    (_frame(b'{"type": "order", "step": 4, "questions": [{"id": 1}], "n": 1, "seed": 0, "version": 0, "part": 0}'), "questions"),
    (_frame(b'{"type": "order", "step": 4, "questions": [], "n": 1, "seed": 0, "version": 0, "part": 0, "x": 1}'), "order.x"),
    (_frame(b'{"type": "order", "step": 4, "questions": [], "n": 1, "seed": 0, "version": 0, "part": 0}', b"x"), "1 bytes of data"),
    (_frame(b'{"type": "weights", "version": 1, "drop_below": 0, "size": 5}', b"abc"), "3 bytes of data where 5"),
    (_frame(b'{"type": "pickle"}'), "does not match any of the expected tags"),
    (_frame(b'{"type": "ready", "tools": []}'), "a ready message where only hello, weights, order, close"),
    (_frame(b"[" * 5000 + b"]" * 5000), "recursion limit"),
    (_frame(b"\xff\xfe not json"), "Invalid JSON"),
    (_frame(pickle.dumps({"type": "close"})), "Invalid JSON"),
    (pickle.dumps(("x", 1)), "does not speak searchrl's rollout wire format"),
    (struct.pack(">4sIQ", wire.MAGIC, wire.MAX_HEADER + 1, 0), "over the limit"),
])
def test_what_is_not_one_of_the_closed_set_of_messages_is_refused(raw, why):
    a, b = socket.socketpair()
    with Link(b) as link:
        a.sendall(raw)
        with pytest.raises(WireError, match=re.escape(why)):
            link.recv(wire.TO_WORKER)
    a.close()


def test_no_pickle_in_the_rollout_wire_code():
    rollout = ROOT / "src" / "searchrl" / "rollout"
    for name in ("wire.py", "worker_links.py", "worker_process.py", "weights.py", "weight_broadcast.py"):
        text = (rollout / name).read_text()
        assert not re.search(r"^\s*(import|from)\s+(pickle|cPickle|dill|cloudpickle|multiprocessing\.connection)\b", text, re.MULTILINE), name
        assert "pickle.load" not in text and "torch.load" not in text and "Listener(" not in text, name


# -- the server ------------------------------------------------------------------------------------


def test_serve_without_a_key_refuses_to_start_unless_told_so(monkeypatch, capsys):
    monkeypatch.delenv(links.KEY_ENV, raising=False)
    assert cli.run(["rollout", "serve", "--listen", "127.0.0.1:0"]) == EXIT_USAGE
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and "no key: set SEARCHRL_WORKER_KEY" in lines[0] and "--insecure-no-key" in lines[0], captured
    assert "listening" not in captured.out
    assert links.server_key("127.0.0.1", "127.0.0.1:0", insecure_no_key=True) is None
    with pytest.raises(SearchRLError, match="--insecure-no-key serves loopback addresses only"):
        links.server_key("0.0.0.0", "0.0.0.0:7001", insecure_no_key=True)
    monkeypatch.setenv(links.KEY_ENV, "s3cret")
    assert links.server_key("0.0.0.0", "0.0.0.0:7001", insecure_no_key=False) == b"s3cret"


@pytest.mark.parametrize("server", [KEY, None], indirect=True, ids=["key", "insecure"])
def test_a_pickle_payload_sent_to_the_server_never_runs(server, tmp_path, capfd):
    ran = tmp_path / "ran"
    # As the previous wire would have taken it: multiprocessing's length-prefixed pickle.
    with Client(server.address) as conn:
        conn.send(Payload(ran))
        with pytest.raises((EOFError, OSError)):
            while True:
                conn.recv_bytes()  # the challenge, then the end: the server dropped it
    # Framed as a header, after a handshake that passed (the insecure server asks for no key).
    if server.key is None:
        with Link(socket.create_connection(server.address)) as link:
            wire.client_handshake(link, None, _address(server), links.KEY_ENV)
            link.sock.sendall(_frame(pickle.dumps(Payload(ran))))
            with pytest.raises(EOFError):
                link.recv(wire.TO_TRAINER)
    # And to a served trainer's order loop, once its hello was accepted.
    trainer, worker = _pair()
    orders: queue.Queue = queue.Queue()
    trainer.sock.sendall(_frame(pickle.dumps(Payload(ran))))
    links._receive_orders(worker, tmp_path, orders)
    assert orders.get(timeout=5) is None  # the loop ends as a trainer's None would end it
    time.sleep(0.2)
    assert not ran.exists()
    assert server.hellos.empty()
    err = capfd.readouterr().out
    assert "refused a connection from 127.0.0.1 (WireError: a peer that does not speak searchrl's rollout wire format" in err
    assert "dropped the trainer: it sent a message that is not one of this side's" in err


def test_an_idle_connection_does_not_block_the_next_trainer_and_is_dropped_at_the_deadline(server):
    idle = [socket.create_connection(server.address) for _ in range(5)]  # several pending at once
    started = time.monotonic()
    link = links._connect(_address(server), server.address, KEY, patience_s=5)
    link.send(Hello(_worker_cfg(_address(server))))
    served, hello, host = server.hellos.get(timeout=5)
    assert time.monotonic() - started < 0.5 and hello.cfg["run"] == "runs/x" and host == "127.0.0.1"
    served.send(Ready(["search"]))
    assert link.recv(wire.TO_TRAINER) == Ready(["search"])
    for sock in idle:  # the challenge, then closed once the 1 s deadline passed
        sock.settimeout(5)
        data = b""
        while chunk := sock.recv(4096):
            data += chunk
        assert data.startswith(wire.MAGIC) and b'"challenge"' in data
        sock.close()
    assert time.monotonic() - started >= 0.9
    link.close()
    served.close()


def test_a_slow_drip_handshake_is_cut_at_the_deadline(server):
    sock = socket.create_connection(server.address)
    sock.settimeout(5)
    sock.recv(4096)  # the challenge
    started, closed = time.monotonic(), False
    answer = _frame(json.dumps({"type": "answer", "protocol": wire.PROTOCOL, "nonce": None, "mac": None}).encode())
    for byte in answer:  # one byte every 0.2 s: each read is quick, the whole is not
        try:
            sock.sendall(bytes([byte]))
        except OSError:
            closed = True
            break
        time.sleep(0.2)
        if time.monotonic() - started > 3:
            break
    if not closed:
        assert sock.recv(4096) == b""
    assert time.monotonic() - started < 3
    sock.close()


@pytest.mark.parametrize("server", [KEY, None], indirect=True, ids=["key", "insecure"])
def test_keys_that_do_not_match_are_refused_on_both_sides(server):
    address = _address(server)
    if server.key is None:
        with pytest.raises(SearchRLError, match="runs without a key .* cannot prove it is yours"):
            links._connect(address, server.address, KEY, patience_s=2)
        assert links._connect(address, server.address, None, patience_s=2) is not None  # loopback, both without a key
        return
    with pytest.raises(SearchRLError, match=f"requires a key: set {links.KEY_ENV}"):
        links._connect(address, server.address, None, patience_s=2)
    with pytest.raises(SearchRLError, match="refused the trainer: wrong or missing key"):
        links._connect(address, server.address, b"another key", patience_s=2)
    assert server.hellos.empty()


def test_a_trainer_reaching_something_else_says_so():
    with socket.create_server(("127.0.0.1", 0)) as other:
        port = other.getsockname()[1]

        def answer():
            conn, _ = other.accept()
            conn.sendall(b"HTTP/1.1 400 Bad Request\r\n\r\n")
            conn.close()

        threading.Thread(target=answer, daemon=True).start()
        with pytest.raises(SearchRLError, match=rf"127.0.0.1:{port} is not a rollout worker this trainer can use: it sent a peer "
                                                "that does not speak"):
            links._connect(f"127.0.0.1:{port}", ("127.0.0.1", port), KEY, patience_s=2)


def test_a_config_the_worker_cannot_run_is_refused_with_the_field():
    sent = _worker_cfg().model_dump(mode="json")
    with pytest.raises(SearchRLError, match=r"cannot run \(rollout.k: .*different versions of searchrl"):
        links.served_config({**sent, "rollout": {**sent["rollout"], "k": "many"}}, [])
    with pytest.raises(SearchRLError, match=r"cannot run \(stage1: Extra inputs"):
        links.served_config({**sent, "stage1": {}}, [])
