"""Resuming a run directory from elsewhere is safe: nothing in a checkpoint is unpickled, the
checksums cover every file, a checkpoint that cannot be checked is refused unless trusted, an
older searchrl's pickled checkpoint resumes only when trusted and then runs no code, and a
finished run's final checkpoint is checked before the run is declared complete."""

from __future__ import annotations

import json
import pickle
import random
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
import test_trainer
import torch
from conftest import vary_rewards
from safetensors.torch import load_file
from typer.testing import CliRunner

from searchrl.assets import resolve_model
from searchrl.cli import app
from searchrl.config import load_config
from searchrl.errors import SearchRLError
from searchrl.rl import checkpoint as ckpt
from searchrl.rl import rundir, sharding, step, trainer
from searchrl.rl.config import TrainConfig
from searchrl.rl.integrity import CHECKSUMS, write_checksums
from searchrl.runlog import read_metrics


def _cfg(world: Path, out: Path, *extra: str) -> TrainConfig:
    return load_config(TrainConfig, None, test_trainer._overrides(world, out, *extra))


def _learning(run: Path) -> list[dict]:
    return [{k: v for k, v in r.items() if not step.is_timing(k)} for r in read_metrics(run)]


def _assert_same_metrics(a: list[dict], b: list[dict]) -> None:
    assert [r["step"] for r in a] == [r["step"] for r in b]
    for ra, rb in zip(a, b):
        for key, value in ra.items():
            if value is not None:
                assert rb[key] == pytest.approx(value, abs=1e-6, rel=1e-6), (ra["step"], key)


def _flip(path: Path, at: int) -> None:
    data = bytearray(path.read_bytes())
    data[at] ^= 0x01
    path.write_bytes(bytes(data))


class _Payload:
    """Unpickled, it would create `marker` (a stand-in for any code a hostile pickle runs)."""

    def __init__(self, marker: Path) -> None:
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


@pytest.fixture(scope="module")
def two_steps(world, tmp_path_factory) -> Path:
    """A one-stage run of 3 steps (that learns) killed after step 3, before its checkpoint:
    checkpoints after steps 1 and 2 (copy it before changing it)."""
    run = tmp_path_factory.mktemp("two") / "run"
    with pytest.MonkeyPatch.context() as mp, pytest.raises(RuntimeError, match="simulated crash"):
        vary_rewards(mp)
        trainer.train(_cfg(world, run, "stage2.enabled=false", "debug_crash_after_step=3"))
    return run


def _copy(run: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(run, tmp_path / "run"))


# ------------------------------------------------------------------------------------------------
# What a checkpoint holds


def test_a_checkpoint_holds_no_pickle_and_its_checksums_cover_every_file(two_steps):
    folder = two_steps / "checkpoints" / "step_0002"
    files = {str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file()}
    assert {ckpt.STATE_FILE, ckpt.OPTIMIZER_FILE, "rng_rank_000.json", "model.safetensors", CHECKSUMS} <= files
    assert not [f for f in files if f.endswith((".pt", ".bin", ".pkl"))]
    assert set(json.loads((folder / CHECKSUMS).read_text())) == files - {CHECKSUMS}
    state = json.loads((folder / ckpt.STATE_FILE).read_text())
    assert (state["step"], state["stage_step"], state["data_position"]) == (2, 2, 4)
    optimizer = load_file(folder / ckpt.OPTIMIZER_FILE)
    assert optimizer and all(key.split(".", 1)[1] in ("step", "exp_avg", "exp_avg_sq") for key in optimizer)


def test_rng_states_round_trip_through_json():
    saved = json.loads(json.dumps(ckpt.rng_state()))
    drawn = (random.random(), float(np.random.rand()), torch.rand(3))
    ckpt.set_rng_state(saved)
    again = (random.random(), float(np.random.rand()), torch.rand(3))
    assert drawn[:2] == again[:2] and torch.equal(drawn[2], again[2])


def test_resume_reads_nothing_through_pickle(world, two_steps, tmp_path, monkeypatch):
    run = _copy(two_steps, tmp_path)

    def refuse(*args, **kwargs):
        raise AssertionError("a checkpoint was unpickled")

    monkeypatch.setattr(torch, "load", refuse)
    monkeypatch.setattr(pickle, "load", refuse)
    monkeypatch.setattr(pickle, "loads", refuse)
    trainer.train(_cfg(world, run, "stage2.enabled=false"), resume=run)
    assert [r["step"] for r in read_metrics(run)] == [1, 2, 3]


# ------------------------------------------------------------------------------------------------
# Corruption and missing checksums


