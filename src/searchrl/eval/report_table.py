"""`OUT/report.md` and `OUT/plots/*.png` of `searchrl eval report`: the runs' metrics.json beside
the paper's figures (`searchrl.eval.paper`), labelled with the model's size and the corpus's."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from searchrl.eval import result_names as rn
from searchrl.eval.compare import column_labels, metric_cells
from searchrl.eval.paper import (
    PAPER_RESULTS,
    PAPER_RETRIEVAL,
    QWEN,
    PaperResult,
    benchmark_of,
    paper_results,
)
from searchrl.eval.report_config import PlannedRun, ReportConfig, dataset_name
from searchrl.eval.summary import fmt_percent
from searchrl.tables import markdown_table

Result = tuple[PlannedRun, dict]  # a run and its metrics.json
CHARTS = (
    (rn.COVER_EM, "cover-EM % (ACC_R)"),
    (rn.F1, "F1 %"),
    (rn.EM, "EM %"),
    (rn.ACC_L, "ACC_L % (LLM judge)"),
)
REFERENCE = "paper: R1-Searcher, Qwen-2.5-7B-Base (29M passages)"


def _keys(judged: bool) -> list[str]:
    return [
        rn.N,
        rn.EM,
        rn.COVER_EM,
        rn.F1,
        *([rn.ACC_L] if judged else []),
        rn.FORMAT_OK_RATE,
        rn.MEAN_SEARCHES,
        rn.RETRIEVAL_RECALL,
        rn.SECONDS,
    ]


def _paper_cell(p: PaperResult, key: str) -> str:
    if key == "n":
        return str(p.n)
    value = p.get(key)
    return "—" if value is None else fmt_percent(value)


def _table(header: list[str], rows: list[list[str]], left: int) -> list[str]:
    return markdown_table(header, rows, [i >= left for i in range(len(header))]).splitlines()


def results_table(results: Sequence[Result], judged: bool) -> list[str]:
    """Every run, grouped by paper benchmark, each group followed by the paper's rows for it."""
    keys = _keys(judged)
    benches = list(dict.fromkeys(benchmark_of(run.dataset) for run, _ in results))
    rows = []
    for bench in benches:
        for run, m in results:
            if benchmark_of(run.dataset) == bench:
                dataset = run.name + (" (closed-book)" if run.closed_book else "")
                rows.append(
                    [
                        bench or "—",
                        dataset,
                        run.method,
                        run.retriever or "—",
                        *metric_cells(m, keys),
                    ]
                )
        for p in paper_results(bench):
            cells = [_paper_cell(p, k) for k in keys]
            if any(c != "—" for c in cells[1:]):  # without a judge, ACC_L-only rows show nothing
                rows.append([bench, "*paper*", p.system, p.retrieval, *cells])
    return _table(
        ["benchmark", "dataset", "method", "retriever", *column_labels(keys)], rows, left=4
    )


def _score(get, judged: bool, missing: str = "n/a") -> str:
    """cover-EM (/ ACC_L); `missing` for a value not there (ours: not judged, the paper's: not reported)."""
    cem, acc = (get(k) for k in (rn.COVER_EM, rn.ACC_L))
    if cem is None and (acc is None or not judged):
        return "—"
    show = lambda v: missing if v is None else fmt_percent(v)
    return f"{show(cem)} / {show(acc)}" if judged else show(cem)


def paper_layout(results: Sequence[Result], model: str, judged: bool) -> list[str]:
    """The paper's Table-2 layout: a row per system, a column per dataset, cover-EM (/ ACC_L)."""
    datasets = list(dict.fromkeys(run.dataset for run, _ in results))
    by_key = {(run.dataset, run.method, run.retriever): m for run, m in results}
    systems = list(dict.fromkeys((run.method, run.retriever) for run, _ in results))
    rows = []
    for method, retriever in systems:
        cells = [
            _score(by_key[(d, method, retriever)].get, judged)
            if (d, method, retriever) in by_key
            else "—"
            for d in datasets
        ]
        rows.append([" · ".join(x for x in (model, method, retriever) if x), *cells])
    benches = {benchmark_of(d) for d in datasets}
    for system, retrieval in dict.fromkeys(
        (p.system, p.retrieval) for p in PAPER_RESULTS if p.benchmark in benches
    ):
        found = {
            p.benchmark: p for p in PAPER_RESULTS if (p.system, p.retrieval) == (system, retrieval)
        }
        cells = [
            _score(found[benchmark_of(d)].get, judged, "—") if benchmark_of(d) in found else "—"
            for d in datasets
        ]
        if any(c != "—" for c in cells):
            rows.append([f"*paper*: {system} ({retrieval})", *cells])
    return _table(["system", *map(dataset_name, datasets)], rows, left=1)


def _corpus(cfg: ReportConfig, results: Sequence[Result]) -> str:
    from searchrl.retrieval.catalog import INDEXES, named_index_dir
    from searchrl.retrieval.store import read_manifest

    used = list(dict.fromkeys(run.retriever for run, _ in results if run.retriever))
    parts = []
    for name in used:
        index = cfg.indexes[name]
        manifest = read_manifest(named_index_dir(index) if index in INDEXES else Path(index))
        parts.append(f"{name} = `{index}` ({manifest['kind']}, {manifest['count']:,} passages)")
    return "; ".join(parts) if parts else "none (direct only)"


