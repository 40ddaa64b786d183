"""`searchrl eval report`: one model on the real benchmarks of the local corpus, beside the paper.

Every (dataset, method, retriever) is one `eval run` folder under `OUT/runs/`, run with
`run_eval` and one model loaded for all of them. A rerun keeps every finished folder, continues an
interrupted one (`eval run --resume` semantics) and, when `limit` grew, answers only the new
questions; a folder whose settings differ otherwise is refused, naming the key. The report
(`OUT/report.md`, the bar chart `OUT/plots/scores.png`) is written from the folders' metrics.json
(`report_table`).

Open-book vs closed-book. The local corpus (`localwiki`, ~22k paragraphs) holds the gold paragraphs
of the question sets that came with them (hotpotqa-ircot, musique, 2wiki: their questions carry
supporting passage ids). Bamboogle and R1-Searcher's 500-question sets came without paragraphs, so
their supporting facts are mostly absent from the corpus: searching it would measure the corpus,
not the method. A dataset is open-book when its questions carry supporting ids; the others run
`direct` only and are marked closed-book in the report.
"""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Literal

from searchrl.config import dump_config, load_config
from searchrl.errors import SearchRLError
from searchrl.eval import resume as saved
from searchrl.eval.compare import read_metrics
from searchrl.eval.report_config import PlannedRun, ReportConfig, dataset_name
from searchrl.eval.report_table import write_report
from searchrl.eval.run import EvalConfig, run_eval
from searchrl.retrieval import RetrievalConfig
from searchrl.rollout.agent import load_backend
from searchrl.runkind import check_kind, claim


def _slug(dataset: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", dataset_name(dataset))


def open_book(dataset: str, limit: int | None) -> bool:
    """Whether the evaluated questions of `dataset` carry supporting passage ids (module docstring)."""
    from searchrl.data.catalog import load_dataset

    return any(q.supporting_ids for q in load_dataset(dataset)[:limit])


def plan_runs(cfg: ReportConfig, books: dict[str, bool]) -> list[PlannedRun]:
    """The eval runs of the report, dataset by dataset; `books`: dataset -> open-book?"""
    runs = []
    for dataset in cfg.datasets:
        for method in cfg.methods:
            if method != "direct" and not books[dataset]:
                continue
            for retriever in [None] if method == "direct" else cfg.retrievers:
                name = "__".join(x for x in (_slug(dataset), method, retriever) if x)
                retrieval = (
                    RetrievalConfig(index=cfg.indexes[retriever])
                    if retriever
                    else RetrievalConfig()
                )
                ecfg = EvalConfig(
                    method=method,
                    model=cfg.model,
                    dataset=dataset,
                    limit=cfg.limit,
                    profile=cfg.profile,
                    protocol=cfg.protocol,
                    tools=cfg.tools,
                    rollout=cfg.rollout,
                    retrieval=retrieval,
                    judge=cfg.judge,
                    require_think=cfg.require_think,
                    out=str(Path(cfg.out) / "runs" / name),
                )
                runs.append(PlannedRun(dataset, method, retriever, not books[dataset], ecfg))
    return runs


def run_state(cfg: EvalConfig) -> Literal["new", "done", "resume"]:
    """What a run folder needs: nothing (`done`), the rest of its questions (`resume`: interrupted,
    or `limit` grew) or everything (`new`). Other changed settings are refused."""
    out = Path(cfg.out)
    if not (out / "config.yaml").is_file():
        return "new"
    old = load_config(EvalConfig, out / "config.yaml")
    grew = old.limit is not None and (cfg.limit is None or cfg.limit > old.limit)
    if old.limit != cfg.limit and not grew:
        raise SearchRLError(
            f"{out} answered the first {old.limit or 'all'} questions; limit {cfg.limit} is smaller: "
            "give the report another --out (or delete that folder)"
        )
    saved.check_same_config(
        out, {**old.model_dump(mode="json"), "limit": cfg.limit}, cfg.model_dump(mode="json")
    )
    finished = (out / "metrics.json").is_file() and not (out / saved.PROGRESS).is_file()
    return "done" if finished and not grew else "resume"


def run_report(cfg: ReportConfig, backend=None, progress: bool = True) -> Path:
    """Run what the report still lacks, then write `OUT/report.md` and `OUT/plots/`; returns the
    report's path. `backend` may be given (tests, a loaded model); else one is built from
    `cfg.model` on the first run that generates, and closed at the end."""
    from rich.console import Console

    console = Console(stderr=True)
    books = {d: open_book(d, cfg.limit) for d in cfg.datasets}
    runs = plan_runs(cfg, books)
    if not runs:
        raise SearchRLError(
            f"nothing to run: every dataset is closed-book ({', '.join(cfg.datasets)}) and `direct` is not among the methods"
        )
    out = Path(cfg.out)
    check_kind(out, "report")  # before its runs' folders are read: a training run's config is never replaced
    for r in runs:
        check_kind(r.cfg.out, "eval")
    states = [run_state(r.cfg) for r in runs]  # every folder checked before a model loads
    claim(out, "report")
    dump_config(cfg, out / "config.yaml")
    todo = sum(s != "done" for s in states)
    console.print(
        f"{len(runs)} runs: {len(runs) - todo} finished (kept), {todo} to run", highlight=False
    )
    started, own = time.perf_counter(), None
    try:
        for i, (run, state) in enumerate(zip(runs, states), 1):
            head = f"[{i}/{len(runs)}] {run.label}"
            if state == "done":
                console.print(f"{head}: finished, kept", highlight=False, markup=False)
                continue
            if backend is None:  # one model for every run: the runs differ in data, method and index only
                backend = own = load_backend(run.cfg)
            console.print(
                f"{head}" + (" (continued)" if state == "resume" else ""),
                highlight=False,
                markup=False,
            )
            m = run_eval(run.cfg, progress=progress, backend=backend, resume=state == "resume")
            console.print(
                f"    cover-EM {m['cover_em']:.1%}  F1 {m['f1']:.1%}  format ok {m['format_ok_rate']:.0%}  "
                f"searches/q {m['mean_searches']:.2f}  ({m['seconds']:.0f} s; {time.perf_counter() - started:.0f} s so far)",
                highlight=False,
            )
    finally:
        if own is not None:
            own.close()
    closed = [d for d in cfg.datasets if not books[d]]
    return write_report(cfg, [(r, read_metrics(r.cfg.out)) for r in runs], closed)


def report_command(config: str | None, overrides: list[str], flags: dict) -> Path:
    """`searchrl eval report`: YAML file, then `--set` overrides, then the flags (keyed by config keys).
    Prints the results table as Markdown (to paste anywhere)."""
    from rich.console import Console

    from searchrl.config import flag_overrides

    cfg = load_config(ReportConfig, config, list(overrides) + flag_overrides(flags, overrides))
    path = run_report(cfg)
    table = path.read_text(encoding="utf-8").split("## Results\n\n", 1)[1].split("\n\n", 1)[0]
    Console(soft_wrap=True).print(table, markup=False, highlight=False)
    Console(stderr=True).print(
        f"wrote {path} and {path.parent / 'plots' / 'scores.png'}", highlight=False
    )
    return path
