"""The `rollback` health action on the tiny-random model: back to the checkpoint before the alarm's
window (kept by pruning for that purpose), lower learning rate, new seeds, nothing of the abandoned
steps lost, the count surviving a crash, and a stop once the rollbacks are spent; the same for the
monitors of asynchronous training (a real async run) and of looping reasoning (a recorded run)."""

from __future__ import annotations

import json

import pytest
from test_trainer import _overrides
from typer.testing import CliRunner

from searchrl.cli import app
from searchrl.config import load_config
from searchrl.rl import monitors, trainer
from searchrl.rl.checkpoint import complete_checkpoints
from searchrl.rl.config import TrainConfig
from searchrl.rl.health import HealthConfig, HealthStop, HealthWatch
from searchrl.rl.rollback import protected_for_rollback, respond
from searchrl.runlog import ALARMS_FILE, ROLLBACKS_FILE, ROLLED_BACK_FILE, read_metrics

LR = 1e-3


def _fires_at(step: int, only_at_base_lr: bool):
    """A monitor that fires at `step` (while the learning rate is still the configured one)."""

    def monitor(records, cfg):
        rec = records[-1]
        return 1.0, rec["step"] == step and (rec["lr"] == LR or not only_at_base_lr)

    return monitor


def _cfg(world, out, *extra):
    return load_config(TrainConfig, None, _overrides(
        world, out, "stage1.steps=4", "stage2.enabled=false", "logging.keep_last=1",
        "health.step_time.action=rollback", "health.step_time.window=2", *extra))


def test_rollback_goes_back_before_the_window_lowers_lr_reseeds_and_survives_a_crash(world, tmp_path, varied_rewards, monkeypatch):
    monkeypatch.setitem(monitors.MONITORS, "step_time", _fires_at(3, only_at_base_lr=True))
    run = tmp_path / "run"
    with pytest.raises(RuntimeError, match="simulated crash"):
        trainer.train(_cfg(world, run, "debug_crash_after_step=4"))
    # Alarm at step 3 with a 2-step window: back to step_0001, which keep_last=1 would have pruned.
    [rolled] = [json.loads(line) for line in (run / ROLLBACKS_FILE).read_text().splitlines()]
    assert (rolled["monitor"], rolled["step"], rolled["to_step"], rolled["lr_scale"]) == ("step_time", 3, 1, 0.5)
    trainer.train(_cfg(world, run), resume=run)  # the crash at step 4: resumed, still at the lowered rate

    records = read_metrics(run)
    assert [r["step"] for r in records] == [1, 2, 3, 4]
    assert [r["lr"] for r in records] == [LR, LR / 2, LR / 2, LR / 2]
    abandoned = [json.loads(line) for line in (run / ROLLED_BACK_FILE).read_text().splitlines()]
    assert [(r["step"], r["rollback"], r["lr"]) for r in abandoned] == [(2, 1, LR), (3, 1, LR)]
    # Re-seeded: the retried step samples other tokens than the abandoned one did.
    def texts(path):
        return [json.loads(line)["segments"] for line in path.read_text().splitlines()]

    old = texts(run / "samples" / "rollback_1" / "step_0002.jsonl")
    assert old and old != texts(run / "samples" / "step_0002.jsonl")
    assert [p.name for _, p in complete_checkpoints(run)][-1] == "step_0004"
    assert not (run / ALARMS_FILE).exists() or not (run / ALARMS_FILE).read_text().strip()
    result = CliRunner().invoke(app, ["health", str(run), "--json"])
    report = json.loads(result.output)
    assert result.exit_code == 1 and [r["to_step"] for r in report["rollbacks"]] == [1]


def test_rollbacks_spent_stop_the_run(world, tmp_path, varied_rewards, monkeypatch):
    monkeypatch.setitem(monitors.MONITORS, "step_time", _fires_at(2, only_at_base_lr=False))
    run = tmp_path / "run"
    with pytest.raises(HealthStop, match="already rolled back 1 time"):
        trainer.train(_cfg(world, run, "health.rollback.max_rollbacks=1", "health.step_time.window=1"))
    assert len((run / ROLLBACKS_FILE).read_text().splitlines()) == 1
    assert [r["step"] for r in read_metrics(run)] == [1, 2] and read_metrics(run)[1]["lr"] == LR / 2


def test_pruning_keeps_the_checkpoint_a_rollback_needs(tmp_path):
    for step in (1, 2, 3, 4):
        (tmp_path / "checkpoints" / f"step_{step:04d}").mkdir(parents=True)
        (tmp_path / "checkpoints" / f"step_{step:04d}" / "trainer_state.json").write_bytes(b"")
    assert protected_for_rollback(tmp_path, 4, 3) == {"step_0002", "step_0003", "step_0004"}
    assert protected_for_rollback(tmp_path, 4, 9) == {"step_0001", "step_0002", "step_0003", "step_0004"}
    assert protected_for_rollback(tmp_path, 4, None) == set()


