"""Training health monitors (issue 12): the collapses RL search agents fall into, caught while they
happen. In the long CPU run with Stage 2's reward the search rate fell from 1.0 to 0.0 at step 21
and the policy learned to answer comparisons with both candidates ("A or B"), which F1 half-
rewards and cover-EM fully counts.

Each monitor is a pure function of one stage's step records up to the current step (dicts as in
metrics.jsonl) and returns its value for that step, or None when it has nothing to judge (a step
without an update has no entropy; a window not yet full). The trainer runs them after every step
(`HealthWatch`) and `searchrl health` replays them over a finished or live metrics.jsonl
(`scan`), so both see the same alarms. What needs per-rollout data (echoed answers, groups with
equal rewards) is a per-step metric that `rl.step.record` writes; the monitors threshold it.
"""

from __future__ import annotations

import json
import math
import re
import statistics
import sys
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Literal

from pydantic import Field, model_validator

from searchrl import metric_names as mn
from searchrl.config import StrictModel
from searchrl.errors import EXIT_FINDING, EXIT_OK, SearchRLError
from searchrl.metrics import normalize_answer
from searchrl.runlog import (
    ALARMS_FILE,
    METRICS_FILE,
    NUMBER,
    ROLLBACKS_FILE,
    read_events,
    read_metrics,
)


class MonitorConfig(StrictModel):
    """One monitor: what it does when it fires, its threshold and its window of steps."""

    action: Literal["warn", "stop", "rollback", "off"] = Field(
        "warn", description="warn: a console line and a line in the run's alarms.jsonl; stop: that, then a checkpoint "
        "and the run ends with the alarm as its error; rollback: back to the last checkpoint before the window, "
        "with a lower learning rate and new sampling seeds (see health.rollback); off: not computed.",
    )
    threshold: float = Field(..., description="Where the monitor fires (see the monitor's own description).")
    window: int = Field(..., ge=1, description="Steps the monitor averages over (or, for spikes, the baseline's steps).")


class RollbackConfig(StrictModel):
    """What the `rollback` action does (`searchrl.rl.rollback`)."""

    lr_factor: float = Field(0.5, gt=0, le=1, description="Each rollback multiplies the learning rate by this.")
    max_rollbacks: int = Field(2, ge=0, description="Rollbacks a run may take; past them a rollback alarm stops the run.")


def _monitor(threshold: float, window: int, what: str):
    return Field(default_factory=lambda: MonitorConfig(threshold=threshold, window=window), description=what)


class HealthConfig(StrictModel):
    """Monitors run after every step on the step records; windows never reach into the previous
    stage. Defaults stay quiet on the demo's healthy run."""

    search_collapse: MonitorConfig = _monitor(
        0.5, 2, "Mean search_rate over the window as a fraction of the stage's best such mean; fires at or below threshold.")
    format_collapse: MonitorConfig = _monitor(
        0.5, 2, "Mean format_ok over the window as a fraction of the stage's best such mean; fires at or below threshold "
        "(once every rollout fails the format, every reward is the same and nothing is learned any more).")
    answer_echo: MonitorConfig = _monitor(
        0.3, 2, "Mean echo_rate (comparison answers naming both candidates, or the gold plus another) over the window; "
        "fires at or above threshold.")
    length_drift: MonitorConfig = _monitor(
        3.0, 3, "Mean response_tokens over the window against the median of the stage's first window steps; fires when "
        "the ratio is at or above threshold (explosion) or at or below its inverse (collapse).")
    # A tenth: on the shipped long run entropy fell from 0.55 to 0.07-0.15 nats a token (a fifth
    # of its best and less) while search and format held; sampling that stops exploring goes lower.
    entropy_collapse: MonitorConfig = _monitor(
        0.1, 2, "Mean entropy over the window as a fraction of the stage's best such mean; fires at or below threshold.")
    flat_groups: MonitorConfig = _monitor(
        0.9, 5, "Mean flat_groups (share of question groups whose rewards are all equal: no learning signal) over the "
        "window; fires at or above threshold.")
    logprob_mismatch: MonitorConfig = _monitor(
        10.0, 3, "logprob_mismatch (sampler vs actor, per token) against the median of the window's earlier steps; fires "
        "at or above threshold times that median once it is also over 1e-3 (fp32 noise spikes harmlessly).")
    nonfinite: MonitorConfig = _monitor(
        1, 1, "How many of loss, gradient norm, KL, entropy, log-prob mismatch and reward are NaN/Inf; fires at or above threshold.")
    step_time: MonitorConfig = _monitor(
        4.0, 3, "step_seconds against the median of the window's earlier steps; fires at or above threshold.")
    rollback: RollbackConfig = Field(default_factory=RollbackConfig, description="Settings of the rollback action.")

    def monitors(self) -> dict[str, MonitorConfig]:
        return {name: getattr(self, name) for name in MONITORS}

    @model_validator(mode="before")
    @classmethod
    def _fill_from_defaults(cls, data):
        # `health.nonfinite.action=stop` alone keeps that monitor's default threshold and window.
        if not isinstance(data, dict):
            return data
        return {k: {**cls.model_fields[k].default_factory().model_dump(), **v} if isinstance(v, dict) and k in cls.model_fields else v
                for k, v in data.items()}


