"""The actor: the policy being trained and everything that changes it — optimizer, LR schedule,
the frozen reference, the log-prob passes, checkpoints. It never knows which backend generated
the trajectories it learns from.

Every normaliser takes its denominator from outside (`units` of a mini-batch, the whitening
`moments`): one process passes its own counts, several processes would pass global ones, and
the gradients summed over micro-batches (and processes) are those of the whole mini-batch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from searchrl.rl import checkpoint as ckpt
from searchrl.rl.batch import RolloutBatch, group_chunks, group_order
from searchrl.rl.config import TrainConfig
from searchrl.rl.logprobs import batched_logprobs, micro_logprobs
from searchrl.rl.losses import LOSS_AGGREGATIONS, PolicyLossStats, kl_loss, loss_units, policy_loss
from searchrl.rl.policy import Reference, autocast, load_policy, make_reference, set_update_mode


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

    def stats(self, lr: float) -> UpdateStats:
        n, per_token = len(self.grad_norms), max(self.tokens, 1)
        return UpdateStats(
            pg_loss=self.pg_loss / max(n, 1), kl_loss=self.kl_loss / max(n, 1),
            clip_frac=self.clip_frac / per_token, approx_kl=self.approx_kl / per_token,
            ratio_mean=self.ratio_mean / per_token if self.tokens else 1.0,
            grad_norm=float(np.mean(self.grad_norms)) if n else 0.0, updates=n, lr=lr,
        )


class Actor:
    """The trained policy (a transformers causal LM, LoRA-wrapped or not) and its optimizer."""

    def __init__(self, cfg: TrainConfig, model, tokenizer) -> None:
        self.cfg, self.model, self.tokenizer = cfg, model, tokenizer
        self.optimizer: torch.optim.Optimizer | None = None
        self.reference: Reference | None = None

    @classmethod
    def load(cls, cfg: TrainConfig, checkpoint: Path | None = None, lora_resume: bool = False) -> Actor:
        """`cfg.model`, or a checkpoint's weights (its adapter, with LoRA)."""
        return cls(cfg, *load_policy(cfg, checkpoint, lora_resume))

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @property
    def pad_id(self) -> int:
        return self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0

    def autocast(self):
        return autocast(self.cfg)

    def start_stage(self, reference_source: Path | None, optimizer_state: dict | None = None) -> None:
        """A fresh optimizer (or the saved one, resuming) and the stage's reference, as the
        authors launch Stage 2: from Stage 1's weights, with new optimizer state."""
        alg = self.cfg.algorithm
        self.optimizer = torch.optim.AdamW(
            [p for p in self.model.parameters() if p.requires_grad], lr=alg.lr, betas=alg.betas, weight_decay=alg.weight_decay
        )
        if optimizer_state is not None:
            self.optimizer.load_state_dict(optimizer_state)
        self.reference = None  # the previous stage's copy goes before the next one loads
        self.reference = make_reference(self.cfg, self.model, reference_source)

    def end_stage(self) -> None:
        self.optimizer, self.reference = None, None

    # -- log-prob passes --------------------------------------------------------------------------
    def logprobs(self, batch: RolloutBatch) -> tuple[torch.Tensor, torch.Tensor]:
        """(log-probs [B, T], entropy [B, T]) of the batch under the current weights, no gradient."""
        with self.autocast():
            return batched_logprobs(self.model, batch, self.cfg.algorithm.micro_batch_size, self.cfg.rollout.temperature, with_entropy=True)

    def reference_logprobs(self, batch: RolloutBatch) -> torch.Tensor | None:  # [B, T]
        if self.reference is None:
            return None
        with self.autocast():
            return self.reference.logprobs(batch, self.cfg.algorithm.micro_batch_size, self.cfg.rollout.temperature)

    # -- the update -------------------------------------------------------------------------------
    def updates_per_step(self, batch_size: int) -> int:
        alg = self.cfg.algorithm
        return alg.ppo_epochs * math.ceil(batch_size / (alg.mini_batch_size or batch_size))

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

    def update(self, batch: RolloutBatch, stage_step: int, stage_steps: int, shuffle: torch.Generator) -> UpdateStats:
        """`ppo_epochs` passes of clipped updates over the batch in mini-batches, micro-batched
        with gradient accumulation. When `batch.old_logp` is None (one update per batch), each
        micro-batch's own first forward runs on the weights that sampled, so its detached
        log-probs become the old ones (and its entropy the logged one)."""
        alg, b = self.cfg.algorithm, len(batch)
        mini, per_step = alg.mini_batch_size or b, self.updates_per_step(b)
        old_from_update = batch.old_logp is None
        if old_from_update:
            batch.old_logp, batch.entropy = torch.zeros_like(batch.sample_logp), torch.zeros_like(batch.sample_logp)
        # Nothing to learn when every advantage is 0 and no other term has a gradient.
        has_signal = bool(batch.advantages.abs().sum() > 0) or alg.entropy_coef > 0 or self._k3_kl(batch)
        params = [p for p in self.model.parameters() if p.requires_grad]
        acc = _Accumulator()
        for epoch in range(alg.ppo_epochs):
            order = group_order(batch.group_ids, batch.response_lengths(), shuffle).to(batch.mask.device)
            for u, start in enumerate(range(0, b, mini)):
                rows = order[start : start + mini]
                units = loss_units(batch.mask[rows], alg.loss_agg)  # the mini-batch's denominator
                self._set_lr(stage_step * per_step + epoch * math.ceil(b / mini) + u, stage_steps, per_step)
                if not has_signal or units == 0:
                    continue  # no policy token, or nothing to learn from
                self.optimizer.zero_grad(set_to_none=True)
                set_update_mode(self.model, alg.gradient_checkpointing)
                for idx in group_chunks(rows, batch.group_ids, alg.micro_batch_size):
                    if bool(batch.mask[idx].any()):
                        self._backward(batch, idx, units, old_from_update, acc)
                acc.grad_norms.append(float(torch.nn.utils.clip_grad_norm_(params, alg.max_grad_norm or float("inf"))))
                self.optimizer.step()
        self.model.eval()
        return acc.stats(self.optimizer.param_groups[0]["lr"])

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
        pg_loss, stats = policy_loss(logp, mb.old_logp, mb.advantages, mb.mask, alg.clip_eps, alg.clip_eps_high, alg.loss_agg, units)
        loss = pg_loss
        if self._k3_kl(batch):
            kl_term = kl_loss(logp, mb.ref_logp, mb.mask, "k3", alg.loss_agg, units)
            loss = loss + alg.kl_coef * kl_term
            acc.kl_loss += float(kl_term.detach())
        if alg.entropy_coef > 0:  # a bonus, aggregated as the loss is
            loss = loss - alg.entropy_coef * LOSS_AGGREGATIONS.get(alg.loss_agg)(ent, mb.mask, units)
        loss.backward()
        acc.add(float(pg_loss.detach()), stats, int(mb.mask.sum()))

    def _k3_kl(self, batch: RolloutBatch) -> bool:
        return self.cfg.algorithm.kl_kind == "k3-loss" and batch.ref_logp is not None

    def _set_lr(self, update: int, stage_steps: int, per_step: int) -> None:
        for group in self.optimizer.param_groups:
            group["lr"] = self.cfg.algorithm.lr * self.lr_factor(update, stage_steps, per_step)

    # -- checkpoints ------------------------------------------------------------------------------
    def save(self, run_dir: Path, step: int, state: ckpt.TrainerState) -> Path:
        return ckpt.save_checkpoint(run_dir, step, self.model, self.tokenizer, state)
