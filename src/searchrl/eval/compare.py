"""`searchrl eval compare DIR [DIR ...]`: the metrics.json of several runs side by side.

Columns are runs (named by their folder), rows are the model, method, dataset and the metrics, so
the table stays narrow for a handful of runs; fractions are shown in percent. Runs that answered
different questions are compared with a warning line. Runs written before a metric existed show `n/a` in its column. A second
table holds the multi-hop behaviour per question type (`searchrl.eval.multihop`): one row per run
and type, for the runs that measured it.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Sequence
from pathlib import Path

from rich.console import Console

from searchrl.data.textio import read_json
from searchrl.errors import DataError, SearchRLError
from searchrl.eval import result_names as rn
from searchrl.eval.multihop import HEADER, right_aligned, type_rows
from searchrl.eval.summary import fmt_number, fmt_percent
from searchrl.tables import Column, markdown_table, print_table, short_path

# (metrics.json key, column header, kind): kind "pct" = fraction shown in %, else digits.
COLUMNS: tuple[tuple[str, str, str | int], ...] = (
    (rn.N, "n", 0),
    (rn.EM, "EM %", "pct"),
    (rn.F1, "F1 %", "pct"),
    (rn.COVER_EM, "CEM %", "pct"),
    (rn.COVER_EM_SUBSTRING, "CEM-sub %", "pct"),
    (rn.ACC_L, "ACC_L %", "pct"),
    (rn.FORMAT_OK_RATE, "format %", "pct"),
    (rn.SEARCH_RATE, "searched %", "pct"),
    (rn.MEAN_SEARCHES, "searches/q", 2),
    (rn.RETRIEVAL_RECALL, "recall %", "pct"),
    (rn.MEAN_GENERATED_TOKENS, "tokens/q", 1),
    (rn.SECONDS, "seconds", 1),
)
RUN_COLUMNS = ("run", rn.MODEL, rn.METHOD, rn.DATASET)


def read_metrics(folder: str | Path) -> dict:
    """metrics.json of one run folder (or the file itself), with clear errors."""
    path = Path(folder)
    if path.is_dir():
        path = path / "metrics.json"
    if not path.is_file():
        raise SearchRLError(f"{path}: no metrics.json here; give folders written by `searchrl eval run --out`")
    metrics = read_json(path)
    if not isinstance(metrics, dict):
        raise DataError(f"{path}: expected a JSON object of metrics")
    return metrics


def _cell(value, kind) -> str:
    if value is None:
        return "n/a"
    if kind == "pct":
        return fmt_percent(value)
    return str(value) if kind == 0 else fmt_number(value, kind)


def metric_cells(metrics: dict, keys: Sequence[str]) -> list[str]:
    """The cells of `keys` (metrics.json keys of `COLUMNS`) for one run, formatted as `eval compare` does."""
    kinds = {key: kind for key, _, kind in COLUMNS}
    return [_cell(metrics.get(key), kinds[key]) for key in keys]


def column_labels(keys: Sequence[str]) -> list[str]:
    labels = {key: label for key, label, _ in COLUMNS}
    return [labels[key] for key in keys]


def _run_name(folder: str | Path) -> str:
    return Path(folder).name if Path(folder).is_dir() else Path(folder).parent.name


def compare_rows(folders: Sequence[str | Path]) -> tuple[list[str], list[list[str]]]:
    """(header, rows) of the comparison, transposed so it stays narrow: a column per run (named by
    its folder, in the order given), a row per field (model, method, dataset, then the metrics);
    a metric no run measured is left out. A model or dataset given as a path is named by its run
    (`searchrl.tables.short_path`)."""
    runs = [read_metrics(folder) for folder in folders]
    rows = [[key] + [short_path(str(m.get(key) or "-")) for m in runs] for key in RUN_COLUMNS[1:]]
    for key, label, kind in COLUMNS:
        if any(m.get(key) is not None for m in runs):
            rows.append([label] + [_cell(m.get(key), kind) for m in runs])
    return ["", *map(_run_name, folders)], rows


def _question_ids(folder: str | Path) -> frozenset[str] | None:
    path = Path(folder) / "predictions.jsonl" if Path(folder).is_dir() else Path(folder).parent / "predictions.jsonl"
    if not path.is_file():
        return None
    ids = []
    with path.open(encoding="utf-8") as lines:
        for line in lines:
            with contextlib.suppress(ValueError, AttributeError):
                ids.append(str(json.loads(line).get("question_id")))
    return frozenset(ids)


def question_set_warning(folders: Sequence[str | Path]) -> str | None:
    """One line when the runs did not answer the same questions (another dataset, another count,
    or, where predictions.jsonl is there, other question ids); None when they did."""
    runs = [read_metrics(folder) for folder in folders]
    sets = {(m.get("dataset"), m.get("n")) for m in runs}
    ids = [_question_ids(folder) for folder in folders]
    known = [i for i in ids if i is not None]
    if len(sets) == 1 and len(set(known)) <= 1:
        return None
    each = ", ".join(f"{_run_name(f)}: {m.get('n', '?')} of {m.get('dataset', '?')}" for f, m in zip(folders, runs))
    return f"warning: the runs answered different questions ({each}); their scores are not comparable"


def by_type_rows(folders: Sequence[str | Path]) -> tuple[list[str], list[list[str]]]:
    """(header, rows) of the per-type table: a row per run and question type, `all` first; no
    rows when no run measured it."""
    rows = []
    for folder in folders:
        rows += [[_run_name(folder), *row] for row in type_rows(read_metrics(folder))]
    return ["run", *HEADER], rows


def compare_markdown(folders: Sequence[str | Path]) -> str:
    """The comparison as a Markdown table, then the per-type table (when a run has one)."""
    header, rows = compare_rows(folders)
    markdown = markdown_table(header, rows, [i > 0 for i in range(len(header))])
    header, rows = by_type_rows(folders)
    return markdown + ("\n" + markdown_table(header, rows, right_aligned(header)) if rows else "")


def compare_command(folders: Sequence[str], out: str | None = None, console: Console | None = None,
                    markdown: bool = False) -> str:
    """`searchrl eval compare`: a warning line when the runs answered different questions, then a
    rich table on a terminal (Markdown when piped or with `markdown`; on a narrow terminal the runs
    that fit, the rest named as being in `out`), then the per-type table; the Markdown tables into
    `out` if given."""
    if not folders:
        raise SearchRLError("give at least one run folder")
    console = console or Console()
    warning = question_set_warning(folders)
    if warning:
        Console(stderr=True).print(warning, markup=False, highlight=False, soft_wrap=True)
    text = compare_markdown(folders)
    if markdown:
        console.print(text, end="", markup=False, highlight=False, soft_wrap=True)
    else:
        header, rows = compare_rows(folders)
        print_table(console, [Column(col, right=i > 0) for i, col in enumerate(header)], rows,
                    title="evaluation runs", keep=2, elsewhere=out)
        header, rows = by_type_rows(folders)
        if rows:
            console.print()
            print_table(console, [Column(col, right=r) for col, r in zip(header, right_aligned(header))], rows,
                        title="by question type", keep=2, elsewhere=out)
    if out is not None:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        Path(out).write_text(text, encoding="utf-8")
        Console(stderr=True).print(f"wrote {out}", highlight=False, markup=False)
    return text
