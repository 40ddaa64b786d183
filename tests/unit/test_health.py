"""Health monitors on crafted metric series (each fires where it should, at the right step, and
not before), no false alarm on the demo's healthy run, the trainer's warn and stop, and the CLI."""

from __future__ import annotations

import json
import math
import os
import shutil
from pathlib import Path

import pytest
from test_trainer import _overrides
from typer.testing import CliRunner

from searchrl.cli import app
from searchrl.config import load_config
from searchrl.errors import EXIT_FINDING, EXIT_USAGE
from searchrl.rl import trainer
from searchrl.rl.checkpoint import latest_checkpoint
from searchrl.rl.config import TrainConfig
from searchrl.rl.health import HealthConfig, HealthStop, scan
from searchrl.rl.health_signals import echoes
from searchrl.runlog import ALARMS_FILE, read_metrics

DEMO = Path(__file__).parent / "data" / "demo_metrics.jsonl"  # the demo's healthy run (fresh clone)
# configs/toyworld-cpu-long.yaml as shipped (search bonus): healthy, 29 steps.
LONG = Path(__file__).parent / "data" / "long_run_metrics.jsonl"
# The same with the paper's Stage-2 reward at a constant learning rate (docs/results.md, long run D): the
# policy stopped searching at step 8 and never searched again.
COLLAPSED = Path(__file__).parent / "data" / "long_run_paper_reward_metrics.jsonl"
# Run D with `rollback` armed (docs/results.md, long run E): the run folder as the trainer left it.
ROLLED = Path(__file__).parent / "data" / "long_run_rollback"


def _series(key: str, values: list, stage: int = 1, **extra) -> list[dict]:
    return [{"stage": stage, "step": i + 1, key: v, **extra} for i, v in enumerate(values)]


def _fired(records: list[dict], **monitors) -> list[tuple[str, int]]:
    cfg = HealthConfig(**{k: {"threshold": t, "window": w} for k, (t, w) in monitors.items()})
    return [(a.monitor, a.step) for a in scan(records, cfg)]


def test_demo_run_raises_no_alarm():
    records = [json.loads(line) for line in DEMO.read_text().splitlines()]
    assert len(records) == 13 and scan(records, HealthConfig()) == []


def test_shipped_long_run_raises_no_alarm():
    records = [json.loads(line) for line in LONG.read_text().splitlines()]
    assert len(records) == 29 and scan(records, HealthConfig()) == []


def test_search_collapse_of_the_paper_reward_long_run_is_flagged_where_it_happens():
    records = [json.loads(line) for line in COLLAPSED.read_text().splitlines()]
    stage2 = [r for r in records if r["stage"] == 2]
    # Where it happens: the first step from which the policy never searched again.
    gone = next(i for i in range(len(stage2)) if all(r["search_rate"] == 0 for r in stage2[i:]))
    assert stage2[gone - 1]["search_rate"] >= 0.8 and len(stage2) - gone >= 10  # abrupt, and for good
    alarms = [(a.monitor, a.step) for a in scan(records, HealthConfig()) if a.monitor == "search_collapse"]
    assert len(alarms) == 1 and 0 <= alarms[0][1] - stage2[gone]["step"] <= 2, (alarms, stage2[gone]["step"])


