"""`TrainConfig`: the one typed tree of a training run (docs/concepts/algorithms.md). Every field's description is
its help text; YAML files in `configs/` fill it and `key=value` overrides adjust it.

Paper settings (R1-Searcher, Song et al. 2025, arXiv:2503.05592, §4.2): Reinforce++ with a group
baseline, lr 2e-6, 16 samples per prompt, temperature 1.0, top-p 0.95, KL 0 (Qwen-2.5-7B-Base) or
1e-4 (Llama-3.1-8B-Instruct), bf16, gradient checkpointing, checkpoints every 10-20 steps.
"""

from __future__ import annotations

import sys
from typing import Literal

from pydantic import Field, field_validator, model_validator

from searchrl.config import StrictModel
from searchrl.rewards import RewardConfig
from searchrl.rl.health_config import HealthConfig
from searchrl.rollout.agent import AgentConfig, AgentDefaults
from searchrl.rollout.worker_config import Dtype, WorkerConfig


class LoraConfig(StrictModel):
    """Low-rank adapters (needs the `peft` package). The reference model is then the base with the
    adapter disabled, so no second copy of the weights is held."""

    enabled: bool = Field(False, description="Train LoRA adapters instead of all weights.")
    r: int = Field(16, ge=1, description="Adapter rank.")
    alpha: int = Field(32, ge=1, description="Adapter scaling numerator (scale = alpha / r).")
    dropout: float = Field(0.0, ge=0, lt=1, description="Adapter dropout; 0 keeps old and new log-probs comparable.")
    target_modules: str | list[str] = Field(
        "all-linear", description="Modules to adapt: a peft shorthand such as all-linear, or a list of module names."
    )


class AlgorithmConfig(StrictModel):
    """The policy update: advantages, clipped loss, KL, optimizer."""

    advantage: str = Field(
        "reinforce_pp",
        description="Advantage estimator: reinforce_pp (paper default: reward minus group mean, whitened over the batch), "
        "grpo ((r - mean) / std per group, Shao et al. 2024), rloo (leave-one-out baseline).",
    )
    clip_eps: float = Field(0.2, gt=0, description="PPO ratio clip ε (paper: 0.2).")
    clip_eps_high: float | None = Field(None, gt=0, description="Upper clip (DAPO's clip-higher); null = clip_eps.")
    loss_agg: Literal["token-mean", "seq-mean-token-mean"] = Field(
        "token-mean",
        description="How token losses are averaged: token-mean over all policy tokens of a mini-batch (R1-Searcher/OpenRLHF; "
        "long rollouts weigh more) or seq-mean-token-mean (each rollout counts once, the GRPO paper's form).",
    )
    off_policy: str = Field(
        "none",
        description="Off-policy correction to the behaviour policy (the sampler's own per-token log-probs, recorded at "
        "generation): none (the paper's: the trainer's recomputed old log-probs stand for the sampler); tis (truncated "
        "importance sampling, Yao et al. 2025: each token's clipped loss times min(pi_old / pi_sampler, is_cap)); "
        "decoupled (decoupled PPO, Hilton et al. 2022 / AReaL: the clip is taken against the policy at the start of the "
        "update, weighted by pi_old / pi_sampler, and tokens over is_cap are left out). Why: the sampler's log-probs "
        "differ from the trainer's even in sync mode (another engine or code path: vLLM kernels, bf16, a KV cache), "
        "and in async mode samples are policy versions old; both corrections keep the PPO clip, so updates stay in a "
        "trust region. Costs: a bias toward the sampler where the cap binds; none costs nothing. "
        "See docs/concepts/algorithms.md.",
    )
    is_cap: float = Field(
        2.0, ge=1.0, description="Cap of the off-policy weight pi_old / pi_sampler (tis truncates to it, decoupled drops "
        "tokens above it). Lower: less variance, more bias toward the sampler; higher: the reverse. Default 2 (Yao et al. 2025).",
    )
    kl_coef: float = Field(
        0.0, ge=0, description="KL-to-reference coefficient (paper: 0 for Qwen-2.5-7B-Base, 1e-4 for Llama-3.1-8B-Instruct). "
        "0 loads no reference model at all.",
    )
    kl_kind: Literal["k1-reward", "k3-loss"] = Field(
        "k1-reward",
        description="k1-reward: -kl_coef·(logp - ref_logp) as a per-token reward inside the advantage (R1-Searcher/OpenRLHF); "
        "k3-loss: kl_coef·k3 added to the loss (GRPO, arXiv:2402.03300 eq. 3).",
    )
    ppo_epochs: int = Field(1, ge=1, description="Passes over each rollout batch. More reuse samples more but drift off-policy (the clip guards it).")
    mini_batch_size: int | None = Field(
        None, ge=1, description="Rollouts per optimizer step, over all processes; the batch is split into ceil(B / this) "
        "near-equal updates per epoch (each process splits its own rows as many times). null = one update per epoch.",
    )
    micro_batch_size: int = Field(
        4, ge=1, description="Rollouts per forward/backward; gradients accumulate over a mini-batch, so this trades memory for speed and never changes the result.",
    )
    lr: float = Field(2e-6, gt=0, description="AdamW learning rate (paper: 2e-6 for 7-8B; a 135M model needs ~5e-5).")
    betas: tuple[float, float] = Field((0.9, 0.95), description="AdamW betas (OpenRLHF's defaults).")
    weight_decay: float = Field(0.0, ge=0, description="AdamW decoupled weight decay.")
    warmup_steps: int = Field(0, ge=0, description="Training steps of linear LR warm-up at the start of each stage.")
    lr_schedule: Literal["constant", "cosine", "linear"] = Field(
        "constant", description="LR after warm-up, per stage: constant, cosine or linear decay to min_lr_ratio·lr."
    )
    min_lr_ratio: float = Field(0.1, ge=0, le=1, description="Final LR of cosine/linear schedules as a fraction of lr.")
    max_grad_norm: float | None = Field(1.0, gt=0, description="Clip the gradient's global norm to this; null = no clipping.")
    entropy_coef: float = Field(0.0, ge=0, description="Entropy bonus weight (0 in the paper; entropy is logged either way).")
    gradient_checkpointing: bool = Field(False, description="Recompute activations in the backward pass (paper: on); saves memory, costs ~30% time.")
    lora: LoraConfig = Field(default_factory=LoraConfig, description="LoRA adapters (optional; needs peft).")

    @field_validator("advantage")
    @classmethod
    def _known_advantage(cls, v: str) -> str:
        from searchrl.rl.advantages import ADVANTAGES

        ADVANTAGES.get(v)
        return v

    @field_validator("off_policy")
    @classmethod
    def _known_correction(cls, v: str) -> str:
        from searchrl.rl.losses import OFF_POLICY_CORRECTIONS

        OFF_POLICY_CORRECTIONS.get(v)
        return v