@pytest.mark.parametrize("name", [ckpt.STATE_FILE, ckpt.OPTIMIZER_FILE, "rng_rank_000.json"])
def test_a_flipped_byte_in_the_training_state_is_found_and_the_checkpoint_skipped(two_steps, tmp_path, capsys, name):
    run = _copy(two_steps, tmp_path)
    path = run / "checkpoints" / "step_0002" / name
    _flip(path, path.stat().st_size - 3)  # a number's digit, a tensor's byte
    folder, state = rundir.newest_intact_checkpoint(run)
    assert (folder.name, state.step) == ("step_0001", 1)
    assert f"skipping corrupt checkpoint {path.parent}: {name} does not match its sha256" in capsys.readouterr().err


def test_a_checkpoint_without_its_checksums_is_refused_unless_trusted(world, two_steps, tmp_path, capsys):
    run = _copy(two_steps, tmp_path)
    folder = run / "checkpoints" / "step_0002"
    (folder / CHECKSUMS).unlink()
    _flip(folder / "model.safetensors", (folder / "model.safetensors").stat().st_size - 5)  # now nothing can tell
    metrics = (run / "metrics.jsonl").read_text()
    with pytest.raises(SearchRLError, match=rf"checkpoint {folder} has no {CHECKSUMS} .*resume with --trust-unverified .*move {folder} aside"):
        trainer.train(_cfg(world, run), resume=run)
    assert (run / "metrics.jsonl").read_text() == metrics  # refused before anything was trimmed

    found, state = rundir.newest_intact_checkpoint(run, trust_unverified=True)
    assert (found, state.step) == (folder, 2)
    assert f"using checkpoint {folder} unverified (--trust-unverified): it has no {CHECKSUMS}" in capsys.readouterr().err


def test_a_finished_run_whose_final_checkpoint_is_corrupt_is_not_declared_complete(world, tmp_path):
    run = trainer.train(_cfg(world, tmp_path / "run", "stage1.steps=2", "stage2.enabled=false"))
    before = _learning(run)
    _flip(run / "checkpoints" / "step_0002" / ckpt.STATE_FILE, 40)
    result = CliRunner().invoke(app, ["train", "--resume", str(run)])
    assert result.exit_code == 0, result.output
    assert "every stage is already complete" not in result.output
    assert "skipping corrupt checkpoint" in result.output and "trainer_state.json does not match its sha256" in result.output
    _assert_same_metrics(before, _learning(run))  # step 2 trained again from step 1, as it was
    again = CliRunner().invoke(app, ["train", "--resume", str(run)])
    assert again.exit_code == 0 and "every stage is already complete" in again.output


# ------------------------------------------------------------------------------------------------
# Checkpoints of an older searchrl (a pickled trainer_state.pt, not covered by the checksums)


def _make_legacy(folder: Path) -> None:
    """Rewrite a checkpoint as searchrl wrote it before: RNG tuples and the optimizer pickled in
    `trainer_state.pt`, written after `checksums.json` (which therefore does not cover it)."""
    state = ckpt.load_state(folder)
    rng = ckpt.load_rng(folder, state, 0)
    version, internal, gauss = rng["python"]
    bits, keys, pos, has_gauss, cached = rng["numpy"]
    state.rng = {"python": (version, tuple(internal), gauss), "numpy": (bits, np.array(keys, dtype=np.uint32), pos, has_gauss, cached),
                 "torch": torch.tensor(rng["torch"], dtype=torch.uint8)}
    for name in (ckpt.STATE_FILE, ckpt.OPTIMIZER_FILE, "rng_rank_000.json", CHECKSUMS):
        (folder / name).unlink()
    write_checksums(folder)
    data = {**state.to_json(), "optimizer": state.optimizer, "rng": state.rng}
    torch.save(data, folder / ckpt.LEGACY_STATE_FILE)


def test_a_legacy_checkpoint_resumes_only_when_trusted_and_then_equals_an_uninterrupted_run(world, tmp_path, varied_rewards):
    full = trainer.train(_cfg(world, tmp_path / "full", "stage2.enabled=false"))  # 3 steps
    old = tmp_path / "old"
    with pytest.raises(RuntimeError, match="simulated crash"):
        trainer.train(_cfg(world, old, "stage2.enabled=false", "debug_crash_after_step=3"))
    for _, folder in ckpt.complete_checkpoints(old):
        _make_legacy(folder)
    legacy = old / "checkpoints" / "step_0002"

    with pytest.raises(SearchRLError, match=rf"checkpoint {legacy} was written by an older searchrl: its trainer_state.pt is a pickle .*--trust-unverified .*model={legacy}\)$"):
        trainer.train(_cfg(world, old, "stage2.enabled=false"), resume=old)
    result = CliRunner().invoke(app, ["train", "--resume", str(old), "--trust-unverified", "debug_crash_after_step=null"])
    assert result.exit_code == 0, result.output
    assert f"using checkpoint {legacy} unverified (--trust-unverified)" in result.output

    _assert_same_metrics(_learning(full), _learning(old))
    start = test_trainer._weights(Path(resolve_model("tiny-random")))
    w_full, w_old = (test_trainer._weights(r / "checkpoints" / "step_0003") for r in (full, old))
    assert test_trainer.max_change(start, w_full) > 1e-4  # it learned, so the equality below means something
    assert all(torch.allclose(w_full[k], w_old[k], atol=1e-6) for k in w_full)
    assert (old / "checkpoints" / "step_0003" / ckpt.STATE_FILE).is_file()  # new checkpoints: the new format


