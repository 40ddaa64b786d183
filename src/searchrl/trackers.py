"""Experiment trackers a training run reports to (`logging.report_to`): TensorBoard (`tb/`),
Weights & Biases and MLflow. Each gets the metric names, values and steps of `metrics.jsonl`,
the resolved config once, and wandb and MLflow a table of sampled trajectories per logging step.

Offline by default: wandb runs in offline mode under the run directory unless `WANDB_MODE` is set
(and never prompts for a login), MLflow writes a file store under the run directory unless
`MLFLOW_TRACKING_URI` is set. The wandb and MLflow run ids are kept in `trackers.json`, so a
resumed run goes on in the same tracker runs. Guide: docs/guides/trackers.md.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import secrets
import sys
from pathlib import Path

from searchrl.errors import SearchRLError

TRACKERS = ("tensorboard", "wandb", "mlflow")
IDS_FILE = "trackers.json"  # {"wandb": {"id": ...}, "mlflow": {"run_id": ..., "tracking_uri": ...}}
CONFIG_FILE = "config.yaml"
# The columns of the sampled-trajectory tables, one row per trajectory of `samples/step_XXXX.jsonl`.
SAMPLE_COLUMNS = ("step", "group", "id", "question", "answers", "prediction", "reward", "format_ok",
                  "searches", "stop_reason", "response")
_PACKAGES = {"wandb": "wandb", "mlflow": "mlflow"}  # tracker -> module it needs (tensorboard is a dependency)
_OFFLINE_WANDB_MODES = ("offline", "disabled", "dryrun")
_MLFLOW_PARAM_CHARS = 6000  # MLflow's longest parameter value; config.yaml (an artifact) holds the whole
_MLFLOW_BATCH = 100  # parameters per log_batch request


def check_installed(names: list[str]) -> None:
    """Fail before a run starts when a tracker in `logging.report_to` is not installed."""
    for name in names:
        module = _PACKAGES.get(name)
        if module and importlib.util.find_spec(module) is None:
            raise SearchRLError(
                f"logging.report_to has {name}, but {module} is not installed: pip install 'searchrl[{name}]' "
                f"(or remove {name} from logging.report_to)"
            )


def scalars(record: dict) -> dict[str, float]:
    """The finite numbers of a step record: what every tracker is given (nulls and NaN stay in
    metrics.jsonl only)."""
    return {k: v for k, v in record.items()
            if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)}


def sample_rows(samples: list[dict]) -> list[list]:
    """The sampled trajectories as rows of `SAMPLE_COLUMNS` (an sft stage's gold paths have no
    group, reward or format check: those cells are null)."""
    return [[s["step"], s.get("group"), s["id"], s["question"], " | ".join(s["answers"]), s["prediction"],
             s["reward"]["total"] if "reward" in s else None, s.get("format_ok"), s["n_searches"],
             s["stop_reason"], "".join(seg["text"] for seg in s["segments"])] for s in samples]


def open_trackers(names: list[str], run_dir: Path, config: dict, purge_step: int | None) -> list:
    """The trackers of `names` for the run in `run_dir`, each given the resolved `config` once."""
    check_installed(names)
    ids = _read_ids(run_dir)
    opened = []
    for name in dict.fromkeys(names):  # each once, in the order given
        tracker = {"tensorboard": TensorBoard, "wandb": Wandb, "mlflow": MLflow}[name](run_dir, config, purge_step, ids)
        if tracker.writer is not None:
            opened.append(tracker)
    _write_ids(run_dir, ids)
    return opened


def _read_ids(run_dir: Path) -> dict:
    path = run_dir / IDS_FILE
    return json.loads(path.read_text()) if path.is_file() else {}


def _write_ids(run_dir: Path, ids: dict) -> None:
    if ids:
        (run_dir / IDS_FILE).write_text(json.dumps(ids, indent=2) + "\n")


class TensorBoard:
    """Events under `tb/`; `purge_step` drops those past a resumed checkpoint."""

    def __init__(self, run_dir: Path, config: dict, purge_step: int | None, ids: dict) -> None:
        self.writer = None
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:
            print("note: tensorboard is not installed, so no tb/ events are written "
                  "(pip install tensorboard; metrics.jsonl has everything)", file=sys.stderr)
            return
        self.writer = SummaryWriter(str(run_dir / "tb"), purge_step=purge_step)

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        for key, value in metrics.items():
            self.writer.add_scalar(key, value, step)
        self.writer.flush()

    def log_samples(self, rows: list[list], step: int) -> None:
        """TensorBoard has no tables: the samples are in samples/ of the run."""

    def close(self) -> None:
        self.writer.close()


class Wandb:
    """A wandb run (offline under the run directory unless WANDB_MODE says otherwise); its id is
    kept so that a resumed run goes on in it."""

    def __init__(self, run_dir: Path, config: dict, purge_step: int | None, ids: dict) -> None:
        import wandb

        mode = os.environ.get("WANDB_MODE")
        if mode is not None and mode not in _OFFLINE_WANDB_MODES and not wandb.login(prompt=False, verify=False):
            raise SearchRLError(f"WANDB_MODE={mode} needs a W&B API key: run `wandb login` or set WANDB_API_KEY "
                                "(or unset WANDB_MODE to log offline under the run directory)")
        run_id = ids.get("wandb", {}).get("id") or secrets.token_hex(6)
        self.writer = wandb.init(
            project=os.environ.get("WANDB_PROJECT", "searchrl"), name=run_dir.name, id=run_id, resume="allow",
            dir=os.environ.get("WANDB_DIR", str(run_dir)), mode=None if mode else "offline", config=config,
            # console=off: our stderr summary stays as it is (wandb would wrap stdout and stderr)
            settings=wandb.Settings(console="off", silent=True),
        )
        ids["wandb"] = {"id": run_id}
        if (run_dir / CONFIG_FILE).is_file():
            self.writer.save(str(run_dir / CONFIG_FILE), base_path=str(run_dir), policy="now")
        self._table = wandb.Table

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        self.writer.log(metrics, step=step)

    def log_samples(self, rows: list[list], step: int) -> None:
        self.writer.log({"samples": self._table(columns=list(SAMPLE_COLUMNS), data=rows)}, step=step)

    def close(self) -> None:
        self.writer.finish()


class MLflow:
    """An MLflow run (a file store at `mlruns/` in the run directory unless MLFLOW_TRACKING_URI is
    set): the config as flattened parameters and config.yaml as an artifact, samples as tables."""

    def __init__(self, run_dir: Path, config: dict, purge_step: int | None, ids: dict) -> None:
        from mlflow.tracking import MlflowClient

        uri = os.environ.get("MLFLOW_TRACKING_URI")
        self.file_store = uri is None or _is_file_store(uri)
        if uri is None:
            uri = (run_dir / "mlruns").resolve().as_uri()
            # MLflow 3 keeps its file store in maintenance mode behind this switch; a local,
            # offline store in the run directory is what we want here.
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        self.client = client = MlflowClient(tracking_uri=uri)
        known = ids.get("mlflow", {})
        self.run_id = known.get("run_id") if known.get("tracking_uri") == uri else None
        if self.run_id is None:
            name = os.environ.get("MLFLOW_EXPERIMENT_NAME", "searchrl")
            experiment = client.get_experiment_by_name(name)
            experiment_id = experiment.experiment_id if experiment else client.create_experiment(name)
            self.run_id = client.create_run(experiment_id, run_name=run_dir.name).info.run_id
            self._log_params(config)  # once: MLflow parameters cannot change, a resumed run keeps them
        else:
            client.update_run(self.run_id, status="RUNNING")
        ids["mlflow"] = {"run_id": self.run_id, "tracking_uri": uri}
        if (run_dir / CONFIG_FILE).is_file():
            client.log_artifact(self.run_id, str(run_dir / CONFIG_FILE))
        self.writer = client

    def _log_params(self, config: dict) -> None:
        from mlflow.entities import Param

        params = [Param(k, v[:_MLFLOW_PARAM_CHARS]) for k, v in _flatten(config).items()]
        for i in range(0, len(params), _MLFLOW_BATCH):
            self.client.log_batch(self.run_id, params=params[i: i + _MLFLOW_BATCH])

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        import time

        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        self.client.log_batch(self.run_id, metrics=[Metric(mlflow_name(k, self.file_store), float(v), now, step)
                                                    for k, v in metrics.items()])

    def log_samples(self, rows: list[list], step: int) -> None:
        # log_table's own JSON form ({"columns", "data"}), written without needing pandas
        self.client.log_dict(self.run_id, {"columns": list(SAMPLE_COLUMNS), "data": rows}, f"samples/step_{step:04d}.json")

    def close(self) -> None:
        self.client.set_terminated(self.run_id)


def mlflow_name(key: str, file_store: bool) -> str:
    """A metric's name in MLflow: its metrics.jsonl name, but in a file store (a file per name)
    with "." for "/", since `reward` could not be a file beside the folder of `reward/answer`."""
    return key.replace("/", ".") if file_store else key


def _is_file_store(uri: str) -> bool:
    return uri.startswith("file:") or "://" not in uri and not uri.startswith(("databricks", "uc"))


def _flatten(tree: dict, prefix: str = "") -> dict[str, str]:
    """`{"a": {"b": 1}}` -> `{"a.b": "1"}`: config keys as MLflow parameters (values as JSON)."""
    out = {}
    for key, value in tree.items():
        if isinstance(value, dict) and value:
            out.update(_flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value if isinstance(value, str) else json.dumps(value)
    return out
