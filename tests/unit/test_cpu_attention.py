"""sdpa-gqa: the same attention as transformers' sdpa (padded prompts, cached decoding), without
copying key/value heads; only CPU models with grouped heads are switched."""

from __future__ import annotations

import warnings

import pytest
import torch

from searchrl.assets import load_model
from searchrl.cpu_attention import NAME, use_gqa_attention
from searchrl.errors import DataWarning
from searchrl.rl import preflight
from searchrl.rl.config import TrainConfig


@pytest.fixture(scope="module")
def model():
    return load_model("tiny-random")[0]


def _logits(model, impl, ids, mask):
    model.set_attn_implementation(impl)
    with torch.no_grad():
        full = model(input_ids=ids, attention_mask=mask).logits  # [2, L, V]
        # The last 3 tokens decoded one at a time against the cache of the rest.
        out = model(input_ids=ids[:, :-3], attention_mask=mask[:, :-3], use_cache=True)
        cache, steps = out.past_key_values, []
        for j in range(3, 0, -1):
            col = ids.shape[1] - j
            out = model(input_ids=ids[:, col : col + 1], attention_mask=mask[:, : col + 1], past_key_values=cache, use_cache=True)
            cache = out.past_key_values
            steps.append(out.logits[:, -1])
    return full, torch.stack(steps, dim=1)  # [2, 3, V]


def test_same_values_as_sdpa_with_padding_and_cache(model):
    assert model.config._attn_implementation == NAME  # load_model switched the CPU model with 4 heads over 2
    torch.manual_seed(0)
    ids = torch.randint(0, 1000, (2, 12))
    mask = torch.ones_like(ids)
    mask[0, :4] = 0  # left padding in row 0
    ours_full, ours_steps = _logits(model, NAME, ids, mask)
    ref_full, ref_steps = _logits(model, "sdpa", ids, mask)
    model.set_attn_implementation(NAME)
    real = mask.bool()
    assert torch.allclose(ours_full[real], ref_full[real], atol=1e-5)
    assert torch.allclose(ours_steps, ref_steps, atol=1e-5)
    assert torch.allclose(ours_steps, ours_full[:, -3:], atol=1e-5)  # decoding = the full pass


def test_only_cpu_models_with_grouped_heads(model):
    assert not use_gqa_attention(model)  # already switched
    model.set_attn_implementation("eager")
    assert not use_gqa_attention(model) and model.config._attn_implementation == "eager"
    model.set_attn_implementation("sdpa")
    heads = model.config.num_key_value_heads
    model.config.num_key_value_heads = model.config.num_attention_heads  # as a model without grouping reports
    try:
        assert not use_gqa_attention(model)
    finally:
        model.config.num_key_value_heads = heads
    assert use_gqa_attention(model) and model.config._attn_implementation == NAME


def test_bf16_on_a_cpu_without_bf16_instructions_is_warned(monkeypatch):
    cfg = TrainConfig.model_validate({"model": "tiny-random", "dtype": "bfloat16"})
    monkeypatch.setattr(preflight, "cpu_has_bf16", lambda: False)
    with pytest.warns(DataWarning, match="set dtype=float32"):
        preflight.warn_slow_dtype(cfg)
    monkeypatch.setattr(preflight, "cpu_has_bf16", lambda: True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        preflight.warn_slow_dtype(cfg)
        preflight.warn_slow_dtype(TrainConfig.model_validate({"model": "tiny-random"}))
