"""What differs between transformers versions, each in one small function, so a rename upstream is
fixed here once. Checked on 5.19 (our floor) and 5.24; every note names the versions that differ.

transformers is imported inside the functions: importing this module stays cheap.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping

import torch


def _forward_params(model) -> Mapping[str, inspect.Parameter]:
    # A peft wrapper's forward takes **kwargs and passes them on: probe the model inside it.
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return inspect.signature(base.forward).parameters


def cache_kwarg(model) -> str:
    """The name of the forward argument that takes a KV cache."""
    # transformers 5.24 renamed `past_key_values` to `cache` (the old name is deprecated).
    return "cache" if "cache" in _forward_params(model) else "past_key_values"


def output_cache(output):
    """The KV cache a forward pass returned."""
    # transformers 5.24 returns it as `cache`, earlier versions as `past_key_values`.
    return output["cache"] if "cache" in output else output["past_key_values"]


def takes_logits_to_keep(model) -> bool:
    """Whether forward takes `logits_to_keep` (logits of the last positions only). Where it does
    not, the keyword must not be passed: **kwargs would swallow it and every logit be computed."""
    # Some causal LMs still lack it in 5.19 and 5.24 (xLSTM, MusicGen, the Gemma-4 assistants).
    return "logits_to_keep" in _forward_params(model)


def cache_tensors(cache) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(keys, values) per layer of a cache, each [B, heads, L, head_dim]."""
    # `cache.layers` in 5.19 to 5.24.
    return [(layer.keys, layer.values) for layer in cache.layers]


def dynamic_cache(kv: list[tuple[torch.Tensor, torch.Tensor]]):
    """A `DynamicCache` holding `kv` (per layer, each [B, heads, L, head_dim])."""
    from transformers import DynamicCache

    # `ddp_cache_data` fills the layers in 5.19 to 5.24 (there is no `from_legacy_cache`).
    return DynamicCache(ddp_cache_data=kv)


def enable_checkpointing(model, **kwargs) -> None:
    """Turn on activation (gradient) checkpointing; `kwargs` go to `torch.utils.checkpoint`."""
    # transformers 5.23 renamed `gradient_checkpointing_enable` to `activation_checkpointing_enable`.
    if hasattr(model, "activation_checkpointing_enable"):
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)


def checkpointing_layers(model) -> list[torch.nn.Module]:
    """The layers whose own `training` flag switches checkpointing on (decoder layers)."""
    # Decoder layers derive from `GradientCheckpointingLayer` in 5.19 to 5.24 (its import path too).
    from transformers.modeling_layers import GradientCheckpointingLayer

    return [m for m in model.modules() if isinstance(m, GradientCheckpointingLayer)]


# transformers' own bars over a model already on disk: noise in every command's output (a model
# download keeps huggingface_hub's bar, which is not one of these).
QUIET_BARS = ("Loading weights", "Writing model shards", "Loading checkpoint shards")


def quiet_weight_bars() -> None:
    """Silence transformers' "Loading weights" and "Writing model shards" bars (5.x, through its
    tqdm hook; versions without the hook show them)."""
    from transformers.utils import logging as hf_logging

    set_hook = getattr(hf_logging, "set_tqdm_hook", None)
    empty = getattr(hf_logging, "EmptyTqdm", None)
    if set_hook is None or empty is None or getattr(hf_logging, "_searchrl_quiet", False):
        return

    def hook(factory, args, kwargs):
        return empty(*args, **kwargs) if kwargs.get("desc") in QUIET_BARS else factory(*args, **kwargs)

    set_hook(hook)
    hf_logging._searchrl_quiet = True