def test_a_legacy_stage_end_is_checked_by_its_checksums_without_trust(two_steps, tmp_path):
    run = _copy(two_steps, tmp_path)
    first, second = run / "checkpoints" / "step_0001", run / "checkpoints" / "step_0002"
    _make_legacy(first)  # a stage that ended at step 1, before the upgrade: only its weights are read
    state = json.loads((second / ckpt.STATE_FILE).read_text())
    (second / ckpt.STATE_FILE).write_text(json.dumps({**state, "stage_ends": {"1": first.name}}))
    write_checksums(second)
    folder, resumed = rundir.newest_intact_checkpoint(run)
    assert (folder, resumed.stage_ends) == (second, {1: first.name})
    _flip(first / "model.safetensors", (first / "model.safetensors").stat().st_size - 5)
    with pytest.raises(rundir.UnverifiedCheckpoint, match=f"checkpoint {first} was written by an older searchrl"):
        rundir.newest_intact_checkpoint(run)  # step 2 builds on a corrupt stage end; step 1 itself is legacy


def test_a_legacy_rank_rng_file_is_read_without_pickle_code(tmp_path):
    legacy = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    torch.save(legacy, ckpt.rank_rng_file(tmp_path, 1, ".pt"))  # a torchrun rank's file, as it was written
    drawn = (random.random(), float(np.random.rand()), torch.rand(3))
    ckpt.set_rng_state(ckpt.load_rng(tmp_path, ckpt.TrainerState([1], 1, 0, 0, 0, 0, {}, False), 1))
    again = (random.random(), float(np.random.rand()), torch.rand(3))
    assert drawn[:2] == again[:2] and torch.equal(drawn[2], again[2])


def test_a_hostile_legacy_pickle_runs_no_code_even_when_trusted(two_steps, tmp_path, capsys):
    run = _copy(two_steps, tmp_path)
    marker = tmp_path / "pwned"
    for _, folder in ckpt.complete_checkpoints(run):
        _make_legacy(folder)
        torch.save({"plan": [1], "stage": _Payload(marker)}, folder / ckpt.LEGACY_STATE_FILE)
    assert rundir.newest_intact_checkpoint(run, trust_unverified=True) is None
    assert "cannot read" in capsys.readouterr().err and not marker.exists()


# ------------------------------------------------------------------------------------------------
# DCP (torchrun) checkpoints: their pickled metadata and items are read with allow-lists


def _dcp(folder: Path) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    model = torch.nn.Linear(3, 2)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.randn(4, 3)).sum().backward()
    optimizer.step()
    sharding.save_sharded(folder, model, optimizer)
    return model, optimizer


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
def test_dcp_checkpoints_load_and_hostile_metadata_is_refused(tmp_path):
    model, optimizer = _dcp(tmp_path / "dcp")
    other = torch.nn.Linear(3, 2)
    fresh = torch.optim.AdamW(other.parameters(), lr=1e-3)
    sharding.load_sharded_model(tmp_path / "dcp", other)
    sharding.load_sharded_optimizer(tmp_path / "dcp", other, fresh)
    assert torch.equal(model.weight, other.weight)
    assert torch.equal(optimizer.state_dict()["state"][0]["exp_avg"], fresh.state_dict()["state"][0]["exp_avg"])

    marker = tmp_path / "pwned"
    (tmp_path / "dcp" / ".metadata").write_bytes(pickle.dumps(_Payload(marker)))
    with pytest.raises(SearchRLError, match="open is not a type a DCP checkpoint's metadata holds"):
        sharding.load_sharded_model(tmp_path / "dcp", other)
    assert not marker.exists()


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
def test_dcp_non_tensor_items_are_read_without_running_code(tmp_path):
    import torch.distributed.checkpoint as dcp

    marker = tmp_path / "pwned"
    dcp.save({"item": _Payload(marker)}, checkpoint_id=str(tmp_path / "dcp"))
    with pytest.raises(SearchRLError, match=r"cannot read the sharded checkpoint .*Weights only load failed"):
        sharding._load({"item": None}, tmp_path / "dcp")
    assert not marker.exists()


# ------------------------------------------------------------------------------------------------
# Checksums that cannot be emptied, a state whose values must be of their types


