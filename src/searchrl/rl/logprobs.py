"""Log-probs of response tokens under a model: the forward passes of a training step.

Notation for tensor shapes (see `searchrl.rl.batch`):
    b  rows of a micro-batch       P  padded prompt length      T  padded response length
    N  policy tokens of the micro-batch (mask == 1)             H  hidden size   V  vocabulary

Two savings, both exact (same values and gradients as the plain forward):

- **Output head at policy tokens only.** A log-prob is needed only where the loss mask is 1,
  so the decoder's hidden states are gathered there and the output head runs on [N, H] instead of
  [b, T, H]. Documents blocks are most of a search rollout's tokens, and the [b, T, V] logits
  are a step's largest tensor (V = 152k for Qwen). Models whose head transforms the logits
  (soft-capping, logit scale) or that do not expose decoder and head fall back to full logits.
- **One prompt pass per group** (`shared_prompt_logprobs`): the samples of a question share its
  prompt, so its keys/values are computed once and expanded to the group's rows; gradients of
  every response flow back into that single pass.

Values at non-policy positions are 0: nothing reads them.

A model sharded with FSDP2 runs neither saving (its root must run every forward, and one backward
per forward), and its ranks must run equally many forwards: `align` gives each pass the largest
count over ranks, and a rank short of it runs `idle_pass`es.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from searchrl.compat import (
    cache_kwarg,
    cache_tensors,
    dynamic_cache,
    output_cache,
    takes_logits_to_keep,
)
from searchrl.rl.batch import RolloutBatch, group_chunks, group_order
from searchrl.rl.losses import entropy_from_logits, token_logprobs
from searchrl.rl.sharding import is_sharded

# Positions per slice when reducing logits: bounds the softmax temporaries to [128, V] rows
# instead of another copy of the logits.
LOGIT_CHUNK = 128


def _split_head(model):
    """(decoder, output head) when logits may be taken at chosen positions, else None."""
    config = getattr(model, "config", None)
    if is_sharded(model):
        return None  # the decoder called alone would find the root's weights still sharded
    if getattr(config, "final_logit_softcapping", None) or getattr(config, "logit_scale", None):
        return None  # the model post-processes its logits: use them as it makes them
    try:
        decoder, head = model.get_decoder(), model.get_output_embeddings()
    except (AttributeError, NotImplementedError):
        return None
    if decoder is None or head is None or decoder is model:
        return None
    return decoder, head


def _expand_cache(cache, b: int):
    """A cache holding one row's keys/values as a view repeated over `b` rows."""
    expanded = [(k.expand(b, -1, -1, -1), v.expand(b, -1, -1, -1)) for k, v in cache_tensors(cache)]  # [b, heads, p, D]
    return dynamic_cache(expanded)


def _scores(logits: Tensor, labels: Tensor, temperature: float, with_entropy: bool, entropy_grad: bool):
    """log softmax(logits / temperature)[labels] and, optionally, the entropy; [..., V] -> [...]."""
    # Divided by the sampling temperature, as the sampler did, so old/new ratios and the logged
    # sampler mismatch compare like with like.
    if temperature != 1.0:
        logits = logits / temperature
    logp = token_logprobs(logits, labels, LOGIT_CHUNK)
    if not with_entropy:
        return logp, None
    # A logged-only entropy must not keep its softmax alive in the autograd graph.
    return logp, entropy_from_logits(logits if entropy_grad else logits.detach(), LOGIT_CHUNK)


def _at_policy_tokens(hidden: Tensor, head, mb: RolloutBatch, temperature, with_entropy, entropy_grad):
    """hidden [b, T, H], column j predicting response token j -> (logp [b, T], entropy [b, T])."""
    select = mb.mask.bool()  # [b, T]
    logits = head(hidden[select])[None]  # [1, N, V]
    logp_n, ent_n = _scores(logits, mb.labels[select][None], temperature, with_entropy, entropy_grad)
    logp = logp_n.new_zeros(select.shape)
    logp[select] = logp_n[0]
    if ent_n is None:
        return logp, None
    entropy = ent_n.new_zeros(select.shape)
    entropy[select] = ent_n[0]
    return logp, entropy


def response_logprobs(
    model, mb: RolloutBatch, temperature: float = 1.0, with_entropy: bool = False, entropy_grad: bool = False
) -> tuple[Tensor, Tensor | None]:
    """log π of every policy token of `mb` -> (logp [b, T], entropy [b, T] or None)."""
    t, p = mb.labels.shape[1], mb.prompt_len
    inputs = {"input_ids": mb.input_ids, "attention_mask": mb.attention_mask, "position_ids": mb.position_ids, "use_cache": False}
    split = _split_head(model)
    if split is not None:
        decoder, head = split
        hidden = decoder(**inputs).last_hidden_state[:, p - 1 : p - 1 + t]  # [b, T, H]
        return _at_policy_tokens(hidden, head, mb, temperature, with_entropy, entropy_grad)
    # Only the last T + 1 columns' logits: the prompt's would be the largest tensor of the step.
    out = model(**inputs, **({"logits_to_keep": t + 1} if takes_logits_to_keep(model) else {}))
    logits = out.logits[:, -(t + 1) : -1]  # [b, T, V]: column P - 1 + j predicts response token j
    return _scores(logits, mb.labels, temperature, with_entropy, entropy_grad)


