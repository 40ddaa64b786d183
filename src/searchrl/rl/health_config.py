"""The `health` section of the training config: one `MonitorConfig` per monitor of
`searchrl.rl.monitors` (what it does when it fires, its threshold and window) and the rollback
action's settings (docs/guides/health.md)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from searchrl.config import StrictModel


class MonitorConfig(StrictModel):
    """One monitor: what it does when it fires, its threshold and its window of steps."""

    action: Literal["warn", "stop", "rollback", "off"] = Field(
        "warn", description="warn: a console line and a line in the run's alarms.jsonl; stop: that, then a checkpoint "
        "and the run ends with the alarm as its error; rollback: back to the last checkpoint before the window, "
        "with a lower learning rate and new sampling seeds (see health.rollback); off: not computed.",
    )
    threshold: float = Field(..., description="Where the monitor fires (see the monitor's own description).")
    window: int = Field(..., ge=1, description="Steps the monitor averages over (or, for spikes, the baseline's steps).")


class RollbackConfig(StrictModel):
    """What the `rollback` action does (`searchrl.rl.rollback`)."""

    lr_factor: float = Field(0.5, gt=0, le=1, description="Each rollback multiplies the learning rate by this.")
    max_rollbacks: int = Field(2, ge=0, description="Rollbacks a run may take; past them a rollback alarm stops the run.")


def _monitor(threshold: float, window: int, what: str):
    return Field(default_factory=lambda: MonitorConfig(threshold=threshold, window=window), description=what)


class HealthConfig(StrictModel):
    """Monitors run after every step on the step records; windows never reach into the previous
    stage. Defaults stay quiet on the demo's healthy run."""

    search_collapse: MonitorConfig = _monitor(
        0.5, 2, "Mean search_rate over the window as a fraction of the stage's best such mean; fires at or below threshold.")
    format_collapse: MonitorConfig = _monitor(
        0.5, 2, "Mean format_ok over the window as a fraction of the stage's best such mean; fires at or below threshold "
        "(once every rollout fails the format, every reward is the same and nothing is learned any more).")
    answer_echo: MonitorConfig = _monitor(
        0.3, 2, "Mean echo_rate (comparison answers naming both candidates, or the gold plus another) over the window; "
        "fires at or above threshold.")
    length_drift: MonitorConfig = _monitor(
        3.0, 3, "Mean response_tokens over the window against the median of the stage's first window steps; fires when "
        "the ratio is at or above threshold (explosion) or at or below its inverse (collapse).")
    # A tenth: on the shipped long run entropy fell from 0.55 to 0.07-0.15 nats a token (a fifth
    # of its best and less) while search and format held; sampling that stops exploring goes lower.
    entropy_collapse: MonitorConfig = _monitor(
        0.1, 2, "Mean entropy over the window as a fraction of the stage's best such mean; fires at or below threshold.")
    flat_groups: MonitorConfig = _monitor(
        0.9, 5, "Mean flat_groups (share of question groups whose rewards are all equal: no learning signal) over the "
        "window; fires at or above threshold.")
    logprob_mismatch: MonitorConfig = _monitor(
        10.0, 3, "logprob_mismatch (sampler vs actor, per token) against the median of the window's earlier steps; fires "
        "at or above threshold times that median once it is also over 1e-3 (fp32 noise spikes harmlessly).")
    # Off-policy training (async mode, or a sampler on another engine): the importance ratio
    # pi_old / pi_sampler grows before the loss or the reward shows anything.
    is_ratio_spike: MonitorConfig = _monitor(
        10.0, 3, "is_ratio_max (the step's largest importance ratio pi_old / pi_sampler) against the median of the "
        "window's earlier steps; fires at or above threshold times that median (the sampler and the trainer disagree "
        "far more than they did: too stale rollouts, a learning rate too high for the lag, a sampler precision bug).")
    is_clip: MonitorConfig = _monitor(
        0.05, 3, "Mean is_clip_frac (share of policy tokens whose ratio pi_old / pi_sampler is over algorithm.is_cap) "
        "over the window; fires at or above threshold (the off-policy correction truncates or drops that much of the "
        "signal: lower rollout.max_staleness or the learning rate).")
    # Async mode only: a rollout worker that slows to a stop shows in the trainer's wait for its
    # batch steps before rollout.worker_timeout_s ends the run.
    trainer_idle: MonitorConfig = _monitor(
        0.95, 3, "Async mode only: mean trainer_idle_share (share of the step the trainer waited for its batch) over the "
        "window; fires at or above threshold. Generation twenty times slower than the update also gets there: raise "
        "the threshold, or turn it off, where that is expected.")
    rollout_wait: MonitorConfig = _monitor(
        3.0, 3, "Async mode only: the trainer's wait for its batch (trainer_idle_share x step_seconds) against its wait "
        "window steps earlier (at least 1 s); fires at or above threshold once the wait grew at every step of the "
        "window: a rollout worker slowing to a stop, before rollout.worker_timeout_s stops the run.")
    # The reasoning text degenerates into loops before the reward falls.
    think_repetition: MonitorConfig = _monitor(
        0.25, 3, "Mean think_loop_rate (share of rollouts whose think text writes one span three times or more back to back) over "
        "the window, less the stage's lowest such mean; fires at or above threshold.")
    malformed_tags: MonitorConfig = _monitor(
        0.3, 3, "Mean malformed_tags (share of rollouts failing a tag or call rule of the format check) over the window, "
        "less the stage's lowest such mean; fires at or above threshold (tags break before format_ok halves).")
    # An answer reward pays a guess searched and answered as often as the guess is right (a
    # comparison's candidate: half the time), so the echo can rise while the reward does.
    query_echo: MonitorConfig = _monitor(
        0.3, 2, "Mean query_echo_rate (share of rollouts answering their only query, whatever it returned) over the window, "
        "less the stage's lowest such mean; fires at or above threshold.")
    nonfinite: MonitorConfig = _monitor(
        1, 1, "How many of loss, gradient norm, KL, entropy, log-prob mismatch and reward are NaN/Inf; fires at or above threshold.")
    step_time: MonitorConfig = _monitor(
        4.0, 3, "step_seconds against the median of the window's earlier steps; fires at or above threshold.")
    rollback: RollbackConfig = Field(default_factory=RollbackConfig, description="Settings of the rollback action.")

    def monitors(self) -> dict[str, MonitorConfig]:
        return {name: getattr(self, name) for name in type(self).model_fields if name != "rollback"}

    @model_validator(mode="before")
    @classmethod
    def _fill_from_defaults(cls, data):
        # `health.nonfinite.action=stop` alone keeps that monitor's default threshold and window.
        if not isinstance(data, dict):
            return data
        return {k: {**cls.model_fields[k].default_factory().model_dump(), **v} if isinstance(v, dict) and k in cls.model_fields else v
                for k, v in data.items()}
