"""`RolloutBatch`: a step's trajectories as padded tensors, and how rows are grouped into
micro-batches. The forward passes over it live in `searchrl.rl.logprobs`.

Notation for tensor shapes:
    B  rollouts in the batch (prompts × samples per prompt)
    P  padded prompt length (prompts are LEFT-padded, so every prompt ends at column P - 1)
    T  padded response length (responses are RIGHT-padded, so every response starts at column P)
    V  vocabulary size

With that layout the response of every row occupies the same columns [P, P + T), so the hidden
states that predict response tokens are the columns [P - 1, P + T - 1) of every row.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import torch
from torch import Tensor

from searchrl.data.trajectory import Trajectory


@dataclass
class RolloutBatch:
    input_ids: Tensor  # [B, P + T] prompt (left-padded) + response (right-padded)
    attention_mask: Tensor  # [B, P + T] 1 = a real token
    position_ids: Tensor  # [B, P + T] counts real tokens only, as during generation
    labels: Tensor  # [B, T] response token ids (pad id past each response's end)
    mask: Tensor  # [B, T] loss mask: 1 = sampled by the policy; 0 = env token or padding
    behaviour_logp: Tensor  # [B, T] log-probs the sampler reported: the behaviour policy (0 at masked tokens)
    rewards: Tensor  # [B] outcome reward per rollout
    group_ids: list[int]  # [B] which prompt of the step each rollout answers
    prompt_len: int  # P
    old_logp: Tensor | None = None  # [B, T] current policy before the update, recomputed
    ref_logp: Tensor | None = None  # [B, T] frozen reference model
    advantages: Tensor | None = None  # [B, T]
    entropy: Tensor | None = None  # [B, T] policy entropy at each token (logged only)

    def __len__(self) -> int:
        return self.labels.shape[0]

    def rows(self, idx: Tensor) -> RolloutBatch:
        """The rollouts `idx` [b], with the columns none of them uses cut off (both ends)."""
        real = self.attention_mask[idx].any(dim=0).nonzero()
        left = min(int(real[0]), self.prompt_len - 1) if len(real) else 0
        t = max(int(self.response_lengths()[idx].max()), 1)
        cut = {name: getattr(self, name)[idx][:, left : self.prompt_len + t] for name in _SEQ_FIELDS}
        for name in _TOKEN_FIELDS:
            value = getattr(self, name)
            cut[name] = None if value is None else value[idx][:, :t]
        return replace(
            self,
            **cut,
            rewards=self.rewards[idx],
            group_ids=[self.group_ids[i] for i in idx.tolist()],
            prompt_len=self.prompt_len - left,
        )

    def response_lengths(self) -> Tensor:  # [B]
        return self.attention_mask[:, self.prompt_len :].sum(dim=-1)


_SEQ_FIELDS = ("input_ids", "attention_mask", "position_ids")  # [B, P + T]
_TOKEN_FIELDS = ("labels", "mask", "behaviour_logp", "old_logp", "ref_logp", "advantages", "entropy")  # [B, T]


def make_batch(
    trajs: Sequence[Trajectory], rewards: Sequence[float], group_ids: Sequence[int], pad_id: int, device
) -> RolloutBatch:
    """Pad trajectories into a `RolloutBatch`; T is at least 1 so an empty response still has a column."""
    b = len(trajs)
    p = max(len(t.prompt_ids) for t in trajs)
    t_max = max(max(len(t.token_ids) for t in trajs), 1)
    ids = torch.full((b, p + t_max), pad_id, dtype=torch.long)
    attn = torch.zeros((b, p + t_max), dtype=torch.long)
    pos = torch.zeros((b, p + t_max), dtype=torch.long)
    mask = torch.zeros((b, t_max), dtype=torch.long)
    behaviour_logp = torch.zeros((b, t_max), dtype=torch.float32)
    for i, tr in enumerate(trajs):
        n_p, n_r = len(tr.prompt_ids), len(tr.token_ids)
        ids[i, p - n_p : p] = torch.tensor(tr.prompt_ids, dtype=torch.long)
        ids[i, p : p + n_r] = torch.tensor(tr.token_ids, dtype=torch.long)
        attn[i, p - n_p : p + n_r] = 1
        pos[i, p - n_p : p + n_r] = torch.arange(n_p + n_r)
        mask[i, :n_r] = torch.tensor(tr.loss_mask, dtype=torch.long)
        behaviour_logp[i, :n_r] = torch.tensor(tr.logprobs, dtype=torch.float32)
    return RolloutBatch(
        input_ids=ids.to(device),
        attention_mask=attn.to(device),
        position_ids=pos.to(device),
        labels=ids[:, p:].to(device),
        mask=mask.to(device),
        # Masked like every token field: whatever a backend reported at an inserted token is not
        # the behaviour policy's (it never sampled it).
        behaviour_logp=torch.where(mask.bool(), behaviour_logp, 0.0).to(device),
        rewards=torch.tensor(list(rewards), dtype=torch.float32, device=device),
        group_ids=list(group_ids),
        prompt_len=p,
    )


def group_order(group_ids: Sequence[int], lengths: Tensor, g: torch.Generator | None = None) -> Tensor:  # [B]
    """Row order for micro-batching: each group's rows adjacent (they can share the prompt
    pass) and sorted by response length (a micro-batch pads to its longest row, and one
    rollout with two documents blocks is several times longer than one without). Groups come
    in a random order drawn from `g`, or in order without it."""
    groups = sorted(set(group_ids))
    if g is not None:
        groups = [groups[k] for k in torch.randperm(len(groups), generator=g).tolist()]
    length = lengths.tolist()
    out = []
    for gid in groups:
        out.extend(sorted((i for i, x in enumerate(group_ids) if x == gid), key=lambda i: (length[i], i)))
    return torch.tensor(out, dtype=torch.long)


def group_chunks(order: Tensor, group_ids: Sequence[int], size: int) -> list[Tensor]:
    """Split the row indices `order` into runs of at most `size` rows that never cross a group
    boundary (so each run can share its prompt pass)."""
    chunks: list[list[int]] = []
    for i in order.tolist():
        if not chunks or len(chunks[-1]) == size or group_ids[chunks[-1][-1]] != group_ids[i]:
            chunks.append([])
        chunks[-1].append(i)
    return [torch.tensor(c, dtype=torch.long, device=order.device) for c in chunks]
