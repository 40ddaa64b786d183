"""The per-rollout inputs of the degeneration monitors on hand-made texts: repeated n-grams and
back-to-back loops of the reasoning, the think text each protocol yields, and the step metrics
`rl.step.record` writes from them (think_repeat_rate, think_loop_rate, malformed_tags)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from searchrl.assets import load_tokenizer
from searchrl.data.trajectory import Segment, Trajectory
from searchrl.data.types import Question
from searchrl.protocols.chat_template import NativeChat
from searchrl.protocols.chat_tools import ChatToolsProtocol
from searchrl.protocols.tagged import TagProtocol
from searchrl.protocols.tags import R1SEARCHER_TAGS, SEARCH_R1_TAGS
from searchrl.rewards import RewardConfig, compute_reward
from searchrl.rl import step
from searchrl.rl.actor import UpdateStats
from searchrl.rl.health_signals import back_to_back, loops, repeated_ngram_share

# Healthy: names its entities again and again, never one span thrice in a row.
HEALTHY = ("I need the river of Town 3. Town 3 lies on a river; the river of Town 3 is named in the passage about "
           "Town 3. The passage says Town 3 lies on the river R3, so the river of Town 3 is R3.")
# Degenerate: the policy says one clause until its token budget runs out.
LOOPING = "I need to search for Town 3. " + "I need to search for the river. " * 6


def _traj(*segments: tuple[str, str], answer: str | None = None) -> Trajectory:
    return Trajectory("q3", "Which river flows through Town 3?", [], [], [], [], [Segment(t, s) for t, s in segments], answer=answer)


def test_repeated_ngram_share_counts_repeats_of_earlier_ngrams():
    # "a b c a b c a": 4-grams abca bcab cabc abca -> the fourth repeats the first: 1 of 4
    assert repeated_ngram_share("a b c a b c a", n=4) == 0.25
    # w1..w7 twice: 11 4-grams; the 4 that start in the second copy (w1w2w3w4 .. w4w5w6w7) repeat
    assert repeated_ngram_share("one two three four five six seven " * 2, n=4) == pytest.approx(4 / 11)
    assert repeated_ngram_share(HEALTHY) > 0.1  # "the river of town 3" comes back: repeats are not loops
    assert repeated_ngram_share(LOOPING) > 0.6
    assert repeated_ngram_share("Town 3", n=4) is None


def test_back_to_back_finds_the_longest_adjacent_repetition():
    assert back_to_back(LOOPING) == 6  # "i need to search for the river" six times running
    assert back_to_back(HEALTHY) == 2  # "Town 3. Town 3": twice happens in healthy text
    assert back_to_back("the the the the") == 4
    assert back_to_back("a b a b a") == 2  # two whole copies of "a b" (and a partial third)
    assert back_to_back("x " + "one two three " * 3, max_span=2) == 1  # a 3-word span is past max_span
    assert back_to_back("") == 0
    assert (loops(LOOPING), loops(HEALTHY), loops("  ")) == (True, False, None)
    assert loops("It was very very old.") is False  # twice is ordinary emphasis


def test_think_text_of_the_tag_protocols(tmp_path):
    r1 = TagProtocol(R1SEARCHER_TAGS)  # the prompt opens the think block
    traj = _traj((LOOPING + "<|begin_of_query|>river of Town 3<|end_of_query|>", "policy"),
                 ("<|begin_of_documents|>(1) Town 3 lies on R3. Town 3 lies on R3. Town 3 lies on R3.<|end_of_documents|>", "env"),
                 ("So it is R3.</think><answer>R3</answer>", "policy"))
    text = r1.think_text(traj)
    assert text.startswith("I need to search for Town 3.") and "river of Town 3" in text and text.endswith("So it is R3.")
    assert "lies on R3" not in text and "<|" not in text and "R3</answer>" not in text  # documents and tags left out
    # An unclosed think block (a tiny model rarely closes it) runs to the end of the policy's text.
    assert r1.think_text(_traj(("I think. I think. I think.", "policy"))) == "I think. I think. I think."
    # A prompt that does not open the think block: the block starts at the policy's tag.
    (tmp_path / "prompt.txt").write_text("Q: {question}\nA:")
    opened = TagProtocol(SEARCH_R1_TAGS, template=str(tmp_path / "prompt.txt"))
    assert not opened.think_opened_in_prompt
    assert opened.think_text(_traj(("<think>Look it up.</think><answer>R3</answer>", "policy"))) == "Look it up."
    assert opened.think_text(_traj(("<answer>R3</answer>", "policy"))) == ""  # no think block at all


def test_think_text_of_tool_call_turns():
    template = str(Path(__file__).parent / "data" / "chat_templates" / "qwen3-style.jinja")
    schema = {"type": "function", "function": {"name": "search", "description": "Search.", "parameters": {
        "type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]}}}
    native = ChatToolsProtocol(NativeChat(load_tokenizer("tiny-random"), [schema], template=template))
    traj = _traj(('Town 3 first.\n<tool_call>{"name": "search", "arguments": {"query": "Town 3"}}</tool_call>', "policy"),
                 ("<tool_response>Town 3 lies on R3.</tool_response>", "env"),
                 ("<think>It says R3.</think>\nR3", "policy"))
    # A call turn without a think block: its text outside the call; a final turn: its think block only.
    assert native.think_text(traj) == "Town 3 first.\nIt says R3."


def test_step_record_writes_the_degeneration_metrics():
    tags = SEARCH_R1_TAGS
    question = Question("q3", "Which river flows through Town 3?", ("R3",))
    trajs = [
        _traj((HEALTHY + "</think><answer>R3</answer>", "policy"), answer="R3"),
        _traj((LOOPING, "policy")),  # cut by the budget: no </think>, no answer
        _traj(("Look. <search>Town 3</think><answer>R3</answer>", "policy"), answer="R3"),  # unclosed query
        _traj(("ok</think><answer>" + "word " * 12 + "</answer>", "policy"), answer="word " * 12),  # too long: a text rule
    ]
    rewards = [compute_reward(t, question.answers, RewardConfig(max_answer_words=10), tags) for t in trajs]
    assert [r.failed_rules for r in rewards] == [[], ["think", "answer"], ["query"], ["answer_length"]]
    scored = step.Scored([question] * 4, trajs, rewards, [0, 0, 0, 0])
    sums = torch.ones((4, len(step._SUMS)), dtype=torch.float64)
    out = step.record(step.StepIndex(1, 1, 0, 0), scored, sums, UpdateStats(0, 0, 0, 0, 1, 0, 0, 1e-5), False, False,
                      step.Timing(1.0, 0.0, 0.0, 1.0), tools=["search"], protocol=TagProtocol(tags))
    assert out["malformed_tags"] == 0.5 and out["format_ok"] == 0.25  # answer_length is not a tag rule
    assert out["think_loop_rate"] == 0.25  # every rollout wrote reasoning; one loops
    texts = [TagProtocol(tags).think_text(t) for t in trajs]
    known = [x for x in map(repeated_ngram_share, texts) if x is not None]
    assert len(known) == 2 and out["think_repeat_rate"] == pytest.approx(sum(known) / 2)
