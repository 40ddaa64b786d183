"""Advantage estimators (docs/concepts/algorithms.md): outcome rewards -> token-level advantages.

Notation for tensor shapes:
    B  rollouts in the batch (prompts × samples per prompt)
    T  padded response length
    mask [B, T]  the loss mask: 1 = token sampled by the policy, 0 = token inserted by the
                 environment (documents block and its tags) or padding.

Every estimator is registered in `ADVANTAGES` under an `AdvantageEstimator` name and has the
same signature:

    fn(rewards [B], group_ids [B], mask [B, T], *, eps=1e-6, kl=None, kl_coef=0.0,
       moments=masked_moments) -> [B, T]

`group_ids` says which prompt each rollout answers (a tensor or any list of hashables, e.g.
question ids). The result is 0 at every masked token. `kl` [B, T] is the per-token k1
estimate logp − ref_logp (`losses.kl_penalty(..., "k1")`); with kl_coef > 0 it acts as a
reward penalty (R1-Searcher's KL option for Llama, kl_coef = 1e-4): Reinforce++ spreads it over
the tokens as a reward-to-go, GRPO and RLOO subtract its sum from the sequence reward.

Group statistics stay within a group, so they need nothing beyond the rows of that group (a
group never spans processes). Batch statistics (Reinforce++'s whitening) come from `moments`,
`losses.masked_moments` of this batch by default; several processes pass one computed globally.

Degenerate inputs give zeros, never NaN: a group whose rewards are all equal (a group of one
included: there is nothing to compare with) has no signal, and a rollout without a policy token
has nothing to train. Group statistics are computed in float64 because a float32 rounding
residue divided by a tiny std would turn "all equal" into a visible advantage.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from enum import Enum

import torch
from torch import Tensor

from searchrl.registry import Registry
from searchrl.rl.losses import Moments, masked_moments, masked_sum, masked_whiten

GroupIds = Tensor | Sequence[Hashable]  # [B]
AdvantageFn = Callable[..., Tensor]


class AdvantageEstimator(str, Enum):
    REINFORCE_PP = "reinforce_pp"
    GRPO = "grpo"
    RLOO = "rloo"


ADVANTAGES: Registry[AdvantageFn] = Registry("advantage estimator")


def compute_advantages(
    estimator: str | AdvantageEstimator,
    rewards: Tensor,  # [B]
    group_ids: GroupIds,  # [B]
    mask: Tensor,  # [B, T]
    **kwargs: object,
) -> Tensor:  # [B, T]
    """Dispatch to the estimator registered under `estimator` (the only entry point trainers use)."""
    name = estimator.value if isinstance(estimator, AdvantageEstimator) else estimator
    return ADVANTAGES.get(name)(rewards, group_ids, mask, **kwargs)


# --- building blocks ---------------------------------------------------------------------


def group_index(group_ids: GroupIds, batch: int) -> Tensor:  # -> [B] long in [0, G)
    """Dense group numbers for `group_ids` (equal ids -> equal numbers)."""
    if len(group_ids) != batch:
        raise ValueError(
            f"group_ids has {len(group_ids)} entries but the batch has {batch} rollouts"
        )
    if isinstance(group_ids, Tensor):
        return torch.unique(group_ids, return_inverse=True)[1]
    numbers: dict[Hashable, int] = {}
    return torch.tensor([numbers.setdefault(g, len(numbers)) for g in group_ids], dtype=torch.long)


def _check(rewards: Tensor, mask: Tensor, kl: Tensor | None) -> None:
    if rewards.dim() != 1 or mask.dim() != 2 or mask.shape[0] != rewards.shape[0]:
        raise ValueError(
            f"need rewards [B] and mask [B, T]; got {tuple(rewards.shape)} and {tuple(mask.shape)}"
        )
    if kl is not None and kl.shape != mask.shape:
        raise ValueError(f"kl must be shaped like mask {tuple(mask.shape)}; got {tuple(kl.shape)}")


def _per_group(values: Tensor, idx: Tensor, reduce: str) -> Tensor:  # [B] -> [B]
    """The group's sum/amax/amin of `values`, repeated for each rollout of the group."""
    groups = int(idx.max()) + 1 if idx.numel() else 0
    start = {"sum": 0.0, "amax": -torch.inf, "amin": torch.inf}[reduce]
    table = torch.full((groups,), start, dtype=values.dtype, device=values.device)
    return table.scatter_reduce(0, idx, values, reduce)[idx]


