"""HTTP retrieval server vs the same index in-process: queries/s at batch 1 and 64, BM25 and dense.

Corpus: the 2WikiMultihopQA passages in shared/data (6,119); queries: the R1-Searcher HotpotQA eval
questions (500). Indexes are built once into the cache and reused. The server runs in a
subprocess (`searchrl serve`, 127.0.0.1, a free port) and is reached with `HttpRetriever`.
Rounds alternate in-process and HTTP passes so background load hits both alike; the ratio
(HTTP q/s / in-process q/s) is the median over rounds. The CPU-time ratio (in-process CPU /
client + server CPU) is printed too: on a shared machine it is the steadier of the two.
Last line: `name=value` pairs, ratios first.

    python bench/retrieval.py [--rounds 5] [--k 5] [--kinds bm25,dense] [--threads 1]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx

from searchrl.data.types import Passage
from searchrl.errors import SearchRLError
from searchrl.paths import cache_dir, shared_data
from searchrl.retrieval.http import HttpRetriever
from searchrl.retrieval.index import build_index, open_index
from searchrl.retrieval.server import free_port

BATCHES = (1, 64)
# Bounded loops: queries per pass for each (kind, batch); batch 64 uses 7 full batches.
PER_PASS = {("bm25", 1): 200, ("bm25", 64): 448, ("dense", 1): 40, ("dense", 64): 128}


def load_corpus(data: Path) -> list[Passage]:
    rows = json.loads((data / "2wikimultihopqa" / "2wikimultihopqa_corpus.json").read_text())
    return [Passage(f"2wiki-{i}", r["title"], r["text"]) for i, r in enumerate(rows)]


def load_queries(data: Path) -> list[str]:
    with open(data / "r1-searcher-eval" / "hotpotqa_500.jsonl") as f:
        return [json.loads(line)["question"] for line in f]


def ensure_index(kind: str, passages: list[Passage]) -> Path:
    out = cache_dir() / "bench" / f"2wiki-{kind}"
    try:
        open_index(out).close()
        print(f"reusing {kind} index {out}")
    except SearchRLError:  # absent or unreadable: rebuild
        t = time.perf_counter()
        build_index(passages, out, kind=kind, overwrite=True)
        print(f"built {kind} index {out} in {time.perf_counter() - t:.1f}s")
    return out


def start_server(
    index: Path, extra: tuple[str, ...] = (), workers: int = 1, headers: dict[str, str] | None = None
) -> tuple[subprocess.Popen, str]:
    """`searchrl serve` on a free loopback port, returned once `workers` worker processes answer
    (`headers`: sent with the polls, e.g. the server's bearer token)."""
    port = free_port()
    cmd = [sys.executable, "-m", "searchrl.cli", "serve", "--index", str(index), "--port", str(port), *extra]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"server exited ({proc.returncode}):\n{proc.stderr.read()}")
        try:
            if httpx.get(url + "/stats", headers=headers, timeout=2).json()["workers"] >= workers:
                return proc, url
        except (httpx.TransportError, ValueError):
            pass
        time.sleep(0.2)
    proc.kill()
    raise SystemExit("server did not come up in 300 s")


def process_cpu_s(pid: int) -> float:
    """CPU seconds another process has run so far (Linux only; 0.0 elsewhere): its live threads'
    schedstat in nanoseconds (/proc/PID/stat counts 10 ms ticks, too coarse for a short pass) plus,
    in ticks, the threads that have exited (their schedstat is gone; the process's stat keeps
    them), or a server whose request threads come and go would seem to lose CPU time."""

    def ticks(stat: Path) -> int:  # utime + stime, after the command name (which may hold spaces)
        fields = stat.read_text().rsplit(")", 1)[1].split()
        return int(fields[11]) + int(fields[12])

    live_ns = live_ticks = 0
    try:
        total_ticks = ticks(Path(f"/proc/{pid}/stat"))
        for task in Path(f"/proc/{pid}/task").iterdir():
            try:
                live_ns += int((task / "schedstat").read_text().split()[0])
                live_ticks += ticks(task / "stat")
            except (OSError, IndexError, ValueError):
                pass  # the thread ended between listing and reading
    except (OSError, IndexError, ValueError):
        return 0.0
    exited_ticks = max(0, total_ticks - live_ticks)
    return live_ns / 1e9 + exited_ticks / os.sysconf("SC_CLK_TCK")


