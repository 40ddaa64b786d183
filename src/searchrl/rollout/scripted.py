"""`ScriptedBackend`: a `GenerationBackend` whose "policy" is a Python function, for tests of the
rollout engine, rewards and trainer plumbing without a model.

`respond(text) -> str` receives the whole sequence so far (prompt + response, documents
included) and returns what the policy writes next. The backend tokenizes it with a real
tokenizer and streams the tokens exactly like a model would: it stops on a stop string, an EOS
token or the budget, and throws the rest away (the next call asks `respond` again, seeing the
documents the engine appended). Append the tokenizer's EOS text to end a sequence with EOS.

`quorum` is simulated as a batched engine would decode: one token per running sequence per step,
so a call lasts as many steps as the continuation that completes its quorum, every running
sequence advances by those steps, and the ones not done yet come back "pending" (their
continuation is fixed when it starts, so results do not depend on the quorum). `stats.decode_steps`
counts the steps.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from searchrl import datatext
from searchrl.rollout.backend import (
    BackendStats,
    Continuation,
    GenerationBackend,
    SamplingParams,
    per_sequence_budgets,
)


@dataclass
class _Scripted:
    ids: list[int]
    stream: list[int] = field(default_factory=list)  # tokens `respond` wrote, not emitted yet
    running: Continuation | None = None  # started, not handed back yet
    decoded: int = 0  # tokens of `running` the simulated steps have produced


class ScriptedBackend(GenerationBackend):
    """Deterministic stand-in for a model. `calls` logs ("generate" | "append" | "release", handles).

    Log-probs are fake but distinct: -(1 + position % 5) / 10 for the token at that position.
    """

    def __init__(self, tokenizer, respond: Callable[[str], str]) -> None:
        self._tok = tokenizer
        self.respond = respond
        self.stats = BackendStats()
        self.calls: list[tuple[str, list[int]]] = []
        self._seqs: dict[int, _Scripted] = {}
        self._next = 0

    @property
    def tokenizer(self):
        return self._tok

    @property
    def eos_token_ids(self) -> frozenset[int]:
        return frozenset([self._tok.eos_token_id])

    def encode(self, text: str, *, prompt: bool = False) -> list[int]:
        return datatext.encode(self._tok, text, add_special_tokens=prompt)

    def decode(self, token_ids: Sequence[int]) -> str:
        return self._tok.decode(list(token_ids), skip_special_tokens=False, clean_up_tokenization_spaces=False)

    def start(self, prompts: Sequence[Sequence[int]], params: SamplingParams) -> list[int]:
        handles = []
        for ids in prompts:
            self._seqs[self._next] = _Scripted(list(ids))
            handles.append(self._next)
            self._next += 1
        return handles

    def generate(self, handles, max_new_tokens, stop=(), quorum=1.0) -> list[Continuation]:
        handles = list(handles)
        self.calls.append(("generate", handles))
        budgets = per_sequence_budgets(handles, max_new_tokens)
        for h, b in zip(handles, budgets):
            seq = self._seqs[h]
            if seq.running is None:  # else pending from an earlier call: budget and stops as then
                seq.running, seq.decoded = self._continue(seq, b, [s for s in stop if s]), 0
        left = sorted(len(self._seqs[h].running.token_ids) - self._seqs[h].decoded for h in handles)
        steps = left[max(1, math.ceil(quorum * len(handles))) - 1]
        self.stats.decode_steps += steps
        for seq in self._seqs.values():
            if seq.running is not None:
                seq.decoded = min(seq.decoded + steps, len(seq.running.token_ids))
        out = []
        for h in handles:
            seq = self._seqs[h]
            if seq.decoded < len(seq.running.token_ids):
                out.append(Continuation([], [], "pending"))
            else:
                out.append(seq.running)
                seq.running = None
        return out

    def _continue(self, seq: _Scripted, budget: int, stop: list[str]) -> Continuation:
        out = Continuation([], [], "length")
        start = len(seq.ids)
        while len(out.token_ids) < budget:
            if not seq.stream:
                seq.stream = self.encode(self.respond(self.decode(seq.ids)))
                if not seq.stream:
                    raise ValueError("the scripted policy wrote nothing; end a script with the EOS text")
            t = seq.stream.pop(0)
            seq.ids.append(t)
            out.token_ids.append(t)
            out.logprobs.append(-(1 + (len(seq.ids) - 1) % 5) / 10)
            self.stats.generated_tokens += 1
            new_text = self.decode(seq.ids[start:])
            before = self.decode(seq.ids[start:-1])
            hit = next((s for s in stop if s in new_text and s not in before), None)
            if hit is not None:
                out.finish_reason, out.stop_string = "stop", hit
                seq.stream = []
                break
            if t in self.eos_token_ids:
                out.finish_reason = "eos"
                break
        return out

    def append(self, handles, token_ids) -> None:
        handles = list(handles)
        self.calls.append(("append", handles))
        for h, ids in zip(handles, token_ids, strict=True):
            seq = self._seqs[h]
            if seq.running is not None:
                raise ValueError(f"sequence {h} is still generating; append after it stops")
            seq.ids.extend(ids)
            seq.stream = []  # the policy reacts to what it now sees
            self.stats.prefill_tokens += len(ids)

    def sync_weights(self, model) -> None:
        """No model, no weights."""

    def release(self, handles) -> None:
        handles = [h for h in handles if h in self._seqs]
        if handles:
            self.calls.append(("release", handles))
        for h in handles:
            self._seqs.pop(h)
