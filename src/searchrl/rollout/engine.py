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
   the sequences still active: the protocol builds them (`Protocol.observe`; tags: the documents
   block, tokenized on its own; tool calls: the template's tool-result messages).

With `round_quorum` < 1 a round closes once that share of its sequences has stopped: a backend
with continuous batching (vLLM) keeps the others generating ("pending") while the stopped ones
are served and resubmitted, so the long tail of a round does not leave the batch near empty.
Each round still calls each tool at most once, for the sequences that paused in it.

Tokens are recorded exactly as sampled or inserted, with the text each observation decodes to
(what the model saw).

The model's context (`backend.max_context`) bounds every rollout: prompt + response never exceed
it. A turn's token budget shrinks to what the context has left; a rollout that fills it stops
with `context_full`. An observation gets what is left, less `ANSWER_ROOM` tokens kept for the
policy to answer in (or less its whole remaining budget when that is smaller); the protocol cuts
one that does not fit (`searchrl.protocols.tagged`, `searchrl.protocols.chat_tools`), and the
trajectory counts its cut blocks (`truncated_documents`). When not even the smallest observation
fits (`Protocol.min_observation_tokens`, or the protocol finds none fits), the rollout stops
with `context_full`.

Partial rollouts (`run(..., between_rounds=...)`; asynchronous training's `rollout.partial:
continue`, docs/guides/async.md): the engine calls `between_rounds()` before each round's
generation, i.e. after the previous round's results are inserted and while no sequence is
generating. It may swap the backend's weights (`GenerationBackend.load_weights`) and returns the
policy version generating from then on. Each token records that version (an inserted block the
version of the round that called for it): `Trajectory.token_versions` when a rollout saw more than
one, and `policy_version` is its oldest. Where the weights come from is the caller's business.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from searchrl.data.trajectory import Segment, Trajectory
from searchrl.data.types import Question
from searchrl.errors import SearchRLError
from searchrl.protocols.base import Protocol, Script, TurnRead
from searchrl.retrieval.base import Retriever
from searchrl.rollout.backend import GenerationBackend
from searchrl.rollout.config import RolloutConfig
from searchrl.tools.base import Observation, Tool, ToolCall
from searchrl.tools.batch import run_calls
from searchrl.tools.context import ToolContext
from searchrl.tools.search import Search

ANSWER_ROOM = 64  # policy tokens a cut observation leaves free, so the model can still answer


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
    messages: list = field(default_factory=list)  # the conversation so far (`Protocol.conversation`)
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
        """Tokens an observation may take: what is left, less room for the policy to answer."""
        return self.room() - min(self.left, ANSWER_ROOM)


class RolloutEngine:
    """Turns questions into `Trajectory`s with a policy (backend) and an environment (retriever)."""

    def __init__(
        self,
        backend: GenerationBackend,
        retriever: Retriever,
        protocol: Protocol,
        cfg: RolloutConfig | None = None,
        tools: dict[str, Tool] | None = None,
    ) -> None:
        self.backend = backend
        self.retriever = retriever
        self.protocol = protocol
        self.cfg = cfg or RolloutConfig()
        self.tools = tools if tools is not None else {"search": Search(ToolContext(retriever, self.cfg.k))}

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
        """The token ids each question's rollouts start from: the protocol's prompt, or `prompts`
        given (where the protocol takes them), each checked to leave room in the context."""
        if prompts is not None and len(prompts) != len(questions):
            raise ValueError(f"{len(prompts)} prompts for {len(questions)} questions")
        given = prompts if prompts is not None else [None] * len(questions)
        prompt_ids = [self.protocol.prompt_ids(q.question, self.backend, p) for q, p in zip(questions, given)]
        self._check_prompt_lengths(questions, prompt_ids)
        return prompt_ids

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
        for r in rollouts:
            r.messages = self.protocol.conversation(r.question.question)
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
                    read = self.protocol.read_turn(r.current_policy_ids(), o.finish_reason, o.stop_string, be)
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

    def _admit(self, r: _Rollout, read: TurnRead) -> list | None:
        """The turn's attempts, each (call or None, what runs: the call or a refusal), within the
        budgets; None when the rollout stops here instead (`r.stop_reason` set): every call over
        its tool's budget (`max_searches`, past `Protocol.spent_turns_allowed` such turns), no
        policy budget left to read the results (`length`), or not even the smallest observation
        fits (`context_full`)."""
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
            if r.spent_turns > self.protocol.spent_turns_allowed:
                r.stop_reason = "max_searches"
        elif r.left <= 0:  # observations it could never read
            r.stop_reason = "length"
        elif r.documents_room() < self.protocol.min_observation_tokens(self.backend):  # not even the smallest fits
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
            obs = self.protocol.observe(r.messages, read, r.current_policy_ids(), results, r.documents_room(), self.backend)
            if obs is None:
                r.stop_reason = "context_full"
                continue
            r.truncated_documents += obs.cut
            r.add("env", obs.ids)
            r.env_texts.append(obs.text)
            r.messages += obs.messages
            served.append(handles[i])
            inserted.append(obs.ids)
        self.backend.append(served, inserted)

    def written(self, question: Question, prompt_ids: Sequence[int], script: Script) -> Trajectory:
        """The trajectory this engine records when the policy writes `script` in the protocol's
        syntax and the environment answers each step with its result (`Protocol.written`): each
        policy piece tokenized as a scripted policy's would be, log-probs 0. Gold trajectories
        for SFT are built so."""
        r = _Rollout(question, list(prompt_ids), self.cfg.max_new_tokens, stop_reason="answer")
        steps = iter(script.steps)
        for source, ids, text in self.protocol.written(question.question, script, self.backend):
            if source == "env":
                step = next(steps)
                r.record([(step.call, step.result)])
                r.env_texts.append(text)
            r.add(source, ids)
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
            final = r.stop_reason == "eos" and ids is r.runs[-1][1]
            text_ids = self.protocol.turn_text(ids, eos if final else frozenset())
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
