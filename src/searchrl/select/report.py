"""What `searchrl data select` writes once every question is done: one question file per bucket,
`summary.json`, `summary.md` and `histogram.png`.

Bucket files hold the questions in the format the loaders read (`Question.to_dict`), plus
`bucket`, `rollouts_needed` (null when unsolved), `rollouts_sampled` and `rollouts_correct`; so a
bucket file is a dataset as it is (`stage1.dataset: runs/select/medium.jsonl`). Every bucket file
is written, an empty one included.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING

from searchrl.data.types import Question
from searchrl.select.buckets import BUCKETS, Tally, bucket_of, bucket_ranges

if TYPE_CHECKING:
    from searchrl.select.config import SelectConfig


def summary(
    cfg: SelectConfig, questions: list[Question], tallies: dict[str, Tally], rounds: list[dict]
) -> dict:
    """Counts per bucket and per (question type, bucket), rollouts sampled, time spent."""
    cap = cfg.max_rollouts
    buckets = {
        q.id: bucket_of(tallies[q.id].needed(cap), cfg.medium_from, cfg.difficult_from)
        for q in questions
    }
    by_type: dict[str, Counter] = {}
    for q in questions:
        by_type.setdefault(q.type or "(none)", Counter())[buckets[q.id]] += 1
    sampled = sum(t.sampled for t in tallies.values())
    seconds = sum(r["seconds"] for r in rounds)
    return {
        "dataset": cfg.dataset,
        "model": cfg.model,
        "metric": cfg.metric,
        "min_score": cfg.min_score,
        "max_rollouts": cap,
        "rollouts_per_round": cfg.rollouts_per_round,
        "medium_from": cfg.medium_from,
        "difficult_from": cfg.difficult_from,
        "ranges": bucket_ranges(cfg.medium_from, cfg.difficult_from, cap),
        "questions": len(questions),
        "buckets": {b: sum(1 for v in buckets.values() if v == b) for b in BUCKETS},
        "by_type": {t: {b: c[b] for b in BUCKETS} for t, c in sorted(by_type.items())},
        "needed": sorted(n for q in questions if (n := tallies[q.id].needed(cap)) is not None),
        "rollouts_sampled": sampled,
        "rounds": len(rounds),
        "seconds": round(seconds, 1),
        "seconds_per_rollout": round(seconds / sampled, 3) if sampled else None,
    }


def summary_markdown(s: dict) -> str:
    n = s["questions"]
    lines = [
        f"# Data selection: {s['dataset']} ({n} questions), {s['model']}",
        "",
        (
            f"A rollout is correct when {s['metric']}(answer, gold) >= {s['min_score']:g}; at most "
            f"{s['max_rollouts']} rollouts per question, {s['rollouts_per_round']} per round."
        ),
        "",
        "| bucket | rollouts to the first correct one | questions | share |",
        "|---|---|---:|---:|",
    ]
    for b in BUCKETS:
        lines.append(
            f"| {b} | {s['ranges'][b]} | {s['buckets'][b]} | {100 * s['buckets'][b] / n:.1f} % |"
        )
    lines += [
        "",
        "| question type | " + " | ".join(BUCKETS) + " |",
        "|---|" + "---:|" * len(BUCKETS),
    ]
    for t, counts in s["by_type"].items():
        lines.append(f"| {t} | " + " | ".join(str(counts[b]) for b in BUCKETS) + " |")
    per = f" ({s['seconds_per_rollout']:.2f} s per rollout)" if s["seconds_per_rollout"] else ""
    lines += [
        "",
        f"{s['rollouts_sampled']:,} rollouts sampled in {s['rounds']} rounds, {s['seconds']:,.1f} s{per}.",
    ]
    return "\n".join(lines) + "\n"


def draw_histogram(s: dict, path: Path) -> None:
    """Questions per count of rollouts needed, coloured by bucket, the unsolved ones in a bar of
    their own right of the cap."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cap = s["max_rollouts"]
    per_count = Counter(s["needed"])
    colors = {
        "easy": "tab:green",
        "medium": "tab:orange",
        "difficult": "tab:red",
        "unsolved": "tab:gray",
    }
    fig, ax = plt.subplots(figsize=(max(6.0, 0.22 * cap + 2), 3.6))
    xs = list(range(1, cap + 1))
    for b in ("easy", "medium", "difficult"):
        sel = [x for x in xs if bucket_of(x, s["medium_from"], s["difficult_from"]) == b]
        if sel:
            ax.bar(
                sel, [per_count[x] for x in sel], color=colors[b], label=f"{b} ({s['buckets'][b]})"
            )
    unsolved_x = cap + 2
    ax.bar(
        [unsolved_x],
        [s["buckets"]["unsolved"]],
        color=colors["unsolved"],
        label=f"unsolved ({s['buckets']['unsolved']})",
    )
    ticks = sorted({1, *range(5, cap + 1, 5), cap})
    ax.set_xticks([*ticks, unsolved_x], [*map(str, ticks), f">{cap}"])
    ax.set_xlabel("rollouts needed for the first correct answer")
    ax.set_ylabel("questions")
    ax.set_title(f"{s['dataset']}, {s['model']}: {s['questions']} questions")
    ax.legend(fontsize=8)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _write(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def write_all(
    cfg: SelectConfig, questions: list[Question], tallies: dict[str, Tally], rounds: list[dict]
) -> dict:
    """Write the bucket files and the report into `cfg.out`; return the summary."""
    out, cap = Path(cfg.out), cfg.max_rollouts
    lines: dict[str, list[str]] = {b: [] for b in BUCKETS}
    for q in questions:
        t = tallies[q.id]
        b = bucket_of(t.needed(cap), cfg.medium_from, cfg.difficult_from)
        record = {
            **q.to_dict(),
            "bucket": b,
            "rollouts_needed": t.needed(cap),
            "rollouts_sampled": t.sampled,
            "rollouts_correct": t.correct,
        }
        lines[b].append(json.dumps(record, ensure_ascii=False) + "\n")
    for b in BUCKETS:
        _write(out / f"{b}.jsonl", "".join(lines[b]))
    s = summary(cfg, questions, tallies, rounds)
    _write(out / "summary.json", json.dumps(s, indent=2) + "\n")
    _write(out / "summary.md", summary_markdown(s))
    draw_histogram(s, out / "histogram.png")
    return s
