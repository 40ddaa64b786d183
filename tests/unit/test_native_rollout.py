"""The rollout engine with native tool calls (`protocol.format: tool-calls`): a scripted policy
writes Hermes calls through our fallback template on SmolLM2's tokenizer; the engine runs them
batched per tool, appends the template's tool-result blocks (loss mask 0), counts malformed and
over-budget calls, and the rewards read the turns."""

from __future__ import annotations

import json
import re

import pytest
from test_rollout import WordRetriever

from searchrl.assets import load_tokenizer
from searchrl.data.types import Question
from searchrl.protocols.config import ProtocolConfig
from searchrl.rewards import RewardConfig, compute_reward
from searchrl.rollout.agent import AgentConfig, build_protocol
from searchrl.rollout.config import RolloutConfig
from searchrl.rollout.engine import ANSWER_ROOM, RolloutEngine
from searchrl.rollout.scripted import ScriptedBackend
from searchrl.tools import ToolContext, build_tools

END = "<|im_end|>"


def call(name, **arguments) -> str:
    return f'<tool_call>\n{json.dumps({"name": name, "arguments": arguments})}\n</tool_call>'


SCRIPTS = {
    "q-two": [  # two searches in one turn, then a calculation, then the answer
        "Both at once.\n" + call("search", query="Quellbridge river") + "\n" + call("search", query="Tessaly flows") + END,
        call("calculate", expression="80 * 2") + END,
        "Orrin Bay" + END,
    ],
    "q-bad": [  # each kind of malformed call, read back as an error, then the answer
        '<tool_call>{"name": "search", "arguments": {"query": </tool_call>' + END,
        call("weather", city="Velmar") + END,
        call("search", q="wrong key") + END,
        "<answer>Tessaly</answer>" + END,
    ],
    "q-budget": [call("search", query="Vantrel X2") + END, call("search", query="Orrin Optics") + END, "x" + END],
    "q-calc": [call("calculate", expression="1+1") + END] * 2 + ["2" + END],
    "q-cut": ["I will look it up.\n<tool_call>\n{\"name\": \"search\", \"arguments\": {\"query\": \"Dagny Halvorsen and more"],
}


def policy(text: str) -> str:
    qid = re.search(r"\[(q-[a-z]+)\]", text).group(1)
    return SCRIPTS[qid][text.count("<|im_start|>assistant") - 1]


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer("tiny-random")


class ShortContext(ScriptedBackend):
    limit: int | None = None

    @property
    def max_context(self) -> int | None:
        return self.limit


def agent(tok, tools=("search", "calculate"), limit=None, **rollout):
    cfg = AgentConfig(protocol=ProtocolConfig(format="tool-calls", chat_template="hermes-fallback"), tools=list(tools))
    backend, retriever = ShortContext(tok, policy), WordRetriever()
    backend.limit = limit
    built = build_tools(cfg.tools, ToolContext.of(retriever, 1))
    protocol = build_protocol(cfg, tok)
    rollout = RolloutConfig(**{"k": 1, "max_new_tokens": 200, **rollout})
    return RolloutEngine(backend, retriever, protocol, rollout, built), retriever


def run(tok, qids, **rollout):
    engine, retriever = agent(tok, **rollout)
    trajs = engine.run([Question(q, f"[{q}] Which river?", ("Orrin Bay",)) for q in qids], n=1)
    return {t.question_id: t for t in trajs}, engine, retriever