def test_the_rollback_run_kept_searching_with_no_echo_in_its_last_quarter():
    collapsed = [json.loads(line) for line in COLLAPSED.read_text().splitlines()]
    abandoned = [json.loads(line) for line in (ROLLED / "metrics.rolled_back.jsonl").read_text().splitlines()]
    # The same run as D up to the alarm: its abandoned steps are D's steps 6-8, D's collapse included.
    keys = ("step", "search_rate", "answer_f1", "reward")
    assert [[r[k] for k in keys] for r in abandoned] == [[r[k] for k in keys] for r in collapsed[5:8]]
    result = CliRunner().invoke(app, ["health", str(ROLLED), "--json"])
    report = json.loads(result.stdout.splitlines()[-1])
    assert result.exit_code == 1 and report["alarms"] == []  # the one alarm became the rollback
    assert [(r["monitor"], r["step"], r["to_step"]) for r in report["rollbacks"]] == [("search_collapse", 8, 5)]
    records = read_metrics(ROLLED)
    stage2 = [r for r in records if r["stage"] == 2]
    last = stage2[-len(stage2) // 4 :]
    assert len(stage2) == 40 and stage2[-1]["search_rate"] >= 0.5
    assert min(r["search_rate"] for r in last) >= 0.5
    assert max(r["health_answer_echo"] for r in last) < HealthConfig().answer_echo.threshold
    assert scan(records, HealthConfig()) == []


def test_search_collapse_at_step_21_is_flagged_within_two_steps():
    records = _series("search_rate", [1.0] * 20 + [0.0] * 5)
    assert [(a.monitor, a.step) for a in scan(records, HealthConfig())] == [("search_collapse", 21)]
    assert _fired(_series("search_rate", [1.0, 0.9, 0.8, 1.0, 0.7])) == []  # noise is no collapse


def test_search_best_is_per_stage():
    # Stage 2 starts low and stays low: no collapse against Stage 1's best.
    records = _series("search_rate", [1.0] * 3) + _series("search_rate", [0.3] * 4, stage=2)
    assert _fired(records) == []


def test_format_collapse_of_a_demo_stage_2_is_flagged():
    # Stage 2 of a demo run at a constant learning rate: one update sent every rollout to a third
    # search past max_searches (format 0, all rewards -2) and it never recovered.
    fmt = [1.0, 0.79, 0.96, 0.96, 1.0, 0.71, 0.0, 0.0, 0.0]
    assert _fired(_series("format_ok", fmt, stage=2)) == [("format_collapse", 7)]  # (0.71 + 0) / 2 <= 0.5
    assert _fired(_series("format_ok", [0.94, 1.0, 0.44, 0.62, 0.94, 1.0])) == []  # a dip it recovered from
    assert _fired(_series("format_ok", [0.0, 0.0, 0.0])) == []  # never learned is not a collapse


def test_step_time_compares_steps_that_updated():
    # The demo's Stage 1 (another run): two steps with equal rewards skip the update, then one updates.
    times, updates = [76.3, 75.1, 125.5, 16.4, 16.8, 68.1], [1, 1, 1, 0, 0, 1]
    records = [{"stage": 1, "step": i + 1, "step_seconds": t, "updates": u} for i, (t, u) in enumerate(zip(times, updates))]
    assert _fired(records) == []
    records.append({"stage": 1, "step": 7, "step_seconds": 400.0, "updates": 1})
    assert _fired(records) == [("step_time", 7)]  # 400 / median(75.1, 125.5, 68.1) >= 4


def test_answer_echo_fires_on_the_window_mean():
    records = _series("echo_rate", [0.0, None, 0.1, 0.2, 0.5, 0.6])
    assert _fired(records) == [("answer_echo", 5)]  # (0.2 + 0.5) / 2 >= 0.3


def test_echoes_names_both_candidates_or_the_gold_plus_another():
    q = "Which film came out first, Dusk Harbour or The Glass Road?"
    assert echoes("The Glass Road or Dusk Harbour", q, ["Dusk Harbour"])
    assert echoes("Dusk Harbour / Paris", q, ["Dusk Harbour"])  # the gold plus something else
    assert not echoes("Dusk Harbour", q, ["Dusk Harbour"]) and not echoes(None, q, ["Dusk Harbour"])
    assert echoes("R1 or R2", "Which river flows through Town 1?", ["R1"]) is None  # not a comparison


def test_length_collapse_and_explosion():
    assert _fired(_series("response_tokens", [60, 62, 58, 50, 30, 15, 12])) == [("length_drift", 7)]  # 19/60 <= 1/3
    assert _fired(_series("response_tokens", [60, 62, 58, 70, 150, 300])) == []  # 173/60 < 3
    assert _fired(_series("response_tokens", [60, 62, 58, 100, 200, 300])) == [("length_drift", 6)]  # 200/60


def test_entropy_collapse_skips_steps_without_an_update():
    records = _series("entropy", [0.9, 1.0, None, 0.8, 0.3, 0.1, 0.05])
    assert _fired(records) == [("entropy_collapse", 7)]  # 0.075 / 0.95 (step 6: 0.2 / 0.95 = 0.21)

def test_flat_groups_fire_after_a_full_window():
    assert _fired(_series("flat_groups", [1.0, 1.0, 1.0, 1.0, 0.4, 1.0])) == []  # 0.88
    assert _fired(_series("flat_groups", [0.0, 1.0, 1.0, 1.0, 1.0, 1.0])) == [("flat_groups", 6)]  # 0.8, then 1.0


def test_logprob_mismatch_spike_needs_the_floor():
    assert _fired(_series("logprob_mismatch", [1e-6, 2e-6, 1e-6, 5e-5])) == []  # 50x, but fp32 noise
    assert _fired(_series("logprob_mismatch", [1e-3, 2e-3, 1e-3, 1e-3, 2e-2, 1e-3])) == [("logprob_mismatch", 5)]


def test_nonfinite_loss_gradient_or_logprobs():
    records = _series("pg_loss", [0.1, 0.2, math.nan, 0.1, 0.1], grad_norm=1.0)
    records[3]["grad_norm"] = math.inf  # still firing: no second alarm
    records[4]["entropy"] = None  # None is a skipped value, not a NaN
    assert _fired(records) == [("nonfinite", 3)]


def test_step_time_blowup():
    assert _fired(_series("step_seconds", [50, 60, 55, 58, 300, 60])) == [("step_time", 5)]


def test_a_monitor_alarms_again_after_it_fell_quiet_and_off_silences_it():
    records = _series("step_seconds", [50, 50, 50, 300, 50, 50, 50, 300])
    assert _fired(records) == [("step_time", 4), ("step_time", 8)]
    assert scan(records, HealthConfig(step_time={"threshold": 4, "window": 3, "action": "off"})) == []


def _run_with_metrics(tmp_path: Path, records: list[dict], torn: bool = False) -> Path:
    run = tmp_path / "run"
    run.mkdir()
    text = "".join(json.dumps(r) + "\n" for r in records)
    (run / "metrics.jsonl").write_text(text + ('{"stage": 1, "st' if torn else ""))
    return run


def test_cli_exit_codes_json_and_torn_last_line(tmp_path):
    healthy = tmp_path / "healthy"
    healthy.mkdir()
    shutil.copy(DEMO, healthy / "metrics.jsonl")
    result = CliRunner().invoke(app, ["health", str(healthy)])
    assert result.exit_code == 0 and "healthy" in result.output

    sick = _run_with_metrics(tmp_path, _series("search_rate", [1.0] * 20 + [0.0] * 3), torn=True)
    result = CliRunner().invoke(app, ["health", str(sick), "--json"])
    assert result.exit_code == 1, result.output
    out = json.loads(result.stdout.splitlines()[-1])
    assert out["healthy"] is False and out["steps"] == 23 and out["alarms"][0]["step"] == 21
    result = CliRunner().invoke(app, ["health", str(sick)])
    assert result.exit_code == 1 and "search_collapse" in result.output

    result = CliRunner().invoke(app, ["health", str(tmp_path / "nowhere")])
    assert result.exit_code != 0


def test_odd_metrics_lines_are_skipped_with_one_warning_and_the_rest_judged(tmp_path):
    records = _series("search_rate", [1.0] * 20 + [0.0] * 3)
    lines = [json.dumps(r) for r in records]
    lines[2:2] = ["[1, 2]", '{"stage": 1, "step": 3, "search_rate": "high"}', '{"step": 3, "search_rate": 1.0}',
                  '{"stage": "one", "step": 3}', '{"stage": 1, "step": 3, "reward": true}']
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text("\n".join(lines) + '\n{"stage": 1, "st')
    (run / "rollbacks.jsonl").write_text('{"rollback": 1, "step": 4}\n')  # the table needs more of it
    result = CliRunner().invoke(app, ["health", str(run), "--json"])
    assert result.exit_code == EXIT_FINDING, (result.output, result.exception)
    out = json.loads(result.stdout.splitlines()[-1])
    assert out["steps"] == 23 and [(a["monitor"], a["step"]) for a in out["alarms"]] == [("search_collapse", 21)]
    assert out["rollbacks"] == []
    warning = next(line for line in result.stderr.splitlines() if "metrics.jsonl: skipped" in line)
    assert warning == (
        f"warning: {run / 'metrics.jsonl'}: skipped 5 line(s) that are not records of this file: line 3 (a JSON array, not "
        'an object); line 4 (`search_rate` is "high", not a number); line 5 (no `stage`) and 2 more'
    )
    assert "rollbacks.jsonl: skipped 1 line(s) that are not records of this file: line 1 (no `monitor`)" in result.stderr
    assert "metrics.jsonl:29: the last line is cut off" in result.stderr


@pytest.mark.parametrize(
    ("metrics", "config", "message"),
    [
        ('{"stage": 1, "st', None, "holds no complete step record, so there is nothing to judge"),
        ("", None, "holds no complete step record, so there is nothing to judge"),
        ('{"stage": 1, "step": 1}\n', "health:\n  step_time: {window: many}\n",
         "has an invalid `health` section (health.step_time.window: Input should be a valid integer"),
        ('{"stage": 1, "step": 1}\n', "health: [unclosed\n", "is not valid YAML"),
        ('{"stage": 1, "step": 1}\n{not json}\n{"stage": 1, "step": 2}\n', None, "metrics.jsonl:2: invalid JSON"),
    ],
)
def test_a_run_with_nothing_to_judge_or_a_bad_config_exits_2_with_one_line(tmp_path, metrics, config, message):
    import subprocess
    import sys

    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text(metrics)
    if config is not None:
        (run / "config.yaml").write_text(config)
    done = subprocess.run([sys.executable, "-m", "searchrl", "health", str(run)], capture_output=True, text=True,
                          timeout=120, check=False,  # wide: rich wraps a long message at the terminal's width
                          env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[2] / "src"), "COLUMNS": "1000"})
    assert done.returncode == EXIT_USAGE, (done.stdout, done.stderr)
    errors = [line for line in done.stderr.splitlines() if not line.startswith(("note:", "warning:"))]
    assert len(errors) == 1 and errors[0].startswith("error: ") and message in errors[0], done.stderr
    assert "Traceback" not in done.stderr and "healthy" not in done.stdout


