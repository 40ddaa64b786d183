"""The generation interface the rollout engine drives (transformers, vLLM).

A backend owns a set of live sequences, each named by an integer handle. The engine

1. `start`s a batch from prompt token ids,
2. `generate`s: every given sequence continues until a stop string, EOS or its token budget,
3. `append`s environment tokens (a documents block) to paused sequences, and goes back to 2,
4. `release`s sequences that are done, so the backend can free their state (KV cache rows).

Token ids are the unit everywhere: what `generate` returns is exactly what was sampled, and what
`append` receives is exactly what the model will see; nothing is ever re-tokenized. The backend
may keep per-sequence state between calls (the transformers backend keeps its KV cache; a vLLM
backend resends the whole token list and relies on prefix caching).

Long tails: sequences of one batch stop at very different times, and a round that waits for the
last one leaves a batched engine decoding for few rows. `generate(..., quorum=q)` lets the call
return once a share `q` of its sequences has stopped; a backend with continuous batching (vLLM)
keeps the others running and reports them "pending" (no tokens yet), and the engine serves the
stopped ones and hands them back while the rest go on. A pending sequence is named again in a
later `generate` call, which returns its whole continuation when it stops.

Weights: a trainer that updates the policy calls `sync_weights(model)` after every optimizer
step, and may wrap the update in `sleep()` / `wake()` so a backend on the same device frees its
memory meanwhile. A rollout worker in another process loads each published version as
(checkpoint name, tensor) pairs (`load_weights`), possibly between two rounds of live sequences
(partial rollouts): their keys/values so far came from the old weights, and the backends compute
them again with the new ones, so what each token is sampled from is exactly one policy.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

from searchrl.registry import Registry

if TYPE_CHECKING:
    import torch

FinishReason = Literal["stop", "eos", "length", "pending"]


@dataclass(frozen=True)
class SamplingParams:
    """How the next token is drawn.

    `temperature` divides the logits; `top_p` keeps the smallest set of tokens whose probability
    reaches `top_p` (1.0 = no truncation); `greedy` takes the arg-max (evaluation) and ignores
    both; `seed` makes a run reproducible on the same backend, batch and hardware.
    """

    temperature: float = 1.0
    top_p: float = 1.0
    greedy: bool = False
    seed: int | None = None

    def __post_init__(self) -> None:
        if not self.greedy and self.temperature <= 0:
            raise ValueError(f"temperature must be > 0 when sampling (got {self.temperature}); use greedy=True")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1] (got {self.top_p})")


@dataclass
class Continuation:
    """What one `generate` call added to one sequence.

    `logprobs[i]` is the log-probability of `token_ids[i]` under the distribution the backend
    sampled from (see the backend's docs for where temperature / top-p enter). The last token is
    the one that completed `stop_string` (finish_reason "stop"), the EOS token ("eos"), or the
    last one the budget allowed ("length"; fewer tokens, possibly none, when the sequence filled
    the backend's context). "pending": still generating (see `quorum`), no tokens yet.
    """

    token_ids: list[int]
    logprobs: list[float]
    finish_reason: FinishReason
    stop_string: str | None = None


@dataclass
class BackendStats:
    """Counters a benchmark or log line can read; backends add to them as they go."""

    prefill_tokens: int = 0  # tokens fed as prompts or environment insertions
    decode_steps: int = 0  # batched forward passes of one token per sequence
    generated_tokens: int = 0
    extra: dict[str, float] = field(default_factory=dict)


# What transformers' tokenizers say when they know no limit (`VERY_LARGE_INTEGER`, 1e30).
_NO_LIMIT = int(1e29)


def context_window(tokenizer=None, model_config=None) -> int | None:
    """Most tokens a sequence may hold: the smaller of the model's `max_position_embeddings` and
    the tokenizer's `model_max_length`, of those that are known (a tokenizer without a limit
    says 1e30; a config may lack the field); None when neither is."""
    known = [
        n for n in (getattr(model_config, "max_position_embeddings", None), getattr(tokenizer, "model_max_length", None))
        if isinstance(n, int) and 0 < n < _NO_LIMIT
    ]
    return min(known, default=None)


def per_sequence_budgets(handles: Sequence[int], max_new_tokens: int | Sequence[int]) -> list[int]:
    """`generate`'s token budget as one number per handle (it takes one for all, or one each)."""
    budgets = [max_new_tokens] * len(handles) if isinstance(max_new_tokens, int) else list(max_new_tokens)
    if len(budgets) != len(handles):
        raise ValueError(f"{len(budgets)} budgets for {len(handles)} sequences")
    return budgets


class GenerationBackend(ABC):
    """Continues batches of token-id sequences; see the module docstring for the protocol."""

    stats: BackendStats

    # -- text <-> ids: the engine tokenizes prompts and documents blocks through these --------
    @abstractmethod
    def encode(self, text: str, *, prompt: bool = False) -> list[int]:
        """Token ids of `text`. `prompt=True` adds what the model expects at the start of a
        sequence (e.g. BOS), once; otherwise no special tokens are added. Text between data marks
        (`searchrl.datatext.data`: passages, pages, tool results, questions) never becomes a
        special or added token: implementations tokenize with `searchrl.datatext.encode`."""

    @abstractmethod
    def decode(self, token_ids: Sequence[int]) -> str:
        """Text of `token_ids`, special tokens kept, no whitespace clean-up (lossless for
        byte-level BPE tokenizers)."""

    @property
    @abstractmethod
    def eos_token_ids(self) -> frozenset[int]:
        """Ids that end a sequence."""

    @property
    def tokenizer(self):
        """The underlying tokenizer object, for prompt templates that need a chat template;
        None when the backend has none to offer."""
        return None

    @property
    def max_context(self) -> int | None:
        """Most tokens (prompt + response) a sequence may hold (`context_window` of the
        tokenizer); None when unknown. The engine never lets a sequence grow past it."""
        return context_window(self.tokenizer)

    # -- sequences -------------------------------------------------------------------------------
    @abstractmethod
    def start(self, prompts: Sequence[Sequence[int]], params: SamplingParams) -> list[int]:
        """Register one sequence per prompt (token ids); returns their handles. Nothing needs to
        run yet: a backend may defer the prompt prefill to the first `generate`."""

    @abstractmethod
    def generate(
        self,
        handles: Sequence[int],
        max_new_tokens: int | Sequence[int],
        stop: Sequence[str] = (),
        quorum: float = 1.0,
    ) -> list[Continuation]:
        """Continue every sequence in `handles` (all started with the same params) until it
        writes one of `stop` (matched on the decoded policy text since the last `append`), an EOS
        token, or `max_new_tokens` new tokens (one budget for all, or one per handle).
        Returns one `Continuation` per handle, in order. A budget of 0 returns no tokens.

        `quorum` in (0, 1]: the call may return once that share of `handles` has stopped, the
        others "pending" (see the module docstring); a pending handle keeps the budget and stop
        strings it was started with. Backends without continuous batching finish every sequence."""

    @abstractmethod
    def append(self, handles: Sequence[int], token_ids: Sequence[Sequence[int]]) -> None:
        """Extend each sequence with environment tokens the model did not sample; the next
        `generate` conditions on them."""

    @abstractmethod
    def release(self, handles: Sequence[int]) -> None:
        """Forget these sequences and free their state. Unknown handles are ignored."""

    def close(self) -> None:
        """Free everything (the model stays with its owner)."""

    # -- weights and memory (training) -----------------------------------------------------------
    @abstractmethod
    def sync_weights(self, model) -> None:
        """Generate with `model`'s current weights from now on (`model`: the trainer's
        `nn.Module`). Called after every optimizer update, between rollouts."""

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Generate with these (checkpoint name, tensor) weights from now on (as `save_pretrained`
        names them, `rollout.weights.named_weights`). Live sequences keep their tokens; the next
        `generate` conditions on them with the new weights. Called with no sequence generating."""
        raise NotImplementedError(f"{type(self).__name__} cannot load published weights; use the hf or vllm backend")

    def sleep(self) -> None:
        """Free accelerator memory the backend holds between rollouts (a KV cache) while the
        trainer updates; a no-op where there is nothing to free. `wake` undoes it."""

    def wake(self) -> None:
        """Take back what `sleep` freed; call before `sync_weights` and the next rollout."""

    @classmethod
    def from_model_name(cls, name: str, **kwargs) -> GenerationBackend:
        """Build the backend for a model name or path (see `searchrl.assets.load_model`)."""
        raise NotImplementedError(f"{cls.__name__} cannot be built from a model name")


BACKENDS: Registry[type[GenerationBackend]] = Registry("generation backend")

# Backends register themselves when their module is imported; these modules are imported on
# demand so that naming a backend never imports another's heavy dependencies.
BACKEND_MODULES = {"hf": "searchrl.rollout.hf_backend", "vllm": "searchrl.rollout.vllm_backend"}


def make_backend(name: str, model: str, **kwargs) -> GenerationBackend:
    """A backend by registry name (`hf`, `vllm`) for a model name or path, e.g.
    `make_backend("hf", "smollm2-135m")`; extra keyword arguments go to the backend."""
    if name not in BACKENDS and name in BACKEND_MODULES:
        import importlib

        importlib.import_module(BACKEND_MODULES[name])
    return BACKENDS.get(name).from_model_name(model, **kwargs)
