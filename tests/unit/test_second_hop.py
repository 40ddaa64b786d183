"""`searchrl eval second-hop`: the retrieval ceiling per hop and the reading of the step after the
gold first search (`searchrl.eval.second_hop`), and the probe (`searchrl.eval.second_hop_probe`) run
through the real engine and index with a scripted policy whose next steps are known: the towns
world of test_sft.py (town -> river -> hills)."""

from __future__ import annotations

import doctest

import pytest
from test_sft import _questions, gold_world  # noqa: F401  (a fixture)

from searchrl.assets import load_tokenizer
from searchrl.data.types import Question
from searchrl.errors import SearchRLError
from searchrl.eval import second_hop
from searchrl.eval.second_hop import HopRanks, ceiling_rows, hop_ranks, next_step, next_step_rows
from searchrl.eval.second_hop_probe import probe
from searchrl.protocols.config import ProtocolConfig
from searchrl.retrieval import open_retriever
from searchrl.rollout.agent import AgentConfig, build_agent
from searchrl.rollout.config import RolloutConfig
from searchrl.rollout.scripted import ScriptedBackend

Q = Question("q", "Where was the director of Falnyk born?", ("Gimnamburg",), type="bridge-2hop")
DOCS = "(1)Title: Falnyk Text: Directed by Kheno Muard, Falnyk is a drama film."


def test_doctests():
    assert doctest.testmod(second_hop).failed == 0


@pytest.mark.parametrize(("query", "bridge", "gold", "misspelt", "repeats", "first"), [
    ("Kheno Muard birthplace", True, True, False, False, False),
    ("Muard", True, True, False, False, False),  # part of the name is the entity
    ("Kheno Muart born", True, True, False, False, False),  # one word right is the entity named
    ("Khena Muart born", False, False, True, False, False),  # both words a letter off: copied wrong
    ("director of Falnyk born", False, False, False, True, False),  # only the question's words
    ("Falnyk", False, False, False, True, True),  # the first query again
    ("Falnyk drama", False, False, False, False, False),  # a new word, but no entity of the documents
])
def test_next_query_is_read_for_the_bridge_entity(query, bridge, gold, misspelt, repeats, first):
    s = next_step(Q, "Falnyk", DOCS, "Kheno Muard", query, False, None, None)
    assert (s.action, s.bridge, s.gold_bridge, s.bridge_misspelt, s.repeats_question, s.repeats_first) == (
        "search", bridge, gold, misspelt, repeats, first)


def test_answers_instead_of_searching():
    right = next_step(Q, "Falnyk", DOCS, "Kheno Muard", None, False, "Gimnamburg", "Gimnamburg")
    bridge = next_step(Q, "Falnyk", DOCS, "Kheno Muard", None, False, "Kheno Muard", "Kheno Muard")
    nothing = next_step(Q, "Falnyk", DOCS, "Kheno Muard", None, False, None, None)
    assert (right.action, right.answer_em, right.answer_is_bridge, right.final_em) == ("answer", 1.0, False, 1.0)
    assert (bridge.answer_em, bridge.answer_is_bridge) == (0.0, True)
    assert (nothing.action, nothing.answer_em) == ("none", 0.0)
    rows = next_step_rows([right, bridge, nothing, next_step(Q, "Falnyk", DOCS, "Kheno Muard", "Muard", True, None, "Gimnamburg")])
    # 4 steps: 1 search (bridge, gold bridge, finds hop 2), 2 answers (1 right, 1 the bridge), 1 neither; final EM 2 of 4
    row = ["4", "25.0", "25.0", "25.0", "0.0", "0.0", "0.0", "25.0", "50.0", "25.0", "25.0", "25.0", "50.0", "50.0"]
    assert rows == [["all", *row], ["bridge-2hop", *row]]


def test_ceiling_rows_count_ranks_within_k():
    ranks = [HopRanks("a", 1, 1, None), HopRanks("a", 2, 3, 1), HopRanks("b", 1, None, 2), HopRanks("b", 2, 2, None)]
    header, rows = ceiling_rows(ranks, (1, 3))
    assert header == ["type", "hop", "n", "title top-1 %", "title top-3 %", "question top-1 %", "question top-3 %"]
    assert rows == [["all", "1", "2", "50.0", "50.0", "0.0", "50.0"], ["all", "2", "2", "0.0", "100.0", "50.0", "50.0"],
                    ["a", "1", "1", "100.0", "100.0", "0.0", "0.0"], ["a", "2", "1", "0.0", "100.0", "100.0", "100.0"],
                    ["b", "1", "1", "0.0", "0.0", "0.0", "100.0"], ["b", "2", "1", "0.0", "100.0", "0.0", "0.0"]]


