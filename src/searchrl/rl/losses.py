"""Losses of the policy update (docs/concepts/algorithms.md): PPO clipped surrogate, off-policy
correction to the behaviour policy, KL to the reference, entropy; the masked NLL of the SFT
baseline (docs/guides/sft.md).

Notation for tensor shapes:
    B  rollouts in the batch (prompts × samples per prompt)
    T  padded response length
    V  vocabulary size
    mask [B, T]  the loss mask: 1 = token sampled by the policy, 0 = token inserted by the
                 environment (documents block and its tags) or padding.

R1-Searcher (Song et al. 2025, arXiv:2503.05592) trains with the PPO clipped ratio loss
(Schulman et al. 2017, arXiv:1707.06347) and averages token losses over policy tokens only:
the loss mask applies wherever a token sum appears (policy loss, KL, entropy, whitening).

Every function is pure. Masked positions are removed with `torch.where`, never by multiplying
by the mask: padding may hold -inf log-probs, and `0 * inf` is NaN in the value and the gradient.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from searchrl.registry import Registry

# --- masked reductions -------------------------------------------------------------------


def _keep(x: Tensor, mask: Tensor) -> Tensor:  # [B, T] -> [B, T]
    """`x` at policy tokens, exactly 0 elsewhere (also 0 gradient, even where x is inf/NaN)."""
    return torch.where(mask.bool(), x, torch.zeros((), dtype=x.dtype, device=x.device))


def masked_sum(x: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """Sum of `x` [B, T] over positions where `mask` [B, T] is 1 (all of them, or along `dim`)."""
    kept = _keep(x, mask)
    return kept.sum() if dim is None else kept.sum(dim)


def masked_mean(x: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """Mean of `x` [B, T] over mask == 1; an empty mask (or an empty row along `dim`) gives 0."""
    count = mask.bool().sum() if dim is None else mask.bool().sum(dim)
    return masked_sum(x, mask, dim) / count.clamp(min=1).to(x.dtype)


def masked_moments(x: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:  # [B, T] -> (), ()
    """(mean, biased variance) of `x` over mask == 1, every policy token counted once.

    The default statistics of `masked_whiten`; a multi-process trainer passes a function of the
    same signature that all-reduces the sums and counts, so every process whitens alike.
    """
    mean = masked_mean(x, mask)
    return mean, masked_mean((x - mean) ** 2, mask)


Moments = Callable[[Tensor, Tensor], tuple[Tensor, Tensor]]  # (x [B, T], mask [B, T]) -> (mean, var)


def masked_whiten(x: Tensor, mask: Tensor, eps: float = 1e-6, moments: Moments = masked_moments) -> Tensor:  # [B, T] -> [B, T]
    """(x − mean) / (std + eps) with the token-weighted mean and biased std of `moments`.

    As OpenRLHF whitens Reinforce++ advantages: every policy token counts once, so a long
    rollout weighs more than a short one. Masked positions come out 0; an empty mask gives
    all zeros; a constant `x` gives zeros (std = 0, the eps keeps it finite).
    """
    mean, var = moments(x, mask)
    return _keep((x - mean) / (var.sqrt() + eps), mask)


# --- aggregation of token losses ---------------------------------------------------------

# Every aggregation divides by an explicit count of its units (policy tokens, or rollouts with a
# policy token): a micro-batch passes its mini-batch's count, several processes the global count,
# so the gradients summed over micro-batches and processes are those of the whole mini-batch.
Aggregation = Callable[[Tensor, Tensor, "float | None"], Tensor]  # (loss [B, T], mask [B, T], units) -> scalar
LOSS_AGGREGATIONS: Registry[Aggregation] = Registry("loss aggregation")


@LOSS_AGGREGATIONS.register("token-mean")
def token_mean(loss: Tensor, mask: Tensor, units: float | None = None) -> Tensor:
    """Sum over policy tokens / `units` (default: this batch's policy tokens): the mean over all
    policy tokens of the mini-batch (R1-Searcher/OpenRLHF; DAPO's choice too)."""
    if units is None:
        return masked_mean(loss, mask)
    return masked_sum(loss, mask) / units


@LOSS_AGGREGATIONS.register("seq-mean-token-mean")
def seq_mean_token_mean(loss: Tensor, mask: Tensor, units: float | None = None) -> Tensor:
    """Sum over rollouts of each rollout's mean over its policy tokens / `units` (default: this
    batch's rollouts with a policy token): the GRPO paper's form.

    Rollouts without a policy token are left out of the outer mean instead of counting as 0.
    """
    per_seq = masked_mean(loss, mask, dim=-1)  # [B]
    has_tokens = mask.bool().any(dim=-1)  # [B]
    if units is None:
        return masked_mean(per_seq, has_tokens)
    return masked_sum(per_seq, has_tokens) / units


def loss_units(mask: Tensor, agg: str) -> int:
    """What aggregation `agg` averages over in `mask` [B, T]: policy tokens (token-mean) or
    rollouts with at least one (seq-mean-token-mean)."""
    return int(mask.sum()) if agg == "token-mean" else int(mask.bool().any(dim=-1).sum())


# --- policy loss ---------------------------------------------------------------------------


@dataclass(frozen=True)
class PolicyLossStats:
    """Means over the policy tokens of one `policy_loss` call (nothing here has a gradient)."""

    clip_frac: float  # share of tokens whose clipped branch won (they get no gradient)
    approx_kl: float  # k3 estimate of KL(old ‖ new)
    ratio_mean: float


def policy_loss(
    logp: Tensor,  # [B, T] log-probs of the sampled tokens under the policy being trained
    old_logp: Tensor,  # [B, T] the same under the policy that sampled them
    advantages: Tensor,  # [B, T]
    mask: Tensor,  # [B, T]
    clip_eps: float = 0.2,
    clip_eps_high: float | None = None,
    agg: str = "token-mean",
    units: float | None = None,
    is_weight: Tensor | None = None,  # [B, T] detached off-policy weight (`OFF_POLICY_CORRECTIONS`)
) -> tuple[Tensor, PolicyLossStats]:
    """PPO clipped surrogate (Schulman et al. 2017, eq. 7) as a loss to minimise.

    ratio = exp(logp − old_logp); pg_loss1 = −A·ratio; pg_loss2 = −A·clip(ratio, 1 − ε, 1 + ε_high);
    the token loss is max(pg_loss1, pg_loss2), aggregated over policy tokens by `agg` (a name in
    `LOSS_AGGREGATIONS`) with `units` as its denominator (default: this batch's). `clip_eps_high` (DAPO's clip-higher, arXiv:2503.14476) defaults to
    `clip_eps`. R1-Searcher uses ε = 0.2.

    `is_weight` [B, T], when given, multiplies each token's clipped loss: the off-policy
    correction to the behaviour policy (`OFF_POLICY_CORRECTIONS`). It must carry no gradient;
    the clip still bounds the move from `old_logp`, so the update stays in the trust region.

    Returns the scalar loss and detached means over this batch's policy tokens:
    `clip_frac` (share of tokens whose clipped branch won, so they get no gradient),
    `approx_kl` (k3 estimate of KL(old ‖ new): (ratio − 1) − log ratio, as in CleanRL),
    `ratio_mean`.
    """
    aggregate = LOSS_AGGREGATIONS.get(agg)
    high = clip_eps if clip_eps_high is None else clip_eps_high
    # Zero the log-ratio before exp: exp of a masked padding difference could overflow and
    # turn the (otherwise zero) gradient into NaN.
    log_ratio = _keep(logp - old_logp, mask)  # [B, T]
    ratio = torch.exp(log_ratio)  # [B, T]
    pg_loss1 = -advantages * ratio
    pg_loss2 = -advantages * torch.clamp(ratio, 1.0 - clip_eps, 1.0 + high)
    pg_loss = torch.maximum(pg_loss1, pg_loss2)  # [B, T]
    if is_weight is not None:
        pg_loss = pg_loss * is_weight
    loss = aggregate(pg_loss, mask, units)
    with torch.no_grad():
        stats = PolicyLossStats(
            clip_frac=float(masked_mean((pg_loss2 > pg_loss1).to(logp.dtype), mask)),
            approx_kl=float(masked_mean((ratio - 1.0) - log_ratio, mask)),
            ratio_mean=float(masked_mean(ratio, mask)),
        )
    return loss, stats


# --- off-policy correction to the behaviour policy ------------------------------------------
# Three policies meet in an update: the BEHAVIOUR policy μ that sampled the tokens (its log-probs
# recorded by the generation backend, post-temperature, over the full vocabulary), the PROXIMAL
# policy π_prox = the trained policy at the start of the update (`old_logp`, recomputed by the
# trainer), and π_θ being trained. Even in sync mode μ ≠ π_prox: the sampler is another code path
# or engine (vLLM kernels, bf16, a KV cache); in async mode μ is also some policy versions old.
# PPO's ratio π_θ / π_prox keeps the update in a trust region around π_prox; the correction below
# is the detached weight w ≈ π_prox / μ that turns samples of μ into samples of π_prox.

OffPolicyWeight = Callable[[Tensor, Tensor, Tensor, float], "Tensor | None"]
# (old_logp [B, T], behaviour_logp [B, T], mask [B, T], cap) -> weight [B, T] (or None: no weight)
OFF_POLICY_CORRECTIONS: Registry[OffPolicyWeight] = Registry("off-policy correction")


def behaviour_log_ratio(old_logp: Tensor, behaviour_logp: Tensor, mask: Tensor) -> Tensor:  # [B, T] -> [B, T]
    """log(π_prox / μ) = old_logp − behaviour_logp at policy tokens, exactly 0 elsewhere."""
    return _keep(old_logp - behaviour_logp, mask)


@OFF_POLICY_CORRECTIONS.register("none")
def no_correction(old_logp: Tensor, behaviour_logp: Tensor, mask: Tensor, cap: float) -> None:
    """No weight: the plain clipped loss, which treats the behaviour policy as π_prox (R1-Searcher)."""


@OFF_POLICY_CORRECTIONS.register("tis")
@torch.no_grad()
def truncated_is_weight(old_logp: Tensor, behaviour_logp: Tensor, mask: Tensor, cap: float) -> Tensor:  # -> [B, T]
    """Truncated importance sampling: w = min(π_prox / μ, cap) per token, 0 at masked tokens.

    Yao et al. 2025, "Your efficient RL framework secretly brings you off-policy RL training"
    (the sampler/trainer mismatch; verl's and OpenRLHF's TIS), after the truncated IS of
    Ionides 2008 and IMPALA's V-trace (Espeholt et al. 2018, arXiv:1802.01561). Truncation bounds
    the variance a rare token with a tiny μ would add, at the cost of a small bias toward μ.
    Computed in log space (min(log w, log cap)), so no ratio overflows.
    """
    log_w = torch.clamp(behaviour_log_ratio(old_logp, behaviour_logp, mask), max=math.log(cap))
    return _keep(torch.exp(log_w), mask)


@OFF_POLICY_CORRECTIONS.register("decoupled")
@torch.no_grad()
def decoupled_is_weight(old_logp: Tensor, behaviour_logp: Tensor, mask: Tensor, cap: float) -> Tensor:  # -> [B, T]
    """The weight of the decoupled clipped objective: w = π_prox / μ where it is at most `cap`,
    0 where it is above (the token leaves the update), 0 at masked tokens.

    Decoupled PPO (Hilton, Cobbe & Schulman 2022, "Batch size-invariance for policy optimization",
    arXiv:2110.00641) separates the behaviour policy from the proximal one the clip is taken
    against; AReaL's asynchronous trainer (Fu et al. 2025, arXiv:2505.24298; ASearcher trains search
    agents on it) takes π_prox = the policy at the start of the update and drops tokens over its
    weight cap (`behav_imp_weight_cap`) rather than truncating them as `truncated_is_weight` does
    (masked IS): a token the sampler found far less likely than π_prox does now is treated as
    unreliable, not down-weighted. Dropped tokens stay in the loss's denominator, as in AReaL.
    """
    log_w = behaviour_log_ratio(old_logp, behaviour_logp, mask)
    kept = mask.bool() & (log_w <= math.log(cap))
    return _keep(torch.exp(torch.clamp(log_w, max=math.log(cap))), kept)


def off_policy_weight(kind: str, old_logp: Tensor, behaviour_logp: Tensor, mask: Tensor, cap: float = 2.0) -> Tensor | None:
    """The `OFF_POLICY_CORRECTIONS` weight `kind` ("none", "tis", "decoupled") -> [B, T] or None.

    All inputs [B, T]; `old_logp` of the proximal policy, `behaviour_logp` of the sampler;
    `cap` ≥ 1 bounds the weight (default 2, as Yao et al. 2025)."""
    return OFF_POLICY_CORRECTIONS.get(kind)(old_logp, behaviour_logp, mask, cap)


# --- supervised fine-tuning ---------------------------------------------------------------


def sft_loss(
    logp: Tensor,  # [B, T] log-probs of the written tokens under the policy being trained
    mask: Tensor,  # [B, T]
    agg: str = "token-mean",
    units: float | None = None,
) -> Tensor:
    """Negative log-likelihood of the policy tokens (scalar): −logp aggregated over mask == 1 by
    `agg` with `units` as its denominator, as in `policy_loss`.

    The SFT baseline (R1-Searcher Table 4) trains on correct search trajectories with the loss
    mask of RL: the inserted documents are read, never learned. On policy tokens its gradient
    equals the clipped loss's with advantage 1 and unchanged weights.
    """
    return LOSS_AGGREGATIONS.get(agg)(-logp, mask, units)


# --- KL to the reference model -------------------------------------------------------------
# Schulman, "Approximating KL divergence" (2020): with samples from the policy and
# d = logp − ref_logp, k1 = d (unbiased, can be negative), k2 = d²/2 (biased, low variance),
# k3 = exp(−d) + d − 1 (unbiased for KL(π ‖ ref), never negative).

KLEstimator = Callable[[Tensor], Tensor]  # log-ratio d = logp − ref_logp [B, T] -> [B, T]
KL_ESTIMATORS: Registry[KLEstimator] = Registry("KL estimator")


@KL_ESTIMATORS.register("k1")
def _k1(d: Tensor) -> Tensor:
    return d


@KL_ESTIMATORS.register("k2")
def _k2(d: Tensor) -> Tensor:
    return 0.5 * d**2


@KL_ESTIMATORS.register("k3")
def _k3(d: Tensor) -> Tensor:
    # expm1 keeps precision when the policy is still close to the reference (d ≈ 0).
    return torch.expm1(-d) + d


def kl_penalty(logp: Tensor, ref_logp: Tensor, kind: str = "k1") -> Tensor:  # [B, T] -> [B, T]
    """Per-token KL estimate between the policy (`logp` [B, T]) and the reference (`ref_logp`).

    `kind` is "k1" (logp − ref), "k2" ((logp − ref)²/2) or "k3" (exp(ref − logp) − (ref − logp) − 1,
    never negative). R1-Searcher uses k1 as a reward penalty (`advantages.kl_penalized_token_rewards`)
    or k3 as a loss term (`kl_loss`).
    """
    return KL_ESTIMATORS.get(kind)(logp - ref_logp)


def kl_loss(
    logp: Tensor,  # [B, T]
    ref_logp: Tensor,  # [B, T]
    mask: Tensor,  # [B, T]
    kind: str = "k3",
    agg: str = "token-mean",
    units: float | None = None,
) -> Tensor:
    """KL to the reference as a loss term: `kl_penalty` aggregated over policy tokens (scalar),
    `units` as in `policy_loss`.

    The loss is added as `kl_coef · kl_loss` (GRPO, arXiv:2402.03300 eq. 3, uses k3).
    """
    kl = kl_penalty(_keep(logp, mask), _keep(ref_logp, mask), kind)  # 0 at masked tokens
    return LOSS_AGGREGATIONS.get(agg)(kl, mask, units)


# --- entropy and log-probs from logits -----------------------------------------------------


def _chunks(length: int, chunk_size: int | None) -> list[slice]:
    step = max(chunk_size or length, 1)
    return [slice(i, i + step) for i in range(0, length, step)] or [slice(0, 0)]


def _upcast(z: Tensor) -> Tensor:
    # A bf16/fp16 logsumexp over a large vocabulary loses about two digits.
    return z.float() if z.dtype in (torch.float16, torch.bfloat16) else z


def entropy_from_logits(logits: Tensor, chunk_size: int | None = None) -> Tensor:
    """Entropy of softmax(`logits` [B, T, V]) at each position -> [B, T], in float32 or wider.

    H = logsumexp(z) − Σ softmax(z)·z, which never takes the log of a 0 probability.
    `chunk_size` bounds the [B, chunk, V] temporaries by working over T in slices.
    """
    out = []
    for sl in _chunks(logits.shape[1], chunk_size):
        z = _upcast(logits[:, sl])
        out.append(torch.logsumexp(z, dim=-1) - (torch.softmax(z, dim=-1) * z).sum(-1))
    return torch.cat(out, dim=1)


def masked_entropy(logits: Tensor, mask: Tensor, chunk_size: int | None = None) -> Tensor:
    """Mean entropy over policy tokens (scalar); `logits` [B, T, V], `mask` [B, T]."""
    return masked_mean(entropy_from_logits(logits, chunk_size), mask)


def token_logprobs(logits: Tensor, labels: Tensor, chunk_size: int | None = None) -> Tensor:
    """log softmax(`logits` [B, T, V])[labels] -> [B, T], in float32 or wider.

    `labels` [B, T] must already be aligned with `logits` (for a causal LM: logits[:, :-1]
    against ids[:, 1:]). Gathers one logit and subtracts logsumexp instead of materialising
    the full [B, T, V] log_softmax; bf16/fp16 logits are upcast to float32 per chunk.
    """
    out = []
    for sl in _chunks(logits.shape[1], chunk_size):
        z = _upcast(logits[:, sl])
        picked = z.gather(-1, labels[:, sl].unsqueeze(-1)).squeeze(-1)
        out.append(picked - torch.logsumexp(z, dim=-1))
    return torch.cat(out, dim=1)
