"""The rollout loop: the policy writes, the tools answer (docs/concepts/rollout.md), written against
`GenerationBackend`, the protocol and the run's tools only.

One batch of rollouts advances in rounds:

1. every active sequence generates until one of the protocol's stop strings (tags: the
   end-of-query tag, `</answer>`, a new "User:" line of completion templates; tool calls: the
   template's end-of-turn token), EOS or its budget;
2. the protocol reads the turn written since the last insertion (`read_turn`): the rollout ends
   (an answer, EOS, `empty_query`), or it made calls (tags: one `search` of the query);
3. calls over their tool's budget are refused (tags: the rollout ends, `max_searches`, unserved;
   tool calls: an error result, and a second such turn ends it); malformed calls get an error
   result; then ALL calls of the round, of every sequence, run batched per tool (one
   `retriever.search(queries, k)` for all searches: `searchrl.tools.batch.run_calls`);
4. each sequence's results are appended as token ids (loss mask 0), and the round repeats for
   the sequences still active. Tags: the documents block, tokenized on its own; tool calls: the
   template's tool-result messages (`NativeChat.observation_ids`).

With `round_quorum` < 1 a round closes once that share of its sequences has stopped: a backend
with continuous batching (vLLM) keeps the others generating ("pending") while the stopped ones
are served and resubmitted, so the long tail of a round does not leave the batch near empty.
Each round still calls each tool at most once, for the sequences that paused in it.

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
Tool-call results that do not fit are shortened alike (each result's text cut to one length and
marked), counted the same way; when not even empty results fit, the rollout stops there.

Partial rollouts (`run(..., between_rounds=...)`; asynchronous training's `rollout.partial:
continue`, docs/guides/async.md): the engine calls `between_rounds()` before each round's
generation, i.e. after the previous round's results are inserted and while no sequence is
generating. It may swap the backend's weights (`GenerationBackend.load_weights`) and returns the
policy version generating from then on. Each token records that version (an inserted block the
version of the round that called for it): `Trajectory.token_versions` when a rollout saw more than
one, and `policy_version` is its oldest. Where the weights come from is the caller's business.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from searchrl.data.trajectory import Segment, Trajectory
from searchrl.data.types import Passage, Question
from searchrl.datatext import data, data_passage, strip_marks
from searchrl.errors import SearchRLError
from searchrl.protocol import Protocol, TurnRead
from searchrl.retrieval.base import Retriever
from searchrl.rollout.backend import GenerationBackend
from searchrl.rollout.config import RolloutConfig
from searchrl.tags import TagSet
from searchrl.toolformat.chat import Message
from searchrl.toolformat.protocol import NativeProtocol
from searchrl.tools.base import Observation, Tool, ToolCall
from searchrl.tools.batch import run_calls
from searchrl.tools.context import ToolContext
from searchrl.tools.search import Search

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
    search_blocks: list[int] = field(default_factory=list)  # per query, the env block its results go into
    stop_reason: str | None = None
    truncated_documents: int = 0  # observation blocks cut to fit the context
    tool_calls: list[dict] = field(default_factory=list)
    tool_s: dict[str, float] = field(default_factory=dict)  # wall time of calls, per tool
    used: dict[str, int] = field(default_factory=dict)  # calls admitted per tool (budgets)
    spent_turns: int = 0  # turns whose every call was over its budget
    messages: list = field(default_factory=list)  # tool calls: the conversation so far
    version: int | None = None  # partial rollouts: the policy version generating now
    versions: list[int] = field(default_factory=list)  # partial rollouts: per token, its version
    gen_s: float = 0.0
    ret_s: float = 0.0

    def record(self, results: Sequence[tuple[ToolCall | None, Observation]]) -> None:
        """A round's calls and what they returned; a served search adds its query and passages."""
        for call, obs in results:
            self.tool_calls.append({
                "name": call.name if call else None,
                "arguments": call.arguments if call else None,
                "ok": obs.ok,
                "error": obs.error,
            })
            if call is not None:
                self.tool_s[call.name] = self.tool_s.get(call.name, 0.0) + obs.latency_s
            if call is not None and call.name == "search" and obs.ok:
                self.queries.append(call.arguments["query"])
                self.retrieved_ids.append([p.id for p in obs.passages])
                self.search_blocks.append(len(self.env_texts))  # the round's observation is appended next

    def add(self, source: str, ids: Sequence[int], logprobs: Sequence[float] | None = None) -> None:
        if not ids:
            return
        self.token_ids.extend(ids)
        self.loss_mask.extend([1 if source == "policy" else 0] * len(ids))
        self.logprobs.extend(logprobs if logprobs is not None else [0.0] * len(ids))
        if self.version is not None:
            self.versions.extend([self.version] * len(ids))
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
        protocol: Protocol | NativeProtocol,
        cfg: RolloutConfig | None = None,
        tools: dict[str, Tool] | None = None,
    ) -> None:
        self.backend = backend
        self.retriever = retriever
        self.protocol = protocol
        self.native = isinstance(protocol, NativeProtocol)
        self.tags = getattr(protocol, "tags", None)
        self.cfg = cfg or RolloutConfig()
        # The tag protocols speak the search tool only; tool calls may call any of the run's.
        self.tools = tools if tools is not None else {"search": Search(ToolContext(retriever, self.cfg.k))}
        self._warned_roundtrip = False
        self._warned_cut = False
        self._tags_len: int | None = None

    def run(
        self,
        questions: Sequence[Question],
        prompts: Sequence[str] | None = None,
        n: int | None = None,
        progress: bool = False,
        between_rounds: Callable[[], int] | None = None,
    ) -> list[Trajectory]:
        """`n` rollouts per question (default `cfg.samples_per_question`), question-major:
        [q0 s0, q0 s1, ..., q1 s0, ...]. `prompts` default to the protocol's template.
        `between_rounds`: partial rollouts (module docstring); then every trajectory carries its
        policy versions."""
        n = n or self.cfg.samples_per_question
        if between_rounds is not None and self.cfg.round_quorum < 1:
            raise ValueError("weights can change between rounds only when no sequence is generating: "
                             f"set rollout.round_quorum=1 (got {self.cfg.round_quorum}) for partial rollouts")
        prompt_ids = self.prompt_ids(questions, prompts)
        items = [(q, ids) for q, ids in zip(questions, prompt_ids) for _ in range(n)]
        out: list[Trajectory] = []
        bar = None
        if progress:
            from tqdm import tqdm

            bar = tqdm(total=len(items), desc="rollouts", unit="seq")
        for start in range(0, len(items), self.cfg.batch_size):
            out.extend(self._run_batch(items[start : start + self.cfg.batch_size], bar, between_rounds))
        if bar is not None:
            bar.close()
        return out

    def prompt_ids(self, questions: Sequence[Question], prompts: Sequence[str] | None = None) -> list[list[int]]:
        """The token ids each question's rollouts start from: `prompts` (default: the protocol's
        template) encoded as a sequence start, each checked to leave room in the context."""
        if self.native:
            if prompts is not None:
                raise ValueError("tool-call rollouts start from the protocol's conversation; prompts cannot be given")
            prompt_ids = [self.protocol.prompt_ids(q.question) for q in questions]
            self._check_prompt_lengths(questions, prompt_ids)
            return prompt_ids
        if prompts is None:  # the question is data: never a control token (searchrl.datatext)
            prompts = [self.protocol.prompt(data(q.question), self.backend.tokenizer) for q in questions]
        if len(prompts) != len(questions):
            raise ValueError(f"{len(prompts)} prompts for {len(questions)} questions")
        prompt_ids = [self.backend.encode(p, prompt=True) for p in prompts]
        self._check_prompt_lengths(questions, prompt_ids)
        return prompt_ids

    def marked_documents(self, passages: Sequence[Passage]) -> str:
        """The documents block of `passages` with their titles and texts marked as data
        (`searchrl.datatext`): what the engine tokenizes, so that no passage makes a control token."""
        return self.protocol.format_documents([data_passage(p) for p in passages])

    def documents(self, passages: Sequence[Passage]) -> tuple[list[int], str]:
        """The documents block of `passages` as the engine inserts it: its token ids (the block
        tokenized on its own, passages as data) and the text they decode to, which is what the
        model sees."""
        marked = self.marked_documents(passages)
        block = strip_marks(marked)
        ids = self.backend.encode(marked)
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
        block = self.marked_documents(passages)
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
    def _run_batch(self, items, bar, between_rounds: Callable[[], int] | None) -> list[Trajectory]:
        cfg, be = self.cfg, self.backend
        limit = be.max_context
        rollouts = [_Rollout(q, list(ids), cfg.max_new_tokens, math.inf if limit is None else limit) for q, ids in items]
        if self.native:
            for r in rollouts:
                r.messages = self.protocol.messages(r.question.question)
        handles = be.start([r.prompt_ids for r in rollouts], cfg.sampling_params())
        stops = self.protocol.stop_strings()
        active = list(range(len(rollouts)))
        try:
            while active:
                if between_rounds is not None:
                    version = between_rounds()
                    for i in active:
                        rollouts[i].version = version
                turn = cfg.max_tokens_per_turn or cfg.max_new_tokens
                t0 = time.perf_counter()
                # The budget never reaches past the context: no position beyond the model's is fed.
                budgets = [int(min(turn, rollouts[i].left, rollouts[i].room())) for i in active]
                outs = be.generate([handles[i] for i in active], budgets, stops, cfg.round_quorum)
                gen_s = time.perf_counter() - t0
                calling: list[tuple[int, TurnRead, list]] = []
                for i, o in zip(active, outs):
                    r = rollouts[i]
                    r.gen_s += gen_s
                    if o.finish_reason == "pending":
                        continue  # still generating; its continuation comes back in a later round
                    r.add("policy", o.token_ids, o.logprobs)
                    r.left -= len(o.token_ids)
                    read = self._read(r, o)
                    if read is not None and read.stop is None:
                        attempts = self._admit(r, read)
                        if attempts is not None:
                            calling.append((i, read, attempts))
                    elif read is not None:
                        r.stop_reason = read.stop
                    elif r.room() <= 0:
                        r.stop_reason = "context_full"
                    elif r.left <= 0 or not o.token_ids:  # budget spent, or the backend's context is full
                        r.stop_reason = "length"
                    # else: the turn's budget ran out mid-thought; it simply goes on next round
                if calling:
                    self._serve(calling, rollouts, handles)
                finished = [i for i in active if rollouts[i].stop_reason is not None]
                be.release([handles[i] for i in finished])
                if bar is not None:
                    bar.update(len(finished))
                active = [i for i in active if rollouts[i].stop_reason is None]
        finally:
            be.release(handles)
        return [self._trajectory(r) for r in rollouts]

    def _read(self, r: _Rollout, o) -> TurnRead | None:
        """The protocol's reading of where this generation stopped (the turn since the last
        observation), or None when it stopped for a budget."""
        if self.native:
            return self.protocol.read_turn(r.current_policy_ids(), o.finish_reason, o.stop_string)
        return self.protocol.read_turn(self.backend.decode(r.current_policy_ids()), o.finish_reason, o.stop_string)

    def _admit(self, r: _Rollout, read: TurnRead) -> list | None:
        """The turn's attempts, each (call or None, what runs: the call or a refusal), within the
        budgets; None when the rollout stops here instead (`r.stop_reason` set): every call over
        its tool's budget (`max_searches`; tool calls: the second such turn, the first is told),
        no policy budget left to read the results (`length`), or not even the tags of a documents
        block fit (`context_full`)."""
        attempts: list[tuple[ToolCall | None, ToolCall | Observation]] = []
        for call in read.calls:
            budget = self.cfg.tool_budget(call.name)
            if r.used.get(call.name, 0) >= budget:
                what = f"a search (at most {budget})" if call.name == "search" else f"a {call.name} call (at most {budget})"
                attempts.append((call, Observation.refused(f"no budget left for {what}; answer with what you have", "budget")))
            else:
                r.used[call.name] = r.used.get(call.name, 0) + 1
                attempts.append((call, call))
        attempts += [(None, Observation.refused(reason, "malformed")) for reason in read.malformed]
        if all(isinstance(a[1], Observation) and a[1].error == "budget" for a in attempts):
            # Tags end here, unserved (the paper's rule); a tool-call model reads that its budget
            # is spent, once, and may still answer.
            r.spent_turns += 1
            if not self.native or r.spent_turns > 1:
                r.stop_reason = "max_searches"
        elif r.left <= 0:  # observations it could never read
            r.stop_reason = "length"
        elif not self.native and r.documents_room() < self._tags_length():  # not even an empty block fits
            r.stop_reason = "context_full"
        return None if r.stop_reason else attempts

    def _serve(self, calling: list[tuple[int, TurnRead, list]], rollouts: list[_Rollout], handles: list[int]) -> None:
        """Every call of the round, run batched per tool (one retrieval call for all searches),
        then each rollout's observations appended as tokens (loss mask 0)."""
        flat = [run for _, _, attempts in calling for _, run in attempts]
        t0 = time.perf_counter()
        observations = iter(run_calls(self.tools, flat))
        tool_s = time.perf_counter() - t0
        served, inserted = [], []
        for i, read, attempts in calling:
            r = rollouts[i]
            r.ret_s += tool_s
            results = [(call, next(observations)) for call, _ in attempts]
            r.record(results)
            ids = self._observe(r, read, results) if self.native else self._insert_search(r, *results[0])
            if ids is None:
                r.stop_reason = "context_full"
                continue
            served.append(handles[i])
            inserted.append(ids)
        self.backend.append(served, inserted)

    def _insert_search(self, r: _Rollout, call: ToolCall, obs: Observation) -> list[int]:
        """The tag protocols' observation: the documents block of the search's passages."""
        return self._insert(r, obs.passages, r.documents_room())

    def _observe(self, r: _Rollout, read: TurnRead, results: list[tuple[ToolCall | None, Observation]]) -> list[int] | None:
        """The tool-call protocol's observation: the template's tool-result messages after the
        sampled turn, as ids. Results that do not fit the room left are shortened alike (their
        texts cut to one length, marked, the block counted in `truncated_documents`); None when
        not even empty results fit."""
        chat, sampled, room = self.protocol.chat, r.current_policy_ids(), r.documents_room()

        def render(texts: list[str]) -> tuple[list[Message], list[int]]:
            messages = [chat.tool_message(call.name if call else "error", t) for (call, _), t in zip(results, texts)]
            return messages, chat.observation_ids(r.messages, sampled, messages)

        texts = [obs.text for _, obs in results]
        messages, ids = render(texts)
        if len(ids) > room:
            r.truncated_documents += 1
            most = max(map(len, texts))
            while len(ids) > room:
                if most == 0:
                    return None
                most = max(0, min(most - 1, int(most * room / len(ids))))
                messages, ids = render([t if len(t) <= most else t[:most] + " [cut]" for t in texts])
        self._add_results(r, read.turn, messages, ids)
        return ids

    def _add_results(self, r: _Rollout, turn, messages: list[Message], ids: list[int]) -> None:
        """Append a tool-call turn's result block (`ids`, loss mask 0) and extend the
        conversation with the turn and its result `messages`."""
        r.add("env", ids)
        r.env_texts.append(self.backend.decode(ids))
        r.messages += [self.protocol.chat.assistant_message(turn), *messages]

    def _tags_length(self) -> int:
        """Tokens of the smallest documents block a cut can leave: its opening and closing parts."""
        if self._tags_len is None:
            self._tags_len = sum(len(self.backend.encode(part)) for part in document_block_ends(self.tags))
        return self._tags_len

    def _insert(self, r: _Rollout, passages: Sequence[Passage], room: float = math.inf) -> list[int]:
        """Append the documents block of `passages` to `r` (loss mask 0), cut to `room` tokens;
        returns its ids. `room` holds at least the block's tags (checked before the search)."""
        ids, seen, cut = self.fitted_documents(passages, room)
        r.truncated_documents += cut
        r.add("env", ids)
        r.env_texts.append(seen)
        return ids

    def written(self, question: Question, prompt_ids: Sequence[int], texts: Sequence[str] | Sequence[Message],
                searches: Sequence[tuple[str, Sequence[Passage]]]) -> Trajectory:
        """The trajectory this engine records when the policy writes `texts[0]` (ending with a
        query), the environment answers `searches[0]` = (query, passages), the policy writes
        `texts[1]`, ... and `texts[-1]` ends with the answer tag: each text tokenized on its own
        (as a scripted policy's would be), log-probs 0. Gold trajectories for SFT are built so.

        Tool calls: `texts` are the conversation after the prompt's messages, an assistant
        message with one call and its tool message per search, then the final assistant
        message; each turn's ids are what a policy samples for it (`selftest.sampled_ids`), each
        result block the template's observation ids (loss mask 0), as `_observe` appends them."""
        r = _Rollout(question, list(prompt_ids), self.cfg.max_new_tokens, stop_reason="answer")
        if not self.native:
            if len(texts) != len(searches) + 1 or not texts[-1].endswith(self.tags.answer_close):
                raise ValueError("give one text more than searches, the last ending with the answer tag")
            for i, text in enumerate(texts):
                r.add("policy", self.backend.encode(text))
                if i < len(searches):
                    query, passages = searches[i]
                    r.record([(ToolCall("search", {"query": query}), Observation("", passages=list(passages)))])
                    self._insert(r, passages)
            return self._trajectory(r)
        if len(texts) != 2 * len(searches) + 1 or any(len(m.get("tool_calls") or []) != 1 for m in texts[:-1:2]):
            raise ValueError("give an assistant message with one call and its tool message per search, then the answer")
        from searchrl.toolformat.selftest import sampled_ids

        chat = self.protocol.chat
        r.messages = self.protocol.messages(question.question)
        for i, assistant in enumerate(texts[::2]):
            sampled = sampled_ids(chat, r.messages, assistant)
            r.add("policy", sampled)
            if i == len(searches):
                break
            tool = texts[2 * i + 1]
            call = assistant["tool_calls"][0]["function"]
            r.record([(ToolCall(call["name"], call["arguments"]), Observation(tool["content"], passages=list(searches[i][1])))])
            self._add_results(r, chat.parse_ids(sampled), [tool], chat.observation_ids(r.messages, sampled, [tool]))
        return self._trajectory(r)

    def _trajectory(self, r: _Rollout) -> Trajectory:
        eos = self.backend.eos_token_ids
        segments: list[Segment] = []
        env_texts = iter(r.env_texts)
        for source, ids in r.runs:
            if source == "env":
                segments.append(Segment(next(env_texts), "env"))
                continue
            # The EOS token stays in token_ids (it was sampled) but is no text of the response;
            # nor is the end-of-turn token that closes each turn of a tool-call rollout.
            if self.native:
                text_ids = self.protocol.turn_text(ids)
            else:
                text_ids = ids[:-1] if ids and ids[-1] in eos and r.stop_reason == "eos" and ids is r.runs[-1][1] else ids
            if text_ids:
                segments.append(Segment(self.backend.decode(text_ids), "policy"))
        versions = {}
        if r.version is not None:  # partial rollouts: staleness counts from the oldest token
            mixed = len(set(r.versions)) > 1
            versions = {"policy_version": min(r.versions, default=r.version), "token_versions": r.versions if mixed else []}
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
            search_blocks=r.search_blocks,
            n_searches=len(r.queries),
            answer=self.protocol.answer(segments),
            stop_reason=r.stop_reason or "length",
            truncated_documents=r.truncated_documents,
            tool_calls=r.tool_calls,
            timing={"generation_s": r.gen_s, "retrieval_s": r.ret_s, **{f"tools/{n}_s": v for n, v in r.tool_s.items()}},
            **versions,
        )