def _rewrite_checksums(folder: Path, keep) -> None:
    sums = json.loads((folder / CHECKSUMS).read_text())
    (folder / CHECKSUMS).write_text(json.dumps({k: v for k, v in sums.items() if keep(k)}))


@pytest.mark.parametrize(("keep", "why"), [
    (lambda name: False, f"{CHECKSUMS} lists no files"),
    (lambda name: name != "model.safetensors", f"{CHECKSUMS} does not cover 'model.safetensors'"),
    (lambda name: name.endswith(".json"), f"{CHECKSUMS} does not cover "),
])
def test_checksums_that_leave_files_out_make_the_checkpoint_damaged(two_steps, tmp_path, capsys, keep, why):
    run = _copy(two_steps, tmp_path)
    folder = run / "checkpoints" / "step_0002"
    _flip(folder / "model.safetensors", (folder / "model.safetensors").stat().st_size - 5)  # what the emptied file hides
    _rewrite_checksums(folder, keep)
    found, state = rundir.newest_intact_checkpoint(run)
    assert (found.name, state.step) == ("step_0001", 1)  # as for a corrupt one: the older complete checkpoint
    assert f"skipping corrupt checkpoint {folder}: {why}" in capsys.readouterr().err


@pytest.mark.parametrize("sums", [[], "x", {"../../outside": {"size": 1, "sha256": "0" * 64}},
                                  {"model.safetensors": {"size": "big", "sha256": "0" * 64}},
                                  {"model.safetensors": {"size": 1}}, {"/etc/passwd": {"size": 1, "sha256": "0" * 64}}])
def test_checksums_of_the_wrong_shape_make_the_checkpoint_damaged_not_a_crash(two_steps, tmp_path, capsys, sums):
    run = _copy(two_steps, tmp_path)
    folder = run / "checkpoints" / "step_0002"
    (folder / CHECKSUMS).write_text(json.dumps(sums))
    found, _ = rundir.newest_intact_checkpoint(run)
    assert found.name == "step_0001"
    assert f"skipping corrupt checkpoint {folder}: {CHECKSUMS} " in capsys.readouterr().err


@pytest.mark.parametrize(("field", "value", "why"), [
    ("step", "2", "field step is '2' (str), not a count of steps"),
    ("stage_step", -1, "field stage_step is -1 (int), not a count of steps"),
    ("plan", [1, "2"], "field plan is [1, '2'] (list), not a list of stage numbers"),
    ("lora", "false", "field lora is 'false' (str), not true or false"),
    ("data_position", 4.0, "field data_position is 4.0 (float)"),
    ("stage_ends", {"1": "../../../elsewhere"}, ("field stage_ends is {'1': '../../../elsewhere'} (dict), not an object of "
                                                "stage numbers to checkpoint names")),
    ("world_size", True, "field world_size is True (bool)"),
    ("metrics_lines", None, "field metrics_lines is None (NoneType)"),
])
def test_a_state_value_of_the_wrong_type_is_one_line_naming_the_file_and_field(world, two_steps, tmp_path, capsys, field, value, why):
    run = _copy(two_steps, tmp_path)
    for _, folder in ckpt.complete_checkpoints(run):  # rewritten with checksums to match: only the types can tell
        state = json.loads((folder / ckpt.STATE_FILE).read_text())
        (folder / ckpt.STATE_FILE).write_text(json.dumps({**state, field: value}))
        (folder / CHECKSUMS).unlink()
        write_checksums(folder)
    path = run / "checkpoints" / "step_0002" / ckpt.STATE_FILE
    with pytest.raises(SearchRLError) as caught:
        ckpt.load_state(path.parent)
    assert str(caught.value) == f"{path}: {why}" or str(caught.value).startswith(f"{path}: {why}")
    assert "\n" not in str(caught.value)
    with pytest.raises(SearchRLError, match=r"none of its checkpoints is intact \(the newest: step_0002: " + re.escape(f"{path}: {why}")):
        trainer.train(_cfg(world, run, "stage2.enabled=false"), resume=run)
    assert f"skipping corrupt checkpoint {path.parent}: {path}: {why}" in capsys.readouterr().err


def test_a_missing_state_field_and_a_state_that_is_no_object_are_named(tmp_path):
    (tmp_path / ckpt.STATE_FILE).write_text(json.dumps({"plan": [1], "stage": 1}))
    with pytest.raises(SearchRLError, match=rf"{re.escape(str(tmp_path / ckpt.STATE_FILE))}: field stage_step is missing$"):
        ckpt.load_state(tmp_path)
    (tmp_path / ckpt.STATE_FILE).write_text("[1, 2]")
    with pytest.raises(SearchRLError, match="holds list, not an object of the trainer's fields"):
        ckpt.load_state(tmp_path)
    (tmp_path / ckpt.STATE_FILE).write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(SearchRLError, match="cannot read"):
        ckpt.load_state(tmp_path)
