"""Advantage estimators: hand-computed batches, degenerate groups, the k1 reward penalty, and a
property test (finite everywhere, 0 at masked tokens) over random batches.

Shapes: B rollouts, T response tokens; mask [B, T] is 1 at policy tokens.
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from searchrl.errors import SearchRLError
from searchrl.rl.advantages import (
    ADVANTAGES,
    AdvantageEstimator,
    compute_advantages,
    compute_grpo_advantages,
    compute_reinforce_pp_advantages,
    compute_rloo_advantages,
    group_index,
    kl_penalized_token_rewards,
    outcome_at_last_token,
    reward_to_go,
)

ESTIMATORS = [e.value for e in AdvantageEstimator]
R3 = math.sqrt(3.0)


def close(actual: torch.Tensor, expected: list, atol: float = 1e-5) -> None:
    torch.testing.assert_close(
        actual, torch.tensor(expected, dtype=actual.dtype), atol=atol, rtol=0
    )


def test_registry_holds_every_enum_name_and_rejects_duplicates():
    assert ADVANTAGES.names() == sorted(ESTIMATORS)
    with pytest.raises(ValueError, match="registered twice"):
        ADVANTAGES.register("grpo")(compute_grpo_advantages)
    with pytest.raises(SearchRLError, match="choose one of: grpo, reinforce_pp, rloo"):
        compute_advantages("ppo", torch.zeros(1), [0], torch.ones(1, 1))


def test_reinforce_pp_two_groups_by_hand():
    rewards = torch.tensor([2.0, 0.0, 1.0, 1.0])  # [B=4]
    groups = [0, 0, 1, 1]
    mask = torch.tensor([[1, 1, 0], [1, 1, 0], [1, 0, 0], [1, 1, 1]])  # [4, 3]
    # group means: g0 = (2+0)/2 = 1, g1 = 1 -> centered r = [1, -1, 0, 0]
    # token level (8 policy tokens): 1,1 | -1,-1 | 0 | 0,0,0 -> mean 0
    # biased var = (1+1+1+1)/8 = 0.5, std = 1/√2 -> row 0: 1·√2, row 1: −√2, group 1 stays 0
    adv = compute_advantages("reinforce_pp", rewards, groups, mask)
    s = math.sqrt(2.0)
    close(adv, [[s, s, 0], [-s, -s, 0], [0, 0, 0], [0, 0, 0]])


def test_reinforce_pp_whitening_is_token_weighted_and_shifts_mean():
    # one group, r = [1, 0] -> centered [0.5, -0.5]; row 0 has 3 policy tokens, row 1 has 1
    # token mean = (3·0.5 − 0.5)/4 = 0.25; deviations 0.25 (×3), −0.75
    # var = (3·0.0625 + 0.5625)/4 = 0.1875 = 3/16, std = √3/4
    # row 0: 0.25/(√3/4) = 1/√3 ≈ 0.5774; row 1: −0.75/(√3/4) = −√3 ≈ −1.7321
    mask = torch.tensor([[1, 1, 1], [1, 0, 0]])
    adv = compute_reinforce_pp_advantages(torch.tensor([1.0, 0.0]), [7, 7], mask)
    close(adv, [[1 / R3, 1 / R3, 1 / R3], [-R3, 0, 0]])


def test_grpo_two_groups_by_hand():
    rewards = torch.tensor([3.0, 0.0, 0.0, 1.0, 1.0])
    groups = torch.tensor([5, 5, 5, 9, 9])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0], [1, 1, 1], [1, 1, 1], [0, 1, 1]])
    # g0: mean 1, deviations [2, −1, −1], unbiased var = (4+1+1)/2 = 3, std √3
    #     -> [2/√3, −1/√3, −1/√3] = [1.1547, −0.5774, −0.5774]; g1 flat -> 0
    adv = compute_advantages(AdvantageEstimator.GRPO, rewards, groups, mask)
    a, b = 2 / R3, -1 / R3
    close(adv, [[a, a, 0], [b, 0, 0], [b, b, b], [0, 0, 0], [0, 0, 0]])


def test_rloo_two_groups_by_hand():
    rewards = torch.tensor([3.0, 0.0, 0.0, 1.0, 1.0])
    mask = torch.ones(5, 2)
    # r0 − mean(0, 0) = 3; r1 − mean(3, 0) = −1.5; r2 likewise; g1: 1 − 1 = 0
    adv = compute_rloo_advantages(rewards, ["q1", "q1", "q1", "q2", "q2"], mask)
    close(adv, [[3, 3], [-1.5, -1.5], [-1.5, -1.5], [0, 0], [0, 0]])


def test_group_ids_as_strings_tensor_or_ints_agree():
    rewards = torch.tensor([0.3, 0.9, 0.1, 0.5])
    mask = torch.ones(4, 3)
    ids = ["b", "a", "b", "a"]
    for name in ESTIMATORS:
        by_str = compute_advantages(name, rewards, ids, mask)
        by_tensor = compute_advantages(name, rewards, torch.tensor([2, 1, 2, 1]), mask)
        torch.testing.assert_close(by_str, by_tensor)
    close(group_index(["b", "a", "b"], 3).float(), [0, 1, 0])
    with pytest.raises(ValueError, match="3 entries but the batch has 4"):
        compute_grpo_advantages(rewards, [0, 0, 1], mask)


@pytest.mark.parametrize("name", ESTIMATORS)
def test_degenerate_inputs_give_zeros(name):
    # 0.1 is not exact in binary: a naive float32 mean leaves a residue that a tiny std blows up
    flat = compute_advantages(name, torch.full((3,), 0.1), [0, 0, 0], torch.ones(3, 4))
    assert torch.equal(flat, torch.zeros(3, 4))
    single = compute_advantages(name, torch.tensor([5.0]), [0], torch.ones(1, 2))
    assert torch.equal(single, torch.zeros(1, 2))
    # rollout 1 has no policy token: zeros for it, the other rows still finite
    mask = torch.tensor([[1, 1], [0, 0], [1, 0]])
    adv = compute_advantages(name, torch.tensor([1.0, 0.0, 0.5]), [0, 0, 0], mask)
    assert torch.equal(adv[1], torch.zeros(2)) and torch.isfinite(adv).all()
    nothing = compute_advantages(name, torch.tensor([1.0, 0.0]), [0, 0], torch.zeros(2, 3))
    assert torch.equal(nothing, torch.zeros(2, 3))
    empty = compute_advantages(name, torch.zeros(0), [], torch.ones(0, 3))
    assert empty.shape == (0, 3)


def test_int_rewards_give_float_advantages():
    adv = compute_grpo_advantages(torch.tensor([1, 0]), [0, 0], torch.ones(2, 1))
    assert adv.dtype == torch.get_default_dtype()


def test_outcome_at_last_token_and_reward_to_go_by_hand():
    mask = torch.tensor([[1, 0, 1, 0], [0, 0, 0, 0], [1, 1, 1, 1]])  # row 0: env token at t=1
    close(
        outcome_at_last_token(torch.tensor([2.0, 3.0, -1.0]), mask),
        [[0, 0, 2, 0], [0] * 4, [0, 0, 0, -1]],
    )
    token_r = torch.tensor([[1.0, 9.0, 2.0, 9.0], [5.0, 5, 5, 5], [1.0, 2.0, 3.0, 4.0]])
    # row 0: t=2 -> 2, t=0 -> 1 + 2 = 3 (env token's 9 skipped); row 2: 10, 9, 7, 4
    close(reward_to_go(token_r, mask), [[3, 0, 2, 0], [0] * 4, [10, 9, 7, 4]])


def test_kl_penalized_token_rewards_by_hand():
    logp = torch.tensor([[-1.0, -2.0, -0.5], [-1.0, -1.0, -1.0]])
    ref = torch.tensor([[-2.0, -2.5, -0.5], [-1.0, -1.5, -9.0]])
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]])
    # k1 = logp − ref: row 0 [1, 0.5, (masked)], row 1 [0, 0.5, 8]; coef 0.1
    # row 0: [−0.1, −0.05 + r0=1] ; row 1: [0, −0.05, −0.8 + r1=0.5]
    out = kl_penalized_token_rewards(torch.tensor([1.0, 0.5]), logp, ref, mask, kl_coef=0.1)
    close(out, [[-0.1, 0.95, 0.0], [0.0, -0.05, -0.3]])


def test_reinforce_pp_with_k1_penalty_by_hand():
    # one group r = [1, 0] -> centered [0.5, −0.5]; kl row 0 [1, 2], row 1 [0, 0]; coef 0.1
    # token rewards: row 0 [−0.1, −0.2 + 0.5] = [−0.1, 0.3]; row 1 [0, −0.5]
    # returns:       row 0 [0.2, 0.3];                       row 1 [−0.5, −0.5]
    # token mean = (0.2 + 0.3 − 1.0)/4 = −0.125; deviations 0.325, 0.425, −0.375, −0.375
    # var = (0.105625 + 0.180625 + 2·0.140625)/4 = 0.141875; std = 0.376663
    kl = torch.tensor([[1.0, 2.0], [0.0, 0.0]])
    adv = compute_reinforce_pp_advantages(
        torch.tensor([1.0, 0.0]), [0, 0], torch.ones(2, 2), kl=kl, kl_coef=0.1
    )
    std = math.sqrt(0.141875)
    close(adv, [[0.325 / std, 0.425 / std], [-0.375 / std, -0.375 / std]], atol=1e-4)


def test_grpo_and_rloo_subtract_summed_k1_from_sequence_reward():
    # r' = r − 0.5·Σ kl over policy tokens: [1 − 0.5·(1+1), 1 − 0] = [0, 1] (masked 100 ignored)
    kl = torch.tensor([[1.0, 1.0, 100.0], [0.0, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]])
    rewards = torch.tensor([1.0, 1.0])
    # rloo: [0 − 1, 1 − 0] = [−1, 1]
    close(
        compute_rloo_advantages(rewards, [0, 0], mask, kl=kl, kl_coef=0.5), [[-1, -1, 0], [1, 1, 1]]
    )
    # grpo: mean 0.5, unbiased std √0.5 -> ±0.5/0.7071 = ±0.7071
    s = math.sqrt(0.5)
    out = compute_grpo_advantages(rewards, [0, 0], mask, kl=kl, kl_coef=0.5)
    close(out, [[-s, -s, 0], [s, s, s]])
    # kl_coef = 0 ignores kl entirely
    assert torch.equal(compute_rloo_advantages(rewards, [0, 0], mask, kl=kl), torch.zeros(2, 3))


@pytest.mark.parametrize("name", ESTIMATORS)
def test_values_at_masked_positions_do_not_matter(name):
    mask = torch.tensor([[1, 0, 1, 0], [1, 1, 0, 0], [1, 1, 1, 1]])
    rewards = torch.tensor([1.0, 0.2, 0.0])
    kl = torch.tensor([[0.1, 0.0, 0.3, 0.0], [0.2, -0.1, 0.0, 0.0], [0.0, 0.5, 0.1, 0.2]])
    poisoned = torch.where(mask.bool(), kl, torch.tensor(float("nan")))
    a = compute_advantages(name, rewards, [0, 0, 0], mask, kl=kl, kl_coef=0.2)
    b = compute_advantages(name, rewards, [0, 0, 0], mask, kl=poisoned, kl_coef=0.2)
    torch.testing.assert_close(a, b)
    assert torch.isfinite(b).all()


@settings(max_examples=60, deadline=None)
@given(
    st.integers(1, 8).flatmap(
        lambda b: st.tuples(
            st.lists(st.floats(-3, 3, width=32), min_size=b, max_size=b),
            st.lists(st.integers(0, 2), min_size=b, max_size=b),
            st.lists(st.lists(st.booleans(), min_size=5, max_size=5), min_size=b, max_size=b),
            st.lists(
                st.lists(st.floats(-5, 5, width=32), min_size=5, max_size=5), min_size=b, max_size=b
            ),
        )
    ),
    st.sampled_from(ESTIMATORS),
    st.sampled_from([0.0, 0.1]),
)
def test_property_finite_and_zero_where_masked(batch, name, kl_coef):
    rewards, groups, mask, kl = batch
    mask_t = torch.tensor(mask, dtype=torch.long)  # [B, 5]
    adv = compute_advantages(
        name, torch.tensor(rewards), groups, mask_t, kl=torch.tensor(kl), kl_coef=kl_coef
    )
    assert adv.shape == mask_t.shape
    assert torch.isfinite(adv).all()
    assert torch.equal(adv[mask_t == 0], torch.zeros(int((mask_t == 0).sum())))
