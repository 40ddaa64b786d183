"""Token sampling for the transformers backend: temperature, top-p, greedy, with the log-prob
of the drawn token under the distribution the trainer recomputes."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from searchrl.rollout.backend import SamplingParams


def sample_tokens(
    logits: torch.Tensor,
    params: SamplingParams,
    generator: torch.Generator | None,
    candidates: Sequence[int] = (64, 1024),
) -> tuple[torch.Tensor, torch.Tensor]:
    """Draw one token per row. logits: [B, V] -> (tokens [B] long, logprobs [B] float32).

    The log-prob is `log_softmax(logits / T)` before top-p truncation (module docstring).
    Top-p looks at the 64, then 1024 most likely tokens (`candidates`) and sorts the whole
    vocabulary only for rows whose candidates hold less than `top_p` of the mass: a full sort of
    a 50k vocabulary per step costs more than a small model's forward pass on CPU. Draws use the inverse CDF
    (`torch.multinomial` is several times slower on CPU).
    """
    logits = logits.float()
    if params.greedy:
        tokens = logits.argmax(dim=-1)  # [B]
        return tokens, logits.gather(1, tokens[:, None])[:, 0] - logits.logsumexp(dim=-1)
    scaled = logits / params.temperature  # [B, V]
    log_z = scaled.logsumexp(dim=-1, keepdim=True)  # [B, 1]
    if params.top_p >= 1.0:
        probs = (scaled - log_z).exp()
        tokens = _inverse_cdf(probs, probs.shape[1], generator)
        return tokens, scaled.gather(1, tokens[:, None])[:, 0] - log_z[:, 0]
    tokens = torch.empty(scaled.shape[0], dtype=torch.long, device=scaled.device)
    logps = torch.empty(scaled.shape[0], dtype=torch.float32, device=scaled.device)
    rows = torch.arange(scaled.shape[0], device=scaled.device)
    sizes = [c for c in candidates if c < scaled.shape[1]] + [scaled.shape[1]]
    for size in sizes:
        sub, sub_z = scaled[rows], log_z[rows]
        if size < scaled.shape[1]:
            top, order = sub.topk(size, dim=-1)  # [b, size], descending
        else:
            top, order = sub.sort(dim=-1, descending=True)
        probs = (top - sub_z).exp()
        done = probs.sum(dim=-1) >= params.top_p if size < scaled.shape[1] else torch.ones_like(rows, dtype=torch.bool)
        if bool(done.any()):
            top, order, probs, sub_z = top[done], order[done], probs[done], sub_z[done]
            # Keep a token while the mass strictly before it is below top_p (the first always stays).
            keep = (probs.cumsum(dim=-1) - probs) < params.top_p
            choice = _inverse_cdf(probs * keep, keep.sum(dim=-1), generator)[:, None]  # index into `order`
            tokens[rows[done]] = order.gather(1, choice)[:, 0]
            logps[rows[done]] = top.gather(1, choice)[:, 0] - sub_z[:, 0]
        rows = rows[~done]
        if len(rows) == 0:
            break
    return tokens, logps


def _inverse_cdf(weights: torch.Tensor, n_valid, generator) -> torch.Tensor:
    """One index per row of weights [B, C] (non-negative, zeros after the first n_valid)."""
    cdf = weights.cumsum(dim=-1)  # [B, C]
    u = torch.rand((weights.shape[0], 1), generator=generator, device=weights.device) * cdf[:, -1:]
    # right=True: the first index whose cumulative weight exceeds u, so zero-weight slots are
    # never chosen; the clamp covers u rounding up to the total.
    idx = torch.searchsorted(cdf, u, right=True)[:, 0]
    limit = n_valid - 1 if isinstance(n_valid, int) else (n_valid - 1).to(idx.dtype)
    return torch.minimum(idx, torch.as_tensor(limit, device=idx.device))
