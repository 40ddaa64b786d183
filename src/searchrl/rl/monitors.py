"""The health monitors: each is a pure function of one stage's step records up to the current
step (dicts as in metrics.jsonl) and returns its value for that step, or None when it has nothing
to judge (a step without an update has no entropy; a window not yet full; a sync run has no
trainer wait), and whether it fires. `MONITORS` registers them by the name of their
`HealthConfig` field; `rl.health` runs them after every step and over a finished run.

What needs per-rollout data (echoed answers, flat groups, looping reasoning, malformed tags) is a
per-step metric that `rl.step.record` writes (`rl.health_signals`); the monitors threshold it.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from itertools import pairwise

from searchrl import metric_names as mn
from searchrl.rl.health_config import HealthConfig, MonitorConfig

Reading = tuple[float | None, bool]
Monitor = Callable[[Sequence[dict], MonitorConfig], Reading]


def _values(records: Sequence[dict], key: str) -> list[float]:
    return [r[key] for r in records if r.get(key) is not None]


def _mean_last(values: list[float], window: int) -> float | None:
    return statistics.fmean(values[-window:]) if len(values) >= window else None


def _window_means(records: Sequence[dict], key: str, window: int) -> list[float]:
    values = _values(records, key)
    return [statistics.fmean(values[i - window:i]) for i in range(window, len(values) + 1)]


def _vs_best(records: Sequence[dict], key: str, cfg: MonitorConfig) -> Reading:
    """The latest window mean over the best window mean so far; None until the best is positive."""
    if not records or records[-1].get(key) is None:
        return None, False
    means = _window_means(records, key, cfg.window)
    if not means or max(means) <= 0:
        return None, False
    ratio = means[-1] / max(means)
    return ratio, ratio <= cfg.threshold


def _rise(records: Sequence[dict], key: str, cfg: MonitorConfig) -> Reading:
    """The latest window mean less the lowest window mean so far: a share that climbs from where
    the stage had it (a policy that never learned the tags has not degenerated)."""
    if not records or records[-1].get(key) is None:
        return None, False
    means = _window_means(records, key, cfg.window)
    if not means:
        return None, False
    rise = means[-1] - min(means)
    return rise, rise >= cfg.threshold


def _window_mean(records: Sequence[dict], key: str, cfg: MonitorConfig) -> Reading:
    if not records or records[-1].get(key) is None:
        return None, False
    mean = _mean_last(_values(records, key), cfg.window)
    return mean, mean is not None and mean >= cfg.threshold


def _spike(records: Sequence[dict], key: str, cfg: MonitorConfig, floor: float = 0.0) -> Reading:
    """The latest value over the median of the `window` values before it."""
    values = _values(records, key)
    if not records or records[-1].get(key) is None or len(values) <= cfg.window:
        return None, False
    base = statistics.median(values[-cfg.window - 1:-1])
    if base <= 0:
        return None, False
    ratio = values[-1] / base
    return ratio, ratio >= cfg.threshold and values[-1] > floor


def search_collapse(records: Sequence[dict], cfg: MonitorConfig) -> Reading:
    return _vs_best(records, mn.SEARCH_RATE, cfg)


def format_collapse(records: Sequence[dict], cfg: MonitorConfig) -> Reading:
    return _vs_best(records, mn.FORMAT_OK, cfg)


def answer_echo(records: Sequence[dict], cfg: MonitorConfig) -> Reading:
    return _window_mean(records, mn.ECHO_RATE, cfg)


def length_drift(records: Sequence[dict], cfg: MonitorConfig) -> Reading:
    values = _values(records, mn.RESPONSE_TOKENS)
    recent = _mean_last(values, cfg.window)
    if recent is None or len(values) < 2 * cfg.window:  # a baseline apart from the window
        return None, False
    base = statistics.median(values[: cfg.window])
    if base <= 0:
        return None, False
    ratio = recent / base
    return ratio, ratio >= cfg.threshold or ratio <= 1 / cfg.threshold


def entropy_collapse(records: Sequence[dict], cfg: MonitorConfig) -> Reading:
    return _vs_best(records, mn.ENTROPY, cfg)


def flat_groups(records: Sequence[dict], cfg: MonitorConfig) -> Reading:
    return _window_mean(records, mn.FLAT_GROUPS, cfg)


def logprob_mismatch(records: Sequence[dict], cfg: MonitorConfig) -> Reading:
    return _spike(records, mn.LOGPROB_MISMATCH, cfg, floor=1e-3)


def is_ratio_spike(records: Sequence[dict], cfg: MonitorConfig) -> Reading:
    return _spike(records, mn.IS_RATIO_MAX, cfg)


def is_clip(records: Sequence[dict], cfg: MonitorConfig) -> Reading:
    return _window_mean(records, mn.IS_CLIP_FRAC, cfg)


def trainer_idle(records: Sequence[dict], cfg: MonitorConfig) -> Reading:
    return _window_mean(records, mn.TRAINER_IDLE_SHARE, cfg)


def trainer_wait(record: dict) -> float | None:
    """Seconds the trainer waited for the step's batch (async mode; None in sync mode)."""
    share = record.get(mn.TRAINER_IDLE_SHARE)
    return None if share is None or record.get(mn.STEP_SECONDS) is None else share * record[mn.STEP_SECONDS]


