"""`WorkerConfig`: what a rollout worker process of async training runs (docs/guides/async.md),
and nothing of the trainer's: the run's agent (model, profile, protocol, tools, rollout,
retrieval), the device and dtype it generates with, and the run it serves. The trainer builds it
from its own config (`TrainConfig.worker_config`); a local worker gets it as its process starts,
a remote one (`searchrl rollout serve`) in the trainer's first message, validated there with the
server's overrides (`rollout.worker_links.served_config`)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator

from searchrl.rollout.agent import AgentConfig, AgentDefaults
from searchrl.rollout.config import RolloutConfig

# A run's `dtype` setting (TrainConfig.dtype, WorkerConfig.dtype): how `rollout.precision` computes.
Dtype = Literal["auto", "float32", "bfloat16"]


class WorkerConfig(AgentConfig):
    """A rollout worker of async training: the run's agent, where it generates, the run it serves."""

    defaults = AgentDefaults(searches="a rollout worker searches: set retrieval.index, retrieval.url or retrieval.web")

    device: str = Field("cpu", description="Torch device the worker generates on: the trainer's `device` or its "
                        "`rollout.worker_devices` entry; on a served worker, what its overrides set.")
    dtype: Dtype = Field("auto", description="The run's compute dtype (its `dtype`): the precision of decoding on a "
                         "GPU; the hf backend decodes in float32 on CPU whatever it is.")
    run: str = Field(..., description="The trainer's run directory: the web search budget the worker's searches count "
                     "against (shared by the run's processes).")

    @field_validator("rollout")
    @classmethod
    def _trains(cls, v: RolloutConfig) -> RolloutConfig:
        """What the training config refuses for async rollouts, refused here too: a served worker's
        overrides are validated by this class alone."""
        if v.backend not in ("hf", "vllm"):
            raise ValueError(f"a rollout worker runs the hf or vllm backend; rollout.backend={v.backend} is not supported "
                             "there: set rollout.backend=hf or vllm")
        if v.greedy:
            raise ValueError("rollout.greedy must be false for training: a group of identical samples has no baseline signal")
        if v.partial == "continue" and v.round_quorum < 1:
            raise ValueError(f"rollout.partial=continue swaps weights between rounds, when no rollout is generating; with "
                             f"rollout.round_quorum={v.round_quorum:g} some always are: set rollout.round_quorum=1")
        return v
