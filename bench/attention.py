"""CPU attention: one decode step of SmolLM2-135M (9 query heads over 3 key/value heads) against a
cache of `--context` tokens for `--rows` rows with left padding (a mask, as every rollout has),
with transformers' `sdpa` (the baseline: key/value heads copied per query head) and our
`sdpa-gqa` (src/searchrl/cpu_attention.py), measured in the same run. Then the max difference of
their logits. Last line: `name=value` pairs, ratio first.

    python bench/attention.py [--rows 16] [--context 1000] [--steps 20]
"""

from __future__ import annotations

import argparse
import time

import torch

from searchrl.assets import load_model
from searchrl.cpu_attention import NAME


def decode_seconds(model, impl: str, ids, mask, steps: int):
    """Seconds per decode step, best of 3 rounds of `steps` steps; the last step's logits."""
    model.set_attn_implementation(impl)
    with torch.no_grad():
        cache = model(input_ids=ids, attention_mask=mask, use_cache=True).past_key_values
        token = ids[:, -1:]
        best, logits = float("inf"), None
        for _ in range(3):
            start = time.perf_counter()
            for _ in range(steps):
                step_mask = torch.cat([mask, torch.ones_like(token)], dim=1)
                logits = model(input_ids=token, attention_mask=step_mask, past_key_values=cache, use_cache=True).logits
                cache.crop(-1)  # every step decodes at the same context length
            best = min(best, (time.perf_counter() - start) / steps)
    return best, logits


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=16)
    ap.add_argument("--context", type=int, default=1000)
    ap.add_argument("--steps", type=int, default=20)
    args = ap.parse_args()
    model, _ = load_model("smollm2-135m")
    torch.manual_seed(0)
    ids = torch.randint(0, 40000, (args.rows, args.context))
    mask = torch.ones_like(ids)
    mask[:, : args.context // 10] = 0  # left padding in every row
    base, base_logits = decode_seconds(model, "sdpa", ids, mask, args.steps)
    ours, ours_logits = decode_seconds(model, NAME, ids, mask, args.steps)
    diff = float((base_logits - ours_logits).abs().max())
    print(f"decode step, {args.rows} rows x {args.context} cached tokens: sdpa {base * 1e3:.1f} ms, {NAME} {ours * 1e3:.1f} ms")
    print(f"speedup={base / ours:.2f} sdpa_ms={base * 1e3:.1f} gqa_ms={ours * 1e3:.1f} max_logit_diff={diff:.2e}")


if __name__ == "__main__":
    main()
