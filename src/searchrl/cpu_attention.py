"""Grouped-query attention on CPU without copying keys and values per query head.

transformers' `sdpa` attention passes `enable_gqa` to `scaled_dot_product_attention` only when
there is no attention mask (CUDA's fused kernels need none); otherwise it first repeats every
key/value head for each query head it serves (`repeat_kv`, a copy) and the CPU kernel then takes
a slow path. Our rollouts always carry a mask (left padding, holes between search rounds), so on
CPU every decode step copied the whole KV cache in every layer: measured on SmolLM2-135M (9 query
heads, 3 KV heads), 16 rows × 1,000 cached tokens, one layer's attention took 23 ms that way and
0.8 ms with `enable_gqa` and the mask, the same values (docs/results.md, "Tool calls").

`use_gqa_attention(model)` switches a loaded model on CPU to `sdpa-gqa`: the same attention and
the same masks, the key/value heads shared rather than copied. Models without grouped heads and
models on GPU keep what transformers chose.
"""

from __future__ import annotations

import torch

NAME = "sdpa-gqa"


def sdpa_gqa_attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None, is_causal=None, **kwargs):
    """`AttentionInterface` function: query [b, H, q, D], key/value [b, KV, k, D], H a multiple of
    KV; attention_mask a boolean or additive [b, 1, q, k] mask or None -> ([b, q, H, D], None)."""
    causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    causal = bool(query.shape[2] > 1 and attention_mask is None and causal)  # a mask already holds causality
    out = torch.nn.functional.scaled_dot_product_attention(
        query, key, value, attn_mask=attention_mask, dropout_p=dropout, scale=scaling, is_causal=causal,
        enable_gqa=key.shape[1] != query.shape[1],
    )
    return out.transpose(1, 2).contiguous(), None


def _register() -> None:
    from transformers import AttentionInterface, AttentionMaskInterface
    from transformers.masking_utils import sdpa_mask

    AttentionInterface.register(NAME, sdpa_gqa_attention)
    AttentionMaskInterface.register(NAME, sdpa_mask)  # the masks sdpa gets


def use_gqa_attention(model) -> bool:
    """Switch `model` (on CPU, sdpa attention, fewer KV heads than query heads) to `sdpa-gqa`;
    True when it did."""
    config = model.config
    heads, kv_heads = getattr(config, "num_attention_heads", None), getattr(config, "num_key_value_heads", None)
    on_cpu = next(model.parameters()).device.type == "cpu"
    if not (on_cpu and heads and kv_heads and kv_heads < heads and config._attn_implementation == "sdpa"):
        return False
    _register()
    model.set_attn_implementation(NAME)
    return config._attn_implementation == NAME