# ------------------------------------------------------------------------------------------------
# The monitors: (records of one stage up to this step, config) -> (value | None, fired)

Reading = tuple[float | None, bool]
Monitor = Callable[[Sequence[dict], MonitorConfig], Reading]


def _values(records: Sequence[dict], key: str) -> list[float]:
    return [r[key] for r in records if r.get(key) is not None]


def _mean_last(values: list[float], window: int) -> float | None:
    return statistics.fmean(values[-window:]) if len(values) >= window else None


def _vs_best(records: Sequence[dict], key: str, cfg: MonitorConfig) -> Reading:
    """The latest window mean over the best window mean so far; None until the best is positive."""
    if not records or records[-1].get(key) is None:
        return None, False
    values = _values(records, key)
    means = [statistics.fmean(values[i - cfg.window:i]) for i in range(cfg.window, len(values) + 1)]
    if not means or max(means) <= 0:
        return None, False
    ratio = means[-1] / max(means)
    return ratio, ratio <= cfg.threshold


def _window_mean(records: Sequence[dict], key: str, cfg: MonitorConfig) -> Reading:
    if not records or records[-1].get(key) is None:
        return None, False
    mean = _mean_last(_values(records, key), cfg.window)
    return mean, mean is not None and mean >= cfg.threshold


def _spike(records: Sequence[dict], key: str, cfg: MonitorConfig, floor: float = 0.0) -> Reading:
    """The latest value over the median of the `window` values before it."""
    values = _values(records, key)
    if not records or records[-1].get(key) is None or len(values) <= cfg.window:
        return None, False
    base = statistics.median(values[-cfg.window - 1:-1])
    if base <= 0:
        return None, False
    ratio = values[-1] / base
    return ratio, ratio >= cfg.threshold and values[-1] > floor


def search_collapse(records: Sequence[dict], cfg: MonitorConfig) -> Reading:
    return _vs_best(records, mn.SEARCH_RATE, cfg)


def format_collapse(records: Sequence[dict], cfg: MonitorConfig) -> Reading:
    return _vs_best(records, mn.FORMAT_OK, cfg)


def answer_echo(records: Sequence[dict], cfg: MonitorConfig) -> Reading:
    return _window_mean(records, mn.ECHO_RATE, cfg)


def length_drift(records: Sequence[dict], cfg: MonitorConfig) -> Reading:
    values = _values(records, mn.RESPONSE_TOKENS)
    recent = _mean_last(values, cfg.window)
    if recent is None or len(values) < 2 * cfg.window:  # a baseline apart from the window
        return None, False
    base = statistics.median(values[: cfg.window])
    if base <= 0:
        return None, False
    ratio = recent / base
    return ratio, ratio >= cfg.threshold or ratio <= 1 / cfg.threshold


def entropy_collapse(records: Sequence[dict], cfg: MonitorConfig) -> Reading:
    return _vs_best(records, mn.ENTROPY, cfg)


def flat_groups(records: Sequence[dict], cfg: MonitorConfig) -> Reading:
    return _window_mean(records, mn.FLAT_GROUPS, cfg)


def logprob_mismatch(records: Sequence[dict], cfg: MonitorConfig) -> Reading:
    return _spike(records, mn.LOGPROB_MISMATCH, cfg, floor=1e-3)


# A NaN in any of these poisons the weights (loss, gradients) or shows they already are (log-probs).
NONFINITE_KEYS = (mn.PG_LOSS, mn.SFT_LOSS, mn.KL_LOSS, mn.GRAD_NORM, mn.KL, mn.ENTROPY, mn.LOGPROB_MISMATCH, mn.REWARD)


def nonfinite(records: Sequence[dict], cfg: MonitorConfig) -> Reading:
    bad = sum(1 for k in NONFINITE_KEYS if isinstance(records[-1].get(k), float) and not math.isfinite(records[-1][k]))
    return float(bad), bad >= cfg.threshold


def step_time(records: Sequence[dict], cfg: MonitorConfig) -> Reading:
    # A step whose rewards were all equal skips the update and takes a fraction of the time (16 s
    # against 68 s in the demo): compare steps that updated with steps that updated.
    if records and records[-1].get(mn.UPDATES) == 0:
        return None, False
    return _spike([r for r in records if r.get(mn.UPDATES) != 0], mn.STEP_SECONDS, cfg)


MONITORS: dict[str, Monitor] = {
    "search_collapse": search_collapse, "format_collapse": format_collapse, "answer_echo": answer_echo, "length_drift": length_drift,
    "entropy_collapse": entropy_collapse, "flat_groups": flat_groups, "logprob_mismatch": logprob_mismatch,
    "nonfinite": nonfinite, "step_time": step_time,
}
assert set(MONITORS) == set(HealthConfig.model_fields) - {"rollback"}, "every monitor has a config field and back"


