"""A policy's weights as (checkpoint name, tensor) pairs: what a rollout engine of its own loads
after every update (`GenerationBackend.sync_weights`), or, for a rollout worker in another
process, reads from a versioned file the trainer publishes (`publish`, `read_published`) and hands
to its backend (`GenerationBackend.load_weights`)."""

from __future__ import annotations

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


def published_path(folder: Path, version: int) -> Path:
    return folder / f"weights-{version:06d}.safetensors"


def publish(model: torch.nn.Module, folder: Path, version: int) -> Path:
    """Write `model`'s weights (`named_weights`, on CPU) as policy `version` into `folder`: to a
    temporary name, then renamed, so a reader never sees half a file."""
    from safetensors.torch import save_file

    path = published_path(folder, version)
    tmp = path.with_name(f".{path.name}.tmp")
    save_file({name: w.detach().to("cpu").contiguous() for name, w in named_weights(model)}, str(tmp))
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
    versions = [int(p.stem.split("-")[1]) for p in folder.glob("weights-*.safetensors")]
    return max(versions, default=None)