def test_hop_ranks_on_the_towns_index(gold_world):  # noqa: F811
    retriever = open_retriever(str(gold_world / "index"))
    b1 = [q for q in _questions(gold_world) if q.id == "b1"]  # Marrowind -> Orrin -> Ulmo
    titles = {p.id: p.title for p in retriever.passages}
    ranks = hop_ranks(b1, titles, retriever, 3)
    # the town by its name first; the river Orrin by its bare name only second, after the decoy "Orrin ferry"
    assert [(r.hop, r.by_title) for r in ranks] == [(1, 1), (2, 2)]
    # the question names the town, never the river
    assert ranks[0].by_question == 1 and ranks[1].by_question is None


def test_probe_reads_what_a_scripted_policy_does_after_the_gold_first_search(gold_world):  # noqa: F811
    """b0 names the river it just read (and then answers right), b1 answers with the river (the
    bridge entity), b2 searches the question again, b3 ends its turn without a step."""
    tokenizer = load_tokenizer("tiny-random")
    eos = tokenizer.eos_token

    def write(text: str) -> str:
        asked = text.rsplit("User: ", 1)[1]
        seen = asked.count("<information>")
        if "Quellbridge" in asked.split("?")[0]:
            return "<search>Tessaly</search>" if seen == 1 else "<answer>Eskar</answer>"
        if "Marrowind" in asked.split("?")[0]:
            return "It is on the Orrin.</think>\n\n<answer>Orrin</answer>"
        if "Velmar" in asked.split("?")[0]:
            return "<search>river through Velmar hills</search>" if seen == 1 else "<answer>Pirr</answer>"
        return eos

    cfg = AgentConfig(model="tiny-random", profile="none", protocol=ProtocolConfig(tags="search-r1", template="oneshot"))
    retriever = open_retriever(str(gold_world / "index"))
    agent = build_agent(cfg, ScriptedBackend(tokenizer, write), retriever)
    bridges = [q for q in _questions(gold_world) if q.type == "bridge-2hop"]
    records, left_out = probe(agent, RolloutConfig(k=1, max_searches=2, max_new_tokens=80, greedy=True), bridges)
    assert left_out == 0
    got = {r["id"]: (r["written_queries"][0], r["action"], r["query"], r["bridge"], r["gold_bridge"], r["repeats_question"],
                     r["finds_next"], r["answer_is_bridge"], r["final_em"]) for r in records}
    assert got == {
        "b0": ("Quellbridge", "search", "Tessaly", True, True, False, True, False, 1.0),
        "b1": ("Marrowind", "answer", None, False, False, False, False, True, 0.0),
        "b2": ("Velmar", "search", "river through Velmar hills", False, False, True, False, False, 1.0),
        "b3": ("Harbel", "none", None, False, False, False, False, False, 0.0),
    }
    # the continuation starts after the documents of the gold first search: the model's own text only
    assert records[0]["continuation"].startswith("<search>Tessaly</search>")
    assert all(r["prompt_ids_exact"] in (True, False) for r in records)


def _agent_record(qid, qtype, question, queries, supporting):
    return {"id": qid, "type": qtype, "question": question, "queries": queries, "supporting_ids": supporting,
            "method": "agent"}