class StageConfig(StrictModel):
    """One training stage: its data, its reward and its length."""

    enabled: bool = Field(True, description="Run this stage (stage1.enabled=false is the skip-Stage-1 ablation).")
    kind: Literal["rl", "sft"] = Field(
        "rl", description="rl: outcome-reward RL on the policy's own rollouts (the method). sft: the paper's SFT baseline "
        "(Table 4): supervised fine-tuning on gold search trajectories written from each question's supporting passages "
        "(searchrl.rollout.gold; needs supporting_ids and a local retrieval.index), masked as in RL, one per question "
        "(samples_per_prompt: 1), with the same optimizer, schedule and batches; the reward is not used.",
    )
    evidence: bool = Field(
        False, description="kind: sft only: after each documents block the gold trajectory first quotes the evidence of "
        "the passage just found: the question's evidence sentences (the toy world lists them: the sentence stating each "
        "hop's fact), else the sentence that names the next search's entity or the answer (searchrl.rollout.gold), so "
        "the policy sees where the entity it copies stands and which values a comparison compares. A deviation from "
        "the paper's SFT baseline, for small models that pick the wrong entity of a passage (docs/guides/sft.md).",
    )
    drop_shortcuts: bool = Field(
        False, description="Leave out questions that one search can answer: those whose first supporting passage names "
        "the answer while the question does not (searchrl.rollout.gold.shortcut; needs supporting_ids and a local "
        "retrieval.index). Data selection for multi-hop training: an outcome reward pays a rollout that stops after one "
        "search on such a question as much as one that searches on (docs/results.md, \"Training for the second hop\").",
    )
    dataset: str = Field("toyworld:train", description="Training questions: catalog name (r1s-stage1, toyworld:train, ...), a file, or hf:NAME.")
    question_types: list[str] | None = Field(
        None, description="Train only on questions of these types (Question.type: e.g. comparison, bridge-2hop; 2Wiki's "
        "compositional, inference); null = all."
    )
    reward: RewardConfig = Field(default_factory=RewardConfig, description="Reward of this stage: its preset (stage1, stage2), magnitudes and added terms.")
    steps: int = Field(10, ge=0, description="Training steps (one rollout batch each).")
    lr_scale: float = Field(
        1.0, gt=0, description="This stage's learning rate is algorithm.lr times this factor (schedule and rollbacks "
        "apply on top): e.g. an sft warm start at the full rate, then RL at a fraction that does not undo it.",
    )
    prompts_per_step: int = Field(4, ge=1, description="Questions per step.")
    micro_batch_size: int | None = Field(
        None, ge=1, description="This stage's rollouts per forward/backward; null = algorithm.micro_batch_size. E.g. SFT "
        "rows of different questions need small micro-batches for memory, while an RL group of 8 shares its prompt "
        "pass when it fits one micro-batch (fewer, larger passes are faster on a CPU).",
    )
    refill_flat_groups: int = Field(
        0, ge=0, description="rl stages, sync mode: drop the question groups whose rewards are all equal (their advantages "
        "are 0: they teach nothing but dilute the token mean) and draw up to this many rounds of other questions of the "
        "stage, seeded by the step, to refill the step to prompts_per_step groups with signal (DAPO's dynamic sampling, "
        "Yu et al. 2025). Costs the refill rounds' rollouts; 0 (the paper's) trains on every group drawn.",
    )
    samples_per_prompt: int = Field(
        8, ge=1, description="Rollouts per question, one baseline group (paper: 16); at least 2 in an rl stage (a group of one "
        "has no baseline: its advantage is 0), 1 in an sft stage."
    )


