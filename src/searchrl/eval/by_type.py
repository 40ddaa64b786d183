"""`searchrl eval by-type RUN [RUN ...]`: answer scores per question type, with bootstrap 95 %
intervals, for finished `eval run` folders that answered the same questions.

For each run and question type (`all` first, then the types in sorted order) it gives EM, token F1
and cover-EM (the authors' token cover, `searchrl.metrics.cover_em`), recomputed from each
record's prediction and gold answers, each with a percentile bootstrap interval of the mean:
the type's questions resampled with replacement `resamples` times (`all`: every question, not
stratified by type). With a `baseline` run, the difference of every other run to it, per type, with
a *paired* bootstrap interval: one resample of question indices serves both runs, which is the
bootstrap of the per-question differences.

Writes `OUT/by_type.md` (one table per metric: a row per run, a column per type, cells
`score [low, high]` in percent; then the paired differences) and `OUT/by_type.png` (a panel per
metric, a bar per run and type, the intervals as error bars). Runs are named by their folder, or
by `LABEL=DIR`. `common`: compare the questions every run answered (a run stopped early), saying
how many each run had beyond them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from rich.console import Console

from searchrl.data.textio import iter_json_lines
from searchrl.errors import DataError, SearchRLError
from searchrl.eval.multihop import ALL
from searchrl.metrics import cover_em, exact_match, f1_score
from searchrl.tables import Column, markdown_table, print_table

# (key, label): the answer metrics of the table, in its order.
METRICS = (("em", "EM"), ("f1", "F1"), ("cover_em", "cover-EM"))
_SCORERS = {"em": exact_match, "f1": f1_score, "cover_em": cover_em}
LEVEL = 0.95


@dataclass(frozen=True)
class RunScores:
    """One run's per-question scores, in the order of `ids`."""

    name: str
    ids: tuple[str, ...]
    types: tuple[str, ...]
    scores: dict[str, np.ndarray]  # metric key -> [n] score per question, in [0, 1]


def parse_run(spec: str) -> tuple[str, Path]:
    """`LABEL=DIR` or `DIR` (named by its folder).

    >>> parse_run("rag=runs/untrained-rag"), parse_run("runs/untrained-rag")
    (('rag', PosixPath('runs/untrained-rag')), ('untrained-rag', PosixPath('runs/untrained-rag')))
    """
    label, sep, path = spec.partition("=")
    if sep and label and path:
        return label, Path(path)
    return Path(spec).name, Path(spec)


def read_run(name: str, folder: Path) -> RunScores:
    """The scores of a run folder's predictions.jsonl (a record needs id, type, prediction, answers)."""
    path = folder / "predictions.jsonl" if folder.is_dir() else folder
    if not path.is_file():
        raise SearchRLError(f"{path}: no predictions here; give folders written by `searchrl eval run --out`")
    ids, types, scores, seen = [], [], {key: [] for key, _ in METRICS}, set()
    for lineno, rec in iter_json_lines(path):
        where = f"{path}:{lineno}"
        if not isinstance(rec, dict) or not {"id", "prediction", "answers"} <= rec.keys():
            raise DataError(f"{where}: expected an `eval run` record with id, prediction and answers")
        if rec["id"] in seen:
            raise DataError(f"{where}: question {rec['id']!r} occurs twice; each question must be scored once")
        seen.add(rec["id"])
        ids.append(rec["id"])
        types.append(rec.get("type") or "")
        for key, _ in METRICS:
            scores[key].append(_SCORERS[key](rec["prediction"], rec["answers"]))
    if not ids:
        raise DataError(f"{path}: holds no predictions")
    return RunScores(name, tuple(ids), tuple(types), {k: np.asarray(v, dtype=float) for k, v in scores.items()})


