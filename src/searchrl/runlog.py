"""Per-step metrics of a run: one JSON object per line in `metrics.jsonl` (written by the trainer,
read by plots, comparisons and the demo), mirrored to the trackers of `logging.report_to`
(`searchrl.trackers`: TensorBoard under `tb/` by default, wandb, MLflow), and a one-line summary
on stderr.

Readers take only records of the file's schema (`SCHEMAS`): a line that is not an object, lacks
a field or holds one of the wrong type (a step record holds numbers and nulls only) is skipped,
and one warning line names the skipped lines; a last line torn by a crash is skipped with a note.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from searchrl import metric_names as mn
from searchrl.data.textio import iter_json_lines
from searchrl.display import visible
from searchrl.trackers import open_trackers, sample_rows, scalars

METRICS_FILE = "metrics.jsonl"
# What the health monitors write beside it (`searchrl.rl.health`, `searchrl.rl.rollback`).
ALARMS_FILE = "alarms.jsonl"
ROLLBACKS_FILE = "rollbacks.jsonl"
ROLLED_BACK_FILE = "metrics.rolled_back.jsonl"  # the step records a rollback abandoned

NUMBER = (int, float)
Schema = dict[str, type | tuple[type, ...]]
# The fields every reader of a file needs, with their types (a reader may ask for more); step
# records (metrics, rolled back) hold only numbers and nulls besides.
SCHEMAS: dict[str, Schema] = {
    METRICS_FILE: {mn.STAGE: int, mn.STEP: int},
    ROLLED_BACK_FILE: {mn.STAGE: int, mn.STEP: int, "rollback": int},
    ALARMS_FILE: {"step": int},
    ROLLBACKS_FILE: {"rollback": int, "step": int},
}
_STEP_FILES = (METRICS_FILE, ROLLED_BACK_FILE)
_KIND_NAMES = {int: "an integer", str: "a string", NUMBER: "a number"}
_JSON_NAMES = {list: "array", str: "string", int: "number", float: "number", bool: "boolean", type(None): "null"}

# The one-line console summary: (metrics key, label, format).
_SUMMARY = (
    (mn.REWARD, "reward", "{:+.3f}"),
    (mn.SEARCH_RATE, "search", "{:.2f}"),
    (mn.FORMAT_OK, "format", "{:.2f}"),
    (mn.ANSWER_F1, "f1", "{:.3f}"),
    (mn.SFT_LOSS, "sft loss", "{:.3f}"),
    (mn.RESPONSE_TOKENS, "tokens", "{:.0f}"),
    (mn.KL, "kl", "{:.4f}"),
    (mn.WEB.key("requests"), "web requests", "{:.0f}"),
    (mn.STEP_SECONDS, "s", "{:.1f}"),
)


def format_duration(seconds: float) -> str:
    """`42s`, `3m05s`, `2h07m`: a duration for a console line."""
    seconds = max(round(seconds), 0)
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


def read_metrics(run_dir: Path) -> list[dict]:
    """The step records; a last line torn by a crash mid-write is skipped with a note on stderr
    (resuming the run trims it for good), other odd lines with a warning."""
    return read_events(run_dir, METRICS_FILE)


def read_events(run_dir: Path, name: str, fields: Schema | None = None) -> list[dict]:
    """The records of one of a run's jsonl files (`METRICS_FILE`, `ALARMS_FILE`, ...) that hold
    its schema (`SCHEMAS`) and `fields`; none when the file is absent."""
    path = Path(run_dir) / name
    if not path.is_file():
        return []
    kept, skipped = [], []
    for lineno, rec in iter_json_lines(path, on_torn_tail=_note):
        problem = _problem(rec, {**SCHEMAS[name], **(fields or {})}, numbers_only=name in _STEP_FILES)
        if problem:
            skipped.append(f"line {lineno} ({problem})")
        else:
            kept.append(rec)
    if skipped:
        more = f" and {len(skipped) - 3} more" if len(skipped) > 3 else ""
        print(f"warning: {path}: skipped {len(skipped)} line(s) that are not records of this file: "
              f"{'; '.join(skipped[:3])}{more}", file=sys.stderr)
    return kept


def _is(value, kind) -> bool:
    return isinstance(value, kind) and not isinstance(value, bool)


def _problem(rec, schema: dict, numbers_only: bool) -> str:
    """What keeps `rec` from being a record of `schema`; '' when nothing does."""
    if not isinstance(rec, dict):
        return f"a JSON {_JSON_NAMES.get(type(rec), 'value')}, not an object"
    for key, kind in schema.items():
        if key not in rec:
            return f"no `{key}`"
        if not _is(rec[key], kind):
            return f"`{key}` is {json.dumps(rec[key])[:40]}, not {_KIND_NAMES[kind]}"
    if numbers_only:
        for key, value in rec.items():
            if value is not None and not _is(value, NUMBER):
                return f"`{visible(str(key), keep_newlines=False)[:40]}` is {json.dumps(value)[:40]}, not a number"
    return ""


def _note(message: str) -> None:
    print(f"note: {message}", file=sys.stderr)


def truncate_metrics(run_dir: Path, n_lines: int) -> None:
    """Keep only the first `n_lines` records (the steps a resumed checkpoint already covers)."""
    path = Path(run_dir) / METRICS_FILE
    if not path.is_file():
        return
    lines = [line for line in path.read_text().splitlines() if line.strip()]
    path.write_text("".join(line + "\n" for line in lines[:n_lines]))


class RunLogger:
    """Appends step records to metrics.jsonl and hands them to the run's trackers
    (`searchrl.trackers`: TensorBoard, wandb, MLflow); `purge_step` drops TensorBoard events past
    a resumed checkpoint."""

    def __init__(self, run_dir: Path, report_to: list[str] = ("tensorboard",), purge_step: int | None = None,
                 echo: bool = True, config: dict | None = None, stages: dict[int, tuple[int, int]] | None = None) -> None:
        """`stages`: stage -> (steps of the run before it, its steps), for the console's
        "step k/N" and the time left."""
        self.path = Path(run_dir) / METRICS_FILE
        self.echo = echo
        self._trackers = open_trackers(list(report_to), Path(run_dir), config or {}, purge_step)
        self._stages = dict(stages or {})
        self._total = max((offset + n for offset, n in self._stages.values()), default=0)
        self._started, self._logged = time.monotonic(), 0

    def log(self, record: dict) -> None:
        with self.path.open("a", encoding="utf-8") as fh:
            fh.write(json.dumps(record) + "\n")
            fh.flush()
        step = record[mn.STEP]
        values = scalars(record)
        for tracker in self._trackers:
            tracker.log_metrics(values, step)
        self._logged += 1
        if self.echo:
            parts = [self._where(record[mn.STAGE], step)]
            for key, label, fmt in _SUMMARY:
                if record.get(key) is not None:
                    parts.append(f"{label} {fmt.format(record[key])}")
            print(" | ".join(parts), file=sys.stderr, flush=True)

    def _where(self, stage: int, step: int) -> str:
        """"stage 1 step 3/8 (run 3/16, 2m10s left)": the time left from this process's pace so far."""
        if stage not in self._stages:
            return f"stage {stage} step {step}"
        offset, n = self._stages[stage]
        left = self._total - step
        pace = (time.monotonic() - self._started) / self._logged
        eta = f", {format_duration(pace * left)} left" if left > 0 else ", done"
        return f"stage {stage} step {step - offset}/{n} (run {step}/{self._total}{eta})"

    def log_samples(self, step: int, samples: list[dict]) -> None:
        """The step's sampled trajectories (as written to samples/) as a table in each tracker."""
        rows = sample_rows(samples)
        for tracker in self._trackers:
            tracker.log_samples(rows, step)

    def close(self) -> None:
        for tracker in self._trackers:
            tracker.close()
