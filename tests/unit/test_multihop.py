"""Multi-hop behaviour per question type (`searchrl.eval.multihop`): entity tokens, the bridge step,
supporting passages per search, and the per-type metrics of hand-written trajectories, with the
numbers worked out in comments; the same numbers from a trajectory and from its eval record."""

from __future__ import annotations

import doctest

import pytest

from searchrl import metric_names as mn
from searchrl.data.trajectory import Segment, Trajectory
from searchrl.data.types import Question
from searchrl.eval import multihop
from searchrl.eval.multihop import (
    bridge_step,
    multihop_metrics,
    name_tokens,
    row_of_record,
    row_of_trajectory,
    seen_by_query,
    support_by_search,
)
from searchrl.eval.summary import by_type_markdown

FALNYK = "(1)Title: Falnyk Text: Directed by Kheno Muard, Falnyk is a drama film released in 1943."
MUARD = "(1)Title: Kheno Muard Text: Kheno Muard was a film director. Muard was born in Gimnamburg."
SKUSVUS = "(1)Title: Beyond Skusvus Text: Beyond Skusvus is a drama film from 1959, made in Thymren City."


def test_doctests():
    assert doctest.testmod(multihop).failed == 0


# --- entities ------------------------------------------------------------------------------------


def test_name_tokens_are_capitalised_words_inside_sentences_or_next_to_another():
    # "Directed" opens a sentence alone; "Title"/"Text" are scaffolding; "Kheno" opens its sentence
    # but is followed by "Muard"; "Muard" also stands inside a sentence; 1943 is no word with a capital
    assert name_tokens(FALNYK) == {"falnyk", "kheno", "muard"}
    # "City" is a designator: a query saying "city" has read no name
    assert name_tokens(SKUSVUS) == {"beyond", "skusvus", "thymren"}
    # a capitalised word the text also writes in lower case is a sentence opener, not a name
    assert name_tokens("Rivers matter. Drama here. Later, a drama.") == set()


# --- the bridge step -----------------------------------------------------------------------------

QUESTION = "Where was the director of Falnyk born?"


@pytest.mark.parametrize(("queries", "seen", "expected"), [
    # the second query copies the director's name from the first search's passage
    (["director of Falnyk", "Kheno Muard birthplace"], ["", FALNYK], True),
    (["director of Falnyk", "kheno muard born"], ["", FALNYK], True),  # written in lower case
    (["director of Falnyk", "Muard"], ["", FALNYK], True),  # part of the name
    # one search: no later query
    (["Kheno Muard"], [""], False),
    # the second query says only what the question said
    (["director of Falnyk", "Falnyk director born"], ["", FALNYK], False),
    # the name came from the first query (the model knew it), not from the passages
    (["Kheno Muard film", "Kheno Muard born"], ["", FALNYK], False),
    # the name is in the query's own results only, read after it was written
    (["director of Falnyk", "Gimnamburg"], ["", FALNYK], False),
    # a third query counts as a later one too; its earlier passages are both blocks
    (["director of Falnyk", "Falnyk", "Gimnamburg births"], ["", FALNYK, FALNYK + "\n" + MUARD], True),
])
def test_bridge_step_on_hand_written_queries(queries, seen, expected):
    assert bridge_step(QUESTION, queries, seen) is expected


def test_searches_of_one_turn_read_none_of_each_other():
    # tool calls: searches 1 and 2 in one turn share block 0, search 3 comes after it
    assert seen_by_query([FALNYK, MUARD], [0, 0, 1], 3) == ["", "", FALNYK]
    assert not bridge_step(QUESTION, ["Falnyk", "Kheno Muard", "x"], seen_by_query([FALNYK, MUARD], [0, 0, 1], 3))
    # a block that never made it into the response (the context was full) shows nothing
    assert seen_by_query([FALNYK], [0, 1, 2], 3) == ["", FALNYK, FALNYK]


def test_supporting_passages_per_search():
    # a 3-hop question found p1, nothing new, then p2 (p1 again), then p3
    assert support_by_search(["p1", "p2", "p3"], [["p1", "x"], ["p1"], ["p2", "p1"], ["p3"]]) == [1, 0, 1, 1]
    assert support_by_search(["p1"], []) == []


# --- the metrics of hand-written trajectories --------------------------------------------------

Q_BRIDGE = Question("qa", QUESTION, ("Gimnamburg",), ("p1", "p2"), type="bridge")
Q_COMPARE = Question("qb", "Which film came out first, Falnyk or Beyond Skusvus?", ("Falnyk",), ("p1", "p3"), type="comparison")
Q_UNTYPED = Question("qc", "Who founded Helrabou Books?", ("Mymus Vrimani",))


