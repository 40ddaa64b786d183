"""The search-interleaved rollout loop (SPEC §2), written against `GenerationBackend` and
`Retriever` only.

One batch of rollouts advances in rounds:

1. every active sequence generates until the end-of-query tag, `</answer>`, EOS, its budget, or
   (completion templates) a new "User:" line, where it has ended its turn (`turn_end`);
2. a sequence that stopped on end-of-query has its query read from the policy text written since
   the last insertion (empty -> the rollout ends, `empty_query`; searches used up -> it ends,
   `max_searches`, the query unserved);
3. ALL sequences that paused for search are served by ONE `retriever.search(queries, k)` call;
4. each documents block is tokenized on its own and appended as token ids (loss mask 0), and the
   round repeats for the sequences still active.

With `round_quorum` < 1 a round closes once that share of its sequences has stopped: a backend
with continuous batching (vLLM) keeps the others generating ("pending") while the stopped ones
are served and resubmitted, so the long tail of a round does not leave the batch near empty.
Each round still makes at most one retrieval call, for the sequences that paused in it.

Tokens are recorded exactly as sampled or inserted. The documents block starts with a blank line,
so tokenizing it standalone splits no token with the policy text before it; its ids decode back to
exactly the block's text with byte-level BPE tokenizers (the engine warns once when a tokenizer
does not round-trip, and records the text the model actually saw).

The model's context (`backend.max_context`) bounds every rollout: prompt + response never exceed
it. A turn's token budget shrinks to what the context has left; a rollout that fills it stops
with `context_full`. A documents block that does not fit in what is left, less `ANSWER_ROOM`
tokens kept for the policy to answer in (or less its whole remaining budget when that is
smaller), is cut: its opening part (blank line, documents tag) and closing part (newline,
closing tag, blank line) are tokenized on their own and kept whole, and the passages between
them are kept as a prefix of their tokens, i.e. whole passages while they fit and the next one
cut at a token boundary (never inside a character). The trajectory counts its cut blocks
(`truncated_documents`). When not even the two tags fit, the query is not served and the
rollout stops with `context_full`. A block that fits is inserted exactly as without a limit.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from searchrl.data.trajectory import Segment, Trajectory
from searchrl.data.types import Passage, Question
from searchrl.errors import SearchRLError
from searchrl.protocol import Protocol
from searchrl.retrieval.base import Retriever
from searchrl.rollout.backend import GenerationBackend
from searchrl.rollout.config import RolloutConfig
from searchrl.tags import TagSet

log = logging.getLogger(__name__)

ANSWER_ROOM = 64  # policy tokens a cut documents block leaves free, so the model can still answer


def document_block_ends(tags: TagSet) -> tuple[str, str]:
    """The opening and closing parts of every documents block (`tags.format_documents`), which a
    cut keeps whole: block = opening + passage lines (without the last newline) + closing."""
    return f"\n\n{tags.docs_open}\n", f"\n{tags.docs_close}\n\n"


@dataclass
class _Rollout:
    """A rollout under construction; `runs` are [source, token ids] in order."""

    question: Question
    prompt_ids: list[int]
    left: int  # policy tokens still allowed
    limit: float = math.inf  # the model's context: most prompt + response tokens
    token_ids: list[int] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    runs: list[list] = field(default_factory=list)
    env_texts: list[str] = field(default_factory=list)
    queries: list[str] = field(default_factory=list)
    retrieved_ids: list[list[str]] = field(default_factory=list)
    stop_reason: str | None = None
    truncated_documents: int = 0  # documents blocks cut to fit the context
    gen_s: float = 0.0
    ret_s: float = 0.0

    def add(self, source: str, ids: Sequence[int], logprobs: Sequence[float] | None = None) -> None:
        if not ids:
            return
        self.token_ids.extend(ids)
        self.loss_mask.extend([1 if source == "policy" else 0] * len(ids))
        self.logprobs.extend(logprobs if logprobs is not None else [0.0] * len(ids))
        if self.runs and self.runs[-1][0] == source and source == "policy":
            self.runs[-1][1].extend(ids)
        else:
            self.runs.append([source, list(ids)])

    def current_policy_ids(self) -> list[int]:
        return self.runs[-1][1] if self.runs and self.runs[-1][0] == "policy" else []

    def room(self) -> float:
        """Tokens the context has left for this rollout."""
        return self.limit - len(self.prompt_ids) - len(self.token_ids)

    def documents_room(self) -> float:
        """Tokens a documents block may take: what is left, less room for the policy to answer."""
        return self.room() - min(self.left, ANSWER_ROOM)


class RolloutEngine:
    """Turns questions into `Trajectory`s with a policy (backend) and an environment (retriever)."""

    def __init__(
        self,
        backend: GenerationBackend,
        retriever: Retriever,
        protocol: Protocol,
        cfg: RolloutConfig | None = None,
    ) -> None:
        self.backend = backend
        self.retriever = retriever
        self.protocol = protocol
        self.tags = protocol.tags
        self.cfg = cfg or RolloutConfig()
        self._warned_roundtrip = False
        self._warned_cut = False
        self._tags_len: int | None = None

    def run(
        self,
        questions: Sequence[Question],
        prompts: Sequence[str] | None = None,
        n: int | None = None,
        progress: bool = False,
    ) -> list[Trajectory]:
        """`n` rollouts per question (default `cfg.samples_per_question`), question-major:
        [q0 s0, q0 s1, ..., q1 s0, ...]. `prompts` default to the protocol's template."""
        n = n or self.cfg.samples_per_question
        prompt_ids = self.prompt_ids(questions, prompts)
        items = [(q, ids) for q, ids in zip(questions, prompt_ids) for _ in range(n)]
        out: list[Trajectory] = []
        bar = None
        if progress:
            from tqdm import tqdm

            bar = tqdm(total=len(items), desc="rollouts", unit="seq")
        for start in range(0, len(items), self.cfg.batch_size):
            out.extend(self._run_batch(items[start : start + self.cfg.batch_size], bar))
        if bar is not None:
            bar.close()
        return out

    def prompt_ids(self, questions: Sequence[Question], prompts: Sequence[str] | None = None) -> list[list[int]]:
        """The token ids each question's rollouts start from: `prompts` (default: the protocol's
        template) encoded as a sequence start, each checked to leave room in the context."""
        if prompts is None:
            prompts = [self.protocol.prompt(q.question, self.backend.tokenizer) for q in questions]
        if len(prompts) != len(questions):
            raise ValueError(f"{len(prompts)} prompts for {len(questions)} questions")
        prompt_ids = [self.backend.encode(p, prompt=True) for p in prompts]
        self._check_prompt_lengths(questions, prompt_ids)
        return prompt_ids

    def documents(self, passages: Sequence[Passage]) -> tuple[list[int], str]:
        """The documents block of `passages` as the engine inserts it: its token ids (the block
        tokenized on its own) and the text they decode to, which is what the model sees."""
        block = self.protocol.format_documents(passages)
        ids = self.backend.encode(block)
        seen = self.backend.decode(ids)
        if seen != block and not self._warned_roundtrip:
            self._warned_roundtrip = True
            log.warning("the tokenizer does not round-trip documents blocks; trajectories record "
                        "the decoded text the model saw (first block: %r vs %r)", block[:80], seen[:80])
        return ids, seen

    def fitted_documents(self, passages: Sequence[Passage], room: float = math.inf) -> tuple[list[int], str, bool] | None:
        """The documents block of `passages` in at most `room` tokens, cut by the module
        docstring's rule: (ids, decoded text, whether it was cut), or None when not even its
        tags fit."""
        whole, seen = self.documents(passages)
        if len(whole) <= room:
            return whole, seen, False
        block = self.protocol.format_documents(passages)
        head_text, tail_text = document_block_ends(self.tags)
        head, tail = self.backend.encode(head_text), self.backend.encode(tail_text)
        n = int(room) - len(head) - len(tail)
        if n < 0:
            return None
        body = self.backend.encode(block[len(head_text) : -len(tail_text)])[:n]
        while body and self.backend.decode(body[-4:]).endswith("\ufffd"):
            body = body[:-1]  # a cut inside a multi-byte character
        ids = head + body + tail
        if not self._warned_cut:
            self._warned_cut = True
            log.warning("a documents block of %d passages was cut to fit the model's context (%d of %d tokens); "
                        "trajectories count such blocks (truncated_documents): lower rollout.k or rollout.max_searches",
                        len(passages), len(ids), len(whole))
        return ids, self.backend.decode(ids), True

    def _check_prompt_lengths(self, questions: Sequence[Question], prompt_ids: list[list[int]]) -> None:
        # A prompt that fills the context leaves no room to answer (and past the model's positions
        # it generates garbage); say which question, rather than let the library warn or fail.
        limit = self.backend.max_context
        for q, ids in zip(questions, prompt_ids):
            if limit is not None and len(ids) >= limit:
                raise SearchRLError(
                    f"question {q.id!r}: its prompt is {len(ids):,} tokens, but the model's context holds "
                    f"{limit:,}; shorten the question (or the prompt template) or leave it out of the dataset"
                )

    # ---------------------------------------------------------------------------------------------
    def _run_batch(self, items, bar) -> list[Trajectory]:
        cfg, be, tags = self.cfg, self.backend, self.tags
        limit = be.max_context
        rollouts = [_Rollout(q, list(ids), cfg.max_new_tokens, math.inf if limit is None else limit) for q, ids in items]
        handles = be.start([r.prompt_ids for r in rollouts], cfg.sampling_params())
        stops = self.protocol.stop_strings()
        active = list(range(len(rollouts)))
        try:
            while active:
                turn = cfg.max_tokens_per_turn or cfg.max_new_tokens
                t0 = time.perf_counter()
                # The budget never reaches past the context: no position beyond the model's is fed.
                budgets = [int(min(turn, rollouts[i].left, rollouts[i].room())) for i in active]
                outs = be.generate([handles[i] for i in active], budgets, stops, cfg.round_quorum)
                gen_s = time.perf_counter() - t0
                searching: list[tuple[int, str]] = []
                for i, o in zip(active, outs):
                    r = rollouts[i]
                    r.gen_s += gen_s
                    if o.finish_reason == "pending":
                        continue  # still generating; its continuation comes back in a later round
                    r.add("policy", o.token_ids, o.logprobs)
                    r.left -= len(o.token_ids)
                    if o.finish_reason == "eos":
                        r.stop_reason = "eos"
                    elif o.finish_reason == "stop" and o.stop_string == tags.answer_close:
                        r.stop_reason = "answer"
                    elif o.finish_reason == "stop" and o.stop_string == self.protocol.turn_end:
                        r.stop_reason = "turn_end"
                    elif o.finish_reason == "stop" and o.stop_string == tags.query_close:
                        query = self.protocol.extract_query(be.decode(r.current_policy_ids()))
                        if not query:
                            r.stop_reason = "empty_query"
                        elif len(r.queries) >= cfg.max_searches:
                            r.stop_reason = "max_searches"
                        elif r.left <= 0:  # documents it could never read
                            r.stop_reason = "length"
                        elif r.documents_room() < self._tags_length():  # not even an empty block fits
                            r.stop_reason = "context_full"
                        else:
                            searching.append((i, query))
                    elif r.room() <= 0:
                        r.stop_reason = "context_full"
                    elif r.left <= 0 or not o.token_ids:  # budget spent, or the backend's context is full
                        r.stop_reason = "length"
                    # else: the turn's budget ran out mid-thought; it simply goes on next round
                if searching:
                    self._serve(searching, rollouts, handles)
                finished = [i for i in active if rollouts[i].stop_reason is not None]
                be.release([handles[i] for i in finished])
                if bar is not None:
                    bar.update(len(finished))
                active = [i for i in active if rollouts[i].stop_reason is None]
        finally:
            be.release(handles)
        return [self._trajectory(r) for r in rollouts]

    def _serve(self, searching: list[tuple[int, str]], rollouts: list[_Rollout], handles: list[int]) -> None:
        """One batched retrieval call for every paused sequence, then the documents as tokens."""
        queries = [q for _, q in searching]
        t0 = time.perf_counter()
        results = self.retriever.search(queries, self.cfg.k)
        ret_s = time.perf_counter() - t0
        if len(results) != len(queries):
            raise RuntimeError(f"retriever returned {len(results)} result lists for {len(queries)} queries")
        inserted = []
        for (i, query), passages in zip(searching, results):
            rollouts[i].ret_s += ret_s
            inserted.append(self._insert(rollouts[i], query, passages, rollouts[i].documents_room()))
        self.backend.append([handles[i] for i, _ in searching], inserted)

    def _tags_length(self) -> int:
        """Tokens of the smallest documents block a cut can leave: its opening and closing parts."""
        if self._tags_len is None:
            self._tags_len = sum(len(self.backend.encode(part)) for part in document_block_ends(self.tags))
        return self._tags_len

    def _insert(self, r: _Rollout, query: str, passages: Sequence[Passage], room: float = math.inf) -> list[int]:
        """Append the documents block answering `query` to `r` (loss mask 0), cut to `room`
        tokens; returns its ids. `room` holds at least the block's tags (checked before the search)."""
        ids, seen, cut = self.fitted_documents(passages, room)
        r.truncated_documents += cut
        r.add("env", ids)
        r.env_texts.append(seen)
        r.queries.append(query)
        r.retrieved_ids.append([p.id for p in passages])
        return ids

    def written(self, question: Question, prompt_ids: Sequence[int], texts: Sequence[str],
                searches: Sequence[tuple[str, Sequence[Passage]]]) -> Trajectory:
        """The trajectory this engine records when the policy writes `texts[0]` (ending with a
        query), the environment answers `searches[0]` = (query, passages), the policy writes
        `texts[1]`, ... and `texts[-1]` ends with the answer tag: each text tokenized on its own
        (as a scripted policy's would be), log-probs 0. Gold trajectories for SFT are built so."""
        if len(texts) != len(searches) + 1 or not texts[-1].endswith(self.tags.answer_close):
            raise ValueError("give one text more than searches, the last ending with the answer tag")
        r = _Rollout(question, list(prompt_ids), self.cfg.max_new_tokens, stop_reason="answer")
        for i, text in enumerate(texts):
            r.add("policy", self.backend.encode(text))
            if i < len(searches):
                self._insert(r, *searches[i])
        return self._trajectory(r)

    def _trajectory(self, r: _Rollout) -> Trajectory:
        eos = self.backend.eos_token_ids
        segments: list[Segment] = []
        env_texts = iter(r.env_texts)
        for source, ids in r.runs:
            if source == "env":
                segments.append(Segment(next(env_texts), "env"))
                continue
            # The EOS token stays in token_ids (it was sampled) but is no text of the response.
            text_ids = ids[:-1] if ids and ids[-1] in eos and r.stop_reason == "eos" and ids is r.runs[-1][1] else ids
            if text_ids:
                segments.append(Segment(self.backend.decode(text_ids), "policy"))
        return Trajectory(
            question_id=r.question.id,
            question=r.question.question,
            prompt_ids=r.prompt_ids,
            token_ids=r.token_ids,
            loss_mask=r.loss_mask,
            logprobs=r.logprobs,
            segments=segments,
            queries=r.queries,
            retrieved_ids=r.retrieved_ids,
            n_searches=len(r.queries),
            answer=self.protocol.answer(segments),
            stop_reason=r.stop_reason or "length",
            truncated_documents=r.truncated_documents,
            timing={"generation_s": r.gen_s, "retrieval_s": r.ret_s},
        )
