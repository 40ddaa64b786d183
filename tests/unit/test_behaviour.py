"""Failure modes of a search agent (`eval.behaviour`): echo, ungrounded answers, over-hopping,
avoidance and empty searches, per rollout and as the shares training and evaluation report."""

from __future__ import annotations

import doctest

import pytest

from searchrl import metric_names as mn
from searchrl.data.trajectory import Segment, Trajectory
from searchrl.eval import behaviour
from searchrl.eval.behaviour import behaviour as judge
from searchrl.eval.behaviour import behaviour_metrics, of_record, of_trajectory

FALNYK = "(1)Title: Falnyk Text: Falnyk is a drama film directed by Kheno Muard."
MUARD = "(1)Title: Kheno Muard Text: Kheno Muard was born in Gimnamburg."


def test_doctests():
    assert doctest.testmod(behaviour).failed == 0


def test_the_demo_echo_searches_its_guess_finds_nothing_and_answers_it():
    # README's `ask` example before this change: "Tessbridge" searched, nothing found, "Tessbridge" answered.
    b = judge(["Tessbridge"], [[]], ["(no results)"], [0], "Tessbridge", ["Dakvik Press"])
    assert (b.echo, b.ungrounded, b.overhop, b.avoided, b.empty_searches) == (True, True, False, False, 1)


@pytest.mark.parametrize(
    "queries, answer, echo",
    [
        (["Falnyk"], "falnyk!", True),  # normalised: case and punctuation do not matter
        (["Falnyk", "falnyk"], "Falnyk", True),  # the same query twice is still its only query
        (["Falnyk", "Kheno Muard"], "Kheno Muard", False),  # a second, different search: not the ritual
        (["Falnyk"], "Kheno Muard", False),  # read an answer out of what came back
        ([], "Falnyk", False),  # no query to echo
        (["Falnyk"], None, False),
    ],
)
def test_echo_is_the_answer_equal_to_the_only_query(queries, answer, echo):
    docs = [FALNYK] * len(queries)
    assert judge(queries, [["p"]] * len(queries), docs, list(range(len(queries))), answer, ["x"]).echo is echo


def test_grounding_reads_every_documents_block_on_word_boundaries():
    two = [FALNYK, MUARD]
    assert judge(["a", "b"], [["1"], ["2"]], two, [0, 1], "Gimnamburg", ["Gimnamburg"]).ungrounded is False
    assert judge(["a"], [["1"]], [FALNYK], [0], "Gimnam", ["Gimnamburg"]).ungrounded is True  # a word's part
    assert judge([], [], [], [], "Gimnamburg", ["Gimnamburg"]).ungrounded is True  # shown nothing
    assert judge(["a"], [["1"]], [FALNYK], [0], "no", ["no"]).ungrounded is None  # yes/no is not read from text


def test_overhop_is_a_search_after_the_gold_answer_was_read():
    # The gold (Kheno Muard) stood in the first block; the second search came after it: over-hop.
    assert judge(["Falnyk", "Kheno Muard"], [["1"], ["2"]], [FALNYK, MUARD], [0, 1], "Gimnamburg", ["Kheno Muard"]).overhop
    # A bridge question: the first block names the bridge, not the gold; searching on is right.
    assert not judge(["Falnyk", "Kheno Muard"], [["1"], ["2"]], [FALNYK, MUARD], [0, 1], "Gimnamburg", ["Gimnamburg"]).overhop
    # The gold stood only in the last block: nothing was searched after it.
    assert not judge(["Falnyk"], [["1"]], [FALNYK], [0], "Kheno Muard", ["Kheno Muard"]).overhop
    assert judge(["Falnyk", "x"], [["1"], ["2"]], [FALNYK, MUARD], [0, 1], "yes", ["yes"]).overhop is None


def test_avoidance_is_no_answer_or_an_empty_one():
    assert judge([], [], [], [], None, ["x"]).avoided
    assert judge([], [], [], [], " the ", ["x"]).avoided  # normalises to nothing
    assert not judge([], [], [], [], "Paris", ["x"]).avoided


def test_shares_count_what_can_be_judged_and_searches_for_empty_results():
    rows = [
        judge(["Falnyk"], [["1"]], [FALNYK], [0], "Falnyk", ["Gimnamburg"]),  # echo, grounded (Falnyk is in the block)
        judge(["Falnyk", "Muard"], [["1"], []], [FALNYK, "(none)"], [0, 1], "Kheno Muard", ["Kheno Muard"]),  # overhop
        judge([], [], [], [], None, ["yes"]),  # avoided; nothing else to judge
        judge(["q"], [[]], ["(none)"], [0], "yes", ["no"]),
    ]
    m = behaviour_metrics(rows)
    assert m == {
        mn.QUERY_ECHO_RATE: 1 / 4,
        mn.UNGROUNDED_RATE: 0 / 2,  # yes and no answers are not judged
        mn.OVERHOP_RATE: 1 / 2,  # only the rows whose gold is not yes/no
        mn.AVOID_RATE: 1 / 4,
        mn.EMPTY_SEARCH_RATE: 2 / 4,  # 2 of 4 searches returned nothing
    }
    assert set(behaviour_metrics([]).values()) == {None}


def test_a_trajectory_and_its_predictions_record_are_judged_alike():
    segs = [Segment("<search>Falnyk</search>", "policy"), Segment(FALNYK, "env"),
            Segment("<search>Kheno Muard</search>", "policy"), Segment(MUARD, "env"),
            Segment("<answer>Gimnamburg</answer>", "policy")]
    traj = Trajectory("q1", "Where was the director of Falnyk born?", [], [], [], [], segs,
                      queries=["Falnyk", "Kheno Muard"], retrieved_ids=[["a"], ["b"]], search_blocks=[0, 1],
                      n_searches=2, answer="Gimnamburg")
    rec = {**traj.to_dict(tokens=False), "prediction": "Gimnamburg", "answers": ["Gimnamburg"]}
    assert of_trajectory(traj, ["Gimnamburg"]) == of_record(rec)
    assert of_record(rec) == judge(["Falnyk", "Kheno Muard"], [["a"], ["b"]], [FALNYK, MUARD], [0, 1], "Gimnamburg", ["Gimnamburg"])
