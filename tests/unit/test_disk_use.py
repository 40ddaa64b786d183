"""Checkpoint disk use: a line per checkpoint written, and `logging.optimizer_in_latest_only`
keeping the optimizer state in the newest checkpoint only, the older ones still verified and
resumable (with a fresh optimizer, said)."""

from __future__ import annotations

import doctest
import re
import shutil

import test_trainer

from searchrl.config import load_config
from searchrl.rl import checkpoint as ckpt
from searchrl.rl import disk_use, rundir, trainer
from searchrl.rl.config import TrainConfig
from searchrl.rl.integrity import verify_checksums
from searchrl.runlog import read_metrics


def _cfg(world, out, *extra):
    return load_config(TrainConfig, None, test_trainer._overrides(world, out, "stage2.enabled=false", *extra))


def test_each_checkpoint_written_prints_its_disk_use(world, tmp_path, capsys):
    run = trainer.train(_cfg(world, tmp_path / "run"))
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("checkpoint step_")]
    assert [line.split(":")[0] for line in lines] == ["checkpoint step_0001", "checkpoint step_0002", "checkpoint step_0003"]
    newest = run / "checkpoints" / "step_0003"
    size = disk_use.human_bytes(disk_use.folder_bytes(newest))
    optimizer = disk_use.human_bytes((newest / ckpt.OPTIMIZER_FILE).stat().st_size)
    assert re.fullmatch(rf"checkpoint step_0003: {size} \(optimizer state {optimizer}\); checkpoints/ holds \S+ \w+", lines[-1])
    # by default every kept checkpoint keeps its optimizer
    assert all((path / ckpt.OPTIMIZER_FILE).is_file() for _, path in ckpt.complete_checkpoints(run))


def test_optimizer_only_in_the_newest_checkpoint_and_older_ones_resume_fresh(world, tmp_path, capsys):
    run = trainer.train(_cfg(world, tmp_path / "run", "logging.optimizer_in_latest_only=true"))
    out = capsys.readouterr().out
    found = ckpt.complete_checkpoints(run)
    assert [path.name for _, path in found] == ["step_0002", "step_0003"]  # keep_last=2
    assert (found[-1][1] / ckpt.OPTIMIZER_FILE).is_file()
    assert not (found[0][1] / ckpt.OPTIMIZER_FILE).exists()
    assert all(verify_checksums(path) is None for _, path in found)  # still verified, not "damaged"
    assert "of older optimizer states freed)" in out
    # the newest lost: resume falls back to step 2, which has no optimizer, and goes on
    shutil.rmtree(found[-1][1])
    (run / "metrics.jsonl").write_text("".join(line + "\n" for line in (run / "metrics.jsonl").read_text().splitlines()[:2]))
    folder, state = rundir.newest_intact_checkpoint(run)
    assert (folder.name, state.optimizer) == ("step_0002", None)
    trainer.train(_cfg(world, run, "logging.optimizer_in_latest_only=true"), resume=run)
    assert "step_0002 holds no optimizer state (logging.optimizer_in_latest_only): the optimizer starts fresh" in \
        capsys.readouterr().out
    assert [r["step"] for r in read_metrics(run)] == [1, 2, 3]


def test_sizes_read_as_people_say_them():
    assert doctest.testmod(disk_use).failed == 0


def test_the_option_is_off_by_default_and_says_what_it_keeps():
    field = TrainConfig.model_fields["logging"].annotation.model_fields["optimizer_in_latest_only"]
    assert field.default is False and "newest checkpoint" in field.description