def _chart(cfg: ReportConfig, results: Sequence[Result], judged: bool, model_label: str) -> Path:
    """`OUT/plots/scores.png`: a panel per answer metric, a bar per method (x retriever) per
    dataset, and the paper's R1-Searcher (Qwen-2.5-7B-Base) hatched beside them."""
    from searchrl.eval.plots import bar_panels

    datasets = list(dict.fromkeys(run.dataset for run, _ in results))
    closed = {run.dataset for run, _ in results if run.closed_book}
    groups = [dataset_name(d) + ("\n(closed-book)" if d in closed else "") for d in datasets]
    by_key = {(run.dataset, run.method, run.retriever): m for run, m in results}
    systems = list(dict.fromkeys((run.method, run.retriever) for run, _ in results))
    qwen = {
        p.benchmark: p for p in PAPER_RESULTS if p.system == QWEN and p.retrieval == PAPER_RETRIEVAL
    }
    panels = {}
    for key, label in CHARTS:
        if key == rn.ACC_L and not judged:
            continue
        series = {
            " · ".join(x for x in (method, retriever) if x): [
                by_key.get((d, method, retriever), {}).get(key) for d in datasets
            ]
            for method, retriever in systems
        }
        series[REFERENCE] = [
            qwen[benchmark_of(d)].get(key) if benchmark_of(d) in qwen else None for d in datasets
        ]
        panels[label] = series
    title = (
        f"{model_label} on a small local corpus, first {cfg.limit or 'all'} questions per dataset\n"
        "hatched: the paper's 7B model on 29M passages (not comparable)"
    )
    return bar_panels(
        Path(cfg.out) / "plots" / "scores.png", title, groups, panels, hatched={REFERENCE}
    )


NOTES = (
    "CEM = cover-EM with the authors' token rule (the paper's ACC_R); answers normalised as in the authors' "
    "code. recall = share of a question's supporting paragraphs among all passages its trajectory retrieved "
    "(rag: the top k for the question; agent: every search). searches/q counts rag's one retrieval. Paper rows: "
    "ACC_R / ACC_L as published; EM and F1 scored from the authors' released predictions (HotpotQA, Bamboogle). "
    "The paper's HotpotQA/2Wiki/MuSiQue questions are R1-Searcher's 500 sets (`r1s-*`), not IRCoT's; "
    "its MuSiQue figures are not transcribed here."
)


def _header(
    cfg: ReportConfig,
    results: Sequence[Result],
    closed: Sequence[str],
    params: int | None,
    model_label: str,
) -> list[str]:
    """Title, the not-comparable warning and the settings every row shares."""
    ns = ", ".join(map(str, sorted({m[rn.N] for _, m in results})))
    warning = (
        f"**{model_label} on a small local corpus: not comparable to the paper.** The *paper* rows are "
        "7–8B models (and GPT-4o-mini / QwQ-32B pipelines) on 500 questions per benchmark (Bamboogle 125) "
        f"searching 29M Wikipedia passages; the other rows answer the first {cfg.limit or 'all'} questions of "
        f"each dataset (n = {ns}) searching a corpus of the benchmark files' own paragraphs."
    )
    r = cfg.rollout
    generation = (
        f"- generation: backend `{r.backend}`, {'greedy' if r.greedy else 'sampled'}, k = {r.k} passages per "
        f"search (rag: one search with the question); agent: at most {r.max_searches} searches and "
        f"{r.max_new_tokens} policy tokens"
    )
    p = cfg.protocol
    spoken = f"tags `{p.tags}`" if p.format == "tags" else f"tool calls ({', '.join(cfg.tools)})"
    protocol = (
        f"- protocol: {spoken}, template `{p.template}` (agent; model profile {cfg.profile}); rag and direct "
        "use their own answer prompts (`searchrl.eval.answer_prompts`)"
    )
    skipped = (
        ""
        if "direct" in cfg.methods or not closed
        else " (not run: `direct` is not among the methods)"
    )
    closed_line = (
        "- closed-book (direct only; their paragraphs are not in the corpus, so searching it would measure "
        f"the corpus, not the method): {', '.join(map(dataset_name, closed)) or 'none'}{skipped}"
    )
    judge = f"{cfg.judge.model} at {cfg.judge.url}" if cfg.judge.url else "none"
    seconds = sum(m[rn.SECONDS] for _, m in results)
    return [
        f"# Real-benchmark report: {model_label}",
        "",
        warning,
        "",
        f"- model: `{cfg.model}`" + (f", {params:,} parameters" if params else ""),
        protocol,
        generation,
        f"- retrievers: {_corpus(cfg, results)}",
        closed_line,
        f"- ACC_L judge: {judge}",
        f"- generation time over all runs: {seconds:,.0f} s (loading excluded)",
    ]


def write_report(cfg: ReportConfig, results: Sequence[Result], closed: Sequence[str]) -> Path:
    """Write `OUT/report.md` and the chart; returns the report's path. `closed`: the closed-book datasets."""
    from searchrl.assets import stored_parameter_count

    out = Path(cfg.out)
    params = stored_parameter_count(cfg.model)
    judged = cfg.judge.url is not None or any(m.get(rn.ACC_L) is not None for _, m in results)
    layout = "cover-EM / ACC_L %" if judged else "cover-EM % (ACC_R)"
    model_label = f"{cfg.model} ({params / 1e6:.1f}M parameters)" if params else cfg.model
    lines = _header(cfg, results, closed, params, model_label)
    lines += ["", "## Results", "", *results_table(results, judged), "", NOTES, ""]
    lines += [
        f"## In the paper's layout: {layout}",
        "",
        *paper_layout(results, cfg.model, judged),
        "",
    ]
    chart = _chart(cfg, results, judged, model_label)
    lines += ["## Chart", "", f"![scores]({chart.relative_to(out).as_posix()})", ""]
    path = out / "report.md"
    path.write_text("\n".join(lines), encoding="utf-8")
    return path
