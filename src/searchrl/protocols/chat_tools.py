"""The tool-call protocol (`protocol.format: tool-calls`): the model speaks its chat template's
native tool calls, and any tool of the run's registry answers (docs/concepts/protocols.md).

`ChatToolsProtocol` implements `Protocol` over a chat template with tools (`NativeChat`): the
prompt (a system message, worked example conversations, the question), where a turn ends (the
template's end-of-turn token), what a turn holds (a final answer, calls, malformed calls), the
observation ids that follow a turn, and the answer.

**Observations** are the template's tool-result messages after the sampled turn, as ids (the
difference of two renderings, `NativeChat.observation_ids`; loss mask 0). Results that do not
fit the room left are shortened alike: each result's text cut to one length and marked; when
not even empty results fit, the rollout stops there.

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
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cached_property

from searchrl.data.trajectory import Segment, Trajectory
from searchrl.data.types import Passage
from searchrl.errors import SearchRLError
from searchrl.protocols.base import Codec, Observed, Protocol, Script, TurnRead
from searchrl.protocols.chat_template import Message, NativeChat
from searchrl.protocols.config import PROTOCOLS, ProtocolConfig
from searchrl.protocols.format_rules import check_turns, final_answer, policy_turns
from searchrl.protocols.prompts import EXAMPLES, TOOL_TEMPLATES
from searchrl.protocols.template_selftest import check_template, sampled_ids
from searchrl.reward_terms import FormatVerdict
from searchrl.tools.base import Observation, ToolCall
from searchrl.tools.passages import format_passages
from searchrl.tools.registry import tool_class

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


@PROTOCOLS.register("tool-calls")
@dataclass
class ChatToolsProtocol(Protocol):
    """A chat template with tools (`NativeChat`), a system instruction and worked examples."""

    format = "tool-calls"
    default_template = "tools"
    spent_turns_allowed = 1  # a tool-call model reads that its budget is spent, once, and may still answer

    chat: NativeChat
    template: str = "tools"
    system: str = INSTRUCTION

    @classmethod
    def check_config(cls, cfg: ProtocolConfig, tools: Sequence[str] | None = None) -> None:
        if cfg.template not in TOOL_TEMPLATES:
            raise ValueError(f"protocol.format tool-calls takes the templates {', '.join(TOOL_TEMPLATES)}, not {cfg.template!r}")

    @classmethod
    def build(cls, cfg: ProtocolConfig, tools: Sequence[str], tokenizer) -> ChatToolsProtocol:
        """The chat template bound to `tokenizer` and the schemas of `tools`, self-tested (a
        template that is not prefix-preserving stops here)."""
        if tokenizer is None:
            raise SearchRLError("protocol.format tool-calls needs the model's tokenizer; this backend has none")
        # The built-in models' profiles choose our hermes-fallback template (SmolLM2's has no tool
        # section), announced with the profile; any other model without one gets the error naming it.
        chat = NativeChat(tokenizer, [tool_class(name).schema() for name in tools], cfg.call_format, cfg.chat_template,
                          cfg.template_kwargs)
        check_template(chat)
        return cls(chat, cfg.template)

    @cached_property
    def examples(self) -> list[Message]:
        return [m for q, steps in EXAMPLES[: TOOL_TEMPLATES[self.template]] for m in example_conversation(q, steps)]

    def messages(self, question: str) -> list[Message]:
        """The conversation a rollout starts from. The system message is always given: a template
        that injects a default one otherwise would add a prompt nobody chose."""
        return [{"role": "system", "content": self.system}, *self.examples, {"role": "user", "content": question}]

    def conversation(self, question: str) -> list[Message]:
        return self.messages(question)

    def prompt_ids(self, question: str, codec: Codec | None = None, prompt: str | None = None) -> list[int]:
        if prompt is not None:
            raise ValueError("tool-call rollouts start from the protocol's conversation; prompts cannot be given")
        return self.chat.prompt_ids(self.messages(question))

    @cached_property
    def stop_texts(self) -> list[str]:
        """The text of every token that ends a turn (the engine stops there; EOS also stops)."""
        tok = self.chat.tokenizer
        return [tok.decode([i], skip_special_tokens=False) for i in self.chat.stop_ids]

    def stop_strings(self) -> list[str]:
        return list(self.stop_texts)

    def read_turn(self, sampled_ids: Sequence[int], finish_reason: str, stop_string: str | None,
                  codec: Codec | None = None) -> TurnRead | None:
        """The end of a turn (EOS, or an end-of-turn token), read; None when the generation
        stopped for another reason (a budget): a turn cut by the budget is never run."""
        if finish_reason != "eos" and not (finish_reason == "stop" and stop_string in self.stop_texts):
            return None
        turn = self.chat.parse_ids(sampled_ids)
        if turn.is_final:
            return TurnRead("answer", turn=turn)
        return TurnRead(calls=turn.calls, malformed=turn.malformed, turn=turn)

    def observe(self, history: list[Message], read: TurnRead, sampled_ids: Sequence[int],
                results: Sequence[tuple[ToolCall | None, Observation]], room: float, codec: Codec) -> Observed | None:
        """The template's tool-result messages after the sampled turn, as ids, shortened to fit
        (module docstring); with them the conversation gets the turn and its results."""
        chat = self.chat

        def render(texts: list[str]) -> tuple[list[Message], list[int]]:
            messages = [chat.tool_message(call.name if call else "error", t) for (call, _), t in zip(results, texts)]
            return messages, chat.observation_ids(history, sampled_ids, messages)

        texts = [obs.text for _, obs in results]
        messages, ids = render(texts)
        cut = len(ids) > room
        if cut:
            most = max(map(len, texts))
            while len(ids) > room:
                if most == 0:
                    return None
                most = max(0, min(most - 1, int(most * room / len(ids))))
                messages, ids = render([t if len(t) <= most else t[:most] + " [cut]" for t in texts])
        return Observed(ids, codec.decode(ids), cut, [chat.assistant_message(read.turn), *messages])

    def turn_text(self, ids: Sequence[int], final_eos: frozenset[int] = frozenset()) -> list[int]:
        """A turn's ids without the end-of-turn token that closes it (text of a segment)."""
        return list(ids[:-1]) if ids and ids[-1] in self.chat.stop_ids else list(ids)

    def answer(self, segments: Sequence[Segment], *, opened: bool = False, cut_short: bool = False) -> str | None:
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

    def check_format(self, traj: Trajectory, *, max_answer_words: int | None = None, require_think: bool = True,
                     think_opened_in_prompt: bool | None = None) -> FormatVerdict:
        """The tool-call rules (`format_rules.check_turns`); there is no think block to require."""
        return check_turns(traj, final_answer(traj, self), self.observation_markers, max_answer_words=max_answer_words)

    def think_text(self, traj: Trajectory) -> str:
        """Each turn's `<think>` block, or where a call turn has none, its text outside the calls
        (a final turn's text is the answer)."""
        turns = [self.chat.format.parse(text) for text in policy_turns(traj.segments)]
        return "\n".join(t.reasoning or ("" if t.is_final else t.final_text) for t in turns)

    def chat_messages(self, question: str, script: Script) -> list[Message]:
        """The conversation of a written rollout: the protocol's messages, per step an assistant
        turn with its thought and one call and the tool's result, then the answer alone."""
        out = self.messages(question)
        for step in script.steps:
            out.append(NativeChat.call_message(step.thought, [step.call]))
            out.append(NativeChat.tool_message(step.call.name, step.result.text))
        out.append({"role": "assistant", "content": script.answer})
        return out

    def written(self, question: str, script: Script, codec: Codec) -> list[tuple[str, list[int], str]]:
        """Each turn the ids a policy samples for it (`template_selftest.sampled_ids`), each
        result block the template's observation ids, as `observe` appends them."""
        chat, pieces = self.chat, []
        messages = self.chat_messages(question, script)
        history = self.messages(question)
        for i in range(len(history), len(messages), 2):
            assistant = messages[i]
            sampled = sampled_ids(chat, history, assistant)
            pieces.append(("policy", sampled, ""))
            if i + 1 == len(messages):
                break
            tool = messages[i + 1]
            ids = chat.observation_ids(history, sampled, [tool])
            pieces.append(("env", ids, codec.decode(ids)))
            history = [*history, chat.assistant_message(chat.parse_ids(sampled)), tool]
        return pieces

    def search_block_tokens(self, passages: Sequence[Passage], encode: Callable[[str], list[int]]) -> tuple[int, float]:
        """A search result's block: the template's wrapper counted as the frame."""
        return self.observation_overhead, len(encode(format_passages(passages))) / len(passages)

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
