"""The monitors of off-policy and asynchronous training and of degenerating reasoning, on crafted
metric series: each fires where it should, at the right step, and not on the healthy variants;
`searchrl health` reports them and says which had nothing to judge."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from searchrl.cli import app
from searchrl.errors import EXIT_FINDING
from searchrl.rl.health import HealthConfig, replay, scan
from searchrl.rl.monitors import trainer_wait

DEMO = Path(__file__).parent / "data" / "demo_metrics.jsonl"  # a sync run from before these metrics existed


def _series(key: str, values: list, stage: int = 1, **extra) -> list[dict]:
    return [{"stage": stage, "step": i + 1, key: v, **extra} for i, v in enumerate(values)]


def _fired(records: list[dict], **config) -> list[tuple[str, int]]:
    return [(a.monitor, a.step) for a in scan(records, HealthConfig(**config))]


def test_is_ratio_spike_fires_on_a_jump_of_the_largest_ratio():
    records = _series("is_ratio_max", [1.2, 1.5, 1.3, 1.4, 30.0, 1.3])
    assert _fired(records) == [("is_ratio_spike", 5)]  # 30 / median(1.5, 1.3, 1.4) = 21 >= 10
    assert _fired(_series("is_ratio_max", [1.2, 2.0, 3.0, 5.0, 8.0, 13.0])) == []  # drifting: 13 / 5 = 2.6
    # A step whose old log-probs were left to a skipped update has no ratio: skipped, not a zero.
    assert _fired(_series("is_ratio_max", [1.2, None, 1.5, 1.3, 1.4, None, 30.0])) == [("is_ratio_spike", 7)]


def test_is_clip_fires_on_the_window_mean():
    records = _series("is_clip_frac", [0.0, 0.01, 0.02, 0.04, 0.08, 0.1])
    assert _fired(records) == [("is_clip", 6)]  # 0.22 / 3; step 5: 0.14 / 3 < 0.05
    assert _fired(_series("is_clip_frac", [0.0, 0.0, 0.2, 0.0, 0.0, 0.0])) == [("is_clip", 3)]  # one bad step is 0.067
    assert _fired(_series("is_clip_frac", [0.0, 0.0, 0.1, 0.0, 0.0, 0.0])) == []  # 0.033


def test_trainer_idle_fires_when_the_trainer_only_waits():
    records = _series("trainer_idle_share", [0.3, 0.5, 0.97, 0.98, 0.99, 0.4])
    assert _fired(records) == [("trainer_idle", 5)]  # (0.97 + 0.98 + 0.99) / 3; step 4: 0.82
    sync = _series("step_seconds", [50.0, 52.0, 51.0])  # no trainer_idle_share: nothing to judge
    alarms, unjudged = replay(sync, HealthConfig())
    assert alarms == [] and {"trainer_idle", "rollout_wait"} <= set(unjudged)


def _async(waits: list[float], step_seconds: float = 20.0) -> list[dict]:
    """Async step records whose trainer waited `waits` seconds for its batch."""
    return [{"stage": 1, "step": i + 1, "step_seconds": step_seconds + w, "trainer_idle_share": w / (step_seconds + w)}
            for i, w in enumerate(waits)]


def test_rollout_wait_fires_when_the_wait_grows_step_after_step():
    records = _async([0.2, 0.3, 0.25, 2.0, 5.0, 12.0, 0.3])
    assert trainer_wait(records[3]) == pytest.approx(2.0)
    # Step 6: 0.25 < 2 < 5 < 12 and 12 / max(0.25, 1 s) = 12 >= 3. Step 5: 0.3 > 0.25, not growth at every step.
    assert _fired(records) == [("rollout_wait", 6)]
    assert _fired(_async([10.0, 11.0, 12.0, 13.0, 14.0])) == []  # growing, but 14 / 11 < 3
    assert _fired(_async([1.0, 8.0, 2.0, 9.0, 3.0, 10.0])) == []  # high, but not growing: no stall
    assert _fired(_async([0.01, 0.02, 0.04, 0.08, 0.16])) == []  # doubling under the 1 s floor is queue noise


def test_think_repetition_fires_on_a_rise_not_on_a_policy_that_always_looped():
    loops = [0.0, 0.125, 0.0, 0.125, 0.25, 0.625, 0.75]
    # Window means 0.042, 0.083, 0.125, 0.333, 0.542: the rise over 0.042 is 0.29 at step 6 (0.08 at step 5).
    assert _fired(_series("think_loop_rate", loops)) == [("think_repetition", 6)]
    assert _fired(_series("think_loop_rate", [0.9, 1.0, 0.9, 0.9, 1.0])) == []  # never learned not to loop
    assert _fired(_series("think_loop_rate", [0.0, 0.0, 0.25, 0.25, 0.0, 0.0])) == []  # a rise of 0.083: noise


def test_malformed_tags_fire_on_a_rise_of_the_share():
    records = _series("malformed_tags", [0.1, 0.0, 0.1, 0.2, 0.6, 0.8])
    assert _fired(records) == [("malformed_tags", 6)]  # (0.2 + 0.6 + 0.8) / 3 - 0.067 = 0.47; step 5: 0.2
    # The demo's Stage 2 format collapse (1 - format_ok, every failure a tag rule): 0.43 - 0.027 at step 7.
    fmt = [1.0, 0.79, 0.96, 0.96, 1.0, 0.71, 0.0, 0.0, 0.0]
    records = [{**r, "format_ok": f} for r, f in zip(_series("malformed_tags", [round(1 - f, 2) for f in fmt], stage=2), fmt)]
    assert _fired(records) == [("format_collapse", 7), ("malformed_tags", 7)]


def test_a_new_stage_resets_the_rise_baseline():
    records = _series("malformed_tags", [0.0, 0.0, 0.0, 0.2]) + _series("malformed_tags", [0.6, 0.6, 0.6, 0.6], stage=2)
    assert _fired(records) == []  # Stage 2 starts higher (a new reward) and stays there


def _run(tmp_path: Path, records: list[dict]) -> Path:
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return run


def test_health_command_reports_the_new_monitors_and_what_it_could_not_judge(tmp_path):
    healthy = tmp_path / "demo"
    healthy.mkdir()
    (healthy / "metrics.jsonl").write_text(DEMO.read_text())
    result = CliRunner().invoke(app, ["health", str(healthy)], env={"COLUMNS": "400"})
    assert result.exit_code == 0 and "healthy (13 steps, 16 monitors; nothing to judge for " in result.output
    out = json.loads(CliRunner().invoke(app, ["health", str(healthy), "--json"]).stdout.splitlines()[-1])
    # The demo asked no comparison question, predates flat_groups and the new metrics, and ran in sync mode.
    assert out["unjudged"] == ["answer_echo", "flat_groups", "is_ratio_spike", "is_clip", "trainer_idle", "rollout_wait", "think_repetition", "malformed_tags", "query_echo"]

    records = [{**r, **a} for r, a in zip(_series("is_clip_frac", [0.0, 0.0, 0.1, 0.1, 0.1, 0.1]),
                                          _async([0.2, 0.3, 0.25, 4.0, 9.0, 20.0]))]
    result = CliRunner().invoke(app, ["health", str(_run(tmp_path, records)), "--json"])
    out = json.loads(result.stdout.splitlines()[-1])
    assert result.exit_code == EXIT_FINDING
    assert [(a["monitor"], a["step"], a["action"]) for a in out["alarms"]] == [("is_clip", 4, "warn"), ("rollout_wait", 6, "warn")]
    assert "rollout.worker_timeout_s" in out["alarms"][1]["message"]
    judged = {"is_clip", "trainer_idle", "rollout_wait", "step_time"}  # what these records hold
    assert "is_ratio_spike" in out["unjudged"] and not judged & set(out["unjudged"])
    table = CliRunner().invoke(app, ["health", str(tmp_path / "run")], env={"COLUMNS": "400"}).output
    assert "2 alarm(s), 0 rollback(s)" in table and "rollout_wait" in table
    assert f"nothing to judge for {', '.join(out['unjudged'])}" in table
