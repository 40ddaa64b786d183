"""Experiment trackers (`logging.report_to`), against the real wandb (offline) and MLflow (file
store) libraries: a tiny training that crashes and resumes leaves in each the metric names,
values and steps of metrics.jsonl, in one tracker run; its config and sampled-trajectory tables.
The old `logging.tensorboard` key still loads, and a tracker that is not installed is one line."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest
import yaml

from searchrl import trackers
from searchrl.config import load_config
from searchrl.errors import SearchRLError
from searchrl.rl import trainer
from searchrl.rl.config import TrainConfig
from searchrl.runlog import read_metrics
from searchrl.trackers import SAMPLE_COLUMNS, mlflow_name, scalars

pytest.importorskip("wandb", reason="pip install -e '.[dev]' installs wandb")
pytest.importorskip("mlflow", reason="pip install -e '.[dev]' installs mlflow-skinny")

WANDB_META = ("_step", "_runtime", "_timestamp")


@pytest.fixture
def offline(monkeypatch):
    """Neither tracker reaches anything beyond the run directory."""
    for name in ("WANDB_MODE", "WANDB_DIR", "WANDB_PROJECT", "MLFLOW_TRACKING_URI", "MLFLOW_EXPERIMENT_NAME"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "")
    monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE")  # the run sets it; teardown unsets it again
    monkeypatch.setenv("MLFLOW_DISABLE_TELEMETRY", "true")
    monkeypatch.setenv("WANDB_ERROR_REPORTING", "false")


def _overrides(world: Path, out: Path, *extra: str) -> list[str]:
    return [
        "model=tiny-random", f"retrieval.index={world / 'index'}", f"out={out}",
        f"protocol.template={world / 'prompt.txt'}", f"stage1.dataset={world / 'q.jsonl'}",
        "stage1.steps=2", "stage2.enabled=false", "stage1.prompts_per_step=2", "stage1.samples_per_prompt=2",
        "rollout.max_new_tokens=6", "rollout.top_p=1.0", "algorithm.kl_coef=0", "algorithm.micro_batch_size=4",
        "logging.checkpoint_every=1", "logging.progress=false", "logging.report_to=[wandb, mlflow]",
        *extra,
    ]


def _wandb_records(path: Path):
    """The protobuf records of a wandb offline run file (`run-ID.wandb`, LevelDB log framing:
    a 7-byte header, 32 KiB blocks, chunks of crc32 / length / type)."""
    from wandb.proto import wandb_internal_pb2 as pb

    data, pos, block, chunk = path.read_bytes(), 7, 32768, b""
    assert data[:4] == b":W&B"
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # a block's tail too short for a chunk header is padding
            pos += block - pos % block
            continue
        _crc, n, kind = struct.unpack("<IHB", data[pos: pos + 7])
        chunk += data[pos + 7: pos + 7 + n]
        pos += 7 + n
        if kind in (1, 4):  # FULL or LAST: a record is complete
            record = pb.Record()
            record.ParseFromString(chunk)
            chunk = b""
            yield record


def _wandb_history(run_dir: Path, run_id: str) -> tuple[list[dict], dict]:
    """The history rows of every offline run file of `run_id` in order (a resume adds a file), and
    the config the last one was given."""
    rows, config = [], {}
    files = sorted((run_dir / "wandb").glob(f"offline-run-*-{run_id}/run-{run_id}.wandb"))
    assert len(files) == 2  # the crashed run and its resumption: one wandb run id
    for f in files:
        for rec in _wandb_records(f):
            kind = rec.WhichOneof("record_type")
            if kind == "history":
                rows.append({"/".join(i.nested_key) or i.key: json.loads(i.value_json) for i in rec.history.item})
            elif kind == "run":
                config = {u.key: json.loads(u.value_json) for u in rec.run.config.update}
    return rows, config


def _last_per_step(points) -> dict[int, object]:
    """step -> the value logged last at it (a resumed run logs again the steps after its checkpoint)."""
    return {step: value for step, value in points}


def test_wandb_and_mlflow_hold_the_metrics_of_metrics_jsonl_across_a_resume(world, tmp_path, offline, varied_rewards):
    from mlflow.tracking import MlflowClient

    run = tmp_path / "run"
    with pytest.raises(RuntimeError, match="simulated crash"):
        trainer.train(load_config(TrainConfig, None, _overrides(world, run, "debug_crash_after_step=2")))
    ids = json.loads((run / trackers.IDS_FILE).read_text())
    trainer.train(load_config(TrainConfig, run / "config.yaml", ["debug_crash_after_step=null"]), resume=run)
    assert json.loads((run / trackers.IDS_FILE).read_text()) == ids  # the same tracker runs went on

    records = read_metrics(run)
    assert [r["step"] for r in records] == [1, 2]
    expected = {r["step"]: scalars(r) for r in records}
    assert "reward" in expected[1] and "entropy" in expected[1]

    # wandb: one history row per logged step (step 2, redone after the resume, twice); the last one at each step
    # holds exactly the numbers of metrics.jsonl, under the same names.
    rows, config = _wandb_history(run, ids["wandb"]["id"])
    assert [r["_step"] for r in rows] == [1, 2, 2]
    metrics = _last_per_step((r["_step"], {k: v for k, v in r.items() if k not in WANDB_META and not k.startswith("samples")})
                             for r in rows)
    assert metrics == expected
    resolved = yaml.safe_load((run / "config.yaml").read_text())
    assert {k: config[k] for k in resolved} == resolved  # the resolved config, as wandb's run config
    table = [r for r in rows if r["_step"] == 2][-1]
    table_file = next((run / "wandb").glob(f"offline-run-*-{ids['wandb']['id']}/files/{table['samples/path']}"))
    written = json.loads(table_file.read_text())
    dumped = [json.loads(line) for line in (run / "samples" / "step_0002.jsonl").read_text().splitlines()]
    assert written["columns"] == list(SAMPLE_COLUMNS) and len(written["data"]) == len(dumped) == 4
    assert [row[2] for row in written["data"]] == [s["id"] for s in dumped]

    # MLflow: one run in the run directory's file store, read back with MLflow's own client.
    client = MlflowClient(tracking_uri=(run / "mlruns").resolve().as_uri())
    assert ids["mlflow"]["tracking_uri"] == (run / "mlruns").resolve().as_uri()
    (experiment,) = [e for e in client.search_experiments() if e.name == "searchrl"]
    (mlrun,) = client.search_runs([experiment.experiment_id])
    assert mlrun.info.run_id == ids["mlflow"]["run_id"] and mlrun.info.status == "FINISHED"
    names = {mlflow_name(key, file_store=True): key for values in expected.values() for key in values}
    assert names["reward.answer"] == "reward/answer"  # in a file store, beside "reward"
    assert set(mlrun.data.metrics) == set(names)
    for name, key in names.items():
        points = {step: values[key] for step, values in expected.items() if key in values}
        history = sorted(client.get_metric_history(mlrun.info.run_id, name), key=lambda m: (m.timestamp, m.step))
        assert [m.step for m in history] == sorted([*points, 2] if 2 in points else points)  # step 2 redone
        assert _last_per_step((m.step, m.value) for m in history) == points
    assert json.loads(mlrun.data.params["algorithm.lr"]) == resolved["algorithm"]["lr"]
    assert mlrun.data.params["logging.report_to"] == '["wandb", "mlflow"]'
    artifacts = Path(client.download_artifacts(mlrun.info.run_id, "", str(tmp_path / "artifacts")))
    assert (artifacts / "config.yaml").read_text() == (run / "config.yaml").read_text()
    table = json.loads((artifacts / "samples" / "step_0002.json").read_text())
    assert table["columns"] == list(SAMPLE_COLUMNS) and [row[2] for row in table["data"]] == [s["id"] for s in dumped]


SHIPPED = sorted((Path(__file__).resolve().parents[2] / "src" / "searchrl" / "configs").glob("*.yaml"))


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.name)
def test_every_shipped_config_reports_to_tensorboard_by_default(path):
    assert load_config(TrainConfig, path).logging.report_to == ["tensorboard"]


@pytest.mark.parametrize(("old", "report_to"), [("true", ["tensorboard"]), ("false", [])])
def test_the_old_tensorboard_key_is_read_as_report_to_with_a_note(old, report_to, capsys):
    cfg = load_config(TrainConfig, None, [f"logging.tensorboard={old}"])
    assert cfg.logging.report_to == report_to
    assert "logging.tensorboard is deprecated" in capsys.readouterr().err
    assert "tensorboard" not in cfg.model_dump()["logging"]  # a run's config.yaml is written anew


def test_report_to_wins_over_the_old_key_and_a_typo_is_an_error(capsys):
    cfg = load_config(TrainConfig, None, ["logging.tensorboard=true", "logging.report_to=[mlflow]"])
    assert cfg.logging.report_to == ["mlflow"] and "is ignored" in capsys.readouterr().err
    with pytest.raises(SearchRLError, match="logging.report_to"):
        load_config(TrainConfig, None, ["logging.report_to=[tensorbord]"])


def test_a_tracker_that_is_not_installed_is_one_line_saying_what_to_install(monkeypatch):
    real = trackers.importlib.util.find_spec
    monkeypatch.setattr(trackers.importlib.util, "find_spec", lambda name: None if name == "wandb" else real(name))
    trackers.check_installed(["tensorboard", "mlflow"])
    with pytest.raises(SearchRLError, match=r"logging.report_to has wandb, but wandb is not installed: pip install 'searchrl\[wandb\]'"):
        trackers.check_installed(["tensorboard", "wandb"])


def test_a_wandb_mode_that_goes_online_without_a_key_fails_instead_of_prompting(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "online")
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.netrc, no wandb settings: no key anywhere
    monkeypatch.setenv("NETRC", str(tmp_path / ".netrc"))
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "wandb-config"))
    with pytest.raises(SearchRLError, match="WANDB_MODE=online needs a W&B API key"):
        trackers.Wandb(tmp_path, {}, None, {})