def _stage1() -> StageConfig:
    return StageConfig(dataset="toyworld:train", reward=RewardConfig(stage="stage1"))


def _stage2() -> StageConfig:
    return StageConfig(dataset="toyworld:train", reward=RewardConfig(stage="stage2"))


class LoggingConfig(StrictModel):
    """What a run writes besides metrics.jsonl."""

    sample_every: int = Field(1, ge=0, description="Write the step's trajectories to samples/step_XXXX.jsonl every N steps; 0 = never.")
    samples_per_dump: int | None = Field(None, ge=1, description="At most this many trajectories per dump; null = all of the step.")
    checkpoint_every: int = Field(10, ge=0, description="Save a checkpoint every N steps (and always at a stage's end); 0 = only at stage ends.")
    keep_last: int | None = Field(3, ge=1, description="Keep this many latest checkpoints (stage-end ones are always kept); null = all.")
    optimizer_in_latest_only: bool = Field(
        False,
        description="Keep the optimizer state (float32 Adam moments, twice the weights: most of a checkpoint) only in "
        "the newest checkpoint; older ones keep weights, RNG and trainer state, enough to evaluate, export or start a "
        "run from, and resuming from one (a rollback, a damaged newest) starts a fresh optimizer. One-process runs; "
        "sharded checkpoints keep theirs.",
    )
    report_to: list[Literal["tensorboard", "wandb", "mlflow"]] = Field(
        ["tensorboard"],
        description="Experiment trackers that get every metric of metrics.jsonl (same names and steps), the resolved "
        "config, and a table of sampled trajectories per sample dump: tensorboard (events in tb/), wandb (offline "
        "under the run directory unless WANDB_MODE is set; pip install 'searchrl[wandb]'), mlflow (a file store in "
        "mlruns/ unless MLFLOW_TRACKING_URI is set; pip install 'searchrl[mlflow]'); [] = metrics.jsonl only. "
        "Guide: docs/guides/trackers.md.",
    )
    progress: bool = Field(True, description="Print one line per step and a rollout progress bar.")

    @model_validator(mode="before")
    @classmethod
    def _old_tensorboard_key(cls, data):
        """`tensorboard: true|false` (before report_to; run directories' config.yaml still hold it)
        becomes report_to [tensorboard] or [], with a note; report_to wins when both are set."""
        if not isinstance(data, dict) or "tensorboard" not in data:
            return data
        data = dict(data)
        old = data.pop("tensorboard")
        if "report_to" in data:
            print(f"note: logging.tensorboard is replaced by logging.report_to; tensorboard: {old} is ignored "
                  f"(report_to is {data['report_to']})", file=sys.stderr)
            return data
        data["report_to"] = ["tensorboard"] if old else []
        print(f"note: logging.tensorboard is deprecated: read as logging.report_to: {data['report_to']} "
              "(write that instead; docs/guides/trackers.md)", file=sys.stderr)
        return data


