"""What a checkpoint was trained to speak: its protocol and tools, in `agent.yaml` beside the
weights (written by the trainer with every checkpoint). `read_checkpoint_agent` is the one reader:
`ask`, `eval run`, `view`, a next training stage and `export` take a checkpoint's protocol from it
(through the model profile, `searchrl.profiles`), so a trained model needs no protocol flags."""

from __future__ import annotations

from pathlib import Path

import yaml

from searchrl.errors import SearchRLError

AGENT_FILE = "agent.yaml"


def agent_settings(cfg) -> dict:
    """The resolved `protocol` and `tools` sections of an agent config, as plain values."""
    return {"protocol": cfg.protocol.model_dump(mode="json"), "tools": list(cfg.tools)}


def write_checkpoint_agent(folder: Path, settings: dict) -> None:
    """Write `agent_settings(...)` into a checkpoint folder."""
    (Path(folder) / AGENT_FILE).write_text(
        "# The protocol and tools this checkpoint was trained with (searchrl reads them back).\n"
        + yaml.safe_dump(settings, sort_keys=False), encoding="utf-8")


def read_checkpoint_agent(path: str | Path) -> dict | None:
    """`{"protocol": {...}, "tools": [...]}` that the checkpoint folder `path` was trained with;
    None when `path` is no such folder. Checkpoints written before `agent.yaml` existed
    (`RUN/checkpoints/step_XXXX`) give their run's config.yaml sections instead."""
    folder = Path(path).expanduser()
    if not folder.is_dir():
        return None
    file = folder / AGENT_FILE
    if file.is_file():
        return _sections(file, _read(file))
    run_config = folder.parent.parent / "config.yaml"
    if folder.parent.name == "checkpoints" and run_config.is_file():
        data = _read(run_config)
        # A run before tools existed spoke search alone.
        return _sections(run_config, {"protocol": data.get("protocol", {}), "tools": data.get("tools", ["search"])})
    return None


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