def test_calls_run_batched_per_tool_and_results_follow_as_the_templates_tool_messages(tok):
    trajs, engine, retriever = run(tok, ["q-two", "q-budget"])
    t = trajs["q-two"]
    # round 1: the three searches of both rollouts in ONE retrieval call; round 2: q-budget's second
    assert retriever.calls == [["Quellbridge river", "Tessaly flows", "Vantrel X2"], ["Orrin Optics"]]
    assert [(c["name"], c["ok"]) for c in t.tool_calls] == [("search", True), ("search", True), ("calculate", True)]
    assert t.queries == ["Quellbridge river", "Tessaly flows"] and t.n_searches == 2
    assert t.search_blocks == [0, 0]  # one turn's searches: their results share the first env block
    assert trajs["q-budget"].search_blocks == [0, 1]
    assert t.stop_reason == "answer" and t.answer == "Orrin Bay"
    env = [s.text for s in t.segments if s.source == "env"]
    assert env[0].count("<|im_start|>tool\n") == 2 and "(1)Title: Quellbridge" in env[0] and "Text: The Tessaly flows" in env[0]
    assert "<|im_start|>tool\n160<|im_end|>" in env[1]
    # The context is the template's own rendering of the conversation, turn by turn.
    chat = engine.protocol.chat
    history = engine.protocol.messages("[q-two] Which river?")
    turns = [chat.parse_ids(tok.encode(s, add_special_tokens=False)) for s in SCRIPTS["q-two"]]
    results = [part.split("<|im_end|>")[0] for part in env[0].split("<|im_start|>tool\n")[1:]]
    history += [chat.assistant_message(turns[0]), *(chat.tool_message("search", r) for r in results),
                chat.assistant_message(turns[1]), chat.tool_message("calculate", "160"), chat.assistant_message(turns[2])]
    whole = chat.render(history, add_generation_prompt=False)
    assert tok.decode(t.prompt_ids + t.token_ids, skip_special_tokens=False) + chat.separator == whole
    # policy tokens (loss mask 1) are exactly the three sampled turns, each closed by <|im_end|>
    sampled = [i for i, m in zip(t.token_ids, t.loss_mask) if m]
    assert sampled == [i for s in SCRIPTS["q-two"] for i in tok.encode(s, add_special_tokens=False)]
    assert [s.text for s in t.segments if s.source == "policy"] == [s.removesuffix(END) for s in SCRIPTS["q-two"]]
    verdict = engine.protocol.check_format(t)
    assert verdict.ok, verdict.failed
    assert compute_reward(t, ["Orrin Bay"], RewardConfig(stage=2), engine.protocol).total == 1.0


def test_malformed_unknown_and_badly_argued_calls_get_readable_errors_and_fail_the_format(tok):
    trajs, engine, retriever = run(tok, ["q-bad"])
    t = trajs["q-bad"]
    assert retriever.calls == []  # nothing malformed is ever executed
    assert [c["error"] for c in t.tool_calls] == ["malformed", "unknown_tool", "bad_arguments"]
    env = [s.text for s in t.segments if s.source == "env"]
    assert "bad JSON" in env[0] and "unknown tool 'weather'" in env[1] and "search, calculate" in env[1]
    assert "query" in env[2]
    assert t.stop_reason == "answer" and t.answer == "Tessaly"  # the <answer> block of the final message
    verdict = engine.protocol.check_format(t)
    assert verdict.failed == ["calls"]
    assert compute_reward(t, ["Tessaly"], RewardConfig(stage=1), engine.protocol).terms == {
        "retrieve": -1.0, "format": -1.0, "answer": 0.0}


def test_a_call_over_budget_is_told_and_a_second_turn_of_only_such_calls_ends_the_rollout(tok):
    trajs, _, retriever = run(tok, ["q-budget"], max_searches=1)
    t = trajs["q-budget"]
    assert retriever.calls == [["Vantrel X2"]]  # the second search is never served...
    assert [c["error"] for c in t.tool_calls] == [None, "budget"]
    assert "no budget left for a search (at most 1)" in t.segments[3].text  # ...the model reads why
    assert t.stop_reason == "answer" and t.answer == "x" and t.n_searches == 1
    # a per-tool budget: calculate at most 0, told once; a turn calling it again ends the rollout
    trajs, _, _ = run(tok, ["q-calc"], tool_budgets={"calculate": 0})
    assert trajs["q-calc"].stop_reason == "max_searches"
    assert [c["error"] for c in trajs["q-calc"].tool_calls] == ["budget"]


def test_a_call_cut_by_the_token_budget_is_never_executed(tok):
    trajs, engine, retriever = run(tok, ["q-cut"], max_new_tokens=12)
    t = trajs["q-cut"]
    assert t.stop_reason == "length" and retriever.calls == [] and t.tool_calls == []
    assert engine.protocol.check_format(t).failed == ["answer"]


