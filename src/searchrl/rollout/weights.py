"""A policy's weights as (checkpoint name, tensor) pairs: what a rollout engine of its own loads
after every update (`GenerationBackend.sync_weights`), or, for a rollout worker in another
process, reads from a versioned file the trainer publishes (`publish`, `read_published`) and hands
to its backend (`GenerationBackend.load_weights`)."""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterator
from pathlib import Path

import torch


def whole_tensor(t: torch.Tensor) -> torch.Tensor:
    """The full tensor of an FSDP2 shard (a DTensor; an all-gather), else `t`."""
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def named_weights(model: torch.nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """(checkpoint name, tensor) for every weight of a transformers causal LM, as `save_pretrained`
    names them. A peft LoRA model yields its base weights with the active adapters merged
    (W + scale * B @ A, computed here; the model keeps its separate adapters) under the base
    model's names, so the engine serves exactly what the trainer's forward computes.

    A model sharded with FSDP2 yields whole tensors, gathered one at a time (each rank must
    consume the iterator to its end, in step with the others)."""
    if not hasattr(model, "get_base_model"):
        for name, p in model.named_parameters():
            yield name, whole_tensor(p.detach())
        return
    from peft.tuners.lora import LoraLayer

    base = model.get_base_model()
    deltas = {}
    for name, module in base.named_modules():
        if isinstance(module, LoraLayer) and not module.disable_adapters and not module.merged:
            active = [a for a in module.active_adapters if a in module.lora_A]
            if active:
                deltas[f"{name}.base_layer.weight"] = sum(module.get_delta_weight(a) for a in active)
    with torch.no_grad():
        for name, p in base.named_parameters():
            if ".lora_" in name:
                continue
            w = p.detach()
            yield name.replace(".base_layer.", "."), (w + deltas[name].to(w.dtype)) if name in deltas else w


# -- published versions: how a trainer hands weights to a rollout worker in another process -------
#
# A version is a safetensors file in a folder of the run's own, in shared memory (/dev/shm) where
# the machine has room for it: the hand-off is then a copy in RAM, not a write to disk, whose
# writeback made the trainer's publish of SmolLM2-135M's 540 MB take 0.2-2.6 s on a 2-core CPU
# machine (here: 0.13-0.2 s; bench/async.py prints it). A version no order needs any more is not
# deleted but kept as a spare (`retire`): the next `publish` writes its tensors into the spare's
# pages in place, which skips allocating and zeroing 540 MB of fresh pages. Both sides move the
# bytes with plain reads and writes, straight from and into the parameters: mapping the file
# instead cost a page fault per 4 KB.

SPARE = ".spare.safetensors"
# The dtypes a published version may hold, by their safetensors names (also the weight broadcast's).
DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
          "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8, "BOOL": torch.bool}
DTYPE_NAMES = {t: name for name, t in DTYPES.items()}


def weights_folder(run_dir: Path, need_bytes: int) -> Path:
    """The folder of run `run_dir`'s published weights: in /dev/shm when it exists and has
    `need_bytes` free (containers often give it only 64 MB), else the run's `rollout-weights/`.
    Its name follows the run directory, so a run killed before it could remove the folder clears
    it when it resumes (and its local workers remove it when they see the trainer gone)."""
    shm = Path("/dev/shm")
    room = 0
    if shm.is_dir() and os.access(shm, os.W_OK):
        st = os.statvfs(shm)
        room = st.f_bavail * st.f_frsize
    if room < need_bytes:
        return Path(run_dir) / "rollout-weights"
    return shm / f"searchrl-weights-{hashlib.sha1(str(Path(run_dir).resolve()).encode()).hexdigest()[:16]}"


def weights_bytes(model: torch.nn.Module) -> int:
    """The size of one published version of `model` (its parameters; tied ones once)."""
    return sum(p.numel() * p.element_size() for p in model.parameters())


def published_path(folder: Path, version: int) -> Path:
    return folder / f"weights-{version:06d}.safetensors"


def version_of(path: Path) -> int:
    """The policy version of a published file (`published_path`); -1 for any other name."""
    digits = path.name.removeprefix("weights-").removesuffix(".safetensors")
    return int(digits) if path.name.startswith("weights-") and path.name.endswith(".safetensors") and digits.isdigit() else -1


def _header(path: Path) -> tuple[int, dict]:
    """(where the data starts, {name: {dtype, shape, data_offsets}}) of safetensors file `path`."""
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(n))
    header.pop("__metadata__", None)
    return 8 + n, header


def _bytes(t: torch.Tensor):
    """The bytes of contiguous tensor `t`, shared, as a buffer (writable: a read can fill it)."""
    return t.detach().reshape(-1).view(torch.uint8).numpy()


def publish(model: torch.nn.Module, folder: Path, version: int) -> Path:
    """Write `model`'s weights (`named_weights`) as policy `version` into `folder`: into the spare
    (`retire`) when it holds the same tensors, else a new file; under a temporary name, then
    renamed, so a reader never sees half a file."""
    path = published_path(folder, version)
    tmp = path.with_name(f".{path.name}.tmp")
    weights = {name: w.detach().to("cpu").contiguous() for name, w in named_weights(model)}
    spare = folder / SPARE
    start, header = _header(spare) if spare.exists() else (0, {})
    if header.keys() == weights.keys() and all(
            DTYPES.get(h["dtype"]) == weights[k].dtype and h["shape"] == list(weights[k].shape) for k, h in header.items()):
        os.replace(spare, tmp)
        with open(tmp, "r+b") as f:
            for name, w in weights.items():
                f.seek(start + header[name]["data_offsets"][0])
                f.write(_bytes(w))
    else:
        from safetensors.torch import save_file

        spare.unlink(missing_ok=True)
        save_file(weights, str(tmp))
    os.replace(tmp, path)
    return path


def read_published(folder: Path, version: int) -> Iterator[tuple[str, torch.Tensor]]:
    """Policy `version`, as `publish` wrote it: (checkpoint name, tensor) pairs, read one at a
    time (what `GenerationBackend.load_weights` takes; no model is built to read them)."""
    from safetensors import safe_open

    with safe_open(str(published_path(folder, version)), framework="pt") as f:
        names = f.keys()  # a safe_open handle has keys() but is not iterable
        for name in names:
            yield name, f.get_tensor(name)


def latest_published(folder: Path) -> int | None:
    """The newest version published in `folder` (None when there is none). A file is there only
    once complete (`publish` renames it into place)."""
    return max((version_of(p) for p in folder.glob("weights-*.safetensors")), default=None)


def retire(folder: Path, version: int) -> None:
    """Version `version` is needed no more: its file becomes the spare the next `publish` writes into."""
    os.replace(published_path(folder, version), folder / SPARE)
