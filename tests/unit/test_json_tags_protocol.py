"""A third protocol (`json_tags`, one module and its registry line) runs through the same engine,
loss mask, rewards and gold trajectories as the built-in two, with no change elsewhere."""

from __future__ import annotations

import re
from itertools import groupby

import pytest
from json_tags import RESULT_CLOSE, RESULT_OPEN, JsonTags

from searchrl.assets import load_tokenizer
from searchrl.data.types import Passage, Question
from searchrl.protocols.base import Script, Step
from searchrl.protocols.config import ProtocolConfig, protocol_class
from searchrl.retrieval.base import Retriever
from searchrl.rewards import RewardConfig, compute_reward
from searchrl.rollout.config import RolloutConfig
from searchrl.rollout.engine import RolloutEngine
from searchrl.rollout.scripted import ScriptedBackend
from searchrl.tools import ToolContext, build_tools
from searchrl.tools.base import Observation, ToolCall
from searchrl.tools.passages import format_passages

SCRIPTS = {
    "q-two": [
        'Look. <call>{"name": "search", "arguments": {"query": "Quellbridge river"}}</call>',
        'Twice its length. <call>{"name": "calculate", "arguments": {"expression": "80 * 2"}}</call>',
        "So. <answer>Orrin Bay</answer> trailing text never emitted",
    ],
    "q-bad": ["<call>{not json}</call>", "<answer>x</answer>"],
    "q-direct": ["<answer>Paris</answer>"],
}
QUESTIONS = [Question(qid, f"[{qid}] a question", ("Orrin Bay",)) for qid in SCRIPTS]
PASSAGES = [Passage("p1", "Quellbridge", "Quellbridge is a market town on the river Tessaly."),
            Passage("p2", "Tessaly", "The Tessaly flows into Orrin Bay after 80 km.")]


class Recording(Retriever):
    """The same passages for every query; logs every call."""

    def __init__(self) -> None:
        self.calls: list[list[str]] = []

    def search(self, queries, k):
        self.calls.append(list(queries))
        return [PASSAGES[:k] for _ in queries]


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer("tiny-random")


def policy(text: str) -> str:
    qid = re.search(r"\[(q-[a-z]+)\]", text).group(1)
    return SCRIPTS[qid][text.count(RESULT_OPEN.strip())]


def engine_for(tokenizer, respond=policy, **cfg):
    retriever = Recording()
    rollout = RolloutConfig(k=2, **cfg)
    protocol = protocol_class("json-tags").build(ProtocolConfig(format="json-tags"), ["search", "calculate"], tokenizer)
    tools = build_tools(["search", "calculate"], ToolContext(retriever, rollout.k))
    return RolloutEngine(ScriptedBackend(tokenizer, respond), retriever, protocol, rollout, tools), retriever


def env_runs(traj) -> list[list[int]]:
    """The runs of tokens with loss mask 0: the inserted observations."""
    pairs = groupby(zip(traj.token_ids, traj.loss_mask), key=lambda pair: pair[1])
    return [[token for token, _ in run] for mask, run in pairs if mask == 0]


def test_the_registry_line_makes_a_format_of_the_config():
    cfg = ProtocolConfig(format="json-tags")
    assert cfg.template == "json-tags" and protocol_class("json-tags") is JsonTags
    with pytest.raises(ValueError, match="one template, json-tags"):
        ProtocolConfig(format="json-tags", template="base")
    with pytest.raises(ValueError, match="unknown protocol format 'yaml-tags'; choose one of: json-tags, tags, tool-calls"):
        ProtocolConfig(format="yaml-tags")


def test_rollouts_record_exact_tokens_masks_and_calls_of_any_tool(tokenizer):
    engine, retriever = engine_for(tokenizer)
    backend = engine.backend
    trajs = engine.run(QUESTIONS, n=2)
    assert retriever.calls == [["Quellbridge river", "Quellbridge river"]]  # one batched search for the round
    two, bad, direct = trajs[0], trajs[2], trajs[4]
    assert trajs[1].token_ids == two.token_ids  # the samples of one question went alike
    searched = format_passages(PASSAGES)
    expected = [f"{RESULT_OPEN}{searched}{RESULT_CLOSE}", f"{RESULT_OPEN}160{RESULT_CLOSE}"]
    # Loss mask 0 exactly on the inserted results, which decode to the blocks the model reads.
    assert [backend.decode(run) for run in env_runs(two)] == expected
    assert [s.text for s in two.segments if s.source == "env"] == expected
    assert [s.text for s in two.segments if s.source == "policy"] == [SCRIPTS["q-two"][0], SCRIPTS["q-two"][1], "So. <answer>Orrin Bay</answer>"]
    assert len(two.token_ids) == len(two.loss_mask) == len(two.logprobs)
    assert (two.stop_reason, two.answer, two.queries, two.n_searches) == ("answer", "Orrin Bay", ["Quellbridge river"], 1)
    assert [c["name"] for c in two.tool_calls] == ["search", "calculate"]
    assert engine.protocol.check_format(two).ok
    assert compute_reward(two, ["Orrin Bay"], RewardConfig(stage=2), engine.protocol).total == 1.0
    # A call that is no JSON gets an error result the model reads, and fails the format's `calls`.
    assert [c["error"] for c in bad.tool_calls] == ["malformed"] and bad.answer == "x"
    assert engine.protocol.check_format(bad).failed == ["calls"]
    assert (direct.stop_reason, direct.answer, env_runs(direct)) == ("answer", "Paris", [])


def test_a_result_that_does_not_fit_the_context_ends_the_rollout(tokenizer, monkeypatch):
    engine, _ = engine_for(tokenizer)
    prompt = len(engine.prompt_ids(QUESTIONS[:1])[0])
    monkeypatch.setattr(ScriptedBackend, "max_context", prompt + 80)  # the first turn fits, its result does not
    t = engine.run(QUESTIONS[:1], n=1)[0]
    assert t.stop_reason == "context_full" and t.tool_calls[0]["name"] == "search"
    assert len(t.prompt_ids) + len(t.token_ids) <= prompt + 80 and env_runs(t) == []


def test_a_written_rollout_is_token_for_token_what_the_engine_records(tokenizer):
    script = Script((Step("Look.", ToolCall("search", {"query": "Quellbridge river"}),
                          Observation(format_passages(PASSAGES), passages=PASSAGES)),), "So.", "Orrin Bay")
    engine, _ = engine_for(tokenizer)
    question = QUESTIONS[0]
    written = engine.written(question, engine.prompt_ids([question])[0], script)
    texts = [text for source, _, text in engine.protocol.written(question.question, script, engine.backend) if source == "policy"]
    played, _ = engine_for(tokenizer, lambda text: texts[text.count(RESULT_OPEN.strip())])
    rolled = played.run([question], n=1)[0]
    assert (written.token_ids, written.loss_mask, written.queries) == (rolled.token_ids, rolled.loss_mask, rolled.queries)
    assert [s.text for s in written.segments] == [s.text for s in rolled.segments]