def _group_centered(rewards: Tensor, idx: Tensor) -> tuple[Tensor, Tensor]:  # [B] -> [B], [B]
    """(r − mean of r over its group, group size per rollout); exactly 0 where a group is flat."""
    size = _per_group(torch.ones_like(rewards), idx, "sum")
    mean = _per_group(rewards, idx, "sum") / size
    flat = _per_group(rewards, idx, "amax") == _per_group(rewards, idx, "amin")
    return torch.where(flat, torch.zeros_like(rewards), rewards - mean), size


def _penalize(token_rewards: Tensor, kl: Tensor | None, mask: Tensor, kl_coef: float) -> Tensor:
    """`token_rewards` [B, T] − kl_coef · kl [B, T] at policy tokens."""
    if kl is None or kl_coef == 0.0:
        return token_rewards
    kl = torch.where(mask.bool(), kl.to(token_rewards.dtype), torch.zeros_like(token_rewards))
    return token_rewards - kl_coef * kl


def _sequence_rewards(rewards: Tensor, mask: Tensor, kl: Tensor | None, kl_coef: float) -> Tensor:
    """r − kl_coef · Σ_t kl_t over policy tokens, in float64 -> [B]."""
    r = rewards.to(torch.float64)
    if kl is None or kl_coef == 0.0:
        return r
    return r - kl_coef * masked_sum(kl.to(torch.float64), mask, dim=-1)


def _out_dtype(rewards: Tensor) -> torch.dtype:
    return rewards.dtype if rewards.is_floating_point() else torch.get_default_dtype()


def _broadcast(per_seq: Tensor, mask: Tensor) -> Tensor:  # [B] -> [B, T], 0 at masked tokens
    zero = torch.zeros((), dtype=per_seq.dtype, device=per_seq.device)
    return torch.where(mask.bool(), per_seq[:, None], zero)


def outcome_at_last_token(rewards: Tensor, mask: Tensor) -> Tensor:  # [B], [B, T] -> [B, T]
    """The sequence reward placed at each rollout's last policy token, 0 everywhere else."""
    positions = torch.arange(mask.shape[1], device=mask.device)  # [T]
    # -1 for a rollout without a policy token, so no position matches and it gets no reward
    last = torch.where(mask.bool(), positions, -1).amax(dim=-1)  # [B]
    at_last = positions[None, :] == last[:, None]  # [B, T]
    zero = torch.zeros((), dtype=rewards.dtype, device=rewards.device)
    return torch.where(at_last, rewards[:, None], zero)


def kl_penalized_token_rewards(
    rewards: Tensor,  # [B] outcome reward per rollout
    logp: Tensor,  # [B, T] policy log-probs of the sampled tokens
    ref_logp: Tensor,  # [B, T] reference-model log-probs of the same tokens
    mask: Tensor,  # [B, T]
    kl_coef: float,
) -> Tensor:  # [B, T]
    """Per-token rewards: −kl_coef·(logp − ref_logp) at every policy token (k1 penalty,
    Ouyang et al. 2022 eq. 2) plus the outcome reward at the last policy token; 0 at masked tokens."""
    outcome = outcome_at_last_token(rewards.to(logp.dtype), mask)
    return _penalize(outcome, logp - ref_logp, mask, kl_coef)


def reward_to_go(token_rewards: Tensor, mask: Tensor) -> Tensor:  # [B, T] -> [B, T]
    """γ = 1 return at each policy token: the sum of the token rewards from it to the end.

    Environment tokens carry no reward of their own but sit between policy tokens; they are
    skipped in the sum and get 0.
    """
    kept = torch.where(mask.bool(), token_rewards, torch.zeros_like(token_rewards))
    to_go = kept.flip(-1).cumsum(-1).flip(-1)
    return torch.where(mask.bool(), to_go, torch.zeros_like(to_go))


