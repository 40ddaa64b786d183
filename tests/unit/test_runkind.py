"""Run folders know their kind (`searchrl.runkind`): a command never writes into a folder of another
kind — `train --out` on an evaluation, `eval run --out` (even with `--overwrite`) or `--resume` on
a training run, `demo --out` on either — and refuses with one line, every file left as it was.
Folders written before `run.json` existed are known by what they hold."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from searchrl import cli
from searchrl.config import load_config
from searchrl.errors import EXIT_USAGE, SearchRLError
from searchrl.rl import rundir
from searchrl.rl.config import TrainConfig
from searchrl.runkind import KIND_FILE, claim, kind_of


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file() and p.name != "run.lock"}


def _training_run(folder: Path, recorded: bool) -> Path:
    """What `train` leaves: its config, metrics, a checkpoint (and `run.json` when `recorded`)."""
    (folder / "checkpoints" / "step_0001").mkdir(parents=True)
    (folder / "checkpoints" / "step_0001" / "trainer_state.json").write_text('{"step": 1}\n')
    (folder / "config.yaml").write_text("model: tiny-random\nstage1:\n  steps: 1\n")
    (folder / "metrics.jsonl").write_text('{"step": 1}\n')
    if recorded:
        (folder / KIND_FILE).write_text('{"kind": "train"}\n')
    return folder


def _evaluation(folder: Path, recorded: bool) -> Path:
    """What a finished `eval run` leaves."""
    folder.mkdir(parents=True)
    (folder / "config.yaml").write_text("method: agent\nmodel: tiny-random\n")
    (folder / "predictions.jsonl").write_text('{"id": "q1", "prediction": "x"}\n')
    (folder / "metrics.json").write_text('{"n": 1, "em": 0.0}\n')
    if recorded:
        (folder / KIND_FILE).write_text('{"kind": "eval"}\n')
    return folder


def _errors(capsys) -> list[str]:
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return [line for line in err.splitlines() if line.startswith("error")]


@pytest.mark.parametrize("recorded", [True, False], ids=["run.json", "older folder"])
def test_train_refuses_an_evaluation_folder_and_loses_nothing(world, tmp_path, capsys, recorded):
    evaluation = _evaluation(tmp_path / "eval", recorded)
    before = _snapshot(evaluation)
    config = tmp_path / "train.yaml"
    config.write_text(f"model: tiny-random\nretrieval:\n  index: {world / 'index'}\nstage1:\n  dataset: {world / 'q.jsonl'}\n")
    for args in (["--out", str(evaluation)], ["--resume", str(evaluation)]):
        assert cli.run(["train", "--config", str(config), *args]) == EXIT_USAGE
        (error,) = _errors(capsys)
        said = "run.json" if recorded else "predictions.jsonl"
        assert f"{evaluation} holds an evaluation (its {said}), and `searchrl train` writes a training run" in error
        assert _snapshot(evaluation) == before


@pytest.mark.parametrize("recorded", [True, False], ids=["run.json", "older folder"])
@pytest.mark.parametrize("flag", ["--out", "--overwrite", "--resume"])
def test_eval_run_refuses_a_training_run_even_with_overwrite_and_loses_nothing(world, tmp_path, capsys, recorded, flag):
    run = _training_run(tmp_path / "run", recorded)
    before = _snapshot(run)
    where = ["--resume", str(run)] if flag == "--resume" else ["--out", str(run), *(["--overwrite"] if flag == "--overwrite" else [])]
    code = cli.run(["eval", "run", "--model", "tiny-random", "--dataset", str(world / "q.jsonl"), "--index", str(world / "index"),
                    *where])
    (error,) = _errors(capsys)
    assert code == EXIT_USAGE
    said = "run.json" if recorded else "checkpoints"
    assert f"{run} holds a training run (its {said}), and `searchrl eval run` writes an evaluation" in error
    assert _snapshot(run) == before


def test_demo_refuses_a_training_run_and_an_evaluation(tmp_path, capsys):
    for folder in (_training_run(tmp_path / "run", False), _evaluation(tmp_path / "eval", True)):
        before = _snapshot(folder)
        assert cli.run(["demo", "--out", str(folder), "--no-train"]) == EXIT_USAGE
        (error,) = _errors(capsys)
        assert "and `searchrl demo` writes a demo" in error and _snapshot(folder) == before


def test_a_new_run_records_its_kind_and_the_same_kind_goes_on(world, tmp_path):
    cfg = load_config(TrainConfig, None, ["model=tiny-random", f"out={tmp_path / 'run'}"])
    run, state, _ = rundir.open_run(cfg, None, None)
    assert state is None and json.loads((run / KIND_FILE).read_text()) == {"kind": "train"}
    assert kind_of(run) == ("train", KIND_FILE)
    claim(run, "train")  # the same kind: nothing to refuse
    with pytest.raises(SearchRLError, match="holds a training run"):
        claim(run, "eval")
    assert kind_of(tmp_path / "nothing-there") is None and kind_of(tmp_path) is None
    demo = tmp_path / "demo"
    (demo / "eval-untrained-agent").mkdir(parents=True)
    assert kind_of(demo) == ("demo", "eval-untrained-agent/")


@pytest.mark.parametrize("text", ["{", '{"kind": "pickle"}', "[1]", '{"kind": 3}'])
def test_a_damaged_kind_record_is_an_error_not_a_guess(tmp_path, text):
    (tmp_path / KIND_FILE).write_text(text)
    with pytest.raises(SearchRLError, match=f"{KIND_FILE}"):
        kind_of(tmp_path)
