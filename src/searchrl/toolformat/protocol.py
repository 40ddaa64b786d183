"""The tool-call protocol (`protocol.format: tool-calls`): the model speaks its chat template's
native tool calls, and any tool of the run's registry answers (docs/concepts/protocols.md).

`NativeProtocol` is what the rollout engine, rewards and evaluation read instead of the tag
protocol's `Protocol`: the prompt (a system message, worked example conversations, the
question), where a turn ends, what a turn holds (a final answer, calls, malformed calls), the
observation ids that follow a turn, and the answer.

**The answer** is read from the final message, the first assistant turn with no call: the text
of its last `<answer>…</answer>` block when it has one, else its whole text (reasoning removed),
stripped. The system prompts ask for the answer alone, in a few words.

Prompts (`protocol.template` in this format): `tools` (the instruction only), `tools-oneshot`
(one worked example conversation before the question, two searches: what a 135M model needs to
start calling tools), `tools-fewshot` (two). The examples are real conversations in the
template's own rendering (assistant turns with `tool_calls`, tool-role results), so the model
sees its calls exactly as it will write them.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from searchrl.data.trajectory import Segment
from searchrl.prompts import EXAMPLES
from searchrl.protocol import NATIVE_TEMPLATES, TurnRead
from searchrl.tags import format_passages
from searchrl.toolformat.chat import Message, NativeChat
from searchrl.toolformat.selftest import sampled_ids
from searchrl.tools.base import ToolCall

INSTRUCTION = (
    "Answer the user's question. Use the tools to look facts up: search with a short query, read "
    "the results, and search again while a fact is still missing. When you know the answer, reply "
    "with the answer alone, in a few words, and no tool call."
)
_SENTINEL = "SEARCHRL_OBSERVATION"
_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)


def example_conversation(question: str, steps: list[tuple]) -> list[Message]:
    """A worked example (`prompts.EXAMPLES`) as chat messages: each search an assistant turn
    with its reasoning and one `search` call, then the tool's result; then the short answer."""
    messages: list[Message] = [{"role": "user", "content": question}]
    thought = ""
    for step in steps:
        if step[0] == "think":
            thought = step[1].strip()
        elif step[0] == "query":
            messages.append(NativeChat.call_message(thought, [ToolCall("search", {"query": step[1]})]))
            messages.append(NativeChat.tool_message("search", format_passages(step[2])))
        else:
            messages.append({"role": "assistant", "content": step[2]})
    return messages


@dataclass
class NativeProtocol:
    """A chat template with tools (`NativeChat`), a system instruction and worked examples."""

    chat: NativeChat
    template: str = "tools"
    system: str = INSTRUCTION

    @cached_property
    def examples(self) -> list[Message]:
        return [m for q, steps in EXAMPLES[: NATIVE_TEMPLATES[self.template]] for m in example_conversation(q, steps)]

    def messages(self, question: str) -> list[Message]:
        """The conversation a rollout starts from. The system message is always given: a template
        that injects a default one otherwise would add a prompt nobody chose."""
        return [{"role": "system", "content": self.system}, *self.examples, {"role": "user", "content": question}]

    def prompt_ids(self, question: str) -> list[int]:
        return self.chat.prompt_ids(self.messages(question))

    @cached_property
    def stop_texts(self) -> list[str]:
        """The text of every token that ends a turn (the engine stops there; EOS also stops)."""
        tok = self.chat.tokenizer
        return [tok.decode([i], skip_special_tokens=False) for i in self.chat.stop_ids]

    def stop_strings(self) -> list[str]:
        return list(self.stop_texts)

    def read_turn(self, sampled_ids: Sequence[int], finish_reason: str, stop_string: str | None) -> TurnRead | None:
        """The end of a turn (EOS, or an end-of-turn token), read; None when the generation
        stopped for another reason (a budget): a turn cut by the budget is never run."""
        if finish_reason != "eos" and not (finish_reason == "stop" and stop_string in self.stop_texts):
            return None
        turn = self.chat.parse_ids(sampled_ids)
        if turn.is_final:
            return TurnRead("answer", turn=turn)
        return TurnRead(calls=turn.calls, malformed=turn.malformed, turn=turn)

    def turn_text(self, ids: Sequence[int]) -> list[int]:
        """A turn's ids without the end-of-turn token that closes it (text of a segment)."""
        return list(ids[:-1]) if ids and ids[-1] in self.chat.stop_ids else list(ids)

    def answer(self, segments: Sequence[Segment], **_: Any) -> str | None:
        """The answer of a rollout (module docstring): read from its last policy turn when that
        turn has no call; None otherwise (the rollout never gave a final message)."""
        last = next((s.text for s in reversed(segments) if s.source == "policy"), None)
        if last is None:
            return None
        turn = self.chat.format.parse(last)
        if not turn.is_final:
            return None
        found = _ANSWER.findall(turn.final_text)
        return (found[-1].strip() if found else turn.final_text) or None

    @cached_property
    def _probe(self) -> tuple[list[Message], list[int]]:
        """A canned conversation up to a sampled call turn: what observations are measured on."""
        history: list[Message] = [{"role": "user", "content": "ping"}]
        call = self.chat.call_message("", [ToolCall("search", {"query": "ping"})])
        return history, sampled_ids(self.chat, history, call)

    @cached_property
    def observation_overhead(self) -> int:
        """Tokens a tool-result block adds around an empty result (the separator, the tool turn's
        wrapper, the next generation prompt): what the context check counts per call besides
        the result's text."""
        history, sampled = self._probe
        return len(self.chat.observation_ids(history, sampled, [self.chat.tool_message("search", "")]))

    @cached_property
    def observation_markers(self) -> tuple[str, ...]:
        """Text that only the environment writes: the opening of a tool-result block in this
        template (`<|im_start|>tool`, `<|im_start|>user\n<tool_response>`) and the call format's
        result tags. A policy turn that holds one forged an observation."""
        history, sampled = self._probe
        ids = self.chat.observation_ids(history, sampled, [self.chat.tool_message("search", _SENTINEL)])
        opening = self.chat.tokenizer.decode(ids, skip_special_tokens=False).split(_SENTINEL)[0].strip()
        return tuple(m for m in (opening, *self.chat.format.observation_markers) if m)