def _traj(q: Question, queries: list[str], blocks: list[str], retrieved: list[list[str]], answer: str | None) -> Trajectory:
    segments = []
    for query, block in zip(queries, blocks):
        segments += [Segment(f" <search>{query}</search>", "policy"), Segment(block, "env")]
    segments.append(Segment(f"<answer>{answer}</answer>", "policy"))
    return Trajectory(q.id, q.question, [], [], [], [], segments, queries=queries, retrieved_ids=retrieved,
                      search_blocks=list(range(len(blocks))), n_searches=len(queries), answer=answer)


ROLLOUTS = [
    # bridge, right: reads the director's name, searches it, finds the second passage
    (Q_BRIDGE, _traj(Q_BRIDGE, ["director of Falnyk", "Kheno Muard"], [FALNYK, MUARD], [["p1", "p3"], ["p2"]], "Gimnamburg")),
    # bridge, wrong: one search, answers with the bridge entity
    (Q_BRIDGE, _traj(Q_BRIDGE, ["Falnyk director"], [FALNYK], [["p1"]], "Kheno Muard")),
    # comparison, right: two searches, each for a film the question names (no bridge)
    (Q_COMPARE, _traj(Q_COMPARE, ["Falnyk", "Beyond Skusvus"], [FALNYK, SKUSVUS], [["p1"], ["p3"]], "Falnyk")),
    # no type, no supporting passages: answers from memory, half the name (F1 = 2 * 1 * 0.5 / 1.5 = 2/3)
    (Q_UNTYPED, _traj(Q_UNTYPED, [], [], [], "Mymus")),
]
EXPECTED = {
    # all: searches (2 + 1 + 2 + 0) / 4; bridge 1 of 4; support over the 3 with supporting passages:
    # hop 1 (1 + 1 + 1) / 3, hop 2 (1 + 0 + 1) / 3; EM 2 / 4; F1 (1 + 0 + 1 + 2/3) / 4
    "all": (4, 1.25, 0.25, 1.0, 2 / 3, 0.0, 0.5, 2 / 3),
    "bridge": (2, 1.5, 0.5, 1.0, 0.5, 0.0, 0.5, 0.5),
    "comparison": (1, 2.0, 0.0, 1.0, 1.0, 0.0, 1.0, 1.0),
}


def test_per_type_metrics_of_hand_written_trajectories():
    metrics = multihop_metrics([row_of_trajectory(t, q) for q, t in ROLLOUTS])
    assert list(metrics) == [f.key(name) for name in EXPECTED for f in multihop.STATS]  # all first; no untyped key
    for name, values in EXPECTED.items():
        for family, value in zip(multihop.STATS, values):
            assert metrics[family.key(name)] == pytest.approx(value), family.key(name)
    assert all(mn.describe(k) is not None and mn.describe(k).kind == "multihop" for k in metrics)


def test_an_eval_record_gives_what_its_trajectory_gives():
    for q, t in ROLLOUTS:
        rec = t.to_dict(tokens=False) | {"type": q.type, "supporting_ids": list(q.supporting_ids),
                                          "prediction": t.answer, "answers": list(q.answers)}
        assert row_of_record(rec) == row_of_trajectory(t, q)
        old = {k: v for k, v in rec.items() if k not in ("type", "search_blocks")}  # a record of an older run
        assert row_of_record(old) == row_of_trajectory(t, Question(q.id, q.question, q.answers, q.supporting_ids))


def test_no_supporting_passages_and_no_rollouts_give_nulls():
    metrics = multihop_metrics([row_of_trajectory(ROLLOUTS[3][1], Q_UNTYPED)])
    assert metrics[mn.MULTIHOP_SUPPORT_HOP1.key("all")] is None and metrics[mn.MULTIHOP_ROLLOUTS.key("all")] == 1
    empty = multihop_metrics([])
    assert empty[mn.MULTIHOP_ROLLOUTS.key("all")] == 0 and empty[mn.MULTIHOP_EM.key("all")] is None


def test_per_type_table():
    md = by_type_markdown(multihop_metrics([row_of_trajectory(t, q) for q, t in ROLLOUTS]))
    rows = [line for line in md.splitlines() if line.startswith("| ")]
    assert rows[0] == "| type | n | EM % | F1 % | searches | bridge % | supp. hop 1 | hop 2 | hop 3+ |"
    assert rows[1] == "| all | 4 | 50.0 | 66.7 | 1.25 | 25.0 | 1.00 | 0.67 | 0.00 |"
    assert rows[2] == "| bridge | 2 | 50.0 | 50.0 | 1.50 | 50.0 | 1.00 | 0.50 | 0.00 |"
    assert rows[3] == "| comparison | 1 | 100.0 | 100.0 | 2.00 | 0.0 | 1.00 | 1.00 | 0.00 |"
    assert by_type_markdown({"em": 0.5}) == ""  # a run written before the table existed