def shared_prompt_logprobs(
    model, mb: RolloutBatch, temperature: float = 1.0, with_entropy: bool = False, entropy_grad: bool = False
) -> tuple[Tensor, Tensor | None]:
    """`response_logprobs` for rows that all share ONE prompt, running the prompt once.

    For P + b·T tokens instead of b·(P + T): with a 600-token few-shot prompt and 8 samples per
    question this halves a CPU training step. Not for gradient checkpointing with gradients on
    (checkpointed layers drop a passed-in cache).
    """
    b = len(mb)
    p = int(mb.attention_mask[0, : mb.prompt_len].sum())
    prompt = mb.input_ids[:1, mb.prompt_len - p : mb.prompt_len]  # [1, p]
    ones = torch.ones((b, p), dtype=mb.attention_mask.dtype, device=mb.attention_mask.device)
    response = {
        "input_ids": mb.labels,  # [b, T]
        "attention_mask": torch.cat([ones, mb.attention_mask[:, mb.prompt_len :]], dim=1),  # [b, p + T]
        "position_ids": mb.position_ids[:, mb.prompt_len :],
        "use_cache": True,
    }
    split = _split_head(model)
    net = split[0] if split is not None else model
    first = net(input_ids=prompt, use_cache=True)
    out = net(**response, **{cache_kwarg(net): _expand_cache(output_cache(first), b)})
    if split is not None:
        # The prompt's last position predicts response token 0; response column j predicts j + 1.
        last = first.last_hidden_state[:, -1:].expand(b, 1, -1)
        hidden = torch.cat([last, out.last_hidden_state[:, :-1]], dim=1)  # [b, T, H]
        return _at_policy_tokens(hidden, split[1], mb, temperature, with_entropy, entropy_grad)
    logits = torch.cat([first.logits[:, -1:].expand(b, 1, -1), out.logits[:, :-1]], dim=1)  # [b, T, V]
    return _scores(logits, mb.labels, temperature, with_entropy, entropy_grad)


def micro_logprobs(
    model,
    mb: RolloutBatch,
    temperature: float = 1.0,
    with_entropy: bool = False,
    share_prompt: bool = True,
    entropy_grad: bool = False,
) -> tuple[Tensor, Tensor | None]:
    """The shared-prompt pass when it applies (several rows of one group), else the plain one.
    `entropy_grad`: keep the entropy in the graph (an entropy bonus); else it is only logged."""
    shared = share_prompt and len(mb) > 1 and len(set(mb.group_ids)) == 1 and not is_sharded(model)
    fn = shared_prompt_logprobs if shared else response_logprobs
    return fn(model, mb, temperature, with_entropy, entropy_grad)


@torch.no_grad()
def batched_logprobs(
    model,
    batch: RolloutBatch,
    micro_batch_size: int,
    temperature: float = 1.0,
    with_entropy: bool = False,
    share_prompt: bool = True,
    align: Callable[[int], int] | None = None,
) -> tuple[Tensor, Tensor]:
    """Log-probs of the whole batch in micro-batches, no gradient -> ([B, T], entropy [B, T]).
    `align(n)`: the number of forwards every rank runs when this one needs `n`."""
    b, t = batch.labels.shape
    logp = torch.zeros((b, t), dtype=torch.float32, device=batch.labels.device)
    entropy = torch.zeros_like(logp)
    has_tokens = batch.mask.any(dim=-1).tolist()
    order = group_order(batch.group_ids, batch.response_lengths())
    active = torch.tensor([i for i in order.tolist() if has_tokens[i]], dtype=torch.long, device=batch.mask.device)
    chunks = group_chunks(active, batch.group_ids, micro_batch_size)
    passes = align(len(chunks)) if align else len(chunks)  # agreed before any rank's first forward
    for idx in chunks:
        lp, ent = micro_logprobs(model, batch.rows(idx), temperature, with_entropy, share_prompt)
        logp[idx, : lp.shape[1]] = lp.float()
        if ent is not None:
            entropy[idx, : ent.shape[1]] = ent.float()
    for _ in range(passes - len(chunks)):
        idle_pass(model)
    if is_sharded(model):  # FSDP keeps the root unsharded after a forward with no backward to follow
        model.reshard()
    return logp, entropy


def idle_pass(model, backward: bool = False) -> None:
    """A one-token forward (and backward) that changes nothing: what a sharded model's rank runs
    while the others still have micro-batches, so that every rank's collectives match."""
    ids = torch.zeros((1, 1), dtype=torch.long, device=next(model.parameters()).device)
    with torch.set_grad_enabled(backward):
        out = model(input_ids=ids, use_cache=False, **({"logits_to_keep": 1} if takes_logits_to_keep(model) else {}))
        if backward:
            (out.logits.float().sum() * 0.0).backward()