def timed_pass(retriever, queries: list[str], batch: int, k: int, server_pid: int | None = None):
    """Queries/s over the pass, each request's latency in ms, and CPU seconds spent (this
    process plus the server's). CPU time is what the machine's other load cannot inflate."""
    lat = []
    cpu0, server0 = time.process_time(), process_cpu_s(server_pid) if server_pid else 0.0
    for i in range(0, len(queries), batch):
        t = time.perf_counter()
        retriever.search(queries[i : i + batch], k)
        lat.append((time.perf_counter() - t) * 1000)
    cpu = time.process_time() - cpu0 + (process_cpu_s(server_pid) - server0 if server_pid else 0.0)
    return len(queries) / (sum(lat) / 1000), lat, cpu


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, round(q * (len(xs) - 1)))]


def bench_kind(kind: str, index: Path, queries: list[str], rounds: int, k: int) -> dict[str, float]:
    local = open_index(index)
    proc, url = start_server(index, ("--cache-size", "0"))  # rounds repeat their queries: measure searches, not the cache
    out: dict[str, float] = {}
    try:
        with HttpRetriever(url, timeout=120) as http:
            # Same answers both ways, or the comparison means nothing.
            probe = queries[:8]
            assert [[p.id for p in ps] for ps in http.search(probe, k)] == [
                [p.id for p in ps] for ps in local.search(probe, k)
            ]
            for batch in BATCHES:
                qs = queries[: PER_PASS[(kind, batch)]]
                local.search(qs[:batch], k)  # warm caches, the model and the connection
                http.search(qs[:batch], k)
                ratios, local_qps, http_qps, lat, local_cpu, http_cpu = [], [], [], [], 0.0, 0.0
                for _ in range(rounds):
                    lq, _, lc = timed_pass(local, qs, batch, k)
                    hq, hl, hc = timed_pass(http, qs, batch, k, server_pid=proc.pid)
                    ratios.append(hq / lq)
                    local_qps.append(lq)
                    http_qps.append(hq)
                    lat.extend(hl)
                    local_cpu, http_cpu = local_cpu + lc, http_cpu + hc
                key = f"{kind}_b{batch}"
                out[f"{key}_ratio"] = statistics.median(ratios)
                out[f"{key}_cpu_ratio"] = local_cpu / http_cpu if http_cpu else float("nan")
                out[f"{key}_local_qps"] = statistics.median(local_qps)
                out[f"{key}_http_qps"] = statistics.median(http_qps)
                out[f"{key}_p50_ms"] = pct(lat, 0.5)
                out[f"{key}_p99_ms"] = pct(lat, 0.99)
                print(
                    f"{kind:5} batch {batch:3}: in-process {out[f'{key}_local_qps']:8.1f} q/s  "
                    f"http {out[f'{key}_http_qps']:8.1f} q/s  ratio {out[f'{key}_ratio']:.2f} "
                    f"(CPU-time ratio {out[f'{key}_cpu_ratio']:.2f})  "
                    f"per request p50 {out[f'{key}_p50_ms']:.1f} ms p99 {out[f'{key}_p99_ms']:.1f} ms ({len(lat)} requests)"
                )
    finally:
        proc.terminate()
        proc.wait(10)
        local.close()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument(
        "--rounds", type=int, default=5, help="alternating in-process/HTTP passes per setting"
    )
    ap.add_argument("--k", type=int, default=5, help="passages per query")
    ap.add_argument("--kinds", default="bm25,dense", help="comma-separated index kinds to measure")
    ap.add_argument(
        "--threads",
        type=int,
        default=0,
        help="OpenMP/MKL threads for both sides (0 = library default). On a shared, oversubscribed "
        "machine 1 avoids spin-waiting threads that made MiniLM 40x slower in our runs",
    )
    args = ap.parse_args()
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    if args.threads:  # before torch/faiss load; the server subprocess inherits it
        os.environ["OMP_NUM_THREADS"] = os.environ["MKL_NUM_THREADS"] = str(args.threads)

    data = shared_data()
    passages, queries = load_corpus(data), load_queries(data)
    print(
        f"corpus 2wiki: {len(passages)} passages; queries: {len(queries)} HotpotQA questions; k={args.k}; "
        f"threads={args.threads or 'default'}; {args.rounds} rounds"
    )
    results: dict[str, float] = {}
    for kind in args.kinds.split(","):
        results |= bench_kind(kind, ensure_index(kind, passages), queries, args.rounds, args.k)

    # Wall-clock ratios first (b64 before b1), then the CPU-time ratios, then the raw figures.
    names = sorted(
        (n for n in results if n.endswith("_ratio")),
        key=lambda n: (n.endswith("cpu_ratio"), "_b64_" not in n, n),
    )
    ratios = {n: results[n] for n in names}
    rest = {n: v for n, v in results.items() if not n.endswith("_ratio")}
    print(
        " ".join(
            f"{n}={v:.3g}" if "ratio" in n else f"{n}={v:.1f}" for n, v in (ratios | rest).items()
        )
    )


if __name__ == "__main__":
    main()
