"""Checkpoints of a training run: `checkpoints/step_XXXX/` = `save_pretrained` model + tokenizer
+ `trainer_state.json` + `optimizer.safetensors` + `rng_rank_XXX.json` + `agent.yaml` (the
protocol and tools it speaks), written into a hidden temp folder and renamed into place, so a
folder named `step_XXXX` is always complete;
`checkpoints/latest` names the newest one and is written last. `checksums.json`, written last,
covers every other file, so a resume tells a corrupted checkpoint from an intact one.

Nothing is pickled: a run directory from elsewhere (a shared disk, a download) is data, and
reading it runs no code. The optimizer's tensors are safetensors (its other fields JSON in that
file's metadata), the RNG states JSON lists of integers, the rest JSON. Checkpoints of searchrl
before this format (a pickled `trainer_state.pt`) resume only with `--trust-unverified`.

Several ranks (torchrun) write into the same temp folder: `sharded/` (DCP: each rank's shards of
the weights and optimizer state), `rng_rank_XXX.json` each, and at a stage's end the whole model
as a `save_pretrained` export; rank 0 writes `trainer_state.json` and renames once all are done.

Resuming picks the highest complete `step_XXXX` (the pointer is checked, not trusted: a crash
between the rename and the pointer write leaves the pointer one checkpoint behind).
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, fields
from pathlib import Path

import numpy as np
import torch

from searchrl.checkpoint_meta import write_checkpoint_agent
from searchrl.errors import SearchRLError
from searchrl.paths import make_readable
from searchrl.rl.distributed import LOCAL, Dist
from searchrl.rl.integrity import write_checksums

STATE_FILE = "trainer_state.json"
OPTIMIZER_FILE = "optimizer.safetensors"
LEGACY_STATE_FILE = "trainer_state.pt"  # pickled, by searchrl before checkpoints were pickle-free
SHARDED_DIR = "sharded"
LATEST = "latest"
_NAME = re.compile(r"^step_(\d+)$")


@dataclass
class TrainerState:
    """Where a run stands at a checkpoint: everything `--resume` reads, nothing more."""

    plan: list[int]  # the stages this run trains, in order
    stage: int  # the stage the checkpoint belongs to
    stage_step: int  # steps of that stage done
    step: int  # steps of the run done
    data_position: int  # prompts the stage's sampler has drawn
    metrics_lines: int  # records of metrics.jsonl up to this step
    stage_ends: dict[int, str]  # stage -> the checkpoint that ended it (the next stage starts there)
    lora: bool  # the weights are saved as a LoRA adapter
    world_size: int = 1  # processes that trained (sharded checkpoints resume on as many)
    optimizer: dict | None = None  # the optimizer's state_dict (one process, in OPTIMIZER_FILE; sharded: in DCP)
    rng: dict | None = None  # a legacy checkpoint's `rng_state()` (since then: one file per rank)

    def to_json(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name not in ("optimizer", "rng")}

    @classmethod
    def from_dict(cls, data: dict, where: str = "the trainer state") -> TrainerState:
        """The state in `data` (a checkpoint's JSON, or a legacy pickle's dict), every field of
        its type: a `SearchRLError` naming `where` (the file) and the field otherwise."""
        if not isinstance(data, dict):
            raise SearchRLError(f"{where} holds {type(data).__name__}, not an object of the trainer's fields")
        for name, check, wanted in _STATE_FIELDS:
            if name not in data:
                if name in _STATE_OPTIONAL:
                    continue
                raise SearchRLError(f"{where}: field {name} is missing")
            if not check(data[name]):
                shown = repr(data[name])
                raise SearchRLError(f"{where}: field {name} is {shown[:60]}{'...' if len(shown) > 60 else ''} "
                                    f"({type(data[name]).__name__}), not {wanted}")
        state = cls(**{f.name: data[f.name] for f in fields(cls) if f.name in data})
        state.stage_ends = {int(s): name for s, name in state.stage_ends.items()}  # JSON keys are strings
        return state


def _count(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


def _stage_key(s) -> bool:
    return (isinstance(s, str) and s.isdigit() and s.isascii()) or (_count(s))


# Each field of `trainer_state.json`: its check and what it must be (the messages). Stage ends name
# checkpoints of the same run (`step_XXXX`), never a path.
_STATE_FIELDS = (
    ("plan", lambda v: isinstance(v, list) and bool(v) and all(_count(s) for s in v), "a list of stage numbers"),
    ("stage", _count, "a stage number"),
    ("stage_step", _count, "a count of steps (an integer >= 0)"),
    ("step", _count, "a count of steps (an integer >= 0)"),
    ("data_position", _count, "a count of prompts drawn (an integer >= 0)"),
    ("metrics_lines", _count, "a count of metrics records (an integer >= 0)"),
    ("stage_ends", lambda v: isinstance(v, dict) and all(_stage_key(s) and isinstance(n, str) and _NAME.fullmatch(n)
                                                        for s, n in v.items()),
     "an object of stage numbers to checkpoint names (step_XXXX)"),
    ("lora", lambda v: isinstance(v, bool), "true or false"),
    ("world_size", lambda v: _count(v) and v >= 1, "a count of processes (an integer >= 1)"),
    ("optimizer", lambda v: v is None or isinstance(v, dict), "an optimizer state"),
    ("rng", lambda v: v is None or isinstance(v, dict), "an RNG state"),
)
_STATE_OPTIONAL = {"world_size", "optimizer", "rng"}


def checkpoint_name(step: int) -> str:
    return f"step_{step:04d}"


def rng_state() -> dict:
    """Python, numpy and torch (CPU and every CUDA device) generator states, as JSON values:
    python's (version, 625 ints, gauss), numpy's MT19937 (name, 624 keys, pos, has_gauss, cached),
    torch's byte tensors as lists of ints."""
    version, internal, gauss = random.getstate()
    name, keys, pos, has_gauss, cached = np.random.get_state()
    state = {"python": [version, list(internal), gauss], "numpy": [name, keys.tolist(), int(pos), int(has_gauss), float(cached)],
             "torch": torch.get_rng_state().tolist()}
    if torch.cuda.is_available():
        state["cuda"] = [s.tolist() for s in torch.cuda.get_rng_state_all()]
    return state


