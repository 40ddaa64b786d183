"""KV-cache rows of the transformers backend: groups of rows sharing one cache, and the
select / merge / trim operations that move rows between groups (see `hf_backend`'s docstring)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from searchrl.compat import cache_tensors


@dataclass
class Group:
    """Rows sharing one cache. `handles[i]` owns row i.

    Fresh from a merge or split, the keys/values are plain tensors (`init_kv`); the first forward
    wraps them in a cache (`make_cache`) that then lives as long as the group, so a decode step
    costs the cache's own append and nothing more.
    """

    handles: list[int]
    init_kv: list[tuple[torch.Tensor, torch.Tensor]]  # per layer, each [B, H, L, D]; [] when L == 0
    mask: torch.Tensor  # [B, L] long, 1 = real token
    cache: object | None = None

    @property
    def length(self) -> int:
        return self.mask.shape[1]

    @property
    def kv(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        return cache_tensors(self.cache) if self.cache is not None else self.init_kv


# Cache tensors. Groups keep per-layer (keys, values) tensors between merges and splits; the
# cache object wrapped around them lives as long as the group.


def make_cache(kv):
    """A cache holding `kv` (per layer [B, H, L, D]); empty when `kv` is []."""
    from transformers.cache_utils import Cache

    cache = Cache(layer_class_to_replicate=_growing_layer_class())
    for i, (k, v) in enumerate(kv):
        cache.update(k, v, i)
    return cache


_GROWING_LAYER = None
SPARE_COLUMNS = 256  # least spare capacity added when a layer's buffer is full


def _growing_layer_class():
    """A `DynamicLayer` that appends into spare capacity instead of `torch.cat`-ing the whole
    cache every step. The stock layer copies all keys/values of every layer at every decode step,
    which at 1.5k cached tokens costs more than the forward pass itself on CPU (measured 4.0 vs
    1.45 s/step at batch 16, SmolLM2-135M). Capacity grows by a quarter (at least 256 columns),
    so copies are rare and memory overhead is bounded."""
    global _GROWING_LAYER
    if _GROWING_LAYER is not None:
        return _GROWING_LAYER
    from transformers.cache_utils import DynamicLayer

    # Built on DynamicLayer as in 5.19 to 5.24 (`is_initialized`, `lazy_initialization(keys, values)`).
    class GrowingLayer(DynamicLayer):
        def update(self, key_states, value_states, *args, **kwargs):
            if not self.is_initialized:
                self.lazy_initialization(key_states, value_states)
                self.buf_k = self.buf_v = None
            n = 0 if self.buf_k is None else self.keys.shape[-2]
            c = key_states.shape[-2]
            if self.buf_k is None or n + c > self.buf_k.shape[-2]:
                cap = n + c + max(SPARE_COLUMNS, (n + c) // 4)
                b, h, _, d = key_states.shape
                buf_k = key_states.new_empty((b, h, cap, d))
                buf_v = value_states.new_empty((b, value_states.shape[1], cap, value_states.shape[3]))
                if n:
                    buf_k[:, :, :n] = self.keys
                    buf_v[:, :, :n] = self.values
                self.buf_k, self.buf_v = buf_k, buf_v
            self.buf_k[:, :, n : n + c] = key_states
            self.buf_v[:, :, n : n + c] = value_states
            self.keys, self.values = self.buf_k[:, :, : n + c], self.buf_v[:, :, : n + c]
            return self.keys, self.values

    _GROWING_LAYER = GrowingLayer
    return GrowingLayer


def plan_buckets(lengths: Sequence[int], tolerance: float) -> list[list[int]]:
    """Rows (indices into `lengths`) to prefill together. One bucket while the padding of a
    single chunk stays within `tolerance` of its real tokens (or under 64 positions); otherwise
    rows sorted by length, a new bucket whenever a row is shorter than its bucket's longest by
    more than `tolerance` of it (and by more than 16 tokens).

    >>> plan_buckets([400, 1, 420, 3], 0.1)
    [[2, 0], [3, 1]]
    >>> plan_buckets([400, 390, 410], 0.1)
    [[0, 1, 2]]
    """
    width, real = max(lengths), sum(lengths)
    padding = width * len(lengths) - real
    if padding <= max(64, tolerance * real):
        return [list(range(len(lengths)))]
    buckets: list[list[int]] = []
    for i in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
        head = lengths[buckets[-1][0]] if buckets else 0
        if buckets and head - lengths[i] <= max(16, tolerance * head):
            buckets[-1].append(i)
        else:
            buckets.append([i])
    return buckets


def trim(kv, mask):
    """Cut the leading columns that are holes in every row."""
    if mask.shape[1] == 0:
        return kv, mask
    real_cols = mask.any(dim=0).nonzero()
    first = int(real_cols[0]) if len(real_cols) else mask.shape[1]
    if first == 0:
        return kv, mask
    return [(k[:, :, first:], v[:, :, first:]) for k, v in kv], mask[:, first:]


def select_rows(g: Group, rows: list[int], handles: list[int]) -> Group:
    idx = torch.tensor(rows, dtype=torch.long, device=g.mask.device)
    kv = [(k.index_select(0, idx), v.index_select(0, idx)) for k, v in g.kv]
    kv, mask = trim(kv, g.mask.index_select(0, idx))
    return Group(list(handles), kv, mask)


def merge_rows(parts, handles, length, device, kv_like) -> Group:
    """Rows (group, row) or (None, None) for never-fed sequences -> one group, right-aligned to
    `length` columns; shorter rows get holes on the left."""
    b = len(parts)
    mask = torch.zeros((b, length), dtype=torch.long, device=device)
    kv = []
    if kv_like is not None and length > 0:
        for k_ref, v_ref in kv_like:
            h, d = k_ref.shape[1], k_ref.shape[3]
            kv.append(
                (k_ref.new_zeros((b, h, length, d)), v_ref.new_zeros((b, v_ref.shape[1], length, v_ref.shape[3])))
            )
    for i, (g, row) in enumerate(parts):
        if g is None or g.length == 0:
            continue
        off = length - g.length
        mask[i, off:] = g.mask[row]
        for layer, (k, v) in enumerate(g.kv):
            kv[layer][0][i, :, off:] = k[row]
            kv[layer][1][i, :, off:] = v[row]
    kv, mask = trim(kv, mask)
    return Group(list(handles), kv, mask)