# ------------------------------------------------------------------------------------------------
# Per-rollout inputs that `rl.step.record` turns into step metrics

# "Which film came out first, Dusk Harbour or The Glass Road?" -> the two names
_CANDIDATES = re.compile(r",\s*(?P<a>[^,?]+?)\s+or\s+(?P<b>[^,?]+?)\s*\?\s*$", re.IGNORECASE)
# Joins two answers in one: "A or B", "A / B", "A, B"
_JOINER = re.compile(r"\bor\b|[/,;&]", re.IGNORECASE)


def echoes(prediction: str | None, question: str, answers: Sequence[str], qtype: str = "") -> bool | None:
    """Whether an answer to a comparison-like question hedges: it names two or more candidates
    of the question, or the gold joined to something else. None: not comparison-like.

    >>> echoes("Dusk Harbour or The Glass Road", "Which film came out first, Dusk Harbour or The Glass Road?", ["Dusk Harbour"])
    True
    >>> echoes("Dusk Harbour", "Which film came out first, Dusk Harbour or The Glass Road?", ["Dusk Harbour"])
    False
    >>> echoes("yes/no", "Are Ann Lee and Bo Kim citizens of the same country?", ["no"], "comparison")
    True
    >>> echoes("R1", "Which river flows through Town 1?", ["R1"]) is None
    True
    """
    match = _CANDIDATES.search(question)
    if match is None and "comparison" not in qtype:
        return None
    if not prediction:
        return False
    pred = f" {normalize_answer(prediction)} "
    candidates = [match["a"], match["b"]] if match else []
    if {normalize_answer(a) for a in answers} <= {"yes", "no"}:
        candidates += ["yes", "no"]
    named = sum(f" {normalize_answer(c)} " in pred for c in candidates)
    golds = [f" {normalize_answer(a)} " for a in answers]
    gold_plus = any(g in pred and g != pred for g in golds) and bool(_JOINER.search(prediction))
    return named >= 2 or gold_plus


def flat_share(rewards: Sequence[float], group_ids: Sequence[int]) -> float:
    """Share of groups whose rewards are all equal: their advantages are 0, they teach nothing.

    >>> flat_share([1.0, 1.0, 0.0, 1.0, 0.5, 0.5], [0, 0, 1, 1, 2, 2])
    0.6666666666666666
    """
    groups: dict[int, set[float]] = {}
    for r, g in zip(rewards, group_ids):
        groups.setdefault(g, set()).add(r)
    return sum(len(v) == 1 for v in groups.values()) / max(len(groups), 1)


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
            if fired and name not in self.firing:
                alarms.append(Alarm(name, record[mn.STAGE], record[mn.STEP], value, mcfg.threshold, mcfg.action,
                                    _message(name, value, mcfg)))
            (self.firing.add if fired else self.firing.discard)(name)
        return values, alarms


def scan(records: Sequence[dict], cfg: HealthConfig) -> list[Alarm]:
    """Every alarm a run's step records raise, in step order (what `searchrl health` prints)."""
    watch = HealthWatch(cfg)
    return [a for rec in records for a in watch.observe(rec)[1]]


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
    (`run_health_config`); `EXIT_FINDING` if any fired, else 0. A run with no complete step
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
    alarms = scan(records, cfg)
    # The alarms that rolled the run back are not in the kept records any more: listed apart.
    rollbacks = read_events(run_dir, ROLLBACKS_FILE, ROLLBACK_FIELDS)
    if as_json:
        print(json.dumps({"run": str(run_dir), "steps": len(records), "healthy": not alarms and not rollbacks,
                          "alarms": [a.to_dict() for a in alarms], "rollbacks": rollbacks}))
    elif not alarms and not rollbacks:
        Console().print(f"{run_dir}: healthy ({len(records)} steps, {len(MONITORS)} monitors)", highlight=False, markup=False)
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
    return EXIT_FINDING if alarms or rollbacks else EXIT_OK


def _message(name: str, value: float, cfg: MonitorConfig) -> str:
    w = f"{cfg.window} step(s)"
    return {
        "search_collapse": f"search rate over {w} fell to {value:.0%} of the stage's best: the policy stopped searching",
        "format_collapse": f"format-ok rate over {w} fell to {value:.0%} of the stage's best: rollouts stopped following the protocol",
        "answer_echo": f"{value:.0%} of comparison answers over {w} name both candidates or the gold plus another "
                       "(F1 half-rewards it, cover-EM counts it)",
        "length_drift": f"responses over {w} are {value:.2f}x the stage's first steps' length",
        "entropy_collapse": f"entropy over {w} fell to {value:.0%} of the stage's best: sampling is turning deterministic",
        "flat_groups": f"{value:.0%} of question groups over {w} had equal rewards: no learning signal",
        "logprob_mismatch": f"sampler/actor log-prob gap is {value:.1f}x its recent median",
        "nonfinite": f"{value:.0f} of {', '.join(NONFINITE_KEYS)} is NaN/Inf",
        "step_time": f"the step took {value:.1f}x the recent median step time",
    }[name]