# A wait under a second is the queue's own latency: growth from there is no stall.
WAIT_FLOOR_S = 1.0


def rollout_wait(records: Sequence[dict], cfg: MonitorConfig) -> Reading:
    """The latest wait over the wait `window` steps before (at least `WAIT_FLOOR_S`); fires when
    it is at or above threshold and the wait grew at every step in between."""
    waits = [trainer_wait(r) for r in records[-cfg.window - 1:]]
    if len(waits) <= cfg.window or any(w is None for w in waits):
        return None, False
    ratio = waits[-1] / max(waits[0], WAIT_FLOOR_S)
    return ratio, ratio >= cfg.threshold and all(a < b for a, b in pairwise(waits))


def think_repetition(records: Sequence[dict], cfg: MonitorConfig) -> Reading:
    return _rise(records, mn.THINK_LOOP_RATE, cfg)


def malformed_tags(records: Sequence[dict], cfg: MonitorConfig) -> Reading:
    return _rise(records, mn.MALFORMED_TAGS, cfg)


def query_echo(records: Sequence[dict], cfg: MonitorConfig) -> Reading:
    return _rise(records, mn.QUERY_ECHO_RATE, cfg)


# A NaN in any of these poisons the weights (loss, gradients) or shows they already are (log-probs).
NONFINITE_KEYS = (mn.PG_LOSS, mn.SFT_LOSS, mn.KL_LOSS, mn.GRAD_NORM, mn.KL, mn.ENTROPY, mn.LOGPROB_MISMATCH, mn.REWARD)


def nonfinite(records: Sequence[dict], cfg: MonitorConfig) -> Reading:
    bad = sum(1 for k in NONFINITE_KEYS if isinstance(records[-1].get(k), float) and not math.isfinite(records[-1][k]))
    return float(bad), bad >= cfg.threshold


def step_time(records: Sequence[dict], cfg: MonitorConfig) -> Reading:
    # A step whose rewards were all equal skips the update and takes a fraction of the time (16 s
    # against 68 s in the demo): compare steps that updated with steps that updated.
    if records and records[-1].get(mn.UPDATES) == 0:
        return None, False
    return _spike([r for r in records if r.get(mn.UPDATES) != 0], mn.STEP_SECONDS, cfg)


MONITORS: dict[str, Monitor] = {
    "search_collapse": search_collapse, "format_collapse": format_collapse, "answer_echo": answer_echo, "length_drift": length_drift,
    "entropy_collapse": entropy_collapse, "flat_groups": flat_groups, "logprob_mismatch": logprob_mismatch,
    "is_ratio_spike": is_ratio_spike, "is_clip": is_clip, "trainer_idle": trainer_idle, "rollout_wait": rollout_wait,
    "think_repetition": think_repetition, "malformed_tags": malformed_tags, "query_echo": query_echo, "nonfinite": nonfinite, "step_time": step_time,
}
assert set(MONITORS) == set(HealthConfig().monitors()), "every monitor has a config field and back"


def message(name: str, value: float, cfg: MonitorConfig) -> str:
    """What an alarm of monitor `name` says, its value `value`."""
    w = f"{cfg.window} step(s)"
    return {
        "search_collapse": f"search rate over {w} fell to {value:.0%} of the stage's best: the policy stopped searching",
        "format_collapse": f"format-ok rate over {w} fell to {value:.0%} of the stage's best: rollouts stopped following the protocol",
        "answer_echo": f"{value:.0%} of comparison answers over {w} name both candidates or the gold plus another "
                       "(F1 half-rewards it, cover-EM counts it)",
        "length_drift": f"responses over {w} are {value:.2f}x the stage's first steps' length",
        "entropy_collapse": f"entropy over {w} fell to {value:.0%} of the stage's best: sampling is turning deterministic",
        "flat_groups": f"{value:.0%} of question groups over {w} had equal rewards: no learning signal",
        "logprob_mismatch": f"sampler/actor log-prob gap is {value:.1f}x its recent median",
        "is_ratio_spike": f"the largest importance ratio pi_old / pi_sampler is {value:.1f}x its recent median: the update "
                          "trains on rollouts its policy no longer agrees with",
        "is_clip": f"{value:.1%} of policy tokens over {w} had an importance ratio over algorithm.is_cap: the off-policy "
                   "correction truncates or drops them",
        "trainer_idle": f"the trainer waited for its batch {value:.0%} of the time over {w}: the rollout worker barely keeps "
                        "up, or has stalled",
        "rollout_wait": f"the trainer's wait for its batch grew at each of {w} to {value:.1f}x: the rollout worker is "
                        "slowing down (rollout.worker_timeout_s stops the run if it stops)",
        "think_repetition": f"{value:.0%} more rollouts over {w} repeat a span of their reasoning 3+ times back to back "
                            "than at the stage's best: the reasoning is degenerating into loops",
        "malformed_tags": f"{value:.0%} more rollouts over {w} break a tag or call rule than at the stage's best",
        "query_echo": f"{value:.0%} more rollouts over {w} answer their only query than at the stage's lowest: the policy "
                      "searches its guess and answers it, whatever the search returned",
        "nonfinite": f"{value:.0f} of {', '.join(NONFINITE_KEYS)} is NaN/Inf",
        "step_time": f"the step took {value:.1f}x the recent median step time",
    }[name]