def test_results_that_do_not_fit_the_context_are_cut_and_counted(tok):
    question = [Question("q-two", "[q-two] Which river?", ("x",))]
    t = agent(tok)[0].run(question, n=1)[0]
    first_turn = t.loss_mask.index(0)  # policy tokens before the first results
    results = t.loss_mask[first_turn:].index(1)  # tokens of the first results block
    # room for the first turn, the results less 15 tokens, and the 64 tokens kept for answering
    limit = len(t.prompt_ids) + first_turn + results - 15 + ANSWER_ROOM
    cut = agent(tok, limit=limit)[0].run(question, n=1)[0]
    assert t.truncated_documents == 0 and cut.truncated_documents >= 1 and "[cut]" in cut.response_text
    assert cut.token_ids[:first_turn] == t.token_ids[:first_turn] and len(cut.prompt_ids) + len(cut.token_ids) <= limit


def test_eval_run_with_tools_writes_per_tool_metrics_and_every_call(tmp_path, tok):
    from searchrl.data.types import Passage
    from searchrl.eval.run import EvalConfig, run_eval
    from searchrl.retrieval.index import build_index

    build_index([Passage("p1", "Quellbridge", "Quellbridge is a market town on the river Tessaly.")], tmp_path / "index",
                "bm25", progress=False)
    questions = tmp_path / "q.jsonl"
    questions.write_text("".join(json.dumps(Question(q, f"[{q}] Which river?", ("Orrin Bay",)).to_dict()) + "\n"
                                 for q in ("q-two", "q-bad")))
    cfg = EvalConfig(dataset=str(questions), protocol={"format": "tool-calls"}, tools=["search", "calculate"],
                     model="tiny-random", retrieval={"index": str(tmp_path / "index")}, rollout={"k": 1},
                     out=str(tmp_path / "out"))
    metrics = run_eval(cfg, progress=False, backend=ShortContext(tok, policy))
    assert (metrics["format"], metrics["tools"]) == ("tool-calls", ["search", "calculate"])
    assert metrics["tools/search/calls"] == 1.5  # two in q-two, one in q-bad (with bad arguments: counted, not served)
    assert metrics["tools/calculate/calls"] == 0.5
    assert not [k for k in metrics if "weather" in k]  # an unknown tool is a mistake, not a metric key
    assert metrics["tools/invalid_rate"] == 3 / 6  # q-bad's three bad calls of the six
    assert metrics["tools/search/latency_s"] > 0
    recs = [json.loads(line) for line in (tmp_path / "out" / "predictions.jsonl").read_text().splitlines()]
    assert [c["name"] for c in recs[0]["tool_calls"]] == ["search", "search", "calculate"]
    assert [(c["name"], c["ok"]) for c in recs[1]["tool_calls"]] == [(None, False), ("weather", False), ("search", False)]
    assert [r["prediction"] for r in recs] == ["Orrin Bay", "Tessaly"] and [r["format_ok"] for r in recs] == [True, False]


@pytest.mark.parametrize("given, says", [
    ({"tools": ["search", "open"]}, "tag protocols speak the search tool only"),
    ({"protocol": {"format": "tool-calls", "template": "fewshot"}}, "takes the templates tools, tools-oneshot"),
    ({"protocol": {"template": "tools-oneshot"}}, "is a tool-call prompt"),
    ({"rollout": {"tool_budgets": {"search": 2}}}, "budget is rollout.max_searches"),
    ({"protocol": {"format": "tool-calls"}, "tools": ["search", "nope"]}, None),
])
def test_agent_configs_that_cannot_work_are_refused_with_what_to_set(given, says):
    from pydantic import ValidationError

    from searchrl.errors import SearchRLError

    if says is None:  # an unknown tool is found when the protocol is built
        with pytest.raises(SearchRLError, match="unknown tool 'nope'"):
            build_protocol(AgentConfig(**given), load_tokenizer("tiny-random"))
        return
    with pytest.raises(ValidationError, match=re.escape(says)):
        AgentConfig(**given)