# --- estimators ----------------------------------------------------------------------------


@ADVANTAGES.register(AdvantageEstimator.REINFORCE_PP.value)
def compute_reinforce_pp_advantages(
    rewards: Tensor,  # [B]
    group_ids: GroupIds,  # [B]
    mask: Tensor,  # [B, T]
    *,
    eps: float = 1e-6,
    kl: Tensor | None = None,  # [B, T] logp − ref_logp
    kl_coef: float = 0.0,
    moments: Moments = masked_moments,
) -> Tensor:  # [B, T]
    """REINFORCE++ with a group baseline (Hu 2025, arXiv:2501.03262), R1-Searcher's default.

    a = r − mean(r of the same prompt), placed at the last policy token, minus the k1 penalty at
    every policy token, turned into γ = 1 returns, then whitened over the batch with a
    token-weighted mean and std over policy tokens (OpenRLHF's `reinforce_baseline`). Without
    KL every policy token of a rollout gets the same value. Whitening subtracts the token mean,
    so in a batch of rollouts of different lengths a flat group can get a small nonzero value.
    """
    _check(rewards, mask, kl)
    r = rewards.to(torch.float64)
    centered, _ = _group_centered(r, group_index(group_ids, r.shape[0]).to(r.device))
    token_rewards = _penalize(outcome_at_last_token(centered, mask), kl, mask, kl_coef)
    returns = reward_to_go(token_rewards, mask)
    return masked_whiten(returns, mask, eps, moments).to(_out_dtype(rewards))


@ADVANTAGES.register(AdvantageEstimator.GRPO.value)
def compute_grpo_advantages(
    rewards: Tensor,  # [B]
    group_ids: GroupIds,  # [B]
    mask: Tensor,  # [B, T]
    *,
    eps: float = 1e-6,
    kl: Tensor | None = None,  # [B, T] logp − ref_logp
    kl_coef: float = 0.0,
    moments: Moments = masked_moments,  # unused: no batch statistic
) -> Tensor:  # [B, T]
    """GRPO outcome advantage (Shao et al. 2024, arXiv:2402.03300 §4.1.2): (r − mean) / (std + eps).

    std is the unbiased (Bessel, n − 1) group std, as `torch.std` in the DeepSeekMath-derived
    implementations (TRL, verl, OpenRLHF `group_norm`); a group of one gets 0.
    """
    _check(rewards, mask, kl)
    r = _sequence_rewards(rewards, mask, kl, kl_coef)
    idx = group_index(group_ids, r.shape[0]).to(r.device)
    centered, size = _group_centered(r, idx)
    std = (_per_group(centered**2, idx, "sum") / (size - 1).clamp(min=1)).sqrt()
    return _broadcast(centered / (std + eps), mask).to(_out_dtype(rewards))


@ADVANTAGES.register(AdvantageEstimator.RLOO.value)
def compute_rloo_advantages(
    rewards: Tensor,  # [B]
    group_ids: GroupIds,  # [B]
    mask: Tensor,  # [B, T]
    *,
    eps: float = 1e-6,
    kl: Tensor | None = None,  # [B, T] logp − ref_logp
    kl_coef: float = 0.0,
    moments: Moments = masked_moments,  # unused: no batch statistic
) -> Tensor:  # [B, T]
    """REINFORCE leave-one-out (Ahmadian et al. 2024, arXiv:2402.14740): r_i − mean_{j≠i} r_j.

    Equals n/(n − 1)·(r_i − group mean); a group of one has no other sample and gets 0.
    `eps` is unused (no division by a statistic) and kept for the uniform signature.
    """
    _check(rewards, mask, kl)
    r = _sequence_rewards(rewards, mask, kl, kl_coef)
    centered, size = _group_centered(r, group_index(group_ids, r.shape[0]).to(r.device))
    loo = centered * size / (size - 1).clamp(min=1)
    return _broadcast(loo, mask).to(_out_dtype(rewards))
