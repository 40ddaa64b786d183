"""The `rollback` health action: when a monitor set to `rollback` fires, the run goes back to the
last checkpoint taken before the alarm's window, lowers its learning rate by
`health.rollback.lr_factor`, re-seeds its sampling and goes on; at most
`health.rollback.max_rollbacks` times, after which the alarm stops the run as `stop` would.

Nothing of the abandoned steps is lost: their step records move to `metrics.rolled_back.jsonl`
(each with `rollback: n`), their sample dumps to `samples/rollback_<n>/`, and the rollback itself
is a line of `rollbacks.jsonl` (alarm, target step, learning-rate scale). That file is the run's
count of rollbacks: a resumed run reads it, so the lowered rate and the new seeds survive a crash.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from searchrl.errors import SearchRLError
from searchrl.rl import checkpoint as ckpt
from searchrl.rl.health import Alarm, trim_alarms
from searchrl.rl.health_config import HealthConfig
from searchrl.runlog import (
    METRICS_FILE,
    ROLLBACKS_FILE,
    ROLLED_BACK_FILE,
    read_events,
    truncate_metrics,
)


class RollbackRequested(SearchRLError):
    """Raised out of the step loop once the run directory has been rolled back; the trainer
    catches it and resumes the run from the checkpoint kept."""


def lr_scale(cfg: HealthConfig, rollbacks: int) -> float:
    return cfg.rollback.lr_factor**rollbacks


def rollback_window(cfg: HealthConfig) -> int | None:
    """The widest window among monitors set to `rollback` (None when none is)."""
    windows = [m.window for m in cfg.monitors().values() if m.action == "rollback"]
    return max(windows) if windows else None


def target_step(run_dir: Path, alarm: Alarm, window: int) -> int | None:
    """The step of the newest checkpoint taken before the alarm's window (None: no checkpoint that
    early; the run restarts from its configured model)."""
    before = [step for step, _ in ckpt.complete_checkpoints(run_dir) if step <= alarm.step - window]
    return before[-1] if before else None


def protected_for_rollback(run_dir: Path, step: int, window: int | None) -> set[str]:
    """Checkpoints pruning must keep so that an alarm at a later step still finds one before its
    window: the newest one at or before `step + 1 - window`, and every newer one."""
    if window is None:
        return set()
    found = ckpt.complete_checkpoints(run_dir)
    older = [s for s, _ in found if s <= step + 1 - window]
    floor = older[-1] if older else 0
    return {path.name for s, path in found if s >= floor}


def roll_back(run_dir: Path, alarm: Alarm, to_step: int | None, cfg: HealthConfig) -> dict:
    """Move the run directory back to `to_step` (None: step 0) and record the rollback; returns
    its record. Checkpoints after `to_step` are deleted (their policy is the collapsed one)."""
    run_dir = Path(run_dir)
    n = len(read_events(run_dir, ROLLBACKS_FILE)) + 1
    keep = to_step or 0
    lines = [line for line in (run_dir / METRICS_FILE).read_text().splitlines() if line.strip()]
    kept = sum(1 for line in lines if json.loads(line)["step"] <= keep)
    with (run_dir / ROLLED_BACK_FILE).open("a", encoding="utf-8") as fh:
        for line in lines[kept:]:
            fh.write(json.dumps({**json.loads(line), "rollback": n}) + "\n")
    truncate_metrics(run_dir, kept)
    trim_alarms(run_dir, keep)
    samples = run_dir / "samples"
    for f in sorted(samples.glob("step_*.jsonl")) if samples.is_dir() else []:
        if int(f.stem.split("_")[1]) > keep:
            (samples / f"rollback_{n}").mkdir(exist_ok=True)
            shutil.move(f, samples / f"rollback_{n}" / f.name)
    for step, path in ckpt.complete_checkpoints(run_dir):
        if step > keep:
            shutil.rmtree(path)
    record = {"rollback": n, **alarm.to_dict(), "to_step": keep, "lr_scale": lr_scale(cfg, n)}
    with (run_dir / ROLLBACKS_FILE).open("a", encoding="utf-8") as fh:
        fh.write(json.dumps(record) + "\n")
    return record


def respond(run_dir: Path, alarms: list[Alarm], cfg: HealthConfig, done: int) -> tuple[Alarm | None, dict | None]:
    """(the alarm that stops the run, the rollback taken): a rollback alarm rolls the run directory
    back while rollbacks remain, and stops the run once they are spent; a stop alarm stops it."""
    back = next((a for a in alarms if a.action == "rollback"), None)
    if back is not None and done < cfg.rollback.max_rollbacks:
        return None, roll_back(run_dir, back, target_step(run_dir, back, getattr(cfg, back.monitor).window), cfg)
    return next((a for a in alarms if a.action == "stop"), back), None
