"""Policy loss, KL, entropy and log-prob helpers, with expected values worked out by hand.

Shapes: B rollouts, T response tokens, V vocabulary; mask [B, T] is 1 at policy tokens.
"""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from searchrl.errors import SearchRLError
from searchrl.rl.losses import (
    KL_ESTIMATORS,
    LOSS_AGGREGATIONS,
    OFF_POLICY_CORRECTIONS,
    behaviour_log_ratio,
    decoupled_is_weight,
    entropy_from_logits,
    kl_loss,
    kl_penalty,
    loss_units,
    masked_entropy,
    masked_mean,
    masked_moments,
    masked_sum,
    masked_whiten,
    off_policy_weight,
    policy_loss,
    token_logprobs,
    truncated_is_weight,
)

LN2 = math.log(2.0)


def close(actual: torch.Tensor | float, expected, atol: float = 1e-5) -> None:
    actual = torch.as_tensor(actual)
    exp = torch.as_tensor(expected, dtype=actual.dtype)
    torch.testing.assert_close(actual, exp, atol=atol, rtol=0)


# --- masked reductions ---------------------------------------------------------------------


def test_masked_reductions_by_hand_and_empty():
    x = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    mask = torch.tensor([[1, 1, 0], [0, 0, 1]])
    close(masked_sum(x, mask), 9.0)  # 1 + 2 + 6
    close(masked_mean(x, mask), 3.0)  # 9 / 3
    close(masked_mean(x, mask, dim=-1), [1.5, 6.0])
    close(masked_mean(x, torch.zeros_like(mask)), 0.0)
    close(masked_mean(x, torch.tensor([[1, 0, 0], [0, 0, 0]]), dim=-1), [1.0, 0.0])
    # inf/NaN under the mask stay out of the value
    poisoned = torch.tensor([[2.0, float("-inf"), float("nan")]])
    close(masked_mean(poisoned, torch.tensor([[1, 0, 0]])), 2.0)


