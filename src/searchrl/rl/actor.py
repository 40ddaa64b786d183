"""The actor: the policy being trained and everything that changes it — optimizer, LR schedule,
the frozen reference, the log-prob passes, checkpoints. It never knows which backend generated
the trajectories it learns from.

Every normaliser takes its denominator from outside (`units` of a mini-batch, the whitening
`moments`): one process passes its own counts, several processes (`torchrun`, the policy sharded
with FSDP2) pass global ones, and the gradients summed over micro-batches and processes are
those of the whole mini-batch. Every choice that changes how many passes or optimizer steps run
is taken by all ranks together (`Dist.any`, `Dist.max_count`).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from searchrl.checkpoint_meta import agent_settings
from searchrl.errors import SearchRLError
from searchrl.rl import checkpoint as ckpt
from searchrl.rl import sharding
from searchrl.rl.batch import RolloutBatch, group_chunks, group_order
from searchrl.rl.config import TrainConfig
from searchrl.rl.distributed import LOCAL, Dist
from searchrl.rl.logprobs import batched_logprobs, idle_pass, micro_logprobs
from searchrl.rl.losses import (
    LOSS_AGGREGATIONS,
    PolicyLossStats,
    kl_loss,
    loss_units,
    off_policy_weight,
    policy_loss,
    sft_loss,
)
from searchrl.rl.policy import (
    Reference,
    autocast,
    compute_dtype,
    load_policy,
    make_reference,
    set_update_mode,
)
from searchrl.rollout.weights import whole_tensor


@dataclass(frozen=True)
class UpdateStats:
    """What one batch's updates did: losses as minimised, averaged over the optimizer steps; ratio
    statistics averaged over the policy tokens trained on."""

    pg_loss: float
    kl_loss: float  # the k3 loss term (0 unless kl_kind is k3-loss)
    clip_frac: float
    approx_kl: float
    ratio_mean: float
    grad_norm: float  # mean over optimizer steps, before clipping
    updates: int  # optimizer steps taken
    lr: float  # learning rate of the last update


@dataclass
class _Accumulator:
    """Running sums of an update: losses as minimised (each micro-batch's share of its mini-batch),
    ratio statistics weighted by policy tokens, one gradient norm per optimizer step."""

    pg_loss: float = 0.0
    kl_loss: float = 0.0
    clip_frac: float = 0.0
    approx_kl: float = 0.0
    ratio_mean: float = 0.0
    tokens: int = 0
    grad_norms: list[float] = field(default_factory=list)

    def add(self, pg_loss: float, stats: PolicyLossStats, tokens: int) -> None:
        self.pg_loss += pg_loss
        self.clip_frac += stats.clip_frac * tokens
        self.approx_kl += stats.approx_kl * tokens
        self.ratio_mean += stats.ratio_mean * tokens
        self.tokens += tokens

    def reduced(self, d: Dist) -> _Accumulator:
        """Sums over every rank (each rank's losses are its share of the global mini-batch's;
        the gradient norm is already global)."""
        sums = d.sum(torch.tensor([self.pg_loss, self.kl_loss, self.clip_frac, self.approx_kl, self.ratio_mean, self.tokens], dtype=torch.float64))
        *floats, tokens = sums.tolist()
        return _Accumulator(*floats, tokens=int(tokens), grad_norms=self.grad_norms)

    def stats(self, lr: float) -> UpdateStats:
        n, per_token = len(self.grad_norms), max(self.tokens, 1)
        return UpdateStats(
            pg_loss=self.pg_loss / max(n, 1), kl_loss=self.kl_loss / max(n, 1),
            clip_frac=self.clip_frac / per_token, approx_kl=self.approx_kl / per_token,
            ratio_mean=self.ratio_mean / per_token if self.tokens else 1.0,
            grad_norm=float(np.mean(self.grad_norms)) if n else 0.0, updates=n, lr=lr,
        )


# SFT trains on written tokens, not on samples of an old policy: no ratio, nothing clipped.
_NO_RATIO = PolicyLossStats(clip_frac=0.0, approx_kl=0.0, ratio_mean=1.0)


class Actor:
    """The trained policy (a transformers causal LM, LoRA-wrapped or not) and its optimizer."""

    def __init__(self, cfg: TrainConfig, model, tokenizer, dist: Dist = LOCAL) -> None:
        self.cfg, self.model, self.tokenizer, self.dist = cfg, model, tokenizer, dist
        self.optimizer: torch.optim.Optimizer | None = None
        self.reference: Reference | None = None
        # The policy version: training steps whose update has been applied (`update` calls), over
        # the whole run; a resumed run sets it from its checkpoint. Rollouts carry the version that
        # sampled them (`Trajectory.policy_version`), so their staleness is this minus that.
        self.version = 0
        self.micro_batch_size = cfg.algorithm.micro_batch_size  # the stage's, from `start_stage`

    @classmethod
    def load(cls, cfg: TrainConfig, checkpoint: Path | None = None, lora_resume: bool = False, dist: Dist = LOCAL) -> Actor:
        """`cfg.model`, or a checkpoint's weights (its adapter, with LoRA); sharded over the ranks
        of `dist` when launched by torchrun."""
        if not dist.sharded:
            return cls(cfg, *load_policy(cfg, checkpoint, lora_resume))
        if cfg.algorithm.lora.enabled:
            raise SearchRLError("LoRA is trained in one process; with torchrun train all weights (algorithm.lora.enabled=false)")
        model, tokenizer = load_policy(cfg)
        sharding.shard(model, compute_dtype(cfg))
        if checkpoint is not None:
            sharding.load_sharded_model(checkpoint / ckpt.SHARDED_DIR, model)
        return cls(cfg, model, tokenizer, dist)

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @property
    def pad_id(self) -> int:
        return self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0

    def autocast(self):
        return autocast(self.cfg)

    def start_stage(self, reference_source: Path | None, resume_from: tuple[Path, ckpt.TrainerState] | None = None,
                    micro_batch_size: int | None = None) -> None:
        """A fresh optimizer (or, resuming, the one saved with the checkpoint `resume_from` =
        (folder, its trainer state)) and the stage's reference, as the authors launch Stage 2:
        from Stage 1's weights, with new optimizer state. `micro_batch_size`: the stage's rows per
        forward (`StageConfig.micro_batch_size`; None = `algorithm.micro_batch_size`)."""
        alg = self.cfg.algorithm
        self.micro_batch_size = micro_batch_size or alg.micro_batch_size
        self.optimizer = torch.optim.AdamW(
            [p for p in self.model.parameters() if p.requires_grad], lr=alg.lr, betas=alg.betas, weight_decay=alg.weight_decay
        )
        if resume_from is not None:
            folder, saved = resume_from
            if self.dist.sharded:
                sharding.load_sharded_optimizer(folder / ckpt.SHARDED_DIR, self.model, self.optimizer)
            elif saved.optimizer is None:  # an older checkpoint under logging.optimizer_in_latest_only
                print(f"{folder.name} holds no optimizer state (logging.optimizer_in_latest_only): the optimizer "
                      "starts fresh", flush=True)
            else:  # already read with the trainer state: not loaded from disk a second time
                self.optimizer.load_state_dict(saved.optimizer)
        self.reference = None  # the previous stage's copy goes before the next one loads
        self.reference = make_reference(self.cfg, self.model, reference_source)
        if self.reference is not None and self.dist.sharded:
            sharding.shard(self.reference.model, compute_dtype(self.cfg))

    def end_stage(self) -> None:
        self.optimizer, self.reference = None, None

    # -- log-prob passes --------------------------------------------------------------------------
    def logprobs(self, batch: RolloutBatch) -> tuple[torch.Tensor, torch.Tensor]:
        """(log-probs [B, T], entropy [B, T]) of the batch under the current weights, no gradient."""
        with self.autocast():
            return batched_logprobs(self.model, batch, self.micro_batch_size, self.cfg.rollout.temperature,
                                    with_entropy=True, align=self.dist.max_count)

    def reference_logprobs(self, batch: RolloutBatch) -> torch.Tensor | None:  # [B, T]
        if self.reference is None:
            return None
        with self.autocast():
            return self.reference.logprobs(batch, self.micro_batch_size, self.cfg.rollout.temperature, self.dist.max_count)

    # -- the update -------------------------------------------------------------------------------
    def mini_batches(self, batch_size: int) -> int:
        """Optimizer steps per epoch: the global batch (all ranks' `batch_size`) over
        `mini_batch_size`. Each rank splits its own rows into as many near-equal parts, so all
        ranks step together even when their batches differ in size (a collective call)."""
        mini, total = self.cfg.algorithm.mini_batch_size, int(self.dist.total(batch_size))
        return math.ceil(total / mini) if mini else 1

    def lr_factor(self, update: int, steps: int, updates_per_step: int) -> float:
        """LR multiplier at optimizer update `update` of a stage of `steps` steps (warm-up, then
        the schedule)."""
        alg = self.cfg.algorithm
        warm, total = alg.warmup_steps * updates_per_step, max(steps * updates_per_step, 1)
        if update < warm:
            return (update + 1) / warm
        progress = min((update - warm) / max(total - warm, 1), 1.0)
        if alg.lr_schedule == "cosine":
            return alg.min_lr_ratio + (1 - alg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))
        if alg.lr_schedule == "linear":
            return 1.0 - (1 - alg.min_lr_ratio) * progress
        return 1.0

    def update(self, batch: RolloutBatch, stage_step: int, stage_steps: int, shuffle: torch.Generator,
               objective: str = "rl", lr_scale: float = 1.0) -> UpdateStats:
        """`ppo_epochs` passes of clipped updates over the batch in mini-batches, micro-batched
        with gradient accumulation. When `batch.old_logp` is None (one update per batch), each
        micro-batch's own first forward runs on the weights that sampled, so its detached
        log-probs become the old ones (and its entropy the logged one).

        `objective="sft"`: the same passes minimise the masked NLL (`losses.sft_loss`, at
        temperature 1) of written trajectories instead: no old log-probs or advantages, and rows
        of different prompts share micro-batches (`pg_loss` then holds the NLL). `lr_scale`: the
        stage's factor on the learning rate (`StageConfig.lr_scale`)."""
        alg = self.cfg.algorithm
        sft = objective == "sft"
        n_mini = self.mini_batches(len(batch))
        per_step = alg.ppo_epochs * n_mini
        old_from_update = not sft and batch.old_logp is None
        if old_from_update:
            batch.old_logp, batch.entropy = torch.zeros_like(batch.behaviour_logp), torch.zeros_like(batch.behaviour_logp)
        # Nothing to learn when every advantage of every rank is 0 and no other term has a gradient.
        has_signal = sft or self.dist.any(bool(batch.advantages.abs().sum() > 0)) or alg.entropy_coef > 0 or self._k3_kl(batch)
        params = [p for group in self.optimizer.param_groups for p in group["params"]]
        acc = _Accumulator()
        for epoch in range(alg.ppo_epochs):
            order = group_order(batch.group_ids, batch.response_lengths(), shuffle).to(batch.mask.device)
            for u, rows in enumerate(torch.tensor_split(order, n_mini)):
                units = int(self.dist.total(loss_units(batch.mask[rows], alg.loss_agg)))  # the global mini-batch's denominator
                self._set_lr(stage_step * per_step + epoch * n_mini + u, stage_steps, per_step, lr_scale)
                if not has_signal or units == 0:
                    continue  # no policy token, or nothing to learn from
                self.optimizer.zero_grad(set_to_none=True)
                set_update_mode(self.model, alg.gradient_checkpointing)
                # A group shares its prompt pass; SFT rows are each their own question, taken by
                # length so a micro-batch pads little (the mini-batch's gradient is one sum).
                if sft:
                    rows = rows[torch.argsort(batch.response_lengths()[rows].cpu(), stable=True).to(rows.device)]
                split = torch.split(rows, self.micro_batch_size) if sft else group_chunks(rows, batch.group_ids, self.micro_batch_size)
                chunks = [idx for idx in split if bool(batch.mask[idx].any())]
                passes = self.dist.max_count(len(chunks))  # agreed before any rank's first forward
                for idx in chunks:
                    if sft:
                        self._sft_backward(batch, idx, units, acc)
                    else:
                        self._backward(batch, idx, units, old_from_update, acc)
                for _ in range(passes - len(chunks)):
                    idle_pass(self.model, backward=True)
                norm = torch.nn.utils.clip_grad_norm_(params, alg.max_grad_norm or float("inf"))
                acc.grad_norms.append(float(whole_tensor(norm)))  # sharded: a DTensor of the global norm
                self.optimizer.step()
        self.model.eval()
        self.version += 1
        return acc.reduced(self.dist).stats(self.optimizer.param_groups[0]["lr"])

    def _backward(self, batch: RolloutBatch, idx: torch.Tensor, units: int, old_from_update: bool, acc: _Accumulator) -> None:
        """Loss and backward of the micro-batch `idx`, divided by its mini-batch's `units`."""
        alg, mb = self.cfg.algorithm, batch.rows(idx)
        # Checkpointed layers drop a passed-in cache, so the shared-prompt pass needs it off.
        share_prompt = not alg.gradient_checkpointing
        with self.autocast():  # the backward follows the dtypes autocast chose
            logp, ent = micro_logprobs(self.model, mb, self.cfg.rollout.temperature, True, share_prompt, entropy_grad=alg.entropy_coef > 0)
        if old_from_update:
            mb.old_logp = logp.detach()
            batch.old_logp[idx, : logp.shape[1]] = mb.old_logp
            batch.entropy[idx, : ent.shape[1]] = ent.detach()
        # The proximal policy is the one at the start of the update (old_logp); the weight corrects
        # for the sampler's (behaviour) log-probs differing from it. None with off_policy: none.
        weight = off_policy_weight(alg.off_policy, mb.old_logp, mb.behaviour_logp, mb.mask, alg.is_cap)
        pg_loss, stats = policy_loss(logp, mb.old_logp, mb.advantages, mb.mask, alg.clip_eps, alg.clip_eps_high, alg.loss_agg, units,
                                     is_weight=weight)
        loss = pg_loss
        if self._k3_kl(batch):
            kl_term = kl_loss(logp, mb.ref_logp, mb.mask, "k3", alg.loss_agg, units)
            loss = loss + alg.kl_coef * kl_term
            acc.kl_loss += float(kl_term.detach())
        if alg.entropy_coef > 0:  # a bonus, aggregated as the loss is
            loss = loss - alg.entropy_coef * LOSS_AGGREGATIONS.get(alg.loss_agg)(ent, mb.mask, units)
        loss.backward()
        acc.add(float(pg_loss.detach()), stats, int(mb.mask.sum()))

    def _sft_backward(self, batch: RolloutBatch, idx: torch.Tensor, units: int, acc: _Accumulator) -> None:
        """Masked NLL and backward of the micro-batch `idx`, divided by its mini-batch's `units`."""
        mb = batch.rows(idx)
        with self.autocast():
            logp, _ = micro_logprobs(self.model, mb, 1.0, share_prompt=False)
        loss = sft_loss(logp, mb.mask, self.cfg.algorithm.loss_agg, units)
        loss.backward()
        acc.add(float(loss.detach()), _NO_RATIO, int(mb.mask.sum()))

    def _k3_kl(self, batch: RolloutBatch) -> bool:
        return self.cfg.algorithm.kl_kind == "k3-loss" and batch.ref_logp is not None

    def _set_lr(self, update: int, stage_steps: int, per_step: int, scale: float) -> None:
        for group in self.optimizer.param_groups:
            group["lr"] = self.cfg.algorithm.lr * scale * self.lr_factor(update, stage_steps, per_step)

    # -- checkpoints ------------------------------------------------------------------------------
    def save(self, run_dir: Path, step: int, state: ckpt.TrainerState, export: bool,
             also: Callable[[Path], None] | None = None) -> Path:
        """Checkpoint `step` with the optimizer and RNG states. One process writes the model with
        `save_pretrained`; sharded, every rank writes its shards (DCP) and its RNG, and `export`
        (a stage's end) adds the whole model as a `save_pretrained` folder. `also(folder)`, on
        every rank, writes the run's other files into the checkpoint (async batches ahead)."""
        if not self.dist.sharded:
            state = dataclasses.replace(state, optimizer=self.optimizer.state_dict())

            def write(folder: Path) -> None:
                ckpt.save_rank_rng(folder, 0)
                self.model.save_pretrained(folder)
                self.tokenizer.save_pretrained(folder)
                if also is not None:
                    also(folder)
        else:
            def write(folder: Path) -> None:
                sharding.save_sharded(folder / ckpt.SHARDED_DIR, self.model, self.optimizer)
                ckpt.save_rank_rng(folder, self.dist.rank)
                if export:
                    sharding.export_full(folder, self.model, self.dist.main)
                if self.dist.main:
                    self.tokenizer.save_pretrained(folder)
                if also is not None:
                    also(folder)
        return ckpt.save_checkpoint(run_dir, step, write, state, self.dist, agent=agent_settings(self.cfg))