def aligned(runs: Sequence[RunScores], common: bool = False) -> list[RunScores]:
    """`runs` with every run's questions in the first run's order. Runs that did not answer the
    same questions are an error (intervals and paired differences need the same ones), unless
    `common`: then only the questions every run answered are kept (a run stopped early)."""
    first = runs[0]
    shared = set(first.ids).intersection(*(r.ids for r in runs[1:]))
    for run in runs[1:]:
        if set(run.ids) != set(first.ids) and not common:
            only = len(set(run.ids) - set(first.ids))
            missing = len(set(first.ids) - set(run.ids))
            raise SearchRLError(
                f"runs {first.name!r} and {run.name!r} answered different questions ({len(first.ids)} and {len(run.ids)}; "
                f"{only} only in {run.name!r}, {missing} only in {first.name!r}): evaluate them on the same dataset and "
                "--limit, or compare the questions all runs answered (--common)"
            )
    if not shared:
        raise SearchRLError(f"runs {', '.join(r.name for r in runs)} have no question in common")
    ids = tuple(qid for qid in first.ids if qid in shared)
    out = []
    for run in runs:
        where = {qid: i for i, qid in enumerate(run.ids)}
        pick = np.array([where[qid] for qid in ids])
        out.append(RunScores(run.name, ids, tuple(run.types[i] for i in pick), {k: v[pick] for k, v in run.scores.items()}))
    return out


def bootstrap_interval(values: np.ndarray, resamples: int, seed: int, level: float = LEVEL) -> tuple[float, float]:
    """Percentile bootstrap interval of the mean of `values` [n]: `resamples` draws of n indices
    with replacement, the (1 - level)/2 and (1 + level)/2 quantiles of their means. For paired
    runs give the per-question differences.

    >>> bootstrap_interval(np.array([0.0, 1.0]), 2000, 0)
    (0.0, 1.0)
    """
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, len(values), size=(resamples, len(values)))  # [R, n]
    means = values[idx].mean(axis=1)  # [R]
    low, high = np.quantile(means, [(1 - level) / 2, (1 + level) / 2])
    return float(low), float(high)


@dataclass(frozen=True)
class Estimate:
    mean: float
    low: float
    high: float

    def cell(self, signed: bool = False) -> str:
        sign = "+" if signed else ""
        return f"{100 * self.mean:{sign}.1f} [{100 * self.low:{sign}.1f}, {100 * self.high:{sign}.1f}]"


def groups(run: RunScores) -> dict[str, np.ndarray]:
    """Question indices per type: `all` first, then the types sorted (untyped questions in `all` only)."""
    out = {ALL: np.arange(len(run.ids))}
    for qtype in sorted({t for t in run.types if t}):
        out[qtype] = np.array([i for i, t in enumerate(run.types) if t == qtype])
    return out


def estimate(values: np.ndarray, resamples: int, seed: int) -> Estimate:
    return Estimate(float(values.mean()), *bootstrap_interval(values, resamples, seed))


@dataclass(frozen=True)
class ByType:
    """Every estimate of the comparison: `scores[metric][run][type]`, `diffs[metric][run][type]`
    (runs other than the baseline, minus the baseline; empty without one)."""

    runs: list[str]
    types: dict[str, int]  # type -> questions
    scores: dict[str, dict[str, dict[str, Estimate]]]
    diffs: dict[str, dict[str, dict[str, Estimate]]]
    baseline: str | None


def by_type(runs: Sequence[RunScores], baseline: str | None = None, resamples: int = 10_000, seed: int = 0,
            common: bool = False) -> ByType:
    """The comparison of `runs` (same questions, or with `common` those all answered: `aligned`).
    Every estimate draws its resamples from the same seed, so a type's intervals of all runs use
    the same question indices."""
    runs = aligned(runs, common)
    names = [r.name for r in runs]
    if len(set(names)) != len(names):
        raise SearchRLError(f"two runs share a name ({', '.join(names)}): name them LABEL=DIR")
    if baseline is not None and baseline not in names:
        raise SearchRLError(f"baseline {baseline!r} is none of the runs ({', '.join(names)})")
    index = groups(runs[0])
    base = next((r for r in runs if r.name == baseline), None)
    scores: dict = {key: {} for key, _ in METRICS}
    diffs: dict = {key: {} for key, _ in METRICS}
    for key, _ in METRICS:
        for run in runs:
            scores[key][run.name] = {t: estimate(run.scores[key][ix], resamples, seed) for t, ix in index.items()}
            if base is not None and run is not base:
                delta = run.scores[key] - base.scores[key]
                diffs[key][run.name] = {t: estimate(delta[ix], resamples, seed) for t, ix in index.items()}
    return ByType(names, {t: len(ix) for t, ix in index.items()}, scores, diffs, baseline)


