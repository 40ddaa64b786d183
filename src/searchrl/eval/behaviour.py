"""How a search agent fails, one rollout at a time: the behaviours an outcome reward can pay for
without the agent having learned to read (docs/guides/evaluation.md#failure-modes). Training
(`metrics.jsonl`) and evaluation (`metrics.json`) report them under the same names:

- **echo** (`query_echo_rate`): the answer is, word for word after normalisation, the agent's only
  query: it wrote a guess, searched the guess and answered the guess, whatever came back;
- **ungrounded** (`ungrounded_rate`): the answer stands in no document the rollout was shown (a
  yes/no answer is not judged);
- **over-hop** (`overhop_rate`): the agent searched again after a gold answer already stood in the
  documents it had read;
- **avoidance** (`avoid_rate`): no answer, or one that normalises to nothing;
- **empty searches** (`empty_search_rate`): the share of searches that returned no passage.

Containment is of normalised text on word boundaries (`metrics.contains`), so "Paris" stands in
"... born in Paris, France" and not in "Parisian".
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from searchrl import metric_names as mn
from searchrl.eval.multihop import seen_by_query
from searchrl.metrics import contains, normalize_answer

if TYPE_CHECKING:
    from searchrl.data.trajectory import Trajectory

_YES_NO = frozenset({"yes", "no"})


@dataclass(frozen=True)
class Behaviour:
    """What one rollout did that an outcome reward cannot tell from reading."""

    echo: bool  # the answer is the rollout's only (distinct) query
    ungrounded: bool | None  # the answer is in no document shown; None: no answer, or yes/no
    overhop: bool | None  # a search after a gold answer was in the documents read; None: gold is yes/no
    avoided: bool  # no answer, or an empty one
    searches: int
    empty_searches: int  # searches that returned no passage


def behaviour(queries: Sequence[str], retrieved_ids: Sequence[Sequence[str]], env_texts: Sequence[str],
              search_blocks: Sequence[int], answer: str | None, golds: Sequence[str]) -> Behaviour:
    """The behaviour of one rollout: its `queries` in order, the passage ids each returned, the
    text of its environment blocks (documents the rollout was shown, in order), which block shows
    each query's results (`Trajectory.search_blocks`), its `answer` and the gold answers.

    >>> docs = ["(1)Title: Falnyk Text: Directed by Kheno Muard."]
    >>> b = behaviour(["Kheno Muard"], [["p1"]], docs, [0], "Kheno Muard", ["Gimnamburg"])
    >>> b.echo, b.ungrounded, b.overhop, b.avoided
    (True, False, False, False)
    >>> b = behaviour(["Falnyk", "Kheno Muard"], [["p1"], []], docs + ["(no results)"], [0, 1], "Muard", ["Kheno Muard"])
    >>> b.echo, b.overhop, b.empty_searches
    (False, True, 1)
    >>> behaviour([], [], [], [], None, ["no"]).avoided, behaviour([], [], [], [], "yes", ["no"]).ungrounded
    (True, None)
    """
    said = normalize_answer(answer) if answer is not None else ""
    distinct = {normalize_answer(q) for q in queries}
    golds_in_text = [g for g in golds if normalize_answer(g) not in _YES_NO and normalize_answer(g)]
    seen = seen_by_query(env_texts, search_blocks, len(queries))
    return Behaviour(
        echo=bool(said) and distinct == {said},
        ungrounded=None if not said or said in _YES_NO else not contains("\n".join(env_texts), said),
        overhop=None if not golds_in_text else any(any(contains(text, g) for g in golds_in_text) for text in seen[1:]),
        avoided=not said,
        searches=len(queries),
        empty_searches=sum(1 for ids in retrieved_ids if not ids),
    )


def of_trajectory(traj: Trajectory, golds: Sequence[str]) -> Behaviour:
    """A rollout's behaviour against its question's gold answers."""
    env = [s.text for s in traj.segments if s.source == "env"]
    return behaviour(traj.queries, traj.retrieved_ids, env, traj.search_blocks, traj.answer, golds)


def of_record(rec: Mapping) -> Behaviour:
    """A predictions.jsonl record of `searchrl eval run` (records of older runs have no `search_blocks`)."""
    env = [s["text"] for s in rec.get("segments", []) if s["source"] == "env"]
    return behaviour(rec.get("queries", []), rec.get("retrieved_ids", []), env, rec.get("search_blocks", []),
                     rec.get("prediction"), rec["answers"])


def behaviour_metrics(rows: Sequence[Behaviour]) -> dict[str, float | None]:
    """The shares of `rows` under their metric names; a share with nothing to judge is None."""

    def share(values) -> float | None:
        known = [float(v) for v in values if v is not None]
        return sum(known) / len(known) if known else None

    searches = sum(r.searches for r in rows)
    return {
        mn.QUERY_ECHO_RATE: share(r.echo for r in rows),
        mn.UNGROUNDED_RATE: share(r.ungrounded for r in rows),
        mn.OVERHOP_RATE: share(r.overhop for r in rows),
        mn.AVOID_RATE: share(r.avoided for r in rows),
        mn.EMPTY_SEARCH_RATE: sum(r.empty_searches for r in rows) / searches if searches else None,
    }