def test_trainer_warns_then_stops_with_a_checkpoint(world, tmp_path, varied_rewards):
    # Thresholds every step crosses: nonfinite >= 0 fires at step 1, step_time >= 0 once it has a baseline.
    warn = trainer.train(load_config(TrainConfig, None, _overrides(
        world, tmp_path / "warn", "health.nonfinite.threshold=0", "stage1.steps=2", "stage2.enabled=false")))
    records = read_metrics(warn)
    assert {"health_search_collapse", "health_nonfinite", "echo_rate", "flat_groups"} <= set(records[0])
    assert records[0]["health_nonfinite"] == 0.0
    alarms = [json.loads(line) for line in (warn / ALARMS_FILE).read_text().splitlines()]
    assert [(a["monitor"], a["step"], a["action"]) for a in alarms] == [("nonfinite", 1, "warn")]

    stopped = tmp_path / "stop"
    cfg = load_config(TrainConfig, None, _overrides(
        world, stopped, "health.nonfinite.threshold=0", "health.nonfinite.action=stop", "logging.checkpoint_every=0"))
    with pytest.raises(HealthStop, match="nonfinite stopped the run at step 1"):
        trainer.train(cfg)
    assert latest_checkpoint(stopped).name == "step_0001" and len(read_metrics(stopped)) == 1
    assert CliRunner().invoke(app, ["health", str(stopped)]).exit_code == 1  # the run's own thresholds


def test_query_echo_fires_on_a_rise_from_the_stages_lowest():
    # The demo's agent went from 2 of 20 echoed answers untrained to 17 of 20 trained.
    records = _series("query_echo_rate", [0.1, 0.1, 0.2, 0.3, 0.5, 0.8])
    assert _fired(records) == [("query_echo", 5)]  # (0.3 + 0.5) / 2 - 0.1 >= 0.3
    assert _fired(_series("query_echo_rate", [0.6, 0.7, 0.8, 0.8])) == []  # high from the start: no rise