def test_a_rollback_of_an_async_run_when_the_trainer_idle_monitor_fires(world, tmp_path, varied_rewards):
    # At max_staleness 0 the trainer waits for every batch: threshold 0 makes trainer_idle fire
    # for real once its 2-step window is full, every time.
    run = tmp_path / "run"
    with pytest.raises(HealthStop, match="trainer_idle stopped the run at step 2.*already rolled back 1 time"):
        trainer.train(_cfg(world, run, "rollout.mode=async", "rollout.max_staleness=0", "health.step_time.action=warn",
                           "health.trainer_idle.action=rollback", "health.trainer_idle.threshold=0",
                           "health.trainer_idle.window=2", "health.rollback.max_rollbacks=1"))
    # No checkpoint before the window (steps 1-2): back to the configured model, at half the rate.
    [rolled] = [json.loads(line) for line in (run / ROLLBACKS_FILE).read_text().splitlines()]
    assert (rolled["monitor"], rolled["step"], rolled["to_step"], rolled["lr_scale"]) == ("trainer_idle", 2, 0, 0.5)
    abandoned = [json.loads(line) for line in (run / ROLLED_BACK_FILE).read_text().splitlines()]
    assert [(r["step"], r["lr"]) for r in abandoned] == [(1, LR), (2, LR)]
    records = read_metrics(run)
    assert [(r["step"], r["lr"]) for r in records] == [(1, LR / 2), (2, LR / 2)]
    assert records[1]["health_trainer_idle"] == pytest.approx((records[0]["trainer_idle_share"] + records[1]["trainer_idle_share"]) / 2)
    report = json.loads(CliRunner().invoke(app, ["health", str(run), "--json"]).output)
    assert [(a["monitor"], a["step"]) for a in report["alarms"]] == [("trainer_idle", 2)]
    assert [(r["monitor"], r["to_step"]) for r in report["rollbacks"]] == [("trainer_idle", 0)]


def test_looping_reasoning_rolls_a_recorded_run_back_before_its_window(tmp_path):
    # A run folder as the trainer leaves it after step 6: the steps' records, samples and
    # checkpoints. The share of looping rollouts climbs from step 4 on.
    loop_rates = [0.0, 0.125, 0.0, 0.25, 0.5, 0.75]
    run = tmp_path / "run"
    (run / "samples").mkdir(parents=True)
    with (run / "metrics.jsonl").open("w") as fh:
        for step, rate in enumerate(loop_rates, start=1):
            fh.write(json.dumps({"stage": 1, "step": step, "think_loop_rate": rate, "lr": LR}) + "\n")
            (run / "samples" / f"step_{step:04d}.jsonl").write_text(json.dumps({"step": step}) + "\n")
            (run / "checkpoints" / f"step_{step:04d}").mkdir(parents=True)
            (run / "checkpoints" / f"step_{step:04d}" / "trainer_state.json").write_text("{}")
    cfg = HealthConfig(think_repetition={"action": "rollback"})
    watch = HealthWatch(cfg)
    fired = [(rec["step"], watch.observe(rec)[1]) for rec in read_metrics(run)]
    [(step, alarms)] = [(s, a) for s, a in fired if a]
    # Window means 0.042, 0.125, 0.25, 0.5: 0.5 - 0.042 >= 0.25 at step 6 (step 5: 0.21).
    assert step == 6 and [(a.monitor, a.action) for a in alarms] == [("think_repetition", "rollback")]
    stop, rolled = respond(run, alarms, cfg, done=0)
    # The newest checkpoint before the 3-step window (steps 4-6) is step 3.
    assert stop is None and (rolled["monitor"], rolled["to_step"], rolled["lr_scale"]) == ("think_repetition", 3, 0.5)
    assert [r["step"] for r in read_metrics(run)] == [1, 2, 3]
    assert [json.loads(line)["step"] for line in (run / ROLLED_BACK_FILE).read_text().splitlines()] == [4, 5, 6]
    assert sorted(p.name for p in (run / "samples" / "rollback_1").iterdir()) == ["step_0004.jsonl", "step_0005.jsonl", "step_0006.jsonl"]
    assert [s for s, _ in complete_checkpoints(run)] == [1, 2, 3]
    report = json.loads(CliRunner().invoke(app, ["health", str(run), "--json"]).output)
    assert report["alarms"] == [] and [(r["monitor"], r["step"], r["to_step"]) for r in report["rollbacks"]] == [("think_repetition", 6, 3)]
    # Once the rollbacks are spent, the same alarm stops the run.
    assert respond(run, alarms, cfg, done=cfg.rollback.max_rollbacks) == (alarms[0], None)