def tables(result: ByType) -> list[tuple[str, list[str], list[list[str]]]]:
    """(title, header, rows) per table: each metric's scores, then each metric's differences."""
    header = ["run"] + [f"{t} (n={n})" for t, n in result.types.items()]
    out = []
    for key, label in METRICS:
        rows = [[run] + [result.scores[key][run][t].cell() for t in result.types] for run in result.runs]
        out.append((f"{label} % by question type, 95 % bootstrap interval", header, rows))
    for key, label in METRICS if result.baseline else ():
        rows = [[run] + [d[t].cell(signed=True) for t in result.types] for run, d in result.diffs[key].items()]
        out.append((f"{label} points minus {result.baseline}, paired bootstrap 95 % interval", header, rows))
    return out


def plot(result: ByType, path: Path) -> Path:
    """A panel per metric: a bar per run and type, the bootstrap intervals as error bars."""
    from searchrl.eval.plots import bar_panels

    types = list(result.types)
    panels = {f"{label} %": {run: [result.scores[key][run][t].mean for t in types] for run in result.runs}
              for key, label in METRICS}
    intervals = {f"{label} %": {run: [(result.scores[key][run][t].low, result.scores[key][run][t].high) for t in types]
                                for run in result.runs} for key, label in METRICS}
    groups_ = [f"{t}\n(n={n})" for t, n in result.types.items()]
    title = f"{result.types[ALL]} questions by type; error bars: 95 % bootstrap intervals"
    return bar_panels(path, title, groups_, panels, intervals=intervals)


def by_type_command(specs: Sequence[str], out: str, baseline: str | None = None, resamples: int = 10_000, seed: int = 0,
                    common: bool = False, console: Console | None = None) -> str:
    """`searchrl eval by-type`: the tables on screen, then `OUT/by_type.md` and `OUT/by_type.png`;
    returns the Markdown."""
    if not specs:
        raise SearchRLError("give at least one run folder")
    if Path(out).exists() and not Path(out).is_dir():
        raise SearchRLError(f"--out {out} is a file; give a folder for by_type.md and by_type.png")
    if resamples < 100:
        raise SearchRLError(f"--resamples {resamples} is too few for a 95 % interval: give 1000 or more")
    runs = [read_run(*parse_run(spec)) for spec in specs]
    result = by_type(runs, baseline, resamples, seed, common)
    console = console or Console()
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    markdown = []
    for i, (title, header, rows) in enumerate(tables(result)):
        if i:
            console.print()
        right = [i > 0 for i in range(len(header))]
        print_table(console, [Column(h, right=r) for h, r in zip(header, right)], rows, title=title, keep=2,
                    elsewhere=str(folder / "by_type.md"))
        markdown.append(f"{title}\n\n{markdown_table(header, rows, right)}")
    kept = result.types[ALL]
    left = "".join(f" {r.name}: {len(r.ids) - kept} left out." for r in runs if len(r.ids) > kept)
    text = f"{kept} questions answered by every run.{left} {resamples} bootstrap resamples, seed {seed}.\n\n" + "\n".join(markdown)
    (folder / "by_type.md").write_text(text, encoding="utf-8")
    png = plot(result, folder / "by_type.png")
    Console(stderr=True).print(f"wrote {folder / 'by_type.md'}, {png}", highlight=False, markup=False)
    return text