def set_rng_state(state: dict) -> None:
    """Restore `rng_state()` (or a legacy checkpoint's tuples, arrays and tensors)."""
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    name, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((name, np.asarray(keys, dtype=np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(torch.as_tensor(state["torch"], dtype=torch.uint8))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([torch.as_tensor(s, dtype=torch.uint8) for s in state["cuda"]])


def restore_rng(folder: Path, state: TrainerState, rank: int) -> None:
    """Set this rank's generators to the checkpoint's (`load_rng`); a saved state of the wrong
    shape or types is a `SearchRLError` naming its file, not a crash mid-resume."""
    saved = load_rng(folder, state, rank)
    try:
        set_rng_state(saved)
    except (KeyError, TypeError, ValueError, IndexError, OverflowError, RuntimeError) as exc:
        where = Path(folder) / LEGACY_STATE_FILE if state.rng is not None else rank_rng_file(folder, rank)
        if state.rng is None and not where.is_file():
            where = rank_rng_file(folder, rank, ".pt")
        raise SearchRLError(f"{where}: not a saved RNG state ({type(exc).__name__}: {' '.join(str(exc).split())[:200]}); "
                            "the checkpoint was altered: resume from another") from None


def rank_rng_file(folder: Path, rank: int, suffix: str = ".json") -> Path:
    return Path(folder) / f"rng_rank_{rank:03d}{suffix}"


def save_rank_rng(folder: Path, rank: int) -> None:
    rank_rng_file(folder, rank).write_text(json.dumps(rng_state()) + "\n")


def load_rng(folder: Path, state: TrainerState, rank: int) -> dict:
    """This rank's saved RNG state: its own file, or a legacy checkpoint's (in its trainer state
    or a pickled file per rank)."""
    if state.rng is not None:
        return state.rng
    path = rank_rng_file(folder, rank)
    if path.is_file():
        return _read_json(path)
    return _load_legacy(rank_rng_file(folder, rank, ".pt"))


def _write_state(folder: Path, state: TrainerState) -> None:
    """`trainer_state.json`, and the optimizer (one process) as `optimizer.safetensors`: its tensors
    under `PARAM.NAME`, its param groups and non-tensor entries as JSON in the file's metadata."""
    from safetensors.torch import save_file

    (folder / STATE_FILE).write_text(json.dumps(state.to_json(), indent=1) + "\n")
    if state.optimizer is None:
        return
    tensors, scalars = {}, {}
    for param, entries in state.optimizer["state"].items():
        for name, value in entries.items():
            if isinstance(value, torch.Tensor):
                tensors[f"{param}.{name}"] = value.detach().cpu().contiguous()
            else:
                scalars.setdefault(str(param), {})[name] = value
    rest = {"param_groups": state.optimizer["param_groups"], "scalars": scalars}
    save_file(tensors, folder / OPTIMIZER_FILE, metadata={"optimizer": json.dumps(rest)})


def _read_optimizer(path: Path) -> dict:
    from safetensors import safe_open

    with safe_open(path, framework="pt", device="cpu") as fh:
        rest = json.loads(fh.metadata()["optimizer"])
        per_param: dict[int, dict] = {}
        for key in fh.keys():  # noqa: SIM118  (a safetensors file, not a dict)
            param, name = key.split(".", 1)
            per_param.setdefault(int(param), {})[name] = fh.get_tensor(key)
    for param, entries in rest["scalars"].items():
        per_param.setdefault(int(param), {}).update(entries)
    return {"state": per_param, "param_groups": rest["param_groups"]}


def save_checkpoint(run_dir: Path, step: int, write: Callable[[Path], None], state: TrainerState, dist: Dist = LOCAL,
                    agent: dict | None = None) -> Path:
    """Write `checkpoints/step_XXXX` atomically, then point `checkpoints/latest` at it.

    `write(folder)` writes the model's files (on every rank, into the same folder); rank 0 adds
    the trainer state and `agent` (the protocol and tools trained with: `agent.yaml`,
    `searchrl.checkpoint_meta`) once every rank is done, renames, and moves the pointer."""
    root = Path(run_dir) / "checkpoints"
    name = checkpoint_name(step)
    if dist.main:
        root.mkdir(parents=True, exist_ok=True)
    tmp = Path(dist.broadcast(tempfile.mkdtemp(prefix=f".{name}.tmp-", dir=root) if dist.main else None))
    final = root / name
    try:
        write(tmp)
        dist.barrier()
        if dist.main:
            _write_state(tmp, state)
            if agent is not None:
                write_checkpoint_agent(tmp, agent)
            write_checksums(tmp)  # last: of every file, the trainer state's too
            make_readable(tmp)  # safetensors and mkdtemp create private files: 0644 / 0755 under umask 022
            if final.exists():  # the same step saved again after a resume: replace it
                shutil.rmtree(final)
            os.rename(tmp, final)
    except BaseException:
        if dist.main:
            shutil.rmtree(tmp, ignore_errors=True)
        raise
    if dist.main:
        pointer = root / f".{LATEST}.tmp"
        pointer.write_text(name + "\n")
        os.replace(pointer, root / LATEST)
    dist.barrier()  # no rank goes on (and may prune or resume) before the folder is in place
    return final


def complete_checkpoints(run_dir: Path) -> list[tuple[int, Path]]:
    """(step, folder) of every complete checkpoint, oldest first; temp folders are ignored."""
    root = Path(run_dir) / "checkpoints"
    found = []
    for path in root.iterdir() if root.is_dir() else []:
        m = _NAME.match(path.name)
        if m and path.is_dir() and ((path / STATE_FILE).is_file() or (path / LEGACY_STATE_FILE).is_file()):
            found.append((int(m.group(1)), path))
    return sorted(found)


def latest_checkpoint(run_dir: Path) -> Path | None:
    """The newest complete checkpoint of a run, or None when it has none."""
    found = complete_checkpoints(run_dir)
    return found[-1][1] if found else None


def clean_temp(run_dir: Path) -> None:
    """Remove half-written checkpoint folders a killed run left behind."""
    root = Path(run_dir) / "checkpoints"
    for path in root.glob(".step_*.tmp-*") if root.is_dir() else []:
        shutil.rmtree(path, ignore_errors=True)


def is_legacy(folder: Path) -> bool:
    """Written by searchrl before checkpoints were pickle-free (a pickled `trainer_state.pt`)."""
    return not (Path(folder) / STATE_FILE).is_file() and (Path(folder) / LEGACY_STATE_FILE).is_file()


def load_state(folder: Path) -> TrainerState:
    """The trainer state of a checkpoint, its optimizer's too (one process)."""
    folder = Path(folder)
    path = folder / (LEGACY_STATE_FILE if is_legacy(folder) else STATE_FILE)
    try:
        if path.name == LEGACY_STATE_FILE:
            return TrainerState.from_dict(_load_legacy(path), str(path))
        state = TrainerState.from_dict(_read_json(path), str(path))
        if (folder / OPTIMIZER_FILE).is_file():
            path = folder / OPTIMIZER_FILE
            state.optimizer = _read_optimizer(path)
    except SearchRLError:
        raise
    except Exception as exc:  # noqa: BLE001  (a damaged file fails in many ways; all mean 'unreadable')
        raise SearchRLError(f"cannot read {path} ({exc})") from None
    return state


def _read_json(path: Path):
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError) as exc:
        raise SearchRLError(f"cannot read {path} ({exc})") from None


# A legacy state holds numpy RNG arrays beside tensors and plain values: these types, no others.
_reconstruct = np.empty(0).__reduce__()[0]  # numpy's array rebuilder, wherever this numpy keeps it
_LEGACY_TYPES = [np.dtype, np.ndarray, type(np.dtype(np.uint32)), _reconstruct,
                 (_reconstruct, "numpy.core.multiarray._reconstruct")]  # its name when numpy 1 pickled it


def _load_legacy(path: Path):
    """A pickled file of an older searchrl, read without running code (`weights_only`: tensors,
    plain values and the numpy types above; anything else is refused)."""
    try:
        with torch.serialization.safe_globals(_LEGACY_TYPES):
            return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001  (unpickling fails in many ways; all mean 'unreadable')
        raise SearchRLError(f"cannot read {path} ({' '.join(str(exc).split())[:300]})") from None


def prune(run_dir: Path, keep_last: int | None, protected: set[str]) -> None:
    """Delete all but the `keep_last` newest checkpoints, never one named in `protected`."""
    if keep_last is None:
        return
    found = complete_checkpoints(run_dir)
    for _, path in found[: max(len(found) - keep_last, 0)]:
        if path.name not in protected:
            shutil.rmtree(path, ignore_errors=True)
