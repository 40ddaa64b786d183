"""Dense index configurations at scale: build time, memory, queries/s at batch 64 and recall@10
against exact search, on synthetic embeddings; then what they come to at Wikipedia scale.

Data. 1M synthetic unit vectors per dimension (384 = MiniLM, 768 = e5-base), not uniform noise:
uniform random vectors have no neighbourhood structure, so IVF lists and PQ codebooks learn
nothing from them and every method looks worse than on text. Real sentence embeddings are
(a) topical: passages gather in clusters, (b) anisotropic: the variance falls off over the
directions like a power law and all vectors share a mean direction, (c) asked by queries that
sit farther from the passages than passages from each other (questions are not passages). The
generator reproduces the three: a Gaussian mixture (1,000 topics) whose covariance has
eigenvalues k^-0.8 in a random basis, plus a common offset, normalised; queries come from the
same mixture with more spread. Its constants were fitted to all-MiniLM-L6-v2 embeddings of the
6,119 2Wiki passages and the 500 HotpotQA questions of shared/data: mean pair cosine, query
top-k similarities, and above all the recall@10 of PQ48/PQ96/SQ4 codes and of IVF64 at
nprobe 1-16, which decide how far an index can be compressed and how many lists it must probe.
At equal size the synthetic set is slightly harder than the real one on every one of those
(`--calibrate` prints both side by side), so the recalls below err on the low side.

Measurement. Each configuration is trained on a sample and filled chunk by chunk from the
memory-mapped vectors with the library's own `train_index`/`add_vectors` (build time), written
to disk (file size), then searched in a fresh process that loads it as `searchrl serve` does
(resident-memory growth, queries/s at batch 64, recall@10 against the Flat index's answers, for
each setting of its sweep, each for at most `--seconds`). RAM is the file size, except for the
`RFlat` configuration: its full vectors stay on disk, memory-mapped, and only the compressed
IVF part is resident; it is timed cold (the file evicted from the page cache first: vectors
come from this machine's virtual disk) and warm (a second pass). IVF configurations share one
coarse k-means per dimension (each is charged its time). HNSW is built on the first `--hnsw-n`
vectors only (a 1M x 768 HNSW32 build takes ~20 CPU-minutes); its rows say so.

    python bench/retrieval_scale.py [--n 1000000] [--dims 768] [--queries 256] [--threads 2]
        [--nlist 1024] [--hnsw-n 100000] [--configs flat,sq8,...] [--seconds 8]
        [--write-doc FILE] [--calibrate]

The default (768-d, eight configurations) takes ~25 min on a loaded 2-core machine, plus ~10 min
the first time to generate the vectors (kept in the cache); docs/scale.md has the command of the
full table (384 and 768, every configuration).

Last line, for the 768-d configuration that reaches recall@10 >= 0.95 within 1/8 of flat's RAM
(the fastest such; else the best recall within 1/8, else the best recall): `recall_at_10= memory_vs_flat=
qps_vs_flat= ...`, then the best all-in-RAM configurations.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

K = 10
BATCH = 64
SPECTRUM = 0.8  # eigenvalue k ∝ k^-0.8 (MiniLM on shared/data: ~k^-0.79 over k = 5..200)
BETWEEN = 0.3  # share of the variance between topics (the rest is spread within a topic)
MEAN_NORM = 0.275  # common offset: mean pair cosine 0.07, as MiniLM's
QUERY_SPREAD = 0.5  # extra within-topic variance of queries
CLUSTERS = 1000
TARGET_RECALL = 0.95
SCALES = {  # name: (passages, dimension)
    "e5-base, wiki-18 (Search-R1)": (21_000_000, 768),
    "bge-large, KILT (R1-Searcher)": (29_000_000, 1024),
}


@dataclass
class Config:
    key: str  # --configs name
    factory: str
    sweep: list[dict] = field(default_factory=lambda: [{}])  # SearchSettings fields to try
    subset: int | None = None  # rows it is built on, when not all
    mapped: bool = False  # loaded memory-mapped: its refine vectors stay on disk


def configs(d: int, nlist: int, hnsw_n: int) -> list[Config]:
    """Per configuration, the settings it is searched with. The refine stages re-rank
    k_factor x 10 candidates of 4-bit fast-scan codes (2 dimensions a code: d/2 x 4 bits, a
    sixteenth of flat); at 1M x 768 their candidates hold the true top 10 as often as the
    probed lists do from k_factor 16 on, so nprobe sets the recall (0.96 at 64, 0.98 at 128)."""
    probes = [{"nprobe": p} for p in (16, 64, 256) if p <= nlist]

    def rerank(nprobes: tuple[int, ...], k_factors: tuple[int, ...]) -> list[dict]:
        return [{"nprobe": p, "k_factor": k} for p in nprobes if p <= nlist for k in k_factors]

    ivf = f"IVF{nlist}"
    return [
        Config("flat", "Flat"),
        Config("sq8", "SQ8"),
        Config("hnsw", "HNSW32", [{"ef_search": e} for e in (64, 256, 1024)], subset=hnsw_n),
        Config("ivf-sq8", f"{ivf},SQ8", probes),
        Config("ivf-sq6", f"{ivf},SQ6", probes),  # in RAM: 21M x 768 in 12 GB
        Config("ivf-pq", f"{ivf},PQ{d // 8}", probes),
        Config("ivf-pqfs-sq4", f"{ivf},PQ{d // 2}x4fs,Refine(SQ4)", rerank((64, 128), (4, 16))),
        Config(
            "ivf-pqfs-rflat",
            f"{ivf},PQ{d // 2}x4fs,RFlat",
            rerank((64, 128, 256), (4, 16)),
            mapped=True,
        ),
    ]


DEFAULT_CONFIGS = "flat,sq8,hnsw,ivf-sq8,ivf-sq6,ivf-pq,ivf-pqfs-sq4,ivf-pqfs-rflat"


# --- data ------------------------------------------------------------------------------------


def mixture(d: int, seed: int, clusters: int = CLUSTERS):
    """A sampler of the synthetic embedding distribution (see the module docstring)."""
    rng = np.random.default_rng(seed)
    scale = np.arange(1, d + 1, dtype=np.float64) ** (-SPECTRUM / 2)
    scale /= np.sqrt((scale**2).sum())  # total variance 1 before the offset
    basis = np.linalg.qr(rng.standard_normal((d, d)))[0]  # random orientation of the spectrum
    centres = rng.standard_normal((clusters, d)) * scale * np.sqrt(BETWEEN)
    offset = rng.standard_normal(d)
    offset *= MEAN_NORM / np.linalg.norm(offset)

    def draw(m: int, extra: float = 0.0, source=None) -> np.ndarray:  # [m, d] float32, unit rows
        source = source or rng
        z = centres[source.integers(0, clusters, m)]
        z = z + source.standard_normal((m, d)) * scale * np.sqrt(1 - BETWEEN + extra)
        v = z @ basis.T + offset
        return (v / np.linalg.norm(v, axis=1, keepdims=True)).astype(np.float32)

    return draw


def synthetic(folder: Path, n: int, d: int, queries: int) -> tuple[np.ndarray, np.ndarray]:
    """Base vectors [n, d] (a memory-mapped .npy, made once and kept) and queries [queries, d]."""
    path = folder / f"synthetic-{n}x{d}.npy"
    qpath = folder / f"synthetic-{d}-queries{queries}.npy"
    draw = mixture(d, seed=d)
    if not path.is_file():
        print(f"generating {n:,} x {d} synthetic vectors into {path}", flush=True)
        tmp = path.with_suffix(".tmp.npy")
        base = np.lib.format.open_memmap(tmp, "w+", np.float32, (n, d))
        for start in range(0, n, 50_000):  # 50k rows at a time: 300 MB of float64 at 768-d
            base[start : start + 50_000] = draw(min(50_000, n - start))
        base.flush()
        del base
        os.replace(tmp, path)
    if not qpath.is_file():  # drawn apart from the base vectors, so either can change alone
        np.save(qpath, draw(queries, QUERY_SPREAD, np.random.default_rng(d + 1)))
    return np.load(path, mmap_mode="r"), np.load(qpath)


# --- one configuration ------------------------------------------------------------------------


def build(cfg: Config, base: np.ndarray, folder: Path, coarse: dict) -> tuple[float, Path, int]:
    """Train + add with the library's code; returns (seconds, index file, rows). IVF configs
    share one coarse k-means per (d, nlist) (`coarse`: its centroids and seconds), and each is
    charged its time, so build times are those of standalone builds."""
    import faiss

    from searchrl.retrieval.faiss_index import add_vectors, new_faiss_index, train_index

    rows = base if cfg.subset is None else base[: cfg.subset]
    index = new_faiss_index(base.shape[1], cfg.factory)
    charged = 0.0
    ivf = faiss.try_extract_index_ivf(index)
    if ivf is not None:
        key = (base.shape[1], ivf.nlist)
        if key not in coarse:
            started = time.perf_counter()
            lists = new_faiss_index(base.shape[1], f"IVF{ivf.nlist},Flat")
            train_index(lists, rows, f"IVF{ivf.nlist},Flat")
            centroids = faiss.extract_index_ivf(lists).quantizer.reconstruct_n(0, ivf.nlist)
            coarse[key] = (centroids, time.perf_counter() - started)
        centroids, charged = coarse[key]
        ivf.quantizer.add(centroids)  # a quantizer holding nlist centroids: IVF skips k-means
    started = time.perf_counter()
    train_index(index, rows, cfg.factory)
    add_vectors(index, rows, progress=True)
    seconds = time.perf_counter() - started + charged
    path = folder / f"{cfg.key}-{base.shape[1]}.faiss"
    faiss.write_index(index, str(path))
    with open(path, "rb") as f:
        os.fsync(f.fileno())  # written back, so the child can evict it from the page cache
    return seconds, path, len(rows)


def measure(cfg: Config, path: Path, queries: Path, truth: Path | None, args) -> dict:
    """Search `path` in a fresh process (so resident memory is the index's alone)."""
    spec = {
        "path": str(path),
        "factory": cfg.factory,
        "sweep": cfg.sweep,
        "mapped": cfg.mapped,
        "queries": str(queries),
        "truth": str(truth) if truth else None,
        "threads": args.threads,
        "seconds": 1e9 if truth is None else args.seconds,  # Flat answers all: the truth
    }
    done = subprocess.run(
        [sys.executable, __file__, "--child", json.dumps(spec)],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise SystemExit(f"search of {path} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def child(spec: dict) -> None:
    """The search side of `measure`: load, then time batches of 64 for each setting."""
    import faiss

    from searchrl.retrieval.faiss_index import apply_search_settings, read_faiss
    from searchrl.retrieval.kinds import SearchSettings

    faiss.omp_set_num_threads(spec["threads"])
    queries = np.load(spec["queries"])
    truth = np.load(spec["truth"]) if spec["truth"] else None
    path, factory = Path(spec["path"]), spec["factory"]

    def load() -> tuple[faiss.Index, int]:
        if spec["mapped"]:  # start cold: the vectors must come from disk
            fd = os.open(path, os.O_RDONLY)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            os.close(fd)
        before = _rss("RssAnon")
        index, _ = read_faiss(path, spec["mapped"], factory)
        return index, _rss("RssAnon") - before

    def run(index, count: int | None = None) -> tuple[np.ndarray, float, float]:
        """Batches of 64 until `count` queries, else all of them or `seconds`; returns the ids
        found, queries per wall second and per CPU second (all threads: load-independent)."""
        found, started, cpu = [], time.perf_counter(), time.process_time()
        for start in range(0, count or len(queries), BATCH):
            found.append(index.search(queries[start : start + BATCH], K)[1])
            if count is None and time.perf_counter() - started > spec["seconds"]:
                break
        ids = np.concatenate(found)
        wall, cpu = time.perf_counter() - started, time.process_time() - cpu
        return ids, len(ids) / wall, len(ids) / max(cpu, 1e-9)

    index, ram = load()
    results = []
    for setting in spec["sweep"]:
        if spec["mapped"] and results:
            del index
            index, _ = load()
        apply_search_settings(index, SearchSettings(**setting), factory)
        ids, qps, qps_cpu = run(index)
        entry = {"setting": setting, "queries": len(ids), "qps": qps, "qps_cpu": qps_cpu}
        entry["rss"] = ram
        if spec["mapped"]:  # the same queries again: their pages are in the page cache now
            entry["qps_cold"] = qps
            _, entry["qps"], entry["qps_cpu"] = run(index, len(ids))
            entry["rss_file"] = _rss("RssFile")
        if truth is None:  # the Flat run: its answers are the ground truth
            np.save(path.with_suffix(".truth.npy"), ids)
            entry["recall"] = 1.0
        else:
            hits = [len(set(a) & set(b)) for a, b in zip(ids, truth[: len(ids)])]
            entry["recall"] = float(np.mean(hits)) / K
        results.append(entry)
    print(json.dumps({"settings": results}))


def _rss(field_name: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field_name + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {field_name} in /proc/self/status")


# --- the run ----------------------------------------------------------------------------------


def run_dim(d: int, args, folder: Path, tmp: Path) -> list[dict]:
    base, queries = synthetic(folder, args.n, d, args.queries)
    qpath = tmp / f"queries-{d}.npy"
    np.save(qpath, queries)
    rows, truth_for, coarse = [], {}, {}
    for cfg in configs(d, args.nlist, min(args.hnsw_n, args.n)):
        if cfg.key not in args.configs:
            continue
        print(f"[{d}-d] {cfg.factory} ...", flush=True)
        seconds, path, n = build(cfg, base, tmp, coarse)
        if cfg.key != "flat" and n not in truth_for:
            truth_for[n] = _subset_truth(base, n, qpath, tmp, args)
        result = measure(cfg, path, qpath, truth_for.get(n) if cfg.key != "flat" else None, args)
        if cfg.key == "flat":
            truth_for[n] = path.with_suffix(".truth.npy")
        size = path.stat().st_size
        ram = size - (n * d * 4 if cfg.mapped else 0)  # mapped: the refine vectors stay on disk
        path.unlink()
        for s in result["settings"]:
            row = {"d": d, "n": n, "config": cfg.key, "factory": cfg.factory}
            row.update(build_s=seconds, bytes=size, ram=ram, disk=size - ram, **s)
            rows.append(row)
            print("   " + _row_line(row), flush=True)
    return rows


def _subset_truth(base: np.ndarray, n: int, qpath: Path, tmp: Path, args) -> Path:
    """Exact answers over the first `n` rows (for a configuration built on a subset)."""
    import faiss

    index = faiss.IndexFlatIP(base.shape[1])
    index.add(np.ascontiguousarray(base[:n]))
    path = tmp / f"flat-{n}-{base.shape[1]}.faiss"
    faiss.write_index(index, str(path))
    del index
    measure(Config("flat", "Flat"), path, qpath, None, args)
    path.unlink()
    return path.with_suffix(".truth.npy")


def _setting(r: dict) -> str:
    names = {"ef_search": "efSearch"}
    return ", ".join(f"{names.get(k, k)}={v}" for k, v in r["setting"].items()) or "-"


def _row_line(r: dict) -> str:
    cold = f" (cold {r['qps_cold']:.0f})" if "qps_cold" in r else ""
    return (
        f"{r['factory']} {_setting(r)}: build {r['build_s']:.0f}s, RAM {r['ram'] / 1e6:.0f} MB "
        f"(RSS +{r['rss'] / 1e6:.0f} MB), disk {r['disk'] / 1e6:.0f} MB, {r['qps']:.0f} q/s{cold}, "
        f"recall@10 {r['recall']:.3f} ({r['queries']} queries)"
    )


def add_ratios(rows: list[dict]) -> None:
    for r in rows:
        flat = next(f for f in rows if f["d"] == r["d"] and f["config"] == "flat")
        per_vector = flat["bytes"] / flat["n"]
        r["memory_vs_flat"] = r["ram"] / r["n"] / per_vector  # per vector: HNSW is on a subset
        r["qps_vs_flat"] = r["qps"] / flat["qps"]


def bytes_at(r: dict, n: int, d: int) -> float:
    """RAM of configuration `r` at n vectors of d dimensions: per-vector bytes measured, with
    the codes scaled to d (the factories above size their codes by d)."""
    return r["ram"] / r["n"] * d / r["d"] * n


def pick(rows: list[dict], d: int) -> dict[str, dict]:
    """The headline configurations at dimension d."""
    at_d = [r for r in rows if r["d"] == d and r["config"] != "flat" and r["config"] != "hnsw"]
    small = [r for r in at_d if r["memory_vs_flat"] <= 1 / 8]
    good_small = [r for r in small if r["recall"] >= TARGET_RECALL]
    n21, d21 = SCALES["e5-base, wiki-18 (Search-R1)"]
    fits = [r for r in at_d if r["recall"] >= TARGET_RECALL and bytes_at(r, n21, d21) < 16e9]
    in_ram = [r for r in small if not r["disk"]]
    out = {
        "best": max(good_small, key=lambda r: r["qps"])
        if good_small
        else max(
            small or at_d or [r for r in rows if r["d"] == d], key=lambda r: (r["recall"], r["qps"])
        ),
        "in_ram_eighth": max(in_ram, key=lambda r: (r["recall"], r["qps"])) if in_ram else None,
        "in_ram_16gb": max(
            (r for r in fits if not r["disk"]), key=lambda r: r["qps"], default=None
        ),
    }
    return out


def markdown(rows: list[dict], args) -> str:
    lines = [
        f"`python bench/retrieval_scale.py {' '.join(args.argv)}`".replace(" `", "`")
        + f" ({args.threads} threads, {args.queries} queries of batch 64, each setting searched "
        f"for at most {args.seconds:.0f} s).",
        "",
        (
            "| d | index | rows | build s | RAM MB | RSS MB | disk MB | RAM vs flat | setting "
            "| q/s @64 | q/s vs flat | q per CPU-s | recall@10 | queries |"
        ),
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        cold = f" (cold {r['qps_cold']:,.0f})" if "qps_cold" in r else ""
        lines.append(
            f"| {r['d']} | `{r['factory']}` | {r['n']:,} | {r['build_s']:.0f} | "
            f"{r['ram'] / 1e6:,.0f} | {r['rss'] / 1e6:,.0f} | {r['disk'] / 1e6:,.0f} | "
            f"{r['memory_vs_flat']:.3f} | {_setting(r)} | {r['qps']:,.1f}{cold} | "
            f"{r['qps_vs_flat']:.2f} | {r['qps_cpu']:,.1f} | {r['recall']:.3f} | {r['queries']} |"
        )
    return "\n".join(lines) + "\n"


def extrapolation(rows: list[dict]) -> str:
    """RAM at Wikipedia scale from the per-vector bytes measured at 768-d (arithmetic)."""
    best_per_config: dict[str, dict] = {}
    for r in rows:
        if r["d"] != 768:
            continue
        held = best_per_config.get(r["config"])
        if held is None or (r["recall"], r["qps"]) > (held["recall"], held["qps"]):
            best_per_config[r["config"]] = r
    head = " | ".join(f"{name}: {n / 1e6:.0f}M x {d}" for name, (n, d) in SCALES.items())
    lines = [
        f"| index (measured at 768-d) | recall@10 measured | {head} |",
        "|---|---|" + "---|" * len(SCALES),
    ]
    for r in best_per_config.values():
        cells = []
        for n, d in SCALES.values():
            disk = (
                f" + {r['disk'] / r['n'] * d / r['d'] * n / 1e9:,.0f} GB on disk"
                if r["disk"]
                else ""
            )
            cells.append(f"{bytes_at(r, n, d) / 1e9:,.1f} GB{disk}")
        lines.append(f"| `{r['factory']}` | {r['recall']:.3f} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def calibrate(folder: Path) -> None:
    """Real MiniLM embeddings of shared/data against synthetic ones of the same size."""
    import faiss

    real_x, real_q = minilm_embeddings(folder)
    draw = mixture(real_x.shape[1], seed=0)
    sets = {
        "MiniLM, 2Wiki passages / HotpotQA questions": (real_x, real_q),
        "synthetic": (draw(len(real_x)), draw(len(real_q), QUERY_SPREAD)),
    }
    print("| data | pair cos | q top-1 | q top-10 | PQ48 | PQ96 | SQ4 | IVF64 nprobe 1 / 4 / 16 |")
    print("|---|---|---|---|---|---|---|---|")
    for name, (x, q) in sets.items():
        d = x.shape[1]
        exact = faiss.IndexFlatIP(d)
        exact.add(x)
        sims, truth = exact.search(q, K)
        pairs = np.random.default_rng(0).integers(0, len(x), (2, 4000))
        cells = [
            f"{np.mean(np.sum(x[pairs[0]] * x[pairs[1]], 1)):.3f}",
            f"{sims[:, 0].mean():.3f}",
            f"{sims[:, K - 1].mean():.3f}",
        ]
        for factory, probes in (
            ("PQ48", [None]),
            ("PQ96", [None]),
            ("SQ4", [None]),
            ("IVF64,Flat", [1, 4, 16]),
        ):
            from searchrl.retrieval.faiss_index import new_faiss_index, train_index

            index = new_faiss_index(d, factory)
            train_index(index, x, factory)
            index.add(x)
            got = []
            for p in probes:
                if p:
                    faiss.extract_index_ivf(index).nprobe = p
                found = index.search(q, K)[1]
                got.append(np.mean([len(set(a) & set(b)) / K for a, b in zip(found, truth)]))
            cells.append(" / ".join(f"{v:.3f}" for v in got))
        print(f"| {name} | " + " | ".join(cells) + " |")


def minilm_embeddings(folder: Path) -> tuple[np.ndarray, np.ndarray]:
    """MiniLM vectors of the 2Wiki passages and the HotpotQA questions (encoded once, cached)."""
    path, qpath = folder / "minilm-2wiki.npy", folder / "minilm-hotpotqa500.npy"
    if not (path.is_file() and qpath.is_file()):
        from searchrl.assets import load_embedder
        from searchrl.paths import shared_data
        from searchrl.retrieval.encoding import encode

        data = shared_data()
        rows = json.loads((data / "2wikimultihopqa" / "2wikimultihopqa_corpus.json").read_text())
        with open(data / "r1-searcher-eval" / "hotpotqa_500.jsonl") as f:
            questions = [json.loads(line)["question"] for line in f]
        model = load_embedder("minilm")
        np.save(path, encode(model, [f"{r['title']}\n{r['text']}" for r in rows]))
        np.save(qpath, encode(model, questions))
    return np.load(path), np.load(qpath)


def main() -> None:
    if len(sys.argv) == 3 and sys.argv[1] == "--child":
        child(json.loads(sys.argv[2]))
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=1_000_000, help="vectors per dimension")
    parser.add_argument("--dims", default="768")
    parser.add_argument("--queries", type=int, default=256)
    parser.add_argument("--nlist", type=int, default=1024, help="IVF lists")
    parser.add_argument("--hnsw-n", type=int, default=100_000, help="rows HNSW is built on")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seconds", type=float, default=8.0, help="search time per setting")
    parser.add_argument(
        "--configs",
        default=DEFAULT_CONFIGS,
        help=f"of: {', '.join(c.key for c in configs(768, 1024, 1))}",
    )
    parser.add_argument("--data", default=None, help="folder for the vectors (default: cache)")
    parser.add_argument("--write-doc", default=None, help="also write the tables to this file")
    parser.add_argument("--calibrate", action="store_true", help="compare with MiniLM and stop")
    args = parser.parse_args()
    args.argv = sys.argv[1:]
    args.configs = set(args.configs.split(",")) | {"flat"}

    import faiss

    from searchrl.paths import cache_dir

    faiss.omp_set_num_threads(args.threads)
    folder = Path(args.data) if args.data else cache_dir() / "bench" / "retrieval-scale"
    folder.mkdir(parents=True, exist_ok=True)
    if args.calibrate:
        calibrate(folder)
        return
    started = time.perf_counter()
    rows = []
    with tempfile.TemporaryDirectory(dir=folder) as tmp:
        for d in [int(x) for x in args.dims.split(",")]:
            rows += run_dim(d, args, folder, Path(tmp))
    add_ratios(rows)
    table, extra = markdown(rows, args), extrapolation(rows)
    print(f"\n{table}\nRAM extrapolated from 768-d per-vector bytes:\n\n{extra}")
    if args.write_doc:
        Path(args.write_doc).write_text(table + "\n" + extra)
    d = 768 if any(r["d"] == 768 for r in rows) else rows[-1]["d"]
    flat = next(r for r in rows if r["d"] == d and r["config"] == "flat")
    picks = pick(rows, d)
    top = picks["best"]
    n21, d21 = SCALES["e5-base, wiki-18 (Search-R1)"]
    pairs = [
        f"recall_at_10={top['recall']:.3f}",
        f"memory_vs_flat={top['memory_vs_flat']:.4f}",
        f"qps_vs_flat={top['qps_vs_flat']:.2f}",
        f"disk_vs_flat={top['disk'] / flat['bytes']:.2f}",
        f"gb_at_21m={bytes_at(top, n21, d21) / 1e9:.2f}",
        f"flat_gb_at_21m={bytes_at(flat, n21, d21) / 1e9:.1f}",
        f"qps={top['qps']:.1f}",
        f"qps_cold={top.get('qps_cold', top['qps']):.1f}",
        f"flat_qps={flat['qps']:.1f}",
        f"factory={top['factory']}",
        *(f"{k}={v}" for k, v in top["setting"].items()),
    ]
    for label, r in (
        ("in_ram_eighth", picks["in_ram_eighth"]),
        ("in_ram_16gb", picks["in_ram_16gb"]),
    ):
        if r is not None:
            pairs += [
                f"{label}_recall={r['recall']:.3f}",
                f"{label}_memory_vs_flat={r['memory_vs_flat']:.3f}",
                f"{label}_gb_at_21m={bytes_at(r, n21, d21) / 1e9:.2f}",
                f"{label}_factory={r['factory']}",
            ]
    print(f"total {time.perf_counter() - started:.0f}s")
    print(" ".join(pairs))


if __name__ == "__main__":
    main()
