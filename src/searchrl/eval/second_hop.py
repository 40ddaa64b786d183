"""Where the second hop of a multi-hop question fails: the measurements of `searchrl eval
second-hop` (docs/results.md#multi-hop-where-the-second-hop-fails), on values alone (the probe
that generates lives in `searchrl.eval.second_hop_probe`).

- *Retrieval ceiling*: for each supporting passage of a question (hop order), its rank in the
  top k for the passage's title as the query (the entity a searcher has to name: the gold query
  of `searchrl.rollout.gold`) and for the question itself as the query.
- *Next step*: the gold first search is written for the model (its query and the documents it
  returns), then the model goes on. Its next step is a search, an answer, or neither; a search
  is read for the *bridge entity*: whether it names an entity of the first documents that the
  question does not (`multihop.bridge_step`, the rule of the bridge rate), whether it holds a
  word of the second supporting passage's title that the question does not (the entity the gold
  path names), whether it only repeats the question (no word the question lacks) or the first
  query, and whether its top k holds the second supporting passage.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from searchrl.data.types import Question
from searchrl.eval.multihop import ALL, COMMON, bridge_step, words
from searchrl.metrics import cover_em, exact_match
from searchrl.retrieval.base import Retriever

# ----------------------------------------------------------------------------------------------
# Retrieval ceiling


@dataclass(frozen=True)
class HopRanks:
    """One supporting passage of a question: its 1-based rank among the top `depth` results of
    each query, None when it is not among them."""

    type: str
    hop: int  # 1 = the first supporting passage
    by_title: int | None
    by_question: int | None


def _rank(pid: str, ids: Sequence[str]) -> int | None:
    return ids.index(pid) + 1 if pid in ids else None


def hop_ranks(questions: Sequence[Question], titles: dict[str, str], retriever: Retriever, depth: int) -> list[HopRanks]:
    """The ranks of every supporting passage of `questions` (`titles`: passage id -> title), each
    title and each question searched once, in two batched calls."""
    questions = [q for q in questions if q.supporting_ids and all(i in titles for i in q.supporting_ids)]
    hops = [(q, h, pid) for q in questions for h, pid in enumerate(q.supporting_ids, 1)]
    by_title = retriever.search([titles[pid] for _, _, pid in hops], depth)
    by_question = dict(zip((q.id for q in questions), retriever.search([q.question for q in questions], depth)))
    return [HopRanks(q.type, h, _rank(pid, [p.id for p in found]), _rank(pid, [p.id for p in by_question[q.id]]))
            for (q, h, pid), found in zip(hops, by_title)]


def ceiling_rows(ranks: Sequence[HopRanks], ks: Sequence[int]) -> tuple[list[str], list[list[str]]]:
    """(header, rows): per type and hop, the share of supporting passages in the top k of their
    title and of the question, for each k in `ks`; `all` types first."""
    header = ["type", "hop", "n"] + [f"title top-{k} %" for k in ks] + [f"question top-{k} %" for k in ks]
    rows = []
    for qtype in [ALL, *sorted({r.type for r in ranks})]:
        for hop in sorted({r.hop for r in ranks}):
            group = [r for r in ranks if r.hop == hop and qtype in (ALL, r.type)]
            if not group:
                continue
            share = [sum(r.by_title is not None and r.by_title <= k for r in group) for k in ks]
            share += [sum(r.by_question is not None and r.by_question <= k for r in group) for k in ks]
            rows.append([qtype, str(hop), str(len(group))] + [_pct(s, len(group)) for s in share])
    return header, rows


# ----------------------------------------------------------------------------------------------
# Copying an entity


def key_word(name: str, exclude: set[str] = frozenset()) -> str | None:
    """The word that tells an entity's name apart: its longest word less common words and
    `exclude` (the last of the longest: a surname), lower case; None when none is left. Invented
    names are long words, a title's other words ("The Last Days of ...") short common ones.

    >>> key_word("The Last Days of Peisdaern"), key_word("Kheno Muard"), key_word("Veimtarn Studios")
    ('peisdaern', 'muard', 'veimtarn')
    """
    left = [w for w in words(name) if w not in COMMON and w not in exclude]
    return max(reversed(left), key=len) if left else None


def copied(query: str | None, word: str | None) -> str:
    """How `query` names the entity whose `key_word` is `word`: "exact" when it holds the word;
    "near" when it holds a word of four or more letters that differs from it by a few letters (a
    name copied wrong: difflib ratio >= 0.75); "absent" otherwise.

    >>> copied("The last day of Peisdaer", "peisdaern"), copied("Peisdaern studio", "peisdaern")
    ('near', 'exact')
    >>> copied("founder birthplace", "peisdaern"), copied(None, "peisdaern")
    ('absent', 'absent')
    """
    from difflib import SequenceMatcher

    said = set(words(query or ""))
    if word is None or not said:
        return "absent"
    if word in said:
        return "exact"
    near = len(word) >= 4 and any(len(w) >= 4 and SequenceMatcher(None, w, word).ratio() >= 0.75 for w in said)
    return "near" if near else "absent"


# ----------------------------------------------------------------------------------------------
# The next step after the gold first search


@dataclass(frozen=True)
class NextStep:
    """What the model did after the gold first search of one question."""

    type: str
    action: str  # search | answer | none (EOS, a budget, an empty query)
    bridge: bool  # the query names an entity of the first documents the question does not
    gold_bridge: bool  # the query holds a word of the second passage's title the question does not
    bridge_misspelt: bool  # it holds none, but a word a few letters off the title's `key_word`
    repeats_question: bool  # the query holds no word the question lacks
    repeats_first: bool  # the query's words are the first query's
    finds_next: bool  # the query's top k holds the second supporting passage
    answer_em: float  # the first answer written, before any further search (0 without one)
    answer_is_bridge: bool  # that answer names the second passage's title (stopped at the bridge entity)
    final_em: float  # the rollout's final answer, searches included
    final_cover_em: float


def next_step(q: Question, first_query: str, first_docs: str, next_title: str, query: str | None, found_next: bool,
              answer: str | None, final: str | None) -> NextStep:
    """Read one continuation: `query` the model's next query (None: it wrote none before
    `answer`, the answer it wrote first, or nothing); `found_next` whether that query's results
    held the second supporting passage; `final` the rollout's final answer.

    >>> q = Question("q", "Where was the director of Falnyk born?", ("Gimnamburg",), type="bridge-2hop")
    >>> docs = "(1)Title: Falnyk Text: Directed by Kheno Muard, Falnyk is a drama film."
    >>> s = next_step(q, "Falnyk", docs, "Kheno Muard", "Kheno Muard birthplace", True, None, "Gimnamburg")
    >>> s.action, s.bridge, s.gold_bridge, s.repeats_question, s.finds_next, s.final_em
    ('search', True, True, False, True, 1.0)
    >>> next_step(q, "Falnyk", docs, "Kheno Muard", None, False, "Kheno Muard", "Kheno Muard").answer_is_bridge
    True
    """
    said = set(words(q.question))
    if query is not None:
        new = set(words(query)) - said
        title_words = set(words(next_title)) - said - COMMON
        return NextStep(
            q.type, "search",
            bridge=bridge_step(q.question, [first_query, query], ["", first_docs]),
            gold_bridge=bool(new & title_words),
            bridge_misspelt=not new & title_words and copied(query, key_word(next_title, said)) == "near",
            repeats_question=not new,
            repeats_first=set(words(query)) == set(words(first_query)),
            finds_next=found_next,
            answer_em=0.0, answer_is_bridge=False,
            final_em=exact_match(final, q.answers), final_cover_em=cover_em(final, q.answers),
        )
    return NextStep(
        q.type, "answer" if answer is not None else "none",
        bridge=False, gold_bridge=False, bridge_misspelt=False, repeats_question=False, repeats_first=False, finds_next=False,
        answer_em=exact_match(answer, q.answers),
        answer_is_bridge=answer is not None and bool(next_title) and cover_em(answer, [next_title]) == 1.0,
        final_em=exact_match(final, q.answers), final_cover_em=cover_em(final, q.answers),
    )


NEXT_HEADER = ["type", "n", "searches %", "bridge entity %", "gold bridge %", "bridge misspelt %", "repeats question %",
               "repeats 1st query %",
               "finds hop-2 passage %", "answers %", "answer right %", "answers the bridge %", "neither %",
               "final EM %", "final cover-EM %"]


def next_step_rows(steps: Sequence[NextStep]) -> list[list[str]]:
    """One `NEXT_HEADER` row per type, `all` first; every share is of the type's questions."""
    rows = []
    for qtype in [ALL, *sorted({s.type for s in steps})]:
        g = [s for s in steps if qtype in (ALL, s.type)]
        n = len(g)
        counts = [sum(s.action == "search" for s in g), sum(s.bridge for s in g), sum(s.gold_bridge for s in g),
                  sum(s.bridge_misspelt for s in g), sum(s.repeats_question for s in g), sum(s.repeats_first for s in g), sum(s.finds_next for s in g),
                  sum(s.action == "answer" for s in g), sum(s.answer_em for s in g), sum(s.answer_is_bridge for s in g),
                  sum(s.action == "none" for s in g), sum(s.final_em for s in g), sum(s.final_cover_em for s in g)]
        rows.append([qtype, str(n)] + [_pct(c, n) for c in counts])
    return rows


