"""FSDP2 for the policy and the reference (`torch.distributed.fsdp.fully_shard`), and what a sharded
model needs around it: `torch.distributed.checkpoint` (DCP) save and load, and a plain Hugging
Face export. (A rollout engine gets its whole weights from `searchrl.rollout.weights`.)

Each decoder layer is one FSDP unit and the root (embeddings, final norm, head — tied or not) is
another, as torchtitan shards a decoder: a layer's weights exist whole only during its own
forward and backward.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard

from searchrl.compat import checkpointing_layers


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
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import (
        get_model_state_dict,
        get_optimizer_state_dict,
    )

    dcp.save({"model": get_model_state_dict(model), "optimizer": get_optimizer_state_dict(model, optimizer)}, checkpoint_id=str(folder))


def load_sharded_model(folder: Path, model) -> None:
    """The weights of a `save_sharded` folder, into the (already sharded) model."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, set_model_state_dict

    state = {"model": get_model_state_dict(model)}
    dcp.load(state, checkpoint_id=str(folder))
    set_model_state_dict(model, state["model"])


def load_sharded_optimizer(folder: Path, model, optimizer) -> None:
    """The optimizer state of a `save_sharded` folder, into a fresh optimizer of `model`."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import (
        get_optimizer_state_dict,
        set_optimizer_state_dict,
    )

    state = {"optimizer": get_optimizer_state_dict(model, optimizer)}
    dcp.load(state, checkpoint_id=str(folder))
    set_optimizer_state_dict(model, optimizer, state["optimizer"])


def export_full(folder: Path, model, main: bool) -> None:
    """A `save_pretrained` folder of the whole model, written by rank 0 (all ranks gather)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if main:
        if getattr(model.config, "tie_word_embeddings", False):  # gathered as two tensors: save the one
            head = model.get_output_embeddings()
            state.pop(next(f"{n}.weight" for n, m in model.named_modules() if m is head), None)
        model.save_pretrained(folder, state_dict=state)
