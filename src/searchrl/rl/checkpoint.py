"""Checkpoints of a training run: `checkpoints/step_XXXX/` = `save_pretrained` model + tokenizer
+ `trainer_state.pt`, written into a hidden temp folder and renamed into place, so a folder named
`step_XXXX` is always complete; `checkpoints/latest` names the newest one and is written last. `checksums.json` (written before
`trainer_state.pt`) lets a resume tell a corrupted checkpoint from an intact one.

Several ranks (torchrun) write into the same temp folder: `sharded/` (DCP: each rank's shards of
the weights and optimizer state), `rng_rank_XXX.pt` each, and at a stage's end the whole model
as a `save_pretrained` export; rank 0 writes `trainer_state.pt` and renames once all are done.

Resuming picks the highest complete `step_XXXX` (the pointer is checked, not trusted: a crash
between the rename and the pointer write leaves the pointer one checkpoint behind).
"""

from __future__ import annotations

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

from searchrl.errors import SearchRLError
from searchrl.rl.distributed import LOCAL, Dist
from searchrl.rl.integrity import write_checksums

STATE_FILE = "trainer_state.pt"
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
    optimizer: dict | None = None  # the optimizer's state_dict (one process; sharded: in DCP)
    rng: dict | None = None  # `rng_state()` (one process; sharded: one file per rank)

    def to_dict(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)}  # no deep copy of the tensors

    @classmethod
    def from_dict(cls, data: dict) -> TrainerState:
        return cls(**{f.name: data[f.name] for f in fields(cls) if f.name in data})


def checkpoint_name(step: int) -> str:
    return f"step_{step:04d}"


def rng_state() -> dict:
    """Python, numpy and torch (CPU and every CUDA device) generator states."""
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def rank_rng_file(folder: Path, rank: int) -> Path:
    return Path(folder) / f"rng_rank_{rank:03d}.pt"


def save_rank_rng(folder: Path, rank: int) -> None:
    torch.save(rng_state(), rank_rng_file(folder, rank))


def load_rng(folder: Path, state: TrainerState, rank: int) -> dict:
    """This rank's saved RNG state: in the trainer state (one process) or its own file."""
    if state.rng is not None:
        return state.rng
    return torch.load(rank_rng_file(folder, rank), map_location="cpu", weights_only=False)


def save_checkpoint(run_dir: Path, step: int, write: Callable[[Path], None], state: TrainerState, dist: Dist = LOCAL) -> Path:
    """Write `checkpoints/step_XXXX` atomically, then point `checkpoints/latest` at it.

    `write(folder)` writes the model's files (on every rank, into the same folder); rank 0 adds
    the trainer state once every rank is done, renames, and moves the pointer."""
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
            write_checksums(tmp)
            torch.save(state.to_dict(), tmp / STATE_FILE)  # last: its presence marks the folder complete
            tmp.chmod(0o755)
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
        if m and path.is_dir() and (path / STATE_FILE).is_file():
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


def load_state(ckpt: Path) -> TrainerState:
    # Our own file with numpy RNG arrays and optimizer tensors: weights_only would refuse it.
    try:
        return TrainerState.from_dict(torch.load(Path(ckpt) / STATE_FILE, map_location="cpu", weights_only=False))
    except Exception as exc:  # noqa: BLE001  (unpickling fails in many ways; all mean 'unreadable')
        raise SearchRLError(f"cannot read {Path(ckpt) / STATE_FILE} ({exc})") from None


def prune(run_dir: Path, keep_last: int | None, protected: set[str]) -> None:
    """Delete all but the `keep_last` newest checkpoints, never one named in `protected`."""
    if keep_last is None:
        return
    found = complete_checkpoints(run_dir)
    for _, path in found[: max(len(found) - keep_last, 0)]:
        if path.name not in protected:
            shutil.rmtree(path, ignore_errors=True)
