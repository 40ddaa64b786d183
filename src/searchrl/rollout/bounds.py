"""Bounds that follow the model and the index, checked before any rollout runs (`train`'s
preflight, `eval run` before its first batch): a config whose rollouts cannot fit is refused with
its numbers and what to lower, instead of running until the process is killed.

- `rollout.k` at most the passages of a local index (a server or web search cannot say).
- The longest rollout the config allows must fit the model's context window
  (`backend.context_window`): the longest prompt (of up to `SAMPLE` questions spread over the
  dataset) + `max_searches` documents blocks of `k` passages + `max_new_tokens`. A block is
  estimated as its tags plus `k` typical passages: the mean tokens of a passage's line over up to
  `SAMPLE` passages spread over the local index. Passages of a server or web search are not
  known before they come, so their blocks count 0 here; at run time the engine cuts any block
  that would overflow (`rollout.engine`), which bounds them too.

The estimate uses typical passages, so a config refused here overflows on typical results; one
accepted can still meet a long passage, which the engine's cut handles.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from searchrl.data.types import Question
from searchrl.datatext import strip_marks
from searchrl.errors import SearchRLError
from searchrl.protocols.base import Protocol
from searchrl.rollout.backend import context_window
from searchrl.rollout.config import RolloutConfig

SAMPLE = 64  # questions and passages the estimates read: enough for a typical length, fast


def spread(n: int, at_most: int = SAMPLE) -> list[int]:
    """Up to `at_most` row numbers spread evenly over `range(n)`.

    >>> spread(5), spread(1000, 4)
    ([0, 1, 2, 3, 4], [0, 250, 500, 750])
    """
    return sorted({i * n // at_most for i in range(at_most)}) if n > at_most else list(range(n))


class TokenizerCodec:
    """A tokenizer as a protocol's codec, before any backend loads: the text as it reads, data
    marks left out (an estimate needs no guard against control tokens)."""

    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer

    def encode(self, text: str, *, prompt: bool = False) -> list[int]:
        return self.tokenizer(strip_marks(text), add_special_tokens=prompt, verbose=False)["input_ids"]

    def decode(self, token_ids: Sequence[int]) -> str:
        return self.tokenizer.decode(token_ids)


def longest_prompt(questions: Sequence[Question], protocol: Protocol, tokenizer) -> int:
    """Tokens of the longest prompt among up to `SAMPLE` questions spread over `questions`."""
    codec = TokenizerCodec(tokenizer)
    return max((len(protocol.prompt_ids(questions[i].question, codec)) for i in spread(len(questions))), default=0)


def passage_tokens(passages, protocol: Protocol, tokenizer) -> tuple[int, float]:
    """(tokens of a search observation's frame, typical tokens per passage line) for a local
    index's `passages` (module docstring); a block of k passages is estimated as frame + k x
    typical (`Protocol.search_block_tokens`)."""
    return protocol.search_block_tokens(passages.get(spread(len(passages))), TokenizerCodec(tokenizer).encode)


def check_rollout_fits(
    rollout: RolloutConfig,
    protocol: Protocol,
    tokenizer,
    context: int | None,
    questions: Sequence[Question],
    retriever,
    index: str | None,
) -> None:
    """Refuse `rollout` when `k` exceeds a local index or its longest rollout cannot fit `context`
    (None: unknown, nothing to check). `retriever`'s `passages` are read when it has them (a
    local index, named `index` in errors)."""
    passages = getattr(retriever, "passages", None)
    if passages is not None and rollout.k > len(passages):
        raise SearchRLError(
            f"rollout.k={rollout.k} is more than the {len(passages):,} passages of index {index}; "
            f"set rollout.k to {len(passages)} or less"
        )
    if context is None or tokenizer is None:
        return
    prompt = longest_prompt(questions, protocol, tokenizer)
    tags, per_passage = passage_tokens(passages, protocol, tokenizer) if passages is not None else (0, None)
    block = math.ceil(tags + rollout.k * per_passage) if per_passage is not None else 0
    need = prompt + rollout.max_searches * block + rollout.max_new_tokens
    if need <= context:
        return
    docs = (f" + max_searches={rollout.max_searches} x documents block ~{block:,} (k={rollout.k} passages of "
            f"~{per_passage:.0f} tokens in index {index})") if per_passage is not None else ""
    fix = ["rollout.max_new_tokens"]
    if per_passage is not None and rollout.max_searches:
        room = (context - prompt - rollout.max_new_tokens) / rollout.max_searches  # tokens per block that fit
        fits_k = math.floor((room - tags) / per_passage)
        fix = [f"rollout.k (to {fits_k} or less at these settings)" if fits_k >= 1 else "rollout.k",
               "rollout.max_searches"] + fix
    raise SearchRLError(
        f"a rollout may need {need:,} tokens but the model's context holds {context:,}: longest prompt {prompt:,}{docs} "
        f"+ max_new_tokens={rollout.max_new_tokens:,}; lower {', '.join(fix)}"
    )


def model_context(name: str, tokenizer, rollout: RolloutConfig) -> int | None:
    """The context window a run's backend will have, read before the model loads: the model's
    max positions (its config, where it is on disk or cached) and the tokenizer's limit
    (`backend.context_window`), and `vllm.max_model_len` when the vllm backend is set."""
    from transformers import AutoConfig

    from searchrl.assets import resolve_model

    try:  # local files only: a hub model not cached yet leaves the tokenizer's limit
        config = AutoConfig.from_pretrained(resolve_model(name), local_files_only=True)
    except Exception:  # noqa: BLE001 - missing, unreadable or unknown configs come in many types
        config = None
    known = [context_window(tokenizer, config)]
    if rollout.backend == "vllm":
        known.append(rollout.vllm.max_model_len)
    return min((n for n in known if n is not None), default=None)
