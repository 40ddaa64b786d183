"""Gold search trajectories, the training data of the SFT baseline (R1-Searcher Table 4): what an
agent writes that searches for each supporting passage of a question in hop order and then
answers, recorded as the rollout engine records a rollout (`RolloutEngine.written`): the same
prompt ids, the observations built by the protocol's own code with loss mask 0, the policy's
text with loss mask 1, each piece tokenized as a scripted policy's would be.

A question's gold path needs its supporting passage ids in hop order (the toy world records them)
and a local index to read their titles from. Each hop's query is the passage's title, or the
title plus one word of the question when the title alone does not bring that passage into the
top k; the documents of a search are what the retriever returns for its query, so the path is the
one an RL rollout writing the same queries would see. A question with no such path within
`max_searches` searches (more hops than that, a passage no such query finds) has none.

The policy's text is a fixed template around the queries:

    <think> First I search for Q1.

    <search>Q1</search>  [documents]  Next I search for Q2.

    <search>Q2</search>  [documents]  So the answer is A.</think>

    <answer>A</answer>

With `evidence` (an sft stage's `evidence: true`) each step after a documents block first states
the fact the passage just found gives: the question's own evidence sentence for that hop where it
lists them (`Question.evidence`; the toy world's read "The director of X is Q2."), else the
sentence of those documents that names what comes next, the next hop's title or the answer
(`evidence_sentence`; none when no sentence names it):

    [documents]  The director of X is Q2. Next I search for Q2. ...
    [documents]  The birthplace of Q2 is A. So the answer is A.</think> ...
    comparison:  [documents]  The population of B is 91,500. So the answer is C.</think> ...

so the policy names the relation the question asks about before the entity it copies (a cloze a
small pretrained model reads well), and the values a comparison compares. Without it the
warm-started agent's second search missed the second passage on 37 of 59 bridge questions, mostly
by naming another entity of the first passage; quoting the passage's own sentence instead made it
quote the passage's first sentence (docs/results.md, "Training for the second hop").

A path is written protocol-neutral (`GoldPath.script`: per hop a thought, the `search` call and
its result, then the last thought and the answer), and the run's protocol renders it
(`Protocol.written`): the text above for tags; with tool calls (`protocol.format: tool-calls`) a
chat conversation (`Protocol.chat_messages`, the shape Hugging Face datasets use for tool
calling) of the protocol's own messages, per hop an assistant turn "First I search for Q1." with
one `search` call and the tool's result (the search tool's text of the passages), then the answer
alone, recorded turn by turn as the engine records a rollout.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from searchrl.data.trajectory import Trajectory
from searchrl.data.types import Passage, Question
from searchrl.errors import SearchRLError
from searchrl.protocols.base import Message, Script, Step
from searchrl.retrieval.base import Retriever
from searchrl.rollout.engine import RolloutEngine
from searchrl.tools.base import Observation, ToolCall
from searchrl.tools.passages import format_passages

# Question words that say nothing about what a passage holds.
_STOPWORDS = frozenset(
    "a an and are as at be been by did does for from had has have in is it its of on or that the "  # noqa: SIM905
    "this to was were what when where which who whom whose with".split()
)


def query_candidates(title: str, question: str, titles: Sequence[str]) -> list[str]:
    """Queries for the passage titled `title`, in the order they are tried: the title, then the
    title plus each content word of `question` that is in none of the path's `titles`.

    >>> query_candidates("Bosenikford", "Which city is larger, Bosenikford or Laemeburg?", ["Bosenikford", "Laemeburg"])
    ['Bosenikford', 'Bosenikford city', 'Bosenikford larger']
    """
    in_titles = {w.lower() for t in titles for w in re.findall(r"[^\W\d_]+", t)}
    words: list[str] = []
    for w in re.findall(r"[^\W\d_]+", question):
        w = w.lower()
        if len(w) > 2 and w not in _STOPWORDS and w not in in_titles and w not in words:
            words.append(w)
    return [title] + [f"{title} {w}" for w in words]


def evidence_sentence(passages: Sequence[Passage], targets: Sequence[str]) -> str | None:
    """The first sentence of `passages` that names one of `targets` as whole words
    (case-insensitive; "no" is not named by "honour"), or None.

    >>> evidence_sentence([Passage("p1", "Film", "Film is a 1977 film. It was directed by Ana Vel.")], ["Ana Vel"])
    'It was directed by Ana Vel.'
    """
    for p in passages:
        for sentence in re.split(r"(?<=[.!?])\s+", p.text.strip()):
            if names_any(sentence, targets):
                return sentence
    return None


def names_any(text: str, targets: Sequence[str]) -> bool:
    """Whether `text` holds one of `targets` as whole words (case-insensitive)."""
    return any(
        re.search(rf"\b{re.escape(t.strip())}\b", text, re.IGNORECASE) for t in targets if t.strip()
    )


def shortcut(question: Question, first: Passage) -> bool:
    """Whether one search can answer `question`: its first supporting passage `first` names the
    answer and the question itself does not (a comparison names both candidates, and needs both
    passages to choose).

    >>> q = Question("q", "Where was the director of Film born?", ["Harbel"], supporting_ids=["f", "d"])
    >>> shortcut(q, Passage("f", "Film", "Film was shot in Harbel.")), shortcut(q, Passage("f", "Film", "A film."))
    (True, False)
    """
    return names_any(first.text, question.answers) and not names_any(question.question, question.answers)


@dataclass(frozen=True)
class GoldPath:
    """A question's gold search: (query, passages it returned) per hop, in hop order; `evidence`:
    quote the sentence that names the next step's target (module docstring)."""

    question: Question
    searches: tuple[tuple[str, tuple[Passage, ...]], ...]
    evidence: bool = False

    def lead(self, hop: int) -> str:
        """What the policy writes first after the documents of search `hop - 1` (hop = number of
        searches: before the answer): the evidence sentences and a space, or nothing."""
        if not self.evidence or hop == 0:
            return ""
        q = self.question
        if len(q.evidence) == len(q.supporting_ids):  # one a hop
            return f"{q.evidence[hop - 1]} "
        if hop < len(self.searches):
            want = self.question.supporting_ids[hop]
            targets = [p.title for p in self.searches[hop][1] if p.id == want]
        else:
            targets = list(self.question.answers)
        sentence = evidence_sentence(self.searches[hop - 1][1], targets)
        return f"{sentence} " if sentence else ""

    def script(self, observe: Callable[[Sequence[Passage]], str] = format_passages) -> Script:
        """The path written out (module docstring); `observe`: the search tool's text of a
        search's passages."""
        steps = tuple(
            Step(f"{self.lead(i)}{'Next' if i else 'First'} I search for {query}.", ToolCall("search", {"query": query}),
                 Observation(observe(passages), passages=list(passages)))
            for i, (query, passages) in enumerate(self.searches)
        )
        answer = self.question.answers[0]
        return Script(steps, f"{self.lead(len(steps))}So the answer is {answer}.", answer)


