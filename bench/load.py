"""The retrieval server under training load: a concurrency sweep of `searchrl serve` on loopback.

Two servers over the same index run as subprocesses (`searchrl serve`, 127.0.0.1):
- baseline: one uvicorn worker, no batching, no cache (`--workers 1 --batch-window-ms 0
  --cache-size 0`): each request searched alone, under the lock, as the server was before;
- server: `--workers W` (default 2) with the 2 ms batching window and the shared result cache.
For each batch size (1, 64) and number of concurrent clients (1, 4, 16, 64, 256) both get the same
traffic, one right after the other (so background load hits both alike); the server's cache is
emptied (`DELETE /cache`) before each of its cells, as a new training step brings new questions.

Traffic, and what is assumed:
- queries: the released R1-Searcher (Qwen-2.5-7B) model's own queries on HotpotQA-500 (1,055 from
  489 rollouts, shared/data/r1-searcher-results), one list of hops per question; when a cell needs
  more distinct questions, R1-Searcher's Stage-2 training questions follow, asked verbatim (one hop);
- a group is the 16 rollouts of one question (R1-Searcher's samples per prompt). At each hop a
  rollout sends the question's query with probability --repeat, otherwise that query with one word
  left out (the word picked per rollout, so some variants coincide). How often real rollouts repeat
  a query is not measured here (the released outputs hold one rollout per question): 0.5 is an
  assumption. A control cell (64 clients, batch 1, groups of 1: no two rollouts share a question)
  shows the gain without any repeated query;
- batch 1: a client is one rollout (16 consecutive clients form a group) sending one query per
  request; batch 64: a client is a rollout worker holding 4 groups, sending their 64 queries of
  one hop per request.
A cell issues requests for --seconds (at most --max-requests), waits for those in flight, and
reports queries/s (completed queries over the cell's wall time), p50/p99 request latency, errors
(transport failures, non-200 answers, wrong result counts: no retries) and the server's cache hit
rate over the cell (/stats; repeats inside one request count as hits). The load generator runs in
this process, on the same machine as the servers. With --auth both servers require a bearer
token (`serve --api-key-env`, a random one) and every request carries it.
Last line: `name=value` pairs, ratios first.

    python bench/load.py [--kind bm25|dense] [--workers 2] [--concurrency 1,4,16,64,256]
                         [--batches 1,64] [--seconds 4] [--repeat 0.5] [--k 3] [--auth]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import secrets
import socket
import statistics
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
from pydantic_core import from_json, to_json
from retrieval import ensure_index, load_corpus, process_cpu_s, start_server

from searchrl.paths import shared_data

GROUP = 16  # rollouts per question (R1-Searcher's samples per prompt)
QUERY = re.compile(r"<\|begin_of_query\|>(.*?)<\|end_of_query\|>", re.DOTALL)
CONTENT_LENGTH = re.compile(rb"(?i)\r\ncontent-length:\s*(\d+)")
TOKEN_ENV = "SEARCHRL_BENCH_TOKEN"  # --auth: the servers read their token from here
AUTH: dict[str, str] = {}  # the headers every request carries: {} or the bearer token


def load_pool(data: Path) -> tuple[list[list[str]], int]:
    """Questions as lists of hop queries: the released model's own queries first, then Stage-2
    training questions verbatim; and how many of the first kind there are."""
    pool = []
    with open(data / "r1-searcher-results" / "hotpotqa_qwen.jsonl") as f:
        for line in f:
            hops = [" ".join(q.split()) for q in QUERY.findall(json.loads(line)["gen_text_store"])]
            if any(hops):
                pool.append([q for q in hops if q])
    searched = len(pool)
    with open(data / "r1-searcher-train" / "stage_2.jsonl") as f:
        pool += [[" ".join(json.loads(line)["question"].split())] for line in f]
    return pool, searched


class Traffic:
    """Which query each rollout sends at each hop (see the module docstring)."""

    def __init__(self, pool: list[list[str]], group: int, repeat: float, seed: int = 0) -> None:
        self.pool, self.group, self.repeat, self.seed = pool, group, repeat, seed
        self._assigned: dict[
            tuple[int, int], int
        ] = {}  # (group id, its j-th question) -> pool index
        self._lock = threading.Lock()
        self.questions = 0  # distinct questions handed out in this cell

    def question(self, group_id: int, j: int) -> int:
        with self._lock:
            if (group_id, j) not in self._assigned:
                self._assigned[(group_id, j)] = self.questions % len(self.pool)
                self.questions += 1
            return self._assigned[(group_id, j)]

    def query(self, q: int, hop: int, rollout: int) -> str:
        canon = self.pool[q][hop]
        rng = random.Random((self.seed * 1_000_003 + q) * 1_009 + hop * 131 + rollout)
        words = canon.split()
        if rng.random() < self.repeat or len(words) < 3:
            return canon
        drop = rng.randrange(len(words))
        return " ".join(words[:drop] + words[drop + 1 :])


class Client:
    """The request stream of client `c`: one rollout (batch 1) or batch // group whole groups."""

    def __init__(self, traffic: Traffic, c: int, batch: int) -> None:
        self.t, self.batch = traffic, batch
        g = traffic.group
        if batch == 1:
            self.groups, self.rollouts = [c // g], [c % g]
        else:
            per = batch // g
            self.groups, self.rollouts = list(range(c * per, (c + 1) * per)), list(range(g))
        self.state = {gid: [0, 0] for gid in self.groups}  # group -> [j-th question, hop]

    def next_queries(self) -> list[str]:
        out = []
        for gid in self.groups:
            j, hop = self.state[gid]
            q = self.t.question(gid, j)
            out += [self.t.query(q, hop, r) for r in self.rollouts]
            self.state[gid] = [j + 1, 0] if hop + 1 >= len(self.t.pool[q]) else [j, hop + 1]
        return out


@dataclass
class Cell:
    queries: int = 0
    errors: int = 0
    latencies: list[float] = field(default_factory=list)
    wall_s: float = 0.0
    hit_rate: float | None = None  # cache hits (repeats inside a request included) per query
    unsearched: float | None = None  # share of queries without an index search of their own
    cpu_s: float = 0.0  # the server's CPU time (all its processes) during the cell
    client_cpu_s: float = 0.0  # this load generator's
    questions: int = 0
    first_error: str = ""

    @property
    def qps(self) -> float:
        return self.queries / self.wall_s if self.wall_s else 0.0


class Connection:
    """A keep-alive HTTP/1.1 connection that sends a POST and reads the answer's status and body
    (by Content-Length), nothing more: the load generator shares the machine with the servers, so
    it must cost little (http.client's header parsing made it a third of the CPU at batch 1)."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.sock: socket.socket | None = None
        self.buf = b""

    def post(self, path: str, body: bytes) -> tuple[int, bytes]:
        if self.sock is None:
            self.sock = socket.create_connection((self.host, self.port), timeout=300)
            self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        head = (
            f"POST {path} HTTP/1.1\r\nHost: {self.host}\r\nContent-Type: application/json\r\n"
            + "".join(f"{k}: {v}\r\n" for k, v in AUTH.items())
            + f"Content-Length: {len(body)}\r\n\r\n"
        )
        self.sock.sendall(head.encode() + body)
        while b"\r\n\r\n" not in self.buf:
            self._read()
        head_bytes, _, rest = self.buf.partition(b"\r\n\r\n")
        length = int(CONTENT_LENGTH.search(head_bytes).group(1))
        self.buf = rest
        while len(self.buf) < length:
            self._read()
        content, self.buf = self.buf[:length], self.buf[length:]
        return int(head_bytes[9:12]), content

    def _read(self) -> None:
        chunk = self.sock.recv(1 << 18)
        if not chunk:
            raise ConnectionError("the server closed the connection")
        self.buf += chunk

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()
        self.sock, self.buf = None, b""


def run_cell(
    url: str, traffic: Traffic, clients: int, batch: int, k: int, seconds: float, max_requests: int
) -> Cell:
    host, port = url.removeprefix("http://").split(":")
    cell, lock = Cell(), threading.Lock()
    issued = [0]
    start = threading.Barrier(clients + 1)
    stop = threading.Event()

    def client(c: int) -> None:
        stream = Client(traffic, c, batch)
        conn = Connection(host, int(port))
        start.wait()
        while not stop.is_set():
            with lock:
                if issued[0] >= max_requests:
                    return
                issued[0] += 1
            queries = stream.next_queries()
            body = to_json({"queries": queries, "k": k})
            t = time.perf_counter()
            try:
                status, content = conn.post("/search", body)
                if status != 200:
                    raise RuntimeError(f"HTTP {status}: {content[:200]!r}")
                if len(from_json(content)["results"]) != len(queries):
                    raise RuntimeError("wrong number of result lists")
            except Exception as exc:  # noqa: BLE001 - counted: a load test reports failures, it does not retry
                conn.close()
                conn = Connection(host, int(port))
                with lock:
                    cell.errors += 1
                    cell.first_error = cell.first_error or f"{type(exc).__name__}: {exc}"
                continue
            with lock:
                cell.latencies.append(time.perf_counter() - t)
                cell.queries += len(queries)
        conn.close()

    threads = [threading.Thread(target=client, args=(c,), daemon=True) for c in range(clients)]
    for t in threads:
        t.start()
    start.wait()
    began = time.perf_counter()
    stop.wait(seconds)
    stop.set()
    for t in threads:
        t.join(600)
    cell.wall_s = time.perf_counter() - began
    cell.questions = traffic.questions
    return cell


def pct(xs: list[float], q: float) -> float:
    """The q-quantile of `xs` (nan when empty)."""
    xs = sorted(xs)
    return xs[min(len(xs) - 1, round(q * (len(xs) - 1)))] if xs else float("nan")


def server_cpu_s(pid: int) -> float:
    """CPU seconds the server process and its workers (its children) have run so far."""
    pids = [pid]
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            if int(stat.read_text().rsplit(")", 1)[1].split()[1]) == pid:
                pids.append(int(stat.parent.name))
        except (OSError, IndexError, ValueError):
            pass  # the process ended while we looked
    return sum(process_cpu_s(p) for p in pids)


def stats(url: str) -> dict:
    return httpx.get(url + "/stats", headers=AUTH, timeout=30).json()


def measure(
    url: str, pid: int, traffic: Traffic, clients: int, batch: int, args, cached: bool
) -> Cell:
    if cached:
        httpx.delete(url + "/cache", headers=AUTH, timeout=30)
        time.sleep(0.3)  # every worker's counters published
    before, cpu, mine = stats(url), server_cpu_s(pid), time.process_time()
    cell = run_cell(url, traffic, clients, batch, args.k, args.seconds, args.max_requests)
    cell.cpu_s, cell.client_cpu_s = server_cpu_s(pid) - cpu, time.process_time() - mine
    if cached:
        time.sleep(0.3)
        after = stats(url)
        asked = after["queries"] - before["queries"]
        if asked:
            cell.hit_rate = (after["cache"]["hits"] - before["cache"]["hits"]) / asked
            cell.unsearched = 1 - (after["index"]["queries"] - before["index"]["queries"]) / asked
    return cell


@dataclass
class Result:
    """One setting's rounds: baseline and server cells, alternating."""

    base: list[Cell] = field(default_factory=list)
    serv: list[Cell] = field(default_factory=list)

    @property
    def ratio(self) -> float:
        """Median over rounds of server q/s / baseline q/s."""
        return statistics.median(
            s.qps / b.qps if b.qps else float("nan") for b, s in zip(self.base, self.serv)
        )

    @staticmethod
    def qps(cells: list[Cell]) -> float:
        return statistics.median(c.qps for c in cells)

    @staticmethod
    def latency_ms(cells: list[Cell], q: float) -> float:
        return pct([x for c in cells for x in c.latencies], q) * 1e3

    @staticmethod
    def errors(cells: list[Cell]) -> int:
        return sum(c.errors for c in cells)

    @staticmethod
    def cpu_ms_per_query(cells: list[Cell], client: bool = False) -> float:
        queries = sum(c.queries for c in cells)
        cpu = sum(c.client_cpu_s if client else c.cpu_s for c in cells)
        return cpu / queries * 1e3 if queries else float("nan")

    @property
    def hit_rate(self) -> float:
        rates = [c.hit_rate for c in self.serv if c.hit_rate is not None]
        return statistics.mean(rates) if rates else float("nan")

    @property
    def unsearched(self) -> float:
        rates = [c.unsearched for c in self.serv if c.unsearched is not None]
        return statistics.mean(rates) if rates else float("nan")

    @property
    def first_error(self) -> str:
        return next((c.first_error for c in self.base + self.serv if c.first_error), "")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument(
        "--kind", default="bm25", help="index kind over the 2Wiki corpus: bm25 or dense (MiniLM)"
    )
    ap.add_argument(
        "--workers", type=int, default=2, help="worker processes of the server under test"
    )
    ap.add_argument(
        "--concurrency", default="1,4,16,64,256", help="concurrent clients, comma-separated"
    )
    ap.add_argument("--batches", default="1,64", help="queries per request, comma-separated")
    ap.add_argument("--seconds", type=float, default=2.5, help="how long each cell issues requests")
    ap.add_argument(
        "--rounds", type=int, default=3, help="alternating baseline/server cells per setting"
    )
    ap.add_argument(
        "--max-requests", type=int, default=20_000, help="most requests one cell issues"
    )
    ap.add_argument(
        "--repeat",
        type=float,
        default=0.5,
        help="chance a rollout sends its group's query verbatim",
    )
    ap.add_argument("--k", type=int, default=3, help="passages per query (the paper's training k)")
    ap.add_argument(
        "--auth", action="store_true", help="servers require a bearer token; requests send it"
    )
    args = ap.parse_args()
    os.environ.setdefault(
        "OMP_NUM_THREADS", "1"
    )  # servers inherit it: one thread per worker process
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

    data = shared_data()
    pool, searched = load_pool(data)
    index = ensure_index(args.kind, load_corpus(data))
    concurrency = [int(c) for c in args.concurrency.split(",")]
    batches = [int(b) for b in args.batches.split(",")]
    print(
        f"index: 2Wiki {args.kind}; k={args.k}; {len(pool):,} questions ({searched} with the released "
        f"model's queries); groups of {GROUP}, repeat {args.repeat}; {args.rounds} rounds of {args.seconds:g} s "
        f"per setting; {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f} (shared: other jobs run too)",
        flush=True,
    )
    auth = []
    if args.auth:
        os.environ[TOKEN_ENV] = secrets.token_hex(32)  # the servers inherit it
        AUTH["Authorization"] = f"Bearer {os.environ[TOKEN_ENV]}"
        auth = ["--api-key-env", TOKEN_ENV]
    base_proc, base = start_server(
        index, ["--workers", "1", "--batch-window-ms", "0", "--cache-size", "0", *auth], 1, AUTH
    )
    serv_proc, serv = start_server(
        index, ["--workers", str(args.workers), *auth], args.workers, AUTH
    )
    results: dict[tuple, Result] = {}
    plan = [(b, c, GROUP) for b in batches for c in concurrency]
    if 1 in batches and 64 in concurrency:
        plan.append((1, 64, 1))  # the control: no two rollouts share a question
    try:
        for batch, clients, group in plan:
            r = results[(batch, clients, group)] = Result()
            for _ in range(args.rounds):
                for cells, url, proc, cached in (
                    (r.base, base, base_proc, False),
                    (r.serv, serv, serv_proc, True),
                ):
                    traffic = Traffic(pool, group, args.repeat if group > 1 else 1.0)
                    cells.append(measure(url, proc.pid, traffic, clients, batch, args, cached))
            print(
                f"batch {batch:2} clients {clients:3}{' no repeats' if group == 1 else ''}: "
                f"baseline {r.qps(r.base):7.0f} q/s p50 {r.latency_ms(r.base, 0.5):6.1f} ms p99 {r.latency_ms(r.base, 0.99):7.1f} ms "
                f"err {r.errors(r.base)} | server {r.qps(r.serv):7.0f} q/s p50 {r.latency_ms(r.serv, 0.5):6.1f} ms "
                f"p99 {r.latency_ms(r.serv, 0.99):7.1f} ms err {r.errors(r.serv)} hit {r.hit_rate:.2f} "
                f"(not searched {r.unsearched:.2f}) | x{r.ratio:.2f} "
                f"(CPU ms/query: server {r.cpu_ms_per_query(r.base):.2f} -> {r.cpu_ms_per_query(r.serv):.2f}, "
                f"load generator {r.cpu_ms_per_query(r.serv, client=True):.2f})"
                + (f"  first error: {r.first_error}" if r.first_error else ""),
                flush=True,
            )
    finally:
        for proc in (base_proc, serv_proc):
            proc.terminate()
            proc.wait(30)
    print(f"load average at the end: {os.getloadavg()[0]:.1f}")
    print(
        "\n| batch | clients | baseline q/s | server q/s | ratio | baseline p50 / p99 ms | server p50 / p99 ms "
        "| server CPU ms/query (baseline, server) | errors (baseline, server) | cache hit rate (not searched) |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for (batch, clients, group), r in results.items():
        print(
            f"| {batch} | {clients}{' (no repeats)' if group == 1 else ''} | {r.qps(r.base):,.0f} | {r.qps(r.serv):,.0f} | "
            f"**{r.ratio:.2f}** | {r.latency_ms(r.base, 0.5):.1f} / {r.latency_ms(r.base, 0.99):.1f} | "
            f"{r.latency_ms(r.serv, 0.5):.1f} / {r.latency_ms(r.serv, 0.99):.1f} | "
            f"{r.cpu_ms_per_query(r.base):.2f}, {r.cpu_ms_per_query(r.serv):.2f} | "
            f"{r.errors(r.base)}, {r.errors(r.serv)} | {r.hit_rate:.2f} ({r.unsearched:.2f}) |"
        )
    out: dict[str, float] = {}
    for name, key in (("", (1, 64, GROUP)), ("_b64", (64, 64, GROUP)), ("_no_repeats", (1, 64, 1))):
        out[f"throughput_vs_baseline_at_64{name}"] = (
            results[key].ratio if key in results else float("nan")
        )
    out["errors_at_256"] = sum(r.errors(r.serv) for key, r in results.items() if key[1] == 256)
    out["baseline_errors_at_256"] = sum(
        r.errors(r.base) for key, r in results.items() if key[1] == 256
    )
    if (1, 64, GROUP) in results:
        r = results[(1, 64, GROUP)]
        out |= {
            "server_qps_at_64": r.qps(r.serv),
            "baseline_qps_at_64": r.qps(r.base),
            "cache_hit_rate_at_64": r.hit_rate,
        }
    print(" ".join(f"{n}={v:.3g}" if isinstance(v, float) else f"{n}={v}" for n, v in out.items()))


if __name__ == "__main__":
    main()