def _pct(count: float, n: int) -> str:
    return f"{100 * count / n:.1f}" if n else "n/a"


# ----------------------------------------------------------------------------------------------
# Entities in an agent's own queries

COPY_HEADER = ["type", "n", "1st query: entity exact %", "misspelt %", "absent %", "with a 2nd query", "2nd query: bridge exact %",
               "misspelt %", "absent %"]


def copy_rows(records: Sequence[Mapping], titles: Mapping[str, str]) -> list[list[str]]:
    """Per type, `all` first, from an agent's `eval run` records (with supporting ids): how its
    first query names the question's entity (the `key_word` of the first supporting passage's
    title; no query: absent), and, over the rollouts that searched twice, how the second query
    names the bridge entity (that of the second passage's title less the question's words), each
    by `copied`."""
    rows = []
    kinds = ("exact", "near", "absent")
    for qtype in [ALL, *sorted({r["type"] for r in records})]:
        group = [r for r in records if qtype in (ALL, r["type"])]
        first = [copied(r["queries"][0] if r["queries"] else None, key_word(titles[r["supporting_ids"][0]])) for r in group]
        twice = [r for r in group if len(r["queries"]) >= 2]
        second = [copied(r["queries"][1], key_word(titles[r["supporting_ids"][1]], set(words(r["question"])))) for r in twice]
        rows.append([qtype, str(len(group))] + [_pct(first.count(k), len(group)) for k in kinds] + [str(len(twice))]
                    + [_pct(second.count(k), len(twice)) for k in kinds])
    return rows
