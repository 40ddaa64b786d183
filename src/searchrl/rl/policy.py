"""The trained policy: loading (full weights or LoRA), the frozen reference, train/eval modes,
mixed precision.

Dropout stays off in every phase: PPO's ratio compares log-probs of the same weights computed
twice (old pass, then update), so they must be deterministic. Gradient checkpointing in
transformers keys on each decoder layer's own `training` flag, so `set_update_mode` switches only
those flags on, never the dropout modules inside them.
"""

from __future__ import annotations

from pathlib import Path

from searchrl.compat import checkpointing_layers, enable_checkpointing
from searchrl.errors import SearchRLError
from searchrl.rl.config import TrainConfig
from searchrl.rollout import precision


def compute_dtype(cfg: TrainConfig):
    """The dtype forward passes run in (`cfg.dtype`, with auto resolved for the device)."""
    return precision.compute_dtype(cfg.dtype, cfg.device)


def autocast(cfg: TrainConfig):
    """Mixed precision around forward passes when the compute dtype is below float32."""
    return precision.autocast(cfg.dtype, cfg.device)


def _require_peft():
    try:
        import peft
    except ImportError:
        raise SearchRLError(
            "algorithm.lora.enabled needs the peft package: pip install peft (or set algorithm.lora.enabled=false)"
        ) from None
    return peft


def load_policy(cfg: TrainConfig, checkpoint: Path | None = None, lora_resume: bool = False):
    """(model, tokenizer) to train: `cfg.model`, or a checkpoint's weights (its adapter, with LoRA)."""
    from searchrl.assets import load_model

    full_weights = checkpoint is not None and not lora_resume
    # Trained weights are float32 whatever the compute dtype (the master copy of mixed precision).
    model, tokenizer = load_model(str(checkpoint) if full_weights else cfg.model, device=cfg.device, dtype="float32")
    lora = cfg.algorithm.lora
    if lora.enabled:
        peft = _require_peft()
        if lora_resume and checkpoint is not None:
            model = peft.PeftModel.from_pretrained(model, str(checkpoint), is_trainable=True)
        else:
            spec = peft.LoraConfig(
                r=lora.r, lora_alpha=lora.alpha, lora_dropout=lora.dropout,
                target_modules=lora.target_modules, task_type="CAUSAL_LM",
            )
            model = peft.get_peft_model(model, spec)
    elif lora_resume:
        raise SearchRLError(f"{checkpoint} holds a LoRA adapter; resume with algorithm.lora.enabled=true")
    if cfg.algorithm.gradient_checkpointing:
        # Non-reentrant checkpointing needs no input that requires grad (frozen embeddings, LoRA).
        enable_checkpointing(model, use_reentrant=False)
    model.eval()
    return model, tokenizer


class FrozenReference:
    """The reference as its own frozen copy of the weights the stage started from."""

    def __init__(self, model) -> None:
        self.model = model

    def logprobs(self, batch, micro_batch_size: int, temperature: float, align=None):  # -> [B, T]
        from searchrl.rl.logprobs import batched_logprobs

        return batched_logprobs(self.model, batch, micro_batch_size, temperature, align=align)[0]


class AdapterOffReference:
    """With LoRA the reference is the policy's own base: the adapters switched off for the pass,
    so no second copy of the weights is held."""

    def __init__(self, peft_model) -> None:
        self.model = peft_model

    def logprobs(self, batch, micro_batch_size: int, temperature: float, align=None):  # -> [B, T]
        from searchrl.rl.logprobs import batched_logprobs

        with self.model.disable_adapter():
            return batched_logprobs(self.model, batch, micro_batch_size, temperature, align=align)[0]


Reference = FrozenReference | AdapterOffReference


def make_reference(cfg: TrainConfig, policy, stage_start: Path | None) -> Reference | None:
    """The frozen reference of a stage, in the compute dtype: None when kl_coef == 0, the policy
    with its adapters off under LoRA, else the weights the stage started from, read from disk
    (`cfg.model`, or the checkpoint that ended the previous stage), which is exact and never
    holds two float32 copies at once."""
    if cfg.algorithm.kl_coef == 0:
        return None
    if cfg.algorithm.lora.enabled:
        return AdapterOffReference(policy)
    from searchrl.assets import load_model

    ref, _ = load_model(str(stage_start) if stage_start is not None else cfg.model, device=cfg.device, dtype=compute_dtype(cfg))
    ref.requires_grad_(False)
    return FrozenReference(ref.eval())


def set_update_mode(model, gradient_checkpointing: bool) -> None:
    """Eval mode (no dropout), with decoder layers marked training when checkpointing, since
    that flag is what turns checkpointing on."""
    model.eval()
    if not gradient_checkpointing:
        return
    for layer in checkpointing_layers(model):
        layer.training = True
