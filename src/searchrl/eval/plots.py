"""Training curves of a run, in the style of the paper's training-dynamics figures: reward,
response length, searches per rollout, format-ok rate and answer F1 against the step, both stages
on one axis with the stage boundary marked. Health alarms are marked where they fired (red
dotted lines), and the steps a rollback abandoned are drawn grey and dashed, ending in a cross at
the alarm. Several runs are overlaid, a colour per run, on one strip of the same curves. Reads the
runs' jsonl files only (metrics, alarms, rollbacks); matplotlib Agg.
`bar_panels` draws the bar charts of `searchrl eval report`.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from itertools import pairwise
from pathlib import Path

from searchrl import metric_names as mn
from searchrl.errors import SearchRLError
from searchrl.runlog import ALARMS_FILE, ROLLBACKS_FILE, ROLLED_BACK_FILE, read_events, read_metrics

# (metrics key, title, y label)
CURVES = (
    (mn.REWARD, "Training reward", "reward"),
    (mn.RESPONSE_TOKENS, "Response length", "policy tokens per rollout"),
    (mn.SEARCHES, "Searches per rollout", "searches"),
    (mn.FORMAT_OK, "Format correct", "share of rollouts"),
    (mn.ANSWER_F1, "Answer F1", "F1"),
)
_STAGE_COLORS = {1: "tab:blue", 2: "tab:orange"}


def _smooth(values: list[float], window: int) -> list[float]:
    """Trailing moving average (the first points average what exists so far)."""
    out, total = [], 0.0
    for i, v in enumerate(values):
        total += v
        if i >= window:
            total -= values[i - window]
        out.append(total / min(i + 1, window))
    return out


def _draw_health(ax, key: str, alarms: list[dict], rollbacks: list[dict], abandoned: list[dict]) -> None:
    for i, alarm in enumerate(alarms):
        ax.axvline(alarm["step"], color="tab:red", linestyle=":", linewidth=1.2, label="health alarm" if i == 0 else None)
    for i, rb in enumerate(rollbacks):
        pts = [(r["step"], r[key]) for r in abandoned if r.get("rollback") == rb["rollback"] and r.get(key) is not None]
        if pts:
            steps, values = zip(*pts)
            ax.plot(steps, values, color="gray", linestyle="--", linewidth=1, label="rolled back" if i == 0 else None)
            ax.plot(steps[-1], values[-1], "x", color="tab:red")


def _draw(ax, records: list[dict], key: str, title: str, ylabel: str, window: int) -> None:
    for stage in sorted({r[mn.STAGE] for r in records}):
        pts = [(r[mn.STEP], r[key]) for r in records if r[mn.STAGE] == stage and r.get(key) is not None]
        if not pts:
            continue
        steps, values = zip(*pts)
        color = _STAGE_COLORS.get(stage, "tab:gray")
        ax.plot(steps, values, color=color, alpha=0.3, linewidth=1)
        ax.plot(steps, _smooth(list(values), window), color=color, linewidth=2, label=f"Stage {stage}")
    stages = sorted({r[mn.STAGE] for r in records})
    for prev, nxt in pairwise(stages):
        last = max(r[mn.STEP] for r in records if r[mn.STAGE] == prev)
        first = min(r[mn.STEP] for r in records if r[mn.STAGE] == nxt)
        ax.axvline((last + first) / 2, color="black", linestyle="--", linewidth=1)
    ax.set_title(title)
    ax.set_xlabel("step")
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)


def plot_run(run_dir: Path, out: Path | None = None, window: int | None = None) -> list[Path]:
    """Write one PNG per curve plus `training_curves.png` (all of them); returns the paths.

    `window`: moving-average width over steps (default: about a tenth of the run, at least 1).
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    run_dir = Path(run_dir)
    records = read_metrics(run_dir)
    if not records:
        raise SearchRLError(
            f"{run_dir / 'metrics.jsonl'} is missing or holds no complete step record; pass the directory of a `searchrl train` run"
        )
    out = Path(out) if out is not None else run_dir / "plots"
    out.mkdir(parents=True, exist_ok=True)
    window = window or max(1, len(records) // 10)
    health = [read_events(run_dir, name) for name in (ALARMS_FILE, ROLLBACKS_FILE, ROLLED_BACK_FILE)]
    written = []
    fig_all, axes = plt.subplots(1, len(CURVES), figsize=(4.2 * len(CURVES), 3.6))
    for ax_all, (key, title, ylabel) in zip(axes, CURVES):
        fig, ax = plt.subplots(figsize=(5, 3.6))
        _draw(ax, records, key, title, ylabel, window)
        _draw_health(ax, key, *health)
        ax.legend(loc="best", fontsize=8)
        fig.tight_layout()
        path = out / f"{key}.png"
        fig.savefig(path, dpi=120)
        plt.close(fig)
        written.append(path)
        _draw(ax_all, records, key, title, ylabel, window)
        _draw_health(ax_all, key, *health)
    axes[0].legend(loc="best", fontsize=8)
    fig_all.suptitle(run_dir.name)
    fig_all.tight_layout()
    path = out / "training_curves.png"
    fig_all.savefig(path, dpi=110)
    plt.close(fig_all)
    written.append(path)
    return written


def run_labels(runs: Sequence[Path]) -> list[str]:
    """Each run's legend name: its folder's name, with its parent's where two runs share one.

    >>> run_labels([Path("runs/a/train"), Path("runs/b/train"), Path("runs/demo")])
    ['a/train', 'b/train', 'demo']
    """
    names = [Path(r).name for r in runs]
    return [f"{Path(r).parent.name}/{name}" if names.count(name) > 1 else name for r, name in zip(runs, names)]


def overlay_series(records: list[dict], key: str) -> tuple[list[int], list[float]]:
    """(steps, values) of one curve over a run's whole schedule, both stages on one line."""
    pts = [(r[mn.STEP], r[key]) for r in records if r.get(key) is not None]
    return [s for s, _ in pts], [v for _, v in pts]


def overlay_runs(runs: Sequence[Path], out: Path | None = None, window: int | None = None) -> Path:
    """`searchrl plot RUN1 RUN2 ...`: every curve with the runs overlaid, a colour per run (the
    raw steps faint, the moving average bold); `out` (default: the first run's plots/) gets
    `overlay.png`. Returns its path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = [Path(r) for r in runs]
    loaded = []
    for run in runs:
        records = read_metrics(run)
        if not records:
            raise SearchRLError(f"{run / 'metrics.jsonl'} is missing or holds no complete step record; pass directories of `searchrl train` runs")
        loaded.append(records)
    out = Path(out) if out is not None else runs[0] / "plots"
    out.mkdir(parents=True, exist_ok=True)
    fig, axes = plt.subplots(1, len(CURVES), figsize=(4.2 * len(CURVES), 3.6))
    for ax, (key, title, ylabel) in zip(axes, CURVES):
        for i, (records, label) in enumerate(zip(loaded, run_labels(runs))):
            steps, values = overlay_series(records, key)
            if not steps:
                continue
            color = f"C{i % 10}"
            ax.plot(steps, values, color=color, alpha=0.25, linewidth=1)
            ax.plot(steps, _smooth(values, window or max(1, len(values) // 10)), color=color, linewidth=2, label=label)
        ax.set_title(title)
        ax.set_xlabel("step")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
    axes[0].legend(loc="best", fontsize=8)
    fig.suptitle(" vs ".join(run_labels(runs)))
    fig.tight_layout()
    path = out / "overlay.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def bar_panels(
    path: Path, title: str, groups: Sequence[str], panels: dict[str, dict[str, Sequence[float | None]]],
    hatched: Collection[str] = (),
    intervals: dict[str, dict[str, Sequence[tuple[float, float]]]] | None = None,
) -> Path:
    """One PNG of grouped bar charts, a panel per entry of `panels` (its y label -> series -> one
    fraction per group, drawn in percent; None: no bar, e.g. a method a dataset did not run).
    Series named in `hatched` (reference figures) are drawn grey and hatched. `intervals`, keyed
    as `panels`: a (low, high) fraction per group, drawn as error bars."""
    import matplotlib
    import numpy as np

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(panels), 1, figsize=(max(6.0, 1.3 * len(groups) + 2), 3.2 * len(panels)), squeeze=False)
    for ax, (ylabel, series) in zip(axes[:, 0], panels.items()):
        width = 0.8 / max(len(series), 1)
        for i, (name, values) in enumerate(series.items()):
            offset = (i - (len(series) - 1) / 2) * width
            style = {"color": "lightgray", "hatch": "//", "edgecolor": "dimgray"} if name in hatched else {}
            pts = [(g + offset, 100 * v) for g, v in enumerate(values) if v is not None]
            if intervals is not None:
                spans = [100 * np.asarray(intervals[ylabel][name][g]) for g, v in enumerate(values) if v is not None]
                style["yerr"] = [[y - lo for (_, y), (lo, _) in zip(pts, spans)], [hi - y for (_, y), (_, hi) in zip(pts, spans)]]
                style["error_kw"] = {"elinewidth": 0.8, "capsize": 2}
            bars = ax.bar([x for x, _ in pts], [y for _, y in pts], width, label=name, **style)
            ax.bar_label(bars, fmt="%.0f", fontsize=6)  # a 0 shows as a number, not as nothing
        ax.set_xticks(range(len(groups)), groups, fontsize=8)
        ax.set_ylim(0, 100)
        ax.set_ylabel(ylabel)
        ax.grid(axis="y", alpha=0.3)
    axes[0, 0].legend(fontsize=7, loc="upper right")
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return Path(path)


def plot_command(runs: Sequence[Path], out: Path | None, window: int | None) -> None:
    """`searchrl plot RUN [RUN ...]`: draw one run's curves, or several runs overlaid, and say where they went."""
    if len(runs) > 1:
        print(f"wrote {overlay_runs(runs, out, window)} ({len(runs)} runs overlaid)")
        return
    paths = plot_run(runs[0], out, window)
    print(f"wrote {len(paths)} plots to {paths[0].parent} (all curves: {paths[-1].name})")
