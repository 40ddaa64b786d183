"""What lets an evaluation survive being stopped: predictions written as batches finish, and what
`searchrl eval run --resume DIR` reads back.

`predictions.jsonl` grows in question order, one batch at a time, each batch on disk (flushed and
synced) before the next starts. `progress.json` carries the generation seconds and the judge and
web search counters spent so far; it is removed once metrics.json is written, so its presence
marks an unfinished run. A process killed mid-write leaves a torn last line: resuming drops it,
and its batch is run again.
"""

from __future__ import annotations

import json
import os
import shlex
from collections.abc import Sequence
from pathlib import Path

from searchrl.config import C, flag_overrides, load_config
from searchrl.data.textio import read_appended_jsonl
from searchrl.data.types import Question
from searchrl.errors import SearchRLError
from searchrl.eval import result_names as rn
from searchrl.eval.spending import SPENT_KEYS
from searchrl.runkind import check_kind

PREDICTIONS = "predictions.jsonl"
PROGRESS = "progress.json"


def resumed_config(cls: type[C], run_dir: Path, config: str | None, overrides: list[str], flags: dict) -> C:
    """The config to continue `run_dir` with: its config.yaml (or `config`), `overrides` and
    `flags` (keyed by config keys), refused unless it equals the one the run began with."""
    path = run_dir / "config.yaml"
    check_kind(run_dir, "eval", "--resume")  # before its config.yaml is read as an evaluation's
    if not path.is_file():
        raise SearchRLError(f"cannot resume: {path} does not exist; give --resume the --out folder of an interrupted `eval run`")
    if flags.get("out") is not None and Path(flags["out"]).resolve() != run_dir.resolve():
        raise SearchRLError(f"--resume continues {run_dir} in place: drop --out {flags['out']}")
    first = load_config(cls, path)
    cfg = load_config(cls, config or path, overrides + flag_overrides({**flags, "out": str(run_dir)}, overrides))
    check_same_config(run_dir, first.model_dump(mode="json"), cfg.model_dump(mode="json"))
    return cfg


def output_dir(out: str | None) -> Path:
    """`--out` as a folder to write into; refused when missing or a file, before anything loads."""
    if out is None:
        raise SearchRLError("no output folder: give --out DIR")
    path = Path(out)
    if path.exists() and not path.is_dir():
        raise SearchRLError(f"--out {out} is a file; give a folder (eval run writes {PREDICTIONS}, metrics.json and config.yaml into it)")
    return path


def refuse_existing(out: Path) -> None:
    """A run without --resume starts only in a folder that holds no evaluation (its lock file aside);
    `--overwrite` is the way to start over in one."""
    if (out / PROGRESS).is_file():
        raise SearchRLError(
            f"{out} holds an unfinished evaluation ({PROGRESS}): continue it with `searchrl eval run --resume {out}`, "
            "start over with --overwrite (its predictions are lost), or choose another --out"
        )
    predictions = out / PREDICTIONS
    found = [name for name in ("config.yaml", "metrics.json") if (out / name).is_file()]
    found += [PREDICTIONS] if predictions.is_file() and predictions.stat().st_size > 0 else []
    if found:
        raise SearchRLError(
            f"{out} already holds an evaluation ({', '.join(found)}): continue it with `searchrl eval run --resume {out}`, "
            "start over with --overwrite, or choose another --out"
        )


def start_fresh(out: Path) -> None:
    """An empty predictions file, and no metrics or progress of an earlier run in `out`."""
    (out / PREDICTIONS).write_text("")
    for name in (PROGRESS, "metrics.json", "metrics.md"):
        (out / name).unlink(missing_ok=True)


def interrupted(out: Path) -> str:
    """The line for a run stopped by Ctrl-C: what is kept, and the command that goes on from there."""
    if not (out / "config.yaml").is_file():
        return f"interrupted before anything was written to {out}; run the same command again"
    predictions = out / PREDICTIONS
    kept = predictions.read_bytes().count(b"\n") if predictions.is_file() else 0
    return (f"interrupted: {kept} answer(s) are saved in {out}; continue with: "
            f"searchrl eval run --resume {shlex.quote(str(out))}")


def finished_records(out: Path, questions: Sequence[Question]) -> list[dict]:
    """The records an interrupted run wrote into `out`, which must be the first of `questions`
    in order; a torn last line is dropped and cut from the file, so appending goes on from there."""
    path = out / PREDICTIONS
    records = read_appended_jsonl(path, "its question is then run again")
    for i, rec in enumerate(records):
        if i >= len(questions) or rec.get("id") != questions[i].id:
            raise SearchRLError(
                f"cannot resume: {path}:{i + 1} is question {rec.get('id')!r}, but the dataset's question {i + 1} is "
                f"{questions[i].id if i < len(questions) else 'missing'!r}; the dataset changed since the run "
                "started: start a new run with another --out"
            )
    return records


def append_records(out: Path, records: Sequence[dict]) -> None:
    """Add one batch's records to predictions.jsonl, on disk when this returns."""
    with (out / PREDICTIONS).open("a", encoding="utf-8") as fh:
        fh.write("".join(json.dumps(rec, ensure_ascii=False) + "\n" for rec in records))
        fh.flush()
        os.fsync(fh.fileno())


def spent_so_far(out: Path) -> dict:
    """What the earlier runs in `out` spent (generation seconds, judge and web search counters;
    `spending.SPENT_KEYS`): from progress.json while unfinished, from metrics.json once finished
    (a finished run resumed has nothing left to add)."""
    for name in (PROGRESS, "metrics.json"):
        if (out / name).is_file():
            saved = json.loads((out / name).read_text())
            return {k: saved[k] for k in SPENT_KEYS if saved.get(k) is not None}
    return {rn.SECONDS: 0.0}


def save_progress(out: Path, spent: dict) -> None:
    tmp = out / (PROGRESS + ".tmp")
    tmp.write_text(json.dumps(spent) + "\n")
    os.replace(tmp, out / PROGRESS)


def finish(out: Path) -> None:
    """The run is complete: metrics.json now holds its seconds."""
    (out / PROGRESS).unlink(missing_ok=True)


# Where the run lives, how long services are waited for and what web search may spend change no
# prediction (a run stopped by its budget is resumed with a higher cap).
_FREE_TO_CHANGE = ("out", "retrieval.retry.", "retrieval.web.retry.", "retrieval.web.budget.", "retrieval.web.workers",
                   "judge.workers", "judge.max_retries", "judge.backoff_s", "judge.timeout_s")


def check_same_config(run_dir: Path, saved: dict, wanted: dict, free: tuple[str, ...] = _FREE_TO_CHANGE) -> None:
    """Refuse to resume with settings that would give other predictions than the run began with;
    keys starting with one of `free` may change."""
    old, new = _flat(saved), _flat(wanted)
    changed = [k for k in sorted(old.keys() | new.keys()) if old.get(k) != new.get(k) and not k.startswith(free)]
    if changed:
        shown = "; ".join(f"{k}: {old.get(k)!r} -> {new.get(k)!r}" for k in changed[:4])
        raise SearchRLError(
            f"cannot resume {run_dir} with another config ({shown}): its predictions would not match. Resume with "
            f"the settings in {run_dir / 'config.yaml'} (give no flag that changes them), or start a new run with another --out"
        )


def _flat(tree: dict, prefix: str = "") -> dict:
    out = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            out.update(_flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out