def support_passages(retriever: Retriever, ids: set[str]) -> dict[str, Passage]:
    """The passages of `ids` that the retriever's index holds, by id (one pass over the index)."""
    store = getattr(retriever, "passages", None)
    if store is None:
        raise SearchRLError(
            "gold trajectories read supporting passages from the index: set retrieval.index to a local index "
            "(a retrieval server or web search cannot list its passages)"
        )
    return {p.id: p for p in store if p.id in ids}


def gold_paths(
    questions: Sequence[Question], retriever: Retriever, k: int, max_searches: int, evidence: bool = False
) -> list[GoldPath | None]:
    """Each question's gold path, or None when it has none (see the module docstring). Searches
    are batched: round r tries the r-th query candidate of every hop not yet found."""
    passages = support_passages(retriever, {i for q in questions for i in q.supporting_ids})
    candidates: dict[tuple[int, int], list[str]] = {}  # (question, hop) -> queries to try
    for qi, q in enumerate(questions):
        ids = q.supporting_ids
        if (
            not ids
            or len(ids) > max_searches
            or not q.answers
            or any(i not in passages for i in ids)
        ):
            continue
        titles = [passages[i].title for i in ids]
        for hop, title in enumerate(titles):
            candidates[(qi, hop)] = query_candidates(title, q.question, titles)
    found: dict[tuple[int, int], tuple[str, tuple[Passage, ...]]] = {}
    r = 0
    while todo := [key for key, c in candidates.items() if key not in found and r < len(c)]:
        results = retriever.search([candidates[key][r] for key in todo], k)
        for (qi, hop), hits in zip(todo, results):
            if questions[qi].supporting_ids[hop] in {p.id for p in hits}:
                found[(qi, hop)] = (candidates[(qi, hop)][r], tuple(hits))
        r += 1
    paths: list[GoldPath | None] = []
    for qi, q in enumerate(questions):
        hops = [found.get((qi, hop)) for hop in range(len(q.supporting_ids))]
        paths.append(GoldPath(q, tuple(hops), evidence) if hops and all(hops) else None)
    return paths


def gold_script(engine: RolloutEngine, path: GoldPath) -> Script:
    """A path written with the results in the text of the engine's search tool."""
    search = engine.tools.get("search")
    if search is None:
        raise SearchRLError(
            f"a kind: sft stage trains on gold searches, but the run's tools ({', '.join(engine.tools)}) "
            "have no search; add it (tools: [search, ...])"
        )
    return path.script(search.context.format_passages)


def gold_messages(engine: RolloutEngine, path: GoldPath) -> list[Message] | None:
    """A path's conversation in the engine's protocol; None for a protocol without chat messages."""
    return engine.protocol.chat_messages(path.question.question, gold_script(engine, path))


def gold_trajectories(engine: RolloutEngine, paths: Sequence[GoldPath]) -> list[Trajectory]:
    """The gold paths as the engine records rollouts (policy tokens mask 1, documents or tool
    results mask 0). Paths longer than the engine's policy-token budget are refused, all named by
    one error (a rollout would be cut there); the trainer builds every example once before its
    first step, so a run does not stop on one in the middle."""
    prompt_ids = engine.prompt_ids([p.question for p in paths])
    out = [engine.written(path.question, ids, gold_script(engine, path)) for path, ids in zip(paths, prompt_ids)]
    budget = engine.cfg.max_new_tokens
    over = [(sum(t.loss_mask), t.question_id) for t in out if sum(t.loss_mask) > budget]
    if over:
        longest, qid = max(over)
        raise SearchRLError(
            f"{len(over)} of {len(paths)} gold trajectories have more policy tokens than rollout.max_new_tokens="
            f"{budget} (the longest, question {qid!r}, has {longest}); set rollout.max_new_tokens={longest}"
        )
    return out
