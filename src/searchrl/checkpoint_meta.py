"""What a checkpoint was trained to speak: its protocol and tools, in `agent.yaml` beside the
weights (written by the trainer with every checkpoint), or in `searchrl.json` of an export
(written by `searchrl export`, docs/guides/export.md). `read_checkpoint_agent` is the one reader:
`ask`, `eval run`, `eval report`, `data select`, a next training stage and `export` take a trained
model's protocol from it (through the model profile, `searchrl.profiles`), so a trained model
needs no protocol flags."""

from __future__ import annotations

import json
import re
from pathlib import Path

import yaml

from searchrl.errors import SearchRLError

AGENT_FILE = "agent.yaml"
EXPORT_FILE = "searchrl.json"  # an export's manifest
EXPORT_VERSION = 1
PROMPT_FILE = "prompt_template.txt"  # a run's prompt template file, carried into its export


def agent_settings(cfg) -> dict:
    """The resolved `protocol` and `tools` sections of an agent config, as plain values."""
    return {"protocol": cfg.protocol.model_dump(mode="json"), "tools": list(cfg.tools)}


def write_checkpoint_agent(folder: Path, settings: dict) -> None:
    """Write `agent_settings(...)` into a checkpoint folder."""
    (Path(folder) / AGENT_FILE).write_text(
        "# The protocol and tools this checkpoint was trained with (searchrl reads them back).\n"
        + yaml.safe_dump(settings, sort_keys=False), encoding="utf-8")


_STEP = re.compile(r"^step_(\d+)$")
# What makes a checkpoint folder complete and loadable as a model: its trainer state (written last
# but for the checksums) and a model (full weights' config.json, or a LoRA adapter's config).
_STATE_FILES = ("trainer_state.json", "trainer_state.pt")
_MODEL_FILES = ("config.json", "adapter_config.json")


def newest_model_checkpoint(run: Path) -> Path | None:
    """The newest complete checkpoint of the training run `run` that holds a model (a torchrun
    checkpoint inside a stage holds shards only); None when there is none."""
    found = []
    root = Path(run) / "checkpoints"
    for path in root.iterdir() if root.is_dir() else []:
        m = _STEP.match(path.name)
        if (m and path.is_dir() and any((path / f).is_file() for f in _STATE_FILES)
                and any((path / f).is_file() for f in _MODEL_FILES)):
            found.append((int(m.group(1)), path))
    return max(found)[1] if found else None


def resolve_trained_model(model: str) -> str:
    """`--model` as every command reads it: a training run's folder (`RUN`, holding
    `checkpoints/`) or its pointer `RUN/checkpoints/latest` means the run's newest complete
    checkpoint (`RUN/checkpoints/step_XXXX`, returned); anything else (a checkpoint, an export,
    a built-in name, a hub id) is returned as given. A run without a loadable checkpoint is an
    error that says so."""
    path = Path(str(model)).expanduser()
    if path.is_file() and path.name == "latest" and path.parent.name == "checkpoints":
        run = path.parent.parent
    elif path.is_dir() and (path / "checkpoints").is_dir() and not any((path / f).is_file() for f in _MODEL_FILES):
        run = path
    else:
        return model
    found = newest_model_checkpoint(run)
    if found is None:
        raise SearchRLError(f"model {model}: the run {run} has no complete checkpoint with a model under "
                            f"{run / 'checkpoints'} yet; train it further or give a checkpoint folder")
    return str(found)


def read_checkpoint_agent(path: str | Path) -> dict | None:
    """`{"protocol": {...}, "tools": [...]}` that the checkpoint or export folder `path` was
    trained with, and for an export `"rollout"`: the temperature and top-p it was trained to
    sample at; None when `path` is no such folder. Checkpoints written before `agent.yaml`
    existed (`RUN/checkpoints/step_XXXX`) give their run's config.yaml sections instead."""
    folder = Path(path).expanduser()
    if not folder.is_dir():
        return None
    if (folder / EXPORT_FILE).is_file():
        manifest = read_export(folder)
        return {**_sections(folder / EXPORT_FILE, manifest), "rollout": dict(manifest["sampling"])}
    file = folder / AGENT_FILE
    if file.is_file():
        return _sections(file, _read(file))
    run_config = folder.parent.parent / "config.yaml"
    if folder.parent.name == "checkpoints" and run_config.is_file():
        data = _read(run_config)
        # A run before tools existed spoke search alone.
        return _sections(run_config, {"protocol": data.get("protocol", {}), "tools": data.get("tools", ["search"])})
    return None


def read_export(folder: str | Path) -> dict:
    """The manifest of an export folder (`searchrl.json`), a prompt template file resolved to its path."""
    path = Path(folder) / EXPORT_FILE
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise SearchRLError(f"cannot read {path} ({exc}); export the run again") from None
    if not isinstance(manifest, dict) or manifest.get("version") != EXPORT_VERSION:
        found = manifest.get("version") if isinstance(manifest, dict) else None
        raise SearchRLError(f"{path} is of export format {found!r}; this searchrl reads format "
                            f"{EXPORT_VERSION}: export the run again")
    if manifest["protocol"]["template"] == PROMPT_FILE:
        manifest["protocol"]["template"] = str(Path(folder) / PROMPT_FILE)
    return manifest


def export_origin(model: str) -> str | None:
    """What the export folder `model` was exported from, in a few words ("step 13 of
    runs/demo/train/checkpoints/step_0013, base smollm2-135m"); None when `model` is no readable export."""
    if not (Path(model).expanduser() / EXPORT_FILE).is_file():
        return None
    try:
        manifest = read_export(Path(model).expanduser())
    except SearchRLError:
        return None
    return f"step {manifest.get('step')} of {manifest.get('checkpoint')}, base {manifest.get('base_model')}"


def _read(file: Path) -> dict:
    try:
        data = yaml.safe_load(file.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as exc:
        raise SearchRLError(f"cannot read {file} ({type(exc).__name__}): restore it or delete it") from None
    if not isinstance(data, dict):
        raise SearchRLError(f"{file} must hold a mapping with protocol and tools; restore it or delete it")
    return data


def _sections(file: Path, data: dict) -> dict:
    protocol, tools = data.get("protocol"), data.get("tools")
    if not isinstance(protocol, dict) or not isinstance(tools, list) or not all(isinstance(t, str) for t in tools):
        raise SearchRLError(f"{file}: protocol must be a mapping and tools a list of names; restore it or delete it")
    return {"protocol": protocol, "tools": tools}
