"""The precision rules a run's trainer and rollouts share (`rollout.precision`): the compute dtype
from `dtype` and `device`, autocast below float32, and the hf backend's float32 decoding on CPU."""

from __future__ import annotations

import torch

from searchrl.rollout.precision import autocast, compute_dtype, rollout_autocast


def _under(context) -> tuple[bool, torch.dtype]:
    """Whether CPU autocast is on inside `context`, and the dtype a CPU matmul gives there."""
    with context:
        return torch.is_autocast_enabled("cpu"), (torch.ones(2, 2) @ torch.ones(2, 2)).dtype


def test_auto_is_float32_on_cpu_and_a_set_dtype_is_kept():
    assert compute_dtype("auto", "cpu") == torch.float32
    assert compute_dtype("bfloat16", "cpu") == torch.bfloat16
    assert compute_dtype("float32", "cpu") == torch.float32


def test_autocast_below_float32_only():
    assert _under(autocast("float32", "cpu")) == (False, torch.float32)
    assert _under(autocast("auto", "cpu")) == (False, torch.float32)
    assert _under(autocast("bfloat16", "cpu")) == (True, torch.bfloat16)


def test_the_hf_backend_decodes_in_float32_on_cpu_whatever_the_training_dtype():
    assert _under(rollout_autocast("hf", "bfloat16", "cpu")) == (False, torch.float32)
    assert _under(rollout_autocast("vllm", "bfloat16", "cpu")) == (True, torch.bfloat16)  # another engine: the training's
