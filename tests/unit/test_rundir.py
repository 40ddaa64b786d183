"""Nothing lost: one process per run directory, resumes that always find a way on (restart, fall
back past corrupt checkpoints) but never renumber finished steps, and config mistakes caught
before the model loads."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import test_trainer
import torch
from typer.testing import CliRunner

from searchrl.cli import app
from searchrl.config import load_config
from searchrl.errors import SearchRLError
from searchrl.rl import checkpoint as ckpt
from searchrl.rl import rundir, step, trainer
from searchrl.rl.config import TrainConfig
from searchrl.runlock import LOCK_FILE, RunLock
from searchrl.runlog import read_metrics

SRC = Path(__file__).resolve().parents[2] / "src"
_overrides = test_trainer._overrides


def _cfg(world: Path, out: Path, *extra: str) -> TrainConfig:
    return load_config(TrainConfig, None, _overrides(world, out, *extra))


def _steps(run: Path) -> list[tuple[int, int]]:
    return [(r["stage"], r["step"]) for r in read_metrics(run)]


def _python(code: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    return subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


# ------------------------------------------------------------------------------------------------
# One owner per run directory


def test_a_second_trainer_on_a_run_dir_fails_fast_naming_the_owner(world, tmp_path):
    run = trainer.train(_cfg(world, tmp_path / "run", "stage1.steps=1", "stage2.enabled=false"))
    before = (run / "metrics.jsonl").read_text()
    owner = f"in use by another searchrl process (PID {os.getpid()} on host"
    with RunLock(run):  # this process is now the first trainer, still running
        start = time.monotonic()
        second = subprocess.run(
            [sys.executable, "-m", "searchrl.cli", "train", "--resume", str(run)],
            env={**os.environ, "PYTHONPATH": str(SRC)}, capture_output=True, text=True, timeout=300, check=False,
        )
        elapsed = time.monotonic() - start
        with pytest.raises(SearchRLError, match=re.escape(owner)):  # a fresh run into the same --out
            trainer.train(_cfg(world, run))
    assert second.returncode != 0
    assert owner in " ".join(second.stderr.split()), second.stderr  # the CLI wraps lines
    assert elapsed < 60  # Python and torch imports; no model load, no step
    assert (run / "metrics.jsonl").read_text() == before
    assert (run / LOCK_FILE).read_text() == ""  # released on exit


def test_a_lock_left_by_a_killed_process_is_taken_over(tmp_path, capsys):
    run = tmp_path / "run"
    holder = _python(f"from searchrl.runlock import RunLock; lock = RunLock({str(run)!r}).__enter__(); print('locked', flush=True); "
                     "import time; time.sleep(300)")
    assert holder.stdout.readline().strip() == "locked"
    with pytest.raises(SearchRLError, match=f"PID {holder.pid} on host"):
        RunLock(run).__enter__()
    holder.kill()  # SIGKILL: the owner never releases its lock
    holder.wait()
    with RunLock(run):
        assert f'"pid": {os.getpid()}' in (run / LOCK_FILE).read_text()
    err = capsys.readouterr().err
    assert f"taking over {run} from PID {holder.pid} on host" in err and "ended without releasing it" in err


# ------------------------------------------------------------------------------------------------
# Resume always finds a way on


def test_resume_of_a_run_killed_before_its_first_checkpoint_restarts_it(world, tmp_path):
    crashed = tmp_path / "crashed"
    with pytest.raises(RuntimeError, match="simulated crash"):
        trainer.train(_cfg(world, crashed, "debug_crash_after_step=2", "logging.checkpoint_every=0", "stage2.enabled=false"))
    assert _steps(crashed) == [(1, 1), (1, 2)] and not ckpt.complete_checkpoints(crashed)
    result = CliRunner().invoke(app, ["train", "--resume", str(crashed), "debug_crash_after_step=null"])
    assert result.exit_code == 0, result.output
    assert "has no checkpoint (its run stopped before the first one): restarting it from step 0" in result.output
    assert _steps(crashed) == [(1, 1), (1, 2), (1, 3)]  # each step once
    assert sorted(p.name for p in (crashed / "samples").iterdir()) == ["step_0001.jsonl", "step_0002.jsonl", "step_0003.jsonl"]


def test_a_truncated_newest_checkpoint_is_skipped_and_the_run_still_equals_an_uninterrupted_one(world, tmp_path, varied_rewards, capsys):
    full = trainer.train(_cfg(world, tmp_path / "full"))
    crashed = tmp_path / "crashed"
    with pytest.raises(RuntimeError, match="simulated crash"):
        trainer.train(_cfg(world, crashed, "debug_crash_after_step=3"))
    weights = crashed / "checkpoints" / "step_0002" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])  # a disk that filled up, a copy cut short
    trainer.train(_cfg(world, crashed, "debug_crash_after_step=null"), resume=crashed)

    assert f"skipping corrupt checkpoint {weights.parent}: model.safetensors has 1000 bytes" in capsys.readouterr().err
    a, b = read_metrics(full), read_metrics(crashed)
    assert _steps(crashed) == _steps(full) == [(1, 1), (1, 2), (1, 3), (2, 4)]
    for ra, rb in zip(a, b):
        for key, value in ra.items():
            if not step.is_timing(key) and value is not None:
                assert rb[key] == pytest.approx(value, abs=1e-6, rel=1e-6), (ra["step"], key)


def test_flipped_bits_in_the_weights_are_found_and_the_checkpoint_skipped(world, tmp_path, capsys):
    from safetensors.torch import load_file

    run = trainer.train(_cfg(world, tmp_path / "run", "stage1.steps=2", "stage2.enabled=false"))
    weights = run / "checkpoints" / "step_0002" / "model.safetensors"
    data = bytearray(weights.read_bytes())
    gen = torch.Generator().manual_seed(0)
    # 1,000 flipped bits in the second half (past the header): the file still loads without a word
    for pos in torch.randint(len(data) // 2, len(data), (1000,), generator=gen).tolist():
        data[pos] ^= 1 << (pos % 8)
    weights.write_bytes(bytes(data))
    load_file(weights)

    folder, state = rundir.newest_intact_checkpoint(run)
    assert (folder.name, state.step) == ("step_0001", 1)
    assert "step_0002: model.safetensors does not match its sha256" in capsys.readouterr().err


def test_a_resume_may_end_the_current_stage_early_but_never_renumber_finished_steps(world, tmp_path):
    run = tmp_path / "run"
    with pytest.raises(RuntimeError, match="simulated crash"):
        trainer.train(_cfg(world, run, "debug_crash_after_step=3"))  # Stage 1: 3 steps, saved at step 2
    assert ckpt.latest_checkpoint(run).name == "step_0002"
    with pytest.raises(SearchRLError, match=r"stage1.steps=1: Stage 1 already stands at step 2 .*set stage1.steps to 2 or more"):
        trainer.train(_cfg(world, run, "stage1.steps=1"), resume=run)

    trainer.train(_cfg(world, run, "stage1.steps=2"), resume=run)  # Stage 1 ends where it stands
    assert _steps(run) == [(1, 1), (1, 2), (2, 3)]
    for steps in (1, 3):  # Stage 1 has finished: a new length would renumber (and overwrite) its steps
        with pytest.raises(SearchRLError, match=f"stage1.steps={steps}: Stage 1 finished after 2 steps .*set stage1.steps=2"):
            trainer.train(_cfg(world, run, f"stage1.steps={steps}"), resume=run)
    assert _steps(run) == [(1, 1), (1, 2), (2, 3)]
    assert (run / "checkpoints" / "latest").read_text().strip() == "step_0003"
    assert load_config(TrainConfig, run / "config.yaml").stage1.steps == 2  # a refused resume leaves the config alone


# ------------------------------------------------------------------------------------------------
# Config mistakes fail before the model loads


@pytest.mark.parametrize("key, extra", [
    ("stage2.dataset", ["stage2.dataset=/nonexistent/questions.jsonl"]),
    ("stage2.question_types", ["stage2.question_types=[yes-no]"]),
    ("retrieval.index", ["retrieval.index=/nonexistent/index"]),
    ("protocol.template", ["protocol.template=TEMPLATE"]),
])
def test_config_mistakes_fail_before_the_model_loads(world, tmp_path, monkeypatch, key, extra):
    template = tmp_path / "template.txt"
    template.write_text("Q: {question}\n{no_such_placeholder}")
    extra = [e.replace("TEMPLATE", str(template)) for e in extra]

    def never(*args, **kwargs):
        raise AssertionError("the model loaded before the config was checked")

    monkeypatch.setattr(trainer.Actor, "load", never)
    with pytest.raises(SearchRLError, match=key):
        trainer.train(_cfg(world, tmp_path / "run", *extra))
    assert read_metrics(tmp_path / "run") == []
