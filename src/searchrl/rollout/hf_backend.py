"""`GenerationBackend` on plain transformers, with one batched KV cache that is extended, never
recomputed, across search rounds.

How the cache is laid out (the part that makes search rounds cheap):

- The live sequences of a `generate` call form one batch; their keys/values sit in one cache
  of shape `[B, heads, L, head_dim]` per layer (a `DynamicCache` whose layers append into spare
  capacity, `kv_groups.make_cache`), plus a mask `[B, L]` (1 = a real token of that row, 0 = a
  hole). Rows have different real lengths, so the cache holds holes:
  left padding of prompts, left padding of ragged insertions, and (optionally) steps in which a
  row that already stopped sat in the batch.
- Position ids are explicit and count only real tokens (`n_fed` per row), so a row's holes never
  shift its positions and the model sees exactly what it would see unpadded.
- Tokens the model has not consumed yet wait in the row's `pending` list: the prompt, the last
  sampled token of a call, the environment tokens appended after it. The next `generate` feeds all
  rows' pending tokens as one left-padded chunk (so the last column is real for every row and its
  logits give every row's next-token distribution), then decodes token by token. When pending
  lengths differ much, rows are prefilled in buckets of similar length and merged (`plan_buckets`);
  identical fresh prompts (the samples of one question) are prefilled once.
- A row that stops while others continue leaves the running batch once idle rows reach
  `compact_at` of it: the cache rows are split (index-select) into a parked group and the running
  group. The next call merges the groups it needs back into one batch (left-padding the shorter
  ones with holes) and drops released rows. Leading columns that are holes in every row are cut.

Weights that change while sequences are live (`load_weights` between two rounds: partial
rollouts, docs/guides/async.md): the cached keys/values were computed by the old weights, so they
are dropped and each live sequence's whole token list is prefilled again by the next `generate`
(rows with identical lists share one prefill). Every later token is then sampled from, and its
log-prob is, exactly the new policy given the whole prefix: what the trainer recomputes, and what
vLLM does too (its prefix cache is reset). Keeping the old cache would save one prefill per
sequence per new version, but sample from a mixture of the two versions that no policy the loss
can name reproduces.

Log-probs: `log_softmax(logits / temperature)` of the sampled token over the FULL vocabulary, i.e.
before top-p truncation. That is the quantity the trainer recomputes from the same logits, so
old/new ratios compare like with like; the top-p renormalisation is a property of the sampler, not
of the policy. Greedy decoding reports `log_softmax(logits)`.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from searchrl import datatext
from searchrl.compat import cache_kwarg, takes_logits_to_keep
from searchrl.rollout.backend import (
    BACKENDS,
    BackendStats,
    Continuation,
    GenerationBackend,
    SamplingParams,
    context_window,
    per_sequence_budgets,
)
from searchrl.rollout.kv_groups import Group, make_cache, merge_rows, plan_buckets, select_rows
from searchrl.rollout.sampling import sample_tokens
from searchrl.rollout.weights import named_weights

__all__ = ["HFBackend", "plan_buckets", "sample_tokens"]


@dataclass
class _Seq:
    params: SamplingParams
    pending: list[int]  # tokens not yet fed to the model
    ids: list[int]  # every token of the sequence: the n_fed fed ones, then `pending`
    n_fed: int = 0  # real tokens in the cache = position id of the next fed token
    tail: list[int] = field(default_factory=list)  # recent policy tokens since the last append


@BACKENDS.register("hf")
class HFBackend(GenerationBackend):
    """transformers causal LM + tokenizer; see the module docstring for the cache layout.

    `compact_at`: fraction of idle (already stopped) rows in the running batch at which they are
    split off; 1.0 keeps them masked in the batch until the call ends, 0.0 splits at every stop.
    `prefill_tolerance`: the share of padding a prefill chunk may carry before rows are prefilled
    in buckets of similar length (see `plan_buckets`); 1.0 always uses one chunk.
    `eos_token_ids`: ids that end a sequence; default: the tokenizer's and the generation config's.
    """

    def __init__(
        self, model, tokenizer, *, compact_at: float = 0.25, prefill_tolerance: float = 0.1, eos_token_ids=None
    ) -> None:
        self.model = model
        self.prefill_tolerance = prefill_tolerance
        self._tok = tokenizer
        self.compact_at = compact_at
        self.device = next(model.parameters()).device
        self.stats = BackendStats()
        self._seqs: dict[int, _Seq] = {}
        self._group_of: dict[int, Group] = {}
        self._next_handle = 0
        self._generator: torch.Generator | None = None
        self._pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
        eos = set()
        for src in (tokenizer.eos_token_id, getattr(model.generation_config, "eos_token_id", None)):
            if src is not None:
                eos.update(src if isinstance(src, (list, tuple)) else [src])
        self._eos = frozenset(int(e) for e in (eos if eos_token_ids is None else eos_token_ids))
        self._cache_kw = cache_kwarg(model)
        self._keep_last = {"logits_to_keep": 1} if takes_logits_to_keep(model) else {}

    @classmethod
    def from_model_name(cls, name: str, **kwargs) -> HFBackend:
        from searchrl.assets import load_model

        model, tokenizer = load_model(name)
        return cls(model, tokenizer, **kwargs)

    # -- text ------------------------------------------------------------------------------------
    @property
    def tokenizer(self):
        return self._tok

    @property
    def eos_token_ids(self) -> frozenset[int]:
        return self._eos

    @property
    def max_context(self) -> int | None:
        return context_window(self._tok, self.model.config)

    def encode(self, text: str, *, prompt: bool = False) -> list[int]:
        # verbose=False: no bare "longer than the maximum" warning; the engine checks prompts itself.
        # Data marks (`searchrl.datatext`): text from outside never becomes a control token.
        ids = datatext.encode(self._tok, text, add_special_tokens=prompt)
        bos = self._tok.bos_token_id
        # A chat template already writes BOS as text; don't let the tokenizer add a second one.
        if prompt and bos is not None and len(ids) >= 2 and ids[0] == bos and ids[1] == bos:
            ids = ids[1:]
        return list(ids)

    def decode(self, token_ids: Sequence[int]) -> str:
        return self._tok.decode(list(token_ids), skip_special_tokens=False, clean_up_tokenization_spaces=False)

    # -- sequences -------------------------------------------------------------------------------
    def start(self, prompts: Sequence[Sequence[int]], params: SamplingParams) -> list[int]:
        # One generator per started batch; without a seed, torch's global RNG.
        self._generator = (
            torch.Generator(device=self.device).manual_seed(params.seed) if params.seed is not None else None
        )
        handles = []
        for ids in prompts:
            if len(ids) == 0:
                raise ValueError("a prompt has no tokens; every sequence needs at least one")
            self._seqs[self._next_handle] = _Seq(params, list(ids), list(ids))
            handles.append(self._next_handle)
            self._next_handle += 1
        return handles

    def append(self, handles: Sequence[int], token_ids: Sequence[Sequence[int]]) -> None:
        for h, ids in zip(handles, token_ids, strict=True):
            seq = self._seq(h)
            seq.pending.extend(ids)
            seq.ids.extend(ids)
            seq.tail = []  # a stop string never spans an insertion

    def release(self, handles: Sequence[int]) -> None:
        for h in handles:
            self._seqs.pop(h, None)
            group = self._group_of.pop(h, None)
            if group is not None and not any(x in self._group_of for x in group.handles):
                group.cache, group.init_kv = None, []  # last owner gone: free the tensors now

    def close(self) -> None:
        self._seqs.clear()
        self._group_of.clear()

    def sync_weights(self, model) -> None:
        """Nothing to do when `model` is the one this backend generates with (the trainer hands
        over its policy object); another model's weights (sharded, or with LoRA adapters to
        merge) are copied in by name."""
        if model is self.model:
            return
        self.load_weights(named_weights(model))

    def load_weights(self, weights) -> None:
        """Copy (checkpoint name, tensor) pairs into the model by name; live sequences are
        prefilled again with them (module docstring)."""
        params = dict(self.model.named_parameters())
        with torch.no_grad():
            for name, w in weights:
                params[name].copy_(w)
        self._group_of.clear()  # the groups' caches hold the old weights' keys/values
        for seq in self._seqs.values():
            seq.pending, seq.n_fed = list(seq.ids), 0

    def _length(self, h: int) -> int:
        """Tokens of sequence `h`: those fed and those waiting to be."""
        seq = self._seq(h)
        return seq.n_fed + len(seq.pending)

    def _seq(self, h: int) -> _Seq:
        try:
            return self._seqs[h]
        except KeyError:
            raise ValueError(f"unknown or released sequence handle {h}") from None

    # -- the generation loop ---------------------------------------------------------------------
    def generate(
        self,
        handles: Sequence[int],
        max_new_tokens: int | Sequence[int],
        stop: Sequence[str] = (),
        quorum: float = 1.0,
    ) -> list[Continuation]:
        # `quorum` is ignored: one batch decodes in lockstep, so every sequence finishes here.
        # The trainer hands over its policy in train mode; sample without dropout, then give it
        # back as it was.
        was_training = self.model.training
        self.model.eval()
        try:
            with torch.inference_mode():
                return self._generate(handles, max_new_tokens, stop)
        finally:
            self.model.train(was_training)

    def _generate(self, handles, max_new_tokens, stop) -> list[Continuation]:
        handles = list(handles)
        budgets = per_sequence_budgets(handles, max_new_tokens)
        limit = self.max_context
        if limit is not None:  # past its max positions a model generates garbage: stop there ("length")
            budgets = [min(b, max(limit - self._length(h), 0)) for h, b in zip(handles, budgets)]
        results = {h: Continuation([], [], "length") for h in handles}
        live = [h for h, b in zip(handles, budgets) if b > 0]
        if not live:
            return [results[h] for h in handles]
        params = self._seq(live[0]).params
        if any(self._seq(h).params != params for h in live):
            raise ValueError("sequences of one generate call must share their sampling params")
        budget = dict(zip(handles, budgets))
        stop = [s for s in stop if s]
        window = max((len(s.encode()) for s in stop), default=0)  # a token carries >= 1 byte

        t0 = time.perf_counter()
        group = self._gather(live)
        t0 = self._tick("gather_s", t0)
        group, logits = self._prefill(group)  # logits [B, V]
        self._tick("prefill_s", t0)
        running = [True] * len(group.handles)
        while True:
            t0 = time.perf_counter()
            tokens, logps = sample_tokens(logits, params, self._generator)
            tok_list, lp_list = tokens.tolist(), logps.tolist()
            t0 = self._tick("sample_s", t0)
            for i, h in enumerate(group.handles):
                if not running[i]:
                    continue
                out, seq, t = results[h], self._seqs[h], tok_list[i]
                out.token_ids.append(t)
                out.logprobs.append(lp_list[i])
                seq.ids.append(t)
                self.stats.generated_tokens += 1
                seq.tail.append(t)
                if window and len(seq.tail) > window:
                    del seq.tail[: len(seq.tail) - window]
                hit = self._stop_hit(seq.tail, stop) if stop else None
                if hit is not None:
                    out.finish_reason, out.stop_string = "stop", hit
                elif t in self._eos:
                    out.finish_reason = "eos"
                elif len(out.token_ids) >= budget[h]:
                    out.finish_reason = "length"
                else:
                    continue
                running[i] = False
                seq.pending = [t]  # not fed yet: the next call (or insertion) starts with it
            n_run = sum(running)
            t0 = self._tick("stopcheck_s", t0)
            if n_run == 0:
                break
            if n_run < len(running) and (len(running) - n_run) >= self.compact_at * len(running):
                group, tokens = self._split(group, running, tokens)
                running = [True] * len(group.handles)
                t0 = self._tick("compact_s", t0)
            logits = self._decode_step(group, tokens, running)
            self._tick("decode_s", t0)
        return [results[h] for h in handles]

    def _tick(self, key: str, since: float) -> float:
        now = time.perf_counter()
        self.stats.extra[key] = self.stats.extra.get(key, 0.0) + now - since
        return now

    def _stop_hit(self, tail: list[int], stop: list[str]) -> str | None:
        # Only the last few tokens are decoded; a hit must involve the newest token, or it would
        # have been found a step earlier.
        text = self.decode(tail)
        for s in stop:
            if s in text and s not in self.decode(tail[:-1]):
                return s
        return None

    # -- cache plumbing --------------------------------------------------------------------------
    def _forward(self, group: Group, input_ids, position_ids) -> torch.Tensor:
        """input_ids/position_ids: [B, C], group.mask already [B, L + C]; grows the group's
        cache by C columns and returns the last position's logits [B, V]."""
        if group.cache is None:
            group.cache, group.init_kv = make_cache(group.init_kv), []
        out = self.model(
            input_ids=input_ids,
            attention_mask=group.mask,
            position_ids=position_ids,
            use_cache=True,
            **{self._cache_kw: group.cache, **self._keep_last},
        )
        return out.logits[:, -1, :]

    def _prefill(self, group: Group) -> tuple[Group, torch.Tensor]:
        """Feed every row's pending tokens; returns the (possibly rebuilt) group and logits [B, V].

        Fresh rows with the same prompt (the samples of one question) are prefilled once and
        their cache rows copied: with 16 samples per prompt that skips 15/16 of prompt prefill.
        """
        seqs = [self._seqs[h] for h in group.handles]
        pendings = [s.pending for s in seqs]
        n_fed = [s.n_fed for s in seqs]
        if group.length == 0 and not any(n_fed):
            first: dict[tuple, int] = {}
            which = [first.setdefault(tuple(p), len(first)) for p in pendings]  # row -> unique prompt
            if len(first) < len(seqs):
                unique = Group(list(range(-len(first), 0)), [], group.mask[: len(first)])
                unique, logits = self._prefill_rows(unique, [list(p) for p in first], [0] * len(first))
                expand = torch.tensor(which, dtype=torch.long, device=self.device)
                group = select_rows(unique, which, group.handles)
                self._register(group)
                self.stats.extra["prefill_shared"] = self.stats.extra.get("prefill_shared", 0.0) + len(seqs) - len(first)
                logits = logits.index_select(0, expand)
            else:
                group, logits = self._prefill_rows(group, pendings, n_fed)
        else:
            group, logits = self._prefill_rows(group, pendings, n_fed)
        for s in seqs:
            s.n_fed += len(s.pending)
            s.pending = []
        return group, logits

    def _prefill_rows(self, group: Group, pendings: list[list[int]], n_fed: list[int]):
        """One left-padded chunk, or, when rows' pending lengths differ much (documents of
        different lengths next to one-token continuations), one chunk per bucket of similar
        lengths, the buckets' caches merged afterwards: a hole costs a forward position like a
        real token, a merge only a copy of the cache."""
        buckets = plan_buckets([len(p) for p in pendings], self.prefill_tolerance)
        if len(buckets) == 1:
            return group, self._prefill_chunk(group, pendings, n_fed)
        logits = None
        subs, where = [], [None] * len(pendings)
        for rows in buckets:
            sub = select_rows(group, rows, [group.handles[r] for r in rows])
            part = self._prefill_chunk(sub, [pendings[r] for r in rows], [n_fed[r] for r in rows])
            if logits is None:
                logits = part.new_empty((len(pendings), part.shape[1]))
            logits[torch.tensor(rows, device=part.device)] = part
            for j, r in enumerate(rows):
                where[r] = (sub, j)
            subs.append(sub)
        merged = merge_rows(where, group.handles, max(g.length for g in subs), self.device, subs[0].kv)
        if any(h >= 0 for h in group.handles):
            self._register(merged)
        self.stats.extra["prefill_buckets"] = self.stats.extra.get("prefill_buckets", 0.0) + len(buckets)
        return merged, logits

    def _prefill_chunk(self, group: Group, pendings: list[list[int]], n_fed: list[int]) -> torch.Tensor:
        """Left-padded chunk of `pendings` (row i's real tokens get positions n_fed[i], ...)."""
        width = max(len(p) for p in pendings)
        ids = torch.full((len(pendings), width), self._pad_id, dtype=torch.long)
        chunk_mask = torch.zeros((len(pendings), width), dtype=torch.long)
        pos = torch.zeros((len(pendings), width), dtype=torch.long)
        for i, (p, start) in enumerate(zip(pendings, n_fed)):
            n = len(p)
            ids[i, width - n :] = torch.tensor(p, dtype=torch.long)
            chunk_mask[i, width - n :] = 1
            pos[i, width - n :] = torch.arange(start, start + n)
            self.stats.prefill_tokens += n
        self.stats.extra["prefill_padding"] = self.stats.extra.get("prefill_padding", 0.0) + ids.numel() - int(chunk_mask.sum())
        group.mask = torch.cat([group.mask, chunk_mask.to(self.device)], dim=1)
        return self._forward(group, ids.to(self.device), pos.to(self.device))

    def _decode_step(self, group: Group, tokens: torch.Tensor, running: list[bool]) -> torch.Tensor:
        """Feed one sampled token per running row (idle rows get a hole); logits [B, V]."""
        run = torch.tensor(running, dtype=torch.long, device=self.device)  # [B]
        ids = torch.where(run.bool(), tokens, torch.full_like(tokens, self._pad_id))[:, None]
        pos = torch.tensor([self._seqs[h].n_fed for h in group.handles], dtype=torch.long, device=self.device)
        for h, r in zip(group.handles, running):
            if r:
                self._seqs[h].n_fed += 1
        group.mask = torch.cat([group.mask, run[:, None]], dim=1)
        self.stats.decode_steps += 1
        return self._forward(group, ids, pos[:, None])

    def _gather(self, handles: list[int]) -> Group:
        """One group holding exactly `handles` (in that order), merged from the groups they sit
        in; rows of other live sequences stay behind in their own groups."""
        groups: dict[int, Group] = {}
        wanted = set(handles)
        for h in handles:
            g = self._group_of.get(h)
            if g is not None:
                groups[id(g)] = g
        if len(groups) == 1:
            (g,) = groups.values()
            if set(g.handles) == set(handles) and len(g.handles) == len(handles):
                return self._reorder(g, handles)
        # Rows of live sequences not asked for stay in a group of their own.
        for g in groups.values():
            keep = [h for h in g.handles if self._group_of.get(h) is g and h not in wanted]
            if keep:
                self._register(select_rows(g, [g.handles.index(h) for h in keep], keep))
        length = max((g.length for g in groups.values()), default=0)
        parts = []
        for h in handles:
            g = self._group_of.get(h)
            parts.append((g, g.handles.index(h) if g is not None else None))
        merged = merge_rows(parts, handles, length, self.device, self._kv_like(groups))
        self._register(merged)
        return merged

    def _kv_like(self, groups: dict[int, Group]):
        for g in groups.values():
            if g.kv:
                return g.kv
        return None

    def _reorder(self, g: Group, handles: list[int]) -> Group:
        if g.handles == handles:
            return g
        new = select_rows(g, [g.handles.index(h) for h in handles], handles)
        self._register(new)
        return new

    def _split(self, group: Group, running: list[bool], tokens: torch.Tensor):
        """Park the idle rows in a group of their own; returns the running group and its tokens."""
        run_idx = [i for i, r in enumerate(running) if r]
        idle_idx = [i for i, r in enumerate(running) if not r]
        self._register(select_rows(group, idle_idx, [group.handles[i] for i in idle_idx]))
        run = select_rows(group, run_idx, [group.handles[i] for i in run_idx])
        self._register(run)
        return run, tokens[torch.tensor(run_idx, device=tokens.device)]

    def _register(self, g: Group) -> None:
        for h in g.handles:
            self._group_of[h] = g