def test_copy_rows_read_the_entities_of_an_agents_own_queries():
    titles = {"f": "Falnyk", "m": "Kheno Muard", "g": "Gorrim", "t": "Tessaly"}
    recs = [
        _agent_record("1", "bridge-2hop", Q.question, ["Falnyk director", "Kheno Muard"], ["f", "m"]),  # exact, exact
        _agent_record("2", "bridge-2hop", Q.question, ["Falnik director", "Muart born"], ["f", "m"]),  # misspelt twice
        _agent_record("3", "bridge-2hop", Q.question, [], ["f", "m"]),  # no query: absent, no second
        _agent_record("4", "inference", "Who is the father of Gorrim?", ["Gorrim father", "Gorrim father"], ["g", "t"]),
    ]
    rows = second_hop.copy_rows(recs, titles)
    # all: first query exact 2 (1, 4), misspelt 1 (2), absent 1 (3); 3 searched twice: bridge exact 1, misspelt 1, absent 1
    assert rows[0] == ["all", "4", "50.0", "25.0", "25.0", "3", "33.3", "33.3", "33.3"]
    assert rows[1] == ["bridge-2hop", "3", "33.3", "33.3", "33.3", "2", "50.0", "50.0", "0.0"]
    assert rows[2] == ["inference", "1", "100.0", "0.0", "0.0", "1", "0.0", "0.0", "100.0"]


def test_command_without_the_probe_reads_an_agent_run(gold_world, tmp_path):  # noqa: F811
    import json

    from searchrl.eval.second_hop_probe import second_hop_command

    run = tmp_path / "agent"
    run.mkdir()
    recs = [_agent_record(q.id, q.type, q.question, ["Quellbridge", "Tessaly"] if q.id == "b0" else [], list(q.supporting_ids))
            for q in _questions(gold_world) if q.type == "bridge-2hop"]
    (run / "predictions.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    text = second_hop_command(None, [f"dataset={gold_world / 'q.jsonl'}", f"retrieval.index={gold_world / 'index'}",
                                     "model=tiny-random"], {}, ["bridge-2hop"], str(tmp_path / "out"), [str(run)], False)
    assert "4 questions (bridge-2hop) of the first 10" in text and "After the gold first search" not in text
    assert "| all | 4 | 25.0 | 0.0 | 75.0 | 1 | 100.0 | 0.0 | 0.0 |" in text  # b0 named both; the others never searched
    # the ceiling: the towns by their names at rank 1; the rivers too, but the Orrin (behind its decoy) only in the top 3
    assert "| all | 2 | 4 | 75.0 | 100.0 | 100.0 |" in text
    assert (tmp_path / "out" / "second_hop.md").read_text() == text and not (tmp_path / "out" / "second_hop.jsonl").exists()


def test_probe_with_both_hops_written_reads_the_answer(gold_world):  # noqa: F811
    """hops=2: both gold searches (town, then river) are written; b0 answers from the river's
    passage, b1 answers the river (the bridge), the others end their turn."""
    tokenizer = load_tokenizer("tiny-random")

    def write(text: str) -> str:
        asked = text.rsplit("User: ", 1)[1]
        assert asked.count("<information>") == 2  # both documents blocks are there before the model writes
        if "Quellbridge" in asked.split("?")[0]:
            return "<answer>Eskar</answer>"
        return "<answer>Orrin</answer>" if "Marrowind" in asked.split("?")[0] else tokenizer.eos_token

    cfg = AgentConfig(model="tiny-random", profile="none", protocol=ProtocolConfig(tags="search-r1", template="oneshot"))
    retriever = open_retriever(str(gold_world / "index"))
    agent = build_agent(cfg, ScriptedBackend(tokenizer, write), retriever)
    bridges = [q for q in _questions(gold_world) if q.type == "bridge-2hop"]
    records, _ = probe(agent, RolloutConfig(k=1, max_searches=2, max_new_tokens=80, greedy=True), bridges, hops=2)
    got = {r["id"]: (r["written_queries"], r["action"], r["answer_em"], r["final_em"]) for r in records}
    assert got == {"b0": (["Quellbridge", "Tessaly"], "answer", 1.0, 1.0), "b1": (["Marrowind", "Orrin hills"], "answer", 0.0, 0.0),
                   "b2": (["Velmar", "Dagny"], "none", 0.0, 0.0), "b3": (["Harbel", "Brenna"], "none", 0.0, 0.0)}
    assert records[0]["next_title"] == "" and not records[1]["answer_is_bridge"]  # no passage after the last hop
    # a budget the written turns (~20 tokens each here) leave no room in is refused, not run with a token or two
    with pytest.raises(SearchRLError, match="leaving the model fewer than 16: raise it"):
        probe(agent, RolloutConfig(k=1, max_searches=2, max_new_tokens=40, greedy=True), bridges, hops=2)
