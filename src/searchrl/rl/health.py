"""Training health (issue 12): the collapses RL search agents fall into, caught while they
happen. In the long CPU run with Stage 2's reward the search rate fell from 1.0 to 0.0 at step 21
and the policy learned to answer comparisons with both candidates ("A or B"), which F1 half-
rewards and cover-EM fully counts.

The monitors are pure functions of a stage's step records (`rl.monitors`, configured by
`rl.health_config`). This module follows a run with them: the trainer runs them after every step
(`HealthWatch`) and `searchrl health` replays them over a finished or live metrics.jsonl
(`scan`), so both see the same alarms; alarms go to the run's alarms.jsonl.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from searchrl import metric_names as mn
from searchrl.errors import EXIT_FINDING, EXIT_OK, SearchRLError
from searchrl.rl.health_config import HealthConfig, MonitorConfig
from searchrl.rl.monitors import MONITORS, message
from searchrl.runlog import (
    ALARMS_FILE,
    METRICS_FILE,
    NUMBER,
    ROLLBACKS_FILE,
    read_events,
    read_metrics,
)

# ------------------------------------------------------------------------------------------------
# Alarms: a monitor's transition from quiet to firing


@dataclass(frozen=True)
class Alarm:
    monitor: str
    stage: int
    step: int
    value: float
    threshold: float
    action: str
    message: str

    def to_dict(self) -> dict:
        return asdict(self)


class HealthWatch:
    """Follows a run step by step: `observe(record)` returns the monitors' values (for the record)
    and the alarms the step raises. A monitor that keeps firing alarms once, until it falls quiet.
    Seeded with a resumed run's records, it continues their windows and their alarms' state."""

    def __init__(self, cfg: HealthConfig, records: Sequence[dict] = ()) -> None:
        self.cfg = cfg
        self.records: list[dict] = []
        self.firing: set[str] = set()
        self.judged: set[str] = set()  # the monitors that had a value at some step
        for rec in records:
            self.observe(rec)

    def observe(self, record: dict) -> tuple[dict[str, float | None], list[Alarm]]:
        if self.records and self.records[-1][mn.STAGE] != record[mn.STAGE]:
            self.records, self.firing = [], set()  # a new stage: new data, new reward, new baselines
        self.records.append(record)
        values, alarms = {}, []
        for name, monitor in MONITORS.items():
            mcfg: MonitorConfig = getattr(self.cfg, name)
            if mcfg.action == "off":
                continue
            value, fired = monitor(self.records, mcfg)
            values[name] = value
            if value is not None:
                self.judged.add(name)
            if fired and name not in self.firing:
                alarms.append(Alarm(name, record[mn.STAGE], record[mn.STEP], value, mcfg.threshold, mcfg.action,
                                    message(name, value, mcfg)))
            (self.firing.add if fired else self.firing.discard)(name)
        return values, alarms


def replay(records: Sequence[dict], cfg: HealthConfig) -> tuple[list[Alarm], list[str]]:
    """(every alarm a run's step records raise, in step order; the monitors switched on that had
    nothing to judge at any step: their metric is absent, as the async monitors' are in a sync run)."""
    watch = HealthWatch(cfg)
    alarms = [a for rec in records for a in watch.observe(rec)[1]]
    return alarms, [name for name, m in cfg.monitors().items() if m.action != "off" and name not in watch.judged]


def scan(records: Sequence[dict], cfg: HealthConfig) -> list[Alarm]:
    """Every alarm a run's step records raise, in step order."""
    return replay(records, cfg)[0]


class HealthStop(SearchRLError):
    """A monitor with action `stop` fired; the run saved a checkpoint first."""


def report(run_dir: Path, alarms: Sequence[Alarm]) -> None:
    """Appends the alarms to the run's alarms.jsonl and says them on stderr."""
    if not alarms:
        return
    with (Path(run_dir) / ALARMS_FILE).open("a", encoding="utf-8") as fh:
        for a in alarms:
            fh.write(json.dumps(a.to_dict()) + "\n")
            print(f"warning: health: {a.monitor} at step {a.step}: {a.message} (threshold {a.threshold:g})", file=sys.stderr, flush=True)


def trim_alarms(run_dir: Path, step: int) -> None:
    """Keep the alarms of steps up to `step` (a resumed run replays the rest)."""
    path = Path(run_dir) / ALARMS_FILE
    if path.is_file():
        keep = [a for a in read_events(run_dir, ALARMS_FILE) if a["step"] <= step]
        path.write_text("".join(json.dumps(a) + "\n" for a in keep))


# What the table shows of a rollback (`rl.rollback` writes them).
ROLLBACK_FIELDS = {"monitor": str, "stage": int, "value": NUMBER, "threshold": NUMBER, "message": str, "to_step": int,
                   "lr_scale": NUMBER}


def run_health_config(run_dir: Path) -> HealthConfig:
    """The thresholds a run trained with: its config.yaml's `health` section (defaults without)."""
    import yaml
    from pydantic import ValidationError

    path = Path(run_dir) / "config.yaml"
    if not path.is_file():
        return HealthConfig()
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8", errors="replace"))
        return HealthConfig.model_validate((data.get("health") if isinstance(data, dict) else None) or {})
    except yaml.YAMLError as exc:
        problem = f"is not valid YAML ({str(exc).splitlines()[0]})"
    except ValidationError as exc:
        e = exc.errors()[0]
        problem = f"has an invalid `health` section (health.{'.'.join(map(str, e['loc']))}: {e['msg']})"
    raise SearchRLError(f"{path} {problem}; fix it, or move it aside to judge the run with the default thresholds")


def health_command(run_dir: Path, as_json: bool) -> int:
    """`searchrl health RUN`: the alarms of a run's metrics.jsonl under the run's own thresholds
    (`run_health_config`), and the monitors with nothing to judge; `EXIT_FINDING` if any fired, else 0. A run with no complete step
    record has nothing to judge: a SearchRLError, like any input that cannot be read."""
    from rich.console import Console

    from searchrl.display import visible
    from searchrl.tables import Column, print_table

    if not (Path(run_dir) / METRICS_FILE).is_file():
        raise SearchRLError(f"{run_dir}: no {METRICS_FILE}; give the run directory of `searchrl train`")
    cfg = run_health_config(run_dir)
    records = read_metrics(run_dir)
    if not records:
        raise SearchRLError(
            f"{Path(run_dir) / METRICS_FILE} holds no complete step record, so there is nothing to judge; "
            "run `searchrl health` again once the run has finished a step"
        )
    alarms, unjudged = replay(records, cfg)
    # The alarms that rolled the run back are not in the kept records any more: listed apart.
    rollbacks = read_events(run_dir, ROLLBACKS_FILE, ROLLBACK_FIELDS)
    if as_json:
        print(json.dumps({"run": str(run_dir), "steps": len(records), "healthy": not alarms and not rollbacks,
                          "alarms": [a.to_dict() for a in alarms], "rollbacks": rollbacks, "unjudged": unjudged}))
    elif not alarms and not rollbacks:
        idle = f"; nothing to judge for {', '.join(unjudged)}" if unjudged else ""
        Console().print(f"{run_dir}: healthy ({len(records)} steps, {len(MONITORS)} monitors{idle})", highlight=False, markup=False)
    else:
        rows = [[a.monitor, str(a.stage), str(a.step), f"{a.value:.3g}", f"{a.threshold:g}", a.action, a.message]
                for a in alarms]
        rows += [[visible(str(cell)) for cell in (  # read from the run's files: shown as plain text
            r["monitor"], r["stage"], r["step"], f"{r['value']:.3g}", f"{r['threshold']:g}", f"rollback {r['rollback']}",
            f"{r['message']}; back to step {r['to_step']}, lr x{r['lr_scale']:g}")] for r in rollbacks]
        # On a narrow terminal the monitor, step, action and message stay.
        columns = [Column("monitor"), Column("stage", right=True, drop_first=True), Column("step", right=True),
                   Column("value", right=True, drop_first=True), Column("threshold", right=True, drop_first=True),
                   Column("action"), Column("message", wrap=True)]
        print_table(Console(), columns, rows, title=f"{run_dir}: {len(alarms)} alarm(s), {len(rollbacks)} rollback(s)")
        if unjudged:
            Console().print(f"nothing to judge for {', '.join(unjudged)}", highlight=False, markup=False)
    return EXIT_FINDING if alarms or rollbacks else EXIT_OK