def test_masked_whiten_by_hand_and_ignores_masked_values():
    x = torch.tensor([[1.0, 3.0, 100.0], [5.0, -7.0, 0.0]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    # policy values 1, 3, 5: mean 3, biased var (4 + 0 + 4)/3 = 8/3, std 1.63299
    s = math.sqrt(8 / 3)
    out = masked_whiten(x, mask)
    close(out, [[-2 / s, 0, 0], [2 / s, 0, 0]])
    poisoned = torch.where(mask.bool(), x, torch.tensor(float("nan")))
    torch.testing.assert_close(masked_whiten(poisoned, mask), out)
    assert torch.equal(masked_whiten(torch.full((2, 2), 4.0), torch.ones(2, 2)), torch.zeros(2, 2))
    assert torch.equal(masked_whiten(x, torch.zeros(2, 3)), torch.zeros(2, 3))


# --- policy loss ---------------------------------------------------------------------------


def test_policy_loss_ratio_one_is_minus_mean_advantage():
    logp = torch.tensor([[-1.0, -2.0, -3.0]])
    adv = torch.tensor([[1.0, 2.0, 3.0]])
    mask = torch.tensor([[1, 1, 0]])
    loss, stats = policy_loss(logp, logp.clone(), adv, mask)
    close(loss, -1.5)  # −(1 + 2)/2: the masked 3 is left out
    close(stats.clip_frac, 0.0)
    close(stats.approx_kl, 0.0)
    close(stats.ratio_mean, 1.0)


def test_policy_loss_clipped_case_by_hand():
    old = torch.zeros(1, 3)
    logp = torch.log(torch.tensor([[1.5, 0.5, 0.5]]))  # ratio = [1.5, 0.5, 0.5]
    adv = torch.tensor([[1.0, 1.0, -1.0]])
    mask = torch.ones(1, 3)
    # t0: pg_loss1 = −1.5, pg_loss2 = −1.2 (clip at 1.2) -> max −1.2 (clipped)
    # t1: pg_loss1 = −0.5, pg_loss2 = −0.8 (clip at 0.8) -> max −0.5 (not clipped)
    # t2: pg_loss1 = +0.5, pg_loss2 = +0.8               -> max +0.8 (clipped)
    # loss = (−1.2 − 0.5 + 0.8)/3 = −0.3; clip_frac = 2/3
    # approx_kl = mean((r − 1) − ln r) = (0.5 − 0.405465 + 2·(−0.5 + 0.693147))/3 = 0.160276
    loss, stats = policy_loss(logp, old, adv, mask, clip_eps=0.2)
    close(loss, -0.3)
    close(stats.clip_frac, 2 / 3)
    close(stats.approx_kl, 0.160276)
    close(stats.ratio_mean, 2.5 / 3)
    # clip-higher: t0 now clips at 1.28 -> (−1.28 − 0.5 + 0.8)/3 = −0.326667
    loss_hi, _ = policy_loss(logp, old, adv, mask, clip_eps=0.2, clip_eps_high=0.28)
    close(loss_hi, -0.98 / 3)


def test_policy_loss_gradient_by_hand():
    # d/dlogp of −A·ratio at ratio 1 is −A; clipped tokens get exactly 0
    old = torch.zeros(1, 2)
    logp = torch.tensor([[0.0, math.log(1.5)]], requires_grad=True)
    adv = torch.tensor([[2.0, 1.0]])
    loss, _ = policy_loss(logp, old, adv, torch.ones(1, 2))
    loss.backward()
    close(logp.grad, [[-1.0, 0.0]])  # token-mean over 2: −2/2 at t0; t1 clipped


def test_masked_tokens_change_neither_loss_nor_gradient():
    torch.manual_seed(0)
    mask = torch.tensor([[1, 1, 0, 0], [1, 0, 1, 0]])
    adv = torch.randn(2, 4)
    old = torch.randn(2, 4)
    base = torch.randn(2, 4)
    # masked positions: −inf old log-probs (padding) and huge advantages
    bad_old = torch.where(mask.bool(), old, torch.tensor(float("-inf")))
    bad_adv = torch.where(mask.bool(), adv, torch.tensor(1e30))
    for agg in ("token-mean", "seq-mean-token-mean"):
        grads, losses = [], []
        for o, a in ((old, adv), (bad_old, bad_adv)):
            logp = base.clone().requires_grad_(True)
            loss, stats = policy_loss(logp, o, a, mask, agg=agg)
            loss.backward()
            grads.append(logp.grad)
            losses.append(loss.detach())
            assert all(math.isfinite(v) for v in dataclasses.astuple(stats))
        torch.testing.assert_close(losses[0], losses[1])
        torch.testing.assert_close(grads[0], grads[1])
        assert torch.equal(grads[1][mask == 0], torch.zeros(4))


def test_seq_mean_token_mean_by_hand():
    logp = torch.zeros(3, 2)
    # ratio 1 -> token loss = −A: row 0 [1, 3], row 1 [5, (masked)], row 2 has no policy token
    adv = -torch.tensor([[1.0, 3.0], [5.0, -7.0], [9.0, 9.0]])
    mask = torch.tensor([[1, 1], [1, 0], [0, 0]])
    token, _ = policy_loss(logp, logp, adv, mask, agg="token-mean")
    seq, _ = policy_loss(logp, logp, adv, mask, agg="seq-mean-token-mean")
    close(token, 3.0)  # (1 + 3 + 5)/3
    close(seq, 3.5)  # mean(2, 5); the empty row is left out
    with pytest.raises(SearchRLError, match="seq-mean-token-mean, token-mean"):
        policy_loss(logp, logp, adv, mask, agg="sum")
    assert LOSS_AGGREGATIONS.names() == ["seq-mean-token-mean", "token-mean"]


def test_policy_loss_empty_mask_is_zero_not_nan():
    logp = torch.randn(2, 3, requires_grad=True)
    loss, stats = policy_loss(logp, torch.randn(2, 3), torch.randn(2, 3), torch.zeros(2, 3))
    loss.backward()
    assert loss.item() == 0.0 and torch.equal(logp.grad, torch.zeros(2, 3))
    assert dataclasses.astuple(stats) == (0.0, 0.0, 0.0)


# --- off-policy correction -----------------------------------------------------------------
# old_logp: the proximal policy (trainer, start of the update); behaviour: the sampler's log-probs.


def test_correction_weights_by_hand_and_masked_tokens_get_none():
    old = torch.log(torch.tensor([[0.5, 0.6, 0.9], [0.45, 0.9, 0.9]]))
    behaviour = torch.log(torch.tensor([[0.5, 0.4, 0.3], [0.25, 0.0, 0.9]]))  # 0.0: −inf at a masked token
    mask = torch.tensor([[1, 1, 1], [1, 0, 0]])
    # π_old / μ: row 0 [0.5/0.5, 0.6/0.4, 0.9/0.3] = [1.0, 1.5, 3.0]; row 1 [0.45/0.25 = 1.8, masked, masked]
    close(behaviour_log_ratio(old, behaviour, mask), [[0.0, math.log(1.5), math.log(3.0)], [math.log(1.8), 0.0, 0.0]])
    # tis truncates at 2: [1.0, 1.5, 2.0]; [1.8, 0, 0] (masked tokens weigh 0)
    close(truncated_is_weight(old, behaviour, mask, 2.0), [[1.0, 1.5, 2.0], [1.8, 0.0, 0.0]])
    # decoupled drops the token over the cap: [1.0, 1.5, 0.0]; [1.8, 0, 0]
    close(decoupled_is_weight(old, behaviour, mask, 2.0), [[1.0, 1.5, 0.0], [1.8, 0.0, 0.0]])
    # a cap of 5 binds nowhere: both are the plain ratio
    for fn in (truncated_is_weight, decoupled_is_weight):
        close(fn(old, behaviour, mask, 5.0), [[1.0, 1.5, 3.0], [1.8, 0.0, 0.0]])
    assert off_policy_weight("none", old, behaviour, mask) is None
    assert OFF_POLICY_CORRECTIONS.names() == ["decoupled", "none", "tis"]
    with pytest.raises(SearchRLError, match="unknown off-policy correction 'vtrace'"):
        off_policy_weight("vtrace", old, behaviour, mask)


def test_correction_weights_never_overflow_and_carry_no_gradient():
    old = torch.tensor([[0.0, -1.0]], requires_grad=True)
    behaviour = torch.tensor([[-1000.0, -1.0]])  # a token the sampler almost never picks: ratio e^1000
    mask = torch.ones(1, 2)
    tis = truncated_is_weight(old, behaviour, mask, 2.0)
    close(tis, [[2.0, 1.0]])  # truncated in log space, never inf
    close(decoupled_is_weight(old, behaviour, mask, 2.0), [[0.0, 1.0]])
    assert not tis.requires_grad


def _clipped_case():
    """`test_policy_loss_clipped_case_by_hand`'s tokens: ratio π_θ / π_old = [1.5, 0.5, 0.5],
    A = [1, 1, −1], clipped token losses [−1.2, −0.5, +0.8] (plain loss −0.3)."""
    old = torch.zeros(1, 3)
    logp = torch.log(torch.tensor([[1.5, 0.5, 0.5]]))
    return logp, old, torch.tensor([[1.0, 1.0, -1.0]]), torch.ones(1, 3)


@pytest.mark.parametrize("kind", ["tis", "decoupled"])
def test_behaviour_equal_to_old_gives_exactly_the_plain_clipped_loss(kind):
    logp, old, adv, mask = _clipped_case()
    results = []
    for weight in (None, off_policy_weight(kind, old, old.clone(), mask)):  # π_old / μ = 1 at every token
        lp = logp.clone().requires_grad_(True)
        loss, stats = policy_loss(lp, old, adv, mask, is_weight=weight)
        loss.backward()
        results.append((loss.detach(), lp.grad, stats))
    assert torch.equal(results[0][0], results[1][0]) and torch.equal(results[0][1], results[1][1])
    assert results[0][2] == results[1][2]
    close(results[1][0], -0.3)


def test_corrected_loss_and_gradient_by_hand():
    logp, old, adv, mask = _clipped_case()
    behaviour = torch.log(torch.tensor([[1.0, 0.8, 0.25]]))  # π_old / μ = [1, 1.25, 4]
    # tis, cap 2:       w = [1, 1.25, 2] -> (−1.2·1 − 0.5·1.25 + 0.8·2)/3 = −0.225/3 = −0.075
    # decoupled, cap 2: w = [1, 1.25, 0] -> (−1.2 − 0.625 + 0)/3 = −0.608333
    # either, cap 5:    w = [1, 1.25, 4] -> (−1.2 − 0.625 + 3.2)/3 = 0.458333
    for kind, cap, expected in [("tis", 2.0, -0.075), ("decoupled", 2.0, -1.825 / 3), ("tis", 5.0, 1.375 / 3),
                                ("decoupled", 5.0, 1.375 / 3)]:
        lp = logp.clone().requires_grad_(True)
        loss, stats = policy_loss(lp, old, adv, mask, is_weight=off_policy_weight(kind, old, behaviour, mask, cap))
        close(loss, expected)
        close(stats.clip_frac, 2 / 3)  # the weight never changes which branch of the clip wins
        loss.backward()
        # only t1 is unclipped: d/dlogp of −A·ratio·w / 3 = −1·0.5·1.25/3 = −0.208333; the clipped
        # tokens still get exactly 0 (the trust region around π_old holds whatever the weight)
        close(lp.grad, [[0.0, -0.625 / 3, 0.0]])


@pytest.mark.parametrize("kind", ["tis", "decoupled"])
def test_masked_tokens_never_count_in_the_corrected_loss(kind):
    torch.manual_seed(0)
    mask = torch.tensor([[1, 1, 0, 0], [1, 0, 1, 0]])
    adv, old, base = torch.randn(2, 4), torch.randn(2, 4) - 1.0, torch.randn(2, 4) - 1.0
    behaviour = old - 0.3 * torch.randn(2, 4).abs()  # π_old / μ in [1, ~2.5): some over the cap
    # masked positions: −inf sampler log-probs (padding), old log-probs far above them, huge advantages
    bad_behaviour = torch.where(mask.bool(), behaviour, torch.tensor(float("-inf")))
    bad_old = torch.where(mask.bool(), old, torch.tensor(50.0))
    bad_adv = torch.where(mask.bool(), adv, torch.tensor(1e30))
    grads, losses = [], []
    for o, b, a in ((old, behaviour, adv), (bad_old, bad_behaviour, bad_adv)):
        weight = off_policy_weight(kind, o, b, mask, 2.0)
        assert torch.equal(weight[mask == 0], torch.zeros(4))
        logp = base.clone().requires_grad_(True)
        loss, _ = policy_loss(logp, o, a, mask, is_weight=weight)
        loss.backward()
        grads.append(logp.grad)
        losses.append(loss.detach())
    assert torch.isfinite(losses[1])
    torch.testing.assert_close(losses[0], losses[1])
    torch.testing.assert_close(grads[0], grads[1])
    assert torch.equal(grads[1][mask == 0], torch.zeros(4))


# --- KL ------------------------------------------------------------------------------------


def test_kl_estimators_by_hand():
    logp = torch.log(torch.tensor([[0.5, 0.25]]))
    ref = torch.log(torch.tensor([[0.25, 0.5]]))
    # d = logp − ref = [ln 2, −ln 2]
    close(kl_penalty(logp, ref, "k1"), [[LN2, -LN2]])
    close(kl_penalty(logp, ref, "k2"), [[LN2**2 / 2, LN2**2 / 2]])  # 0.240227 both
    # k3 = e^{−d} + d − 1: [0.5 + 0.693147 − 1, 2 − 0.693147 − 1] = [0.193147, 0.306853]
    close(kl_penalty(logp, ref, "k3"), [[0.5 + LN2 - 1, 2 - LN2 - 1]])
    assert KL_ESTIMATORS.names() == ["k1", "k2", "k3"]
    with pytest.raises(SearchRLError, match="unknown KL estimator 'k4'"):
        kl_penalty(logp, ref, "k4")


def test_k3_is_never_negative_and_zero_at_equality():
    torch.manual_seed(1)
    logp, ref = torch.randn(64, 16) * 3, torch.randn(64, 16) * 3
    assert (kl_penalty(logp, ref, "k3") >= 0).all()
    assert torch.equal(kl_penalty(logp, logp, "k3"), torch.zeros(64, 16))


def test_kl_loss_is_masked_mean_and_ignores_padding():
    logp = torch.log(torch.tensor([[0.5, 0.25, 0.9]]))
    ref = torch.log(torch.tensor([[0.25, 0.5, 0.0]]))  # ref = −inf at the masked token
    mask = torch.tensor([[1, 1, 0]])
    # mean of k3 over the two policy tokens: (0.193147 + 0.306853)/2 = 0.25
    close(kl_loss(logp, ref, mask), 0.25)
    close(kl_loss(logp, ref, mask, kind="k1"), 0.0)  # (ln 2 − ln 2)/2
    lp = logp.clone().requires_grad_(True)
    kl_loss(lp, ref, mask).backward()
    # d k3/d logp = 1 − e^{−d}: t0 1 − 0.5 = 0.5, t1 1 − 2 = −1, each /2; masked exactly 0
    close(lp.grad, [[0.25, -0.5, 0.0]])


# --- entropy and token log-probs -----------------------------------------------------------


def test_entropy_uniform_is_log_v_and_by_hand():
    close(entropy_from_logits(torch.zeros(2, 3, 7)), torch.full((2, 3), math.log(7)))
    # p = [1/4, 3/4]: H = ¼·ln 4 + ¾·ln(4/3) = 0.346574 + 0.215762 = 0.562335
    logits = torch.tensor([[[0.0, math.log(3.0)]]])
    close(entropy_from_logits(logits), [[0.562335]])
    # a near one-hot over huge logits stays finite and ≈ 0
    sharp = torch.tensor([[[1e4, 0.0, -1e4]]])
    close(entropy_from_logits(sharp), [[0.0]])


def test_entropy_chunked_masked_and_bf16():
    torch.manual_seed(2)
    logits = torch.randn(2, 5, 11) * 4
    full = entropy_from_logits(logits)
    torch.testing.assert_close(entropy_from_logits(logits, chunk_size=2), full)
    mask = torch.tensor([[1, 1, 0, 0, 0], [0, 0, 0, 0, 1]])
    close(masked_entropy(logits, mask), (full[0, 0] + full[0, 1] + full[1, 4]) / 3)
    out = entropy_from_logits(logits.bfloat16())
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, full, atol=0.05, rtol=0)


def test_token_logprobs_match_categorical():
    torch.manual_seed(3)
    logits = torch.randn(3, 4, 13) * 5  # [B, T, V]
    labels = torch.randint(0, 13, (3, 4))  # [B, T]
    expected = torch.distributions.Categorical(logits=logits).log_prob(labels)
    torch.testing.assert_close(token_logprobs(logits, labels), expected)
    torch.testing.assert_close(token_logprobs(logits, labels, chunk_size=3), expected)
    bf = token_logprobs(logits.bfloat16(), labels)
    assert bf.dtype == torch.float32
    torch.testing.assert_close(bf, expected, atol=0.1, rtol=0)
    # by hand: logits [0, ln 3] -> log p = [ln ¼, ln ¾]
    two = torch.tensor([[[0.0, math.log(3.0)], [0.0, math.log(3.0)]]])
    close(token_logprobs(two, torch.tensor([[0, 1]])), [[math.log(0.25), math.log(0.75)]])


def test_token_logprobs_gradient_and_empty_t():
    logits = torch.zeros(1, 1, 4, requires_grad=True)
    token_logprobs(logits, torch.tensor([[2]])).sum().backward()
    # d log softmax_2 / dz = onehot(2) − softmax = [−¼, −¼, ¾, −¼]
    close(logits.grad, [[[-0.25, -0.25, 0.75, -0.25]]])
    assert token_logprobs(torch.zeros(2, 0, 5), torch.zeros(2, 0, dtype=torch.long)).shape == (2, 0)
    assert entropy_from_logits(torch.zeros(2, 0, 5), chunk_size=4).shape == (2, 0)


# --- explicit denominators: split batches add up to the whole ----------------------------------


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean"])
def test_split_batch_with_the_whole_batch_units_sums_to_the_whole_batch_loss(agg):
    # Two "processes" (or micro-batches) with 2 rollouts each; each divides by the units of all
    # 4 rollouts, so their losses (and so their gradients) add up to the loss of the whole batch.
    g = torch.Generator().manual_seed(0)
    logp = torch.randn(4, 5, generator=g, requires_grad=True)
    old, adv = torch.randn(4, 5, generator=g), torch.randn(4, 5, generator=g)
    mask = torch.tensor([[1, 1, 0, 0, 0], [1, 1, 1, 1, 1], [0, 0, 0, 0, 0], [1, 0, 1, 0, 1]])
    whole, _ = policy_loss(logp, old, adv, mask, agg=agg)
    units = loss_units(mask, agg)
    assert units == (10 if agg == "token-mean" else 3)
    parts = [policy_loss(logp[i], old[i], adv[i], mask[i], agg=agg, units=units)[0] for i in (slice(0, 2), slice(2, 4))]
    close(parts[0] + parts[1], whole)
    (g_whole,) = torch.autograd.grad(whole, logp)
    (g_parts,) = torch.autograd.grad(parts[0] + parts[1], logp)
    torch.testing.assert_close(g_parts, g_whole)
    # Local units instead would weigh the halves' tokens differently: a different loss.
    local = [policy_loss(logp[i], old[i], adv[i], mask[i], agg=agg)[0] for i in (slice(0, 2), slice(2, 4))]
    assert abs(float((local[0] + local[1]).detach()) - float(whole.detach())) > 1e-3


def test_whitening_with_global_moments_equals_whitening_the_whole_batch():
    x = torch.tensor([[1.0, 2.0, 3.0], [10.0, 0.0, 0.0], [4.0, 4.0, 0.0], [7.0, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 1], [1, 0, 0], [1, 1, 0], [1, 0, 0]])
    whole = masked_whiten(x, mask)
    mean, var = masked_moments(x, mask)  # what an all-reduce of sums and counts would give
    close(mean, 31 / 7)
    halves = [masked_whiten(x[i], mask[i], moments=lambda *_: (mean, var)) for i in (slice(0, 2), slice(2, 4))]
    torch.testing.assert_close(torch.cat(halves), whole)
    assert not torch.allclose(masked_whiten(x[:2], mask[:2]), whole[:2])  # local statistics differ
