"""FSDP2 for the policy and the reference (`torch.distributed.fsdp.fully_shard`), and what a sharded
model needs around it: `torch.distributed.checkpoint` (DCP) save and load, and a plain Hugging
Face export. (A rollout engine gets its whole weights from `searchrl.rollout.weights`.)

Each decoder layer is one FSDP unit and the root (embeddings, final norm, head — tied or not) is
another, as torchtitan shards a decoder: a layer's weights exist whole only during its own
forward and backward.

DCP's own reader unpickles a checkpoint's `.metadata` and its non-tensor items; ours reads the one
with an allow-list of DCP's metadata types and the other with `torch.load(weights_only=True)`, so
loading a checkpoint from elsewhere runs no code.
"""

from __future__ import annotations

import importlib
import io
import pickle
from pathlib import Path

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import DefaultLoadPlanner, FileSystemReader
from torch.distributed.checkpoint._traverse import set_element  # what DCP's own planner uses
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard

from searchrl.compat import checkpointing_layers
from searchrl.errors import SearchRLError


def shard(model, compute_dtype: torch.dtype):
    """Shard `model` in place (per decoder layer, then the root) and return it.

    Below float32, FSDP casts the float32 master weights to `compute_dtype` for compute and
    reduces gradients in float32 (mixed precision, bf16 on GPU). FSDP would average the gradients
    over ranks; our losses are already divided by the global number of units, so the ranks' shares
    are summed instead (divide factor 1).
    """
    low = compute_dtype != torch.float32
    policy = MixedPrecisionPolicy(param_dtype=compute_dtype, reduce_dtype=torch.float32) if low else MixedPrecisionPolicy()
    for layer in checkpointing_layers(model):
        fully_shard(layer, mp_policy=policy)
    fully_shard(model, mp_policy=policy)
    if any(p.requires_grad for p in model.parameters()):
        for unit in model.modules():  # each unit reduces its own gradients
            if isinstance(unit, FSDPModule):
                unit.set_gradient_divide_factor(1.0)
                unit.set_force_sum_reduction_for_comms(True)  # a plain sum (gloo has no pre-multiplied one)
    return model


def is_sharded(model) -> bool:
    return isinstance(model, FSDPModule)


def save_sharded(folder: Path, model, optimizer) -> None:
    """Each rank writes its shards of the weights and the optimizer state into `folder` (DCP)."""
    from torch.distributed.checkpoint.state_dict import (
        get_model_state_dict,
        get_optimizer_state_dict,
    )

    dcp.save({"model": get_model_state_dict(model), "optimizer": get_optimizer_state_dict(model, optimizer)}, checkpoint_id=str(folder))


def load_sharded_model(folder: Path, model) -> None:
    """The weights of a `save_sharded` folder, into the (already sharded) model."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, set_model_state_dict

    state = {"model": get_model_state_dict(model)}
    _load(state, folder)
    set_model_state_dict(model, state["model"])


def load_sharded_optimizer(folder: Path, model, optimizer) -> None:
    """The optimizer state of a `save_sharded` folder, into a fresh optimizer of `model`."""
    from torch.distributed.checkpoint.state_dict import (
        get_optimizer_state_dict,
        set_optimizer_state_dict,
    )

    state = {"optimizer": get_optimizer_state_dict(model, optimizer)}
    _load(state, folder)
    set_optimizer_state_dict(model, optimizer, state["optimizer"])


def _load(state: dict, folder: Path) -> None:
    try:
        dcp.load(state, storage_reader=_SafeReader(str(folder)), planner=_SafePlanner())
    except CheckpointException as exc:  # a BaseException, holding each rank's error
        causes = "; ".join(" ".join(str(e).split())[:300] for e, _ in exc.failures.values())
        raise SearchRLError(f"cannot read the sharded checkpoint {folder} ({causes})") from None


# What DCP's `.metadata` pickles: its own dataclasses and enums, tensor sizes, dtypes and layouts.
_METADATA_MODULE = "torch.distributed.checkpoint.metadata"
_METADATA_GLOBALS = {("torch", "Size"), ("torch.serialization", "_get_layout"), ("pathlib", "PosixPath"),
                     ("torch.distributed.checkpoint.filesystem", "_StorageInfo"), ("collections", "OrderedDict")}


class _MetadataUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str):
        if (module, name) in _METADATA_GLOBALS:
            return super().find_class(module, name)
        found = getattr(importlib.import_module(module), name, None) if module in (_METADATA_MODULE, "torch") else None
        if isinstance(found, torch.dtype) or (isinstance(found, type) and found.__module__ == _METADATA_MODULE):
            return found  # a dtype, or a class DCP's metadata module defines (not one it imports)
        raise pickle.UnpicklingError(f"{module}.{name} is not a type a DCP checkpoint's metadata holds")


class _SafeReader(FileSystemReader):
    """DCP's file reader, with `.metadata` read through the allow-list above."""

    def read_metadata(self, *args, **kwargs) -> Metadata:
        with self.fs.create_stream(self._get_metadata_path(kwargs.get("rank")), "rb") as fh:
            metadata = _MetadataUnpickler(fh).load()
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata


class _SafePlanner(DefaultLoadPlanner):
    """DCP's load planner, with non-tensor items (the optimizer's param groups) read as
    `weights_only` (plain values and tensors, nothing else)."""

    def load_bytes(self, read_item, value: io.BytesIO) -> None:
        obj = torch.load(value, weights_only=True)
        if self.flatten_state_dict:
            set_element(self.original_state_dict, self.mappings[read_item.dest_index.fqn], obj)
        else:
            self.state_dict[read_item.dest_index.fqn] = obj


def export_full(folder: Path, model, main: bool) -> None:
    """A `save_pretrained` folder of the whole model, written by rank 0 (all ranks gather)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if main:
        if getattr(model.config, "tie_word_embeddings", False):  # gathered as two tensors: save the one
            head = model.get_output_embeddings()
            state.pop(next(f"{n}.weight" for n, m in model.named_modules() if m is head), None)
        model.save_pretrained(folder, state_dict=state)
