"""The dtype a run computes in and the autocast around its forward passes, from its `dtype` and
`device` settings: the trainer's update (`rl.policy.autocast`) and the rollouts' decoding
(`rollout_autocast`) read the same rule."""

from __future__ import annotations

import contextlib

import torch


def compute_dtype(dtype: str, device: str) -> torch.dtype:
    """The dtype forward passes run in: `dtype` (float32, bfloat16), or for auto float32 on CPU and
    bfloat16 on a GPU that has it."""
    from searchrl.assets import _resolve_dtype

    return _resolve_dtype(None if dtype == "auto" else dtype, device)


def autocast(dtype: str, device: str):
    """Mixed precision around forward passes when the compute dtype is below float32."""
    low = compute_dtype(dtype, device)
    if low == torch.float32:
        return contextlib.nullcontext()
    return torch.autocast(device_type=torch.device(device).type, dtype=low)


def rollout_autocast(backend: str, dtype: str, device: str):
    """The precision of the hf backend's decoding: the training's (`autocast`), except on CPU,
    where it decodes in float32 whatever the training dtype: bf16 autocast there slowed decoding
    ~2x (small batches, every matmul cast; docs/results.md, "Tool calls")."""
    if backend == "hf" and torch.device(device).type == "cpu":
        return contextlib.nullcontext()
    return autocast(dtype, device)