class TrainConfig(AgentConfig):
    """A two-stage outcome-based RL run (R1-Searcher). `searchrl train --config FILE key=value ...`.
    The model is the policy to start from (a Stage-1 checkpoint, for one); the trainer sets the
    rollout's samples_per_question and seed per stage and step; it searches the toy world unless
    told otherwise."""

    defaults = AgentDefaults(
        retrieval={"index": "toyworld"},
        searches="training searches: set retrieval.index (a catalog index such as toyworld, or an index directory), "
        "retrieval.url or retrieval.web",
    )
    device: str = Field("cpu", description="Torch device: cpu, cuda, cuda:1, ...")
    dtype: Dtype = Field(
        "auto",
        description="Compute dtype: auto = float32 on CPU, bfloat16 on a GPU that has it (paper: bf16). With bfloat16 "
        "the trained weights stay float32 (an lr of 2e-6 is below bf16's resolution, so bf16 weights would not move) "
        "and forward passes run under autocast; the frozen reference is held in bfloat16.",
    )
    seed: int = Field(0, description="Seeds data order, sampling and update shuffling; same seed, same run (on the same hardware).")
    out: str | None = Field(None, description="Run directory; null = runs/train-YYYYmmdd-HHMMSS.")
    algorithm: AlgorithmConfig = Field(default_factory=AlgorithmConfig, description="Advantages, loss, KL, optimizer.")
    stage1: StageConfig = Field(default_factory=_stage1, description="Stage 1: learn to call search (R_retrieve + R_format).")
    stage2: StageConfig = Field(default_factory=_stage2, description="Stage 2: learn to use the results (R_answer + R_format); starts from Stage 1's weights.")
    logging: LoggingConfig = Field(default_factory=LoggingConfig, description="Samples, checkpoints, experiment trackers (TensorBoard, wandb, MLflow).")
    health: HealthConfig = Field(
        default_factory=HealthConfig, description="Collapse monitors run after every step (search rate, echoed answers, "
        "length, entropy, flat groups, log-prob mismatch, NaN/Inf, step time): values in metrics.jsonl, alarms in alarms.jsonl.",
    )
    debug_crash_after_step: int | None = Field(
        None, ge=1, description="Testing aid: raise right after this (global) step is logged, before its checkpoint, to exercise --resume.",
    )

    @model_validator(mode="after")
    def _check(self) -> TrainConfig:
        if self.rollout.greedy:
            raise ValueError("rollout.greedy must be false for training: a group of identical samples has no baseline signal")
        if self.rollout.mode == "async":
            if self.rollout.backend not in ("hf", "vllm"):
                raise ValueError(f"rollout.mode=async runs the hf or vllm backend in a worker process; rollout.backend="
                                 f"{self.rollout.backend} is not supported there: set rollout.backend=hf or vllm, or rollout.mode=sync")
            if self.rollout.partial == "continue" and self.rollout.round_quorum < 1:
                raise ValueError(f"rollout.partial=continue swaps weights between rounds, when no rollout is generating; with "
                                 f"rollout.round_quorum={self.rollout.round_quorum:g} some always are: set rollout.round_quorum=1 "
                                 "or rollout.partial=finish")
            sft = [f"stage{n}" for n in (1, 2) if self.stage(n).enabled and self.stage(n).kind == "sft"]
            if sft:
                raise ValueError(f"rollout.mode=async overlaps rollouts with updates, but {', '.join(sft)} is an sft stage "
                                 "(gold trajectories, no rollouts): set rollout.mode=sync")
        for n in (1, 2):
            stage = self.stage(n)
            if stage.kind == "rl" and stage.evidence:
                raise ValueError(f"stage{n}.evidence quotes sentences in gold trajectories, which only an sft stage trains on: "
                                 f"set stage{n}.kind=sft or stage{n}.evidence=false")
            if stage.kind == "sft" and stage.samples_per_prompt != 1:
                raise ValueError(f"stage{n}.kind is sft: set stage{n}.samples_per_prompt=1 (a question's gold trajectory is "
                                 "one fixed sequence; copies would only weigh it more)")
            if stage.refill_flat_groups and (stage.kind != "rl" or self.rollout.mode == "async"):
                raise ValueError(f"stage{n}.refill_flat_groups draws more rollouts within a step: it needs kind=rl and "
                                 "rollout.mode=sync (async workers generate the step's batch ahead); set it to 0")
            if stage.enabled and stage.kind == "rl" and stage.samples_per_prompt == 1:
                # Every estimator's baseline is the question's group (advantages.py): a group of one
                # is flat, so its advantage is 0 whatever the reward (Reinforce++ keeps only the KL term).
                raise ValueError(
                    f"stage{n}.samples_per_prompt=1 cannot learn: algorithm.advantage={self.algorithm.advantage} compares "
                    "each rollout with the other samples of its question, and a group of one has none, so every "
                    f"advantage is 0; set stage{n}.samples_per_prompt to 2 or more (paper: 16)"
                )
        return self

    def stage(self, number: int) -> StageConfig:
        return {1: self.stage1, 2: self.stage2}[number]

    def worker_config(self) -> WorkerConfig:
        """What this run's async rollout workers run: its agent sections, device, dtype and run
        directory (`out`, set by then); the trainer's own settings stay here."""
        return WorkerConfig(model=self.model, profile=self.profile, protocol=self.protocol, tools=self.tools,
                            rollout=self.rollout, retrieval=self.retrieval, device=self.device, dtype=self.dtype, run=self.out)
