"""The start-up check that a chat template can be used turn by turn, token in / token out.

A canned three-turn tool conversation (user → assistant call → tool → assistant call → tool →
answer) is rendered twice: once whole, as the template writes it, and once the way the rollout
engine builds it: prompt ids, then for each turn the ids the policy would sample (the template's
own rendering of that turn) and the observation ids of `NativeChat.observation_ids`. A template
that rewrites earlier turns once the conversation goes on (drops earlier reasoning, moves the
system prompt) gives two different sequences: the run stops before it trains on contexts the
model never saw.

The conversation is checked twice, whatever the template's source looks like: with reasoning
(`<think>…</think>` before each call and the answer: any policy may write it, and a template may
drop it from history by means no look at its source finds) and without. A template that writes a
think block into a turn given without one (Qwen3: every sampled turn holds one) is checked with
reasoning only, since its turns are never without.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import pairwise

from searchrl.errors import SearchRLError
from searchrl.protocols.chat_template import Message, NativeChat
from searchrl.tools.base import ToolCall

SYSTEM = "Answer the question; use the tools when you need them."
QUESTION = "In which year was the town on the river Arno founded?"
RESULTS = ["Florence lies on the Arno.", "Florence was founded in 59 BC."]


@dataclass
class Transcript:
    """One conversation built turn by turn: `ids` with `loss_mask` (1 sampled, 0 environment);
    and `whole`, the ids of rendering it whole, tokenized in pieces cut where each assistant turn
    starts: a generation prompt is tokenized on its own (whitespace at its end never merges with
    what the model writes next), so that is the tokenization a policy meets."""

    ids: list[int]
    loss_mask: list[int]
    whole: list[int]
    messages: list[Message]


def canned_turns(chat: NativeChat, reasoning: bool | None = None) -> list[Message]:
    """The canned assistant turns: two calls of the first tool, then an answer, each with
    reasoning or not (None: as the template's turns are, `writes_reasoning`)."""
    tool = chat.tools[0]["function"] if chat.tools else {"name": "search"}
    calls = [
        ToolCall(tool["name"], {"query": "river Arno town"}),
        ToolCall(tool["name"], {"query": "Florence founded"}),
    ]
    think = writes_reasoning(chat) if reasoning is None else reasoning
    turns = []
    for i, call in enumerate(calls):
        content = f"<think>\nStep {i + 1}: look it up.\n</think>\n\n" if think else ""
        turns.append(chat.call_message(content, [call]))
    answer = "<think>\nFound it.\n</think>\n\n" if think else ""
    turns.append({"role": "assistant", "content": answer + "Florence was founded in 59 BC."})
    return turns


def sampled_ids(chat: NativeChat, history: list[Message], assistant: Message) -> list[int]:
    """The ids a policy writes for `assistant`: the template's rendering of it as the last
    message, after the generation prompt, up to and including its end-of-turn token."""
    head = chat.render(history, add_generation_prompt=True)
    full = chat.render([*history, assistant], add_generation_prompt=False)
    end_text = chat.tokenizer.decode([chat.end_of_turn_id])
    end = full.rfind(end_text)
    if not full.startswith(head) or end < len(head):
        raise SearchRLError(
            "the chat template's generation prompt is not the start of its assistant message; "
            "pick another template (template: hermes-fallback)"
        )
    return chat.encode(full[len(head) : end]) + [chat.end_of_turn_id]


def writes_reasoning(chat: NativeChat) -> bool:
    """Whether the template writes a think block into an assistant turn given without one, read
    from its rendering (Qwen3 does, for the turn being sampled): its turns always hold one."""
    turn = {"role": "assistant", "content": "Florence."}
    sampled = chat.tokenizer.decode(sampled_ids(chat, [{"role": "user", "content": QUESTION}], turn))
    return "</think>" in sampled


def transcript(chat: NativeChat, system: str | None = SYSTEM, reasoning: bool | None = None) -> Transcript:
    """The canned conversation built turn by turn, and rendered whole; `reasoning` as in
    `canned_turns`."""
    history: list[Message] = [{"role": "system", "content": system}] if system else []
    history.append({"role": "user", "content": QUESTION})
    ids = chat.prompt_ids(history)
    mask = [0] * len(ids)
    turns = canned_turns(chat, reasoning)
    starts = []
    for i, assistant in enumerate(turns):
        starts.append(len(chat.render(history, add_generation_prompt=True)))
        sampled = sampled_ids(chat, history, assistant)
        ids += sampled
        mask += [1] * len(sampled)
        if i == len(turns) - 1:
            history.append(assistant)
            break
        _check_parse(chat, sampled, assistant)
        name = assistant["tool_calls"][0]["function"]["name"]
        tools = [chat.tool_message(name, RESULTS[i])]
        observed = chat.observation_ids(history, sampled, tools)
        ids += observed
        mask += [0] * len(observed)
        history += [assistant, *tools]
    whole = chat.render(history, add_generation_prompt=False)
    # The whole rendering ends with the separator the model never samples after its last turn.
    end_text = chat.tokenizer.decode([chat.end_of_turn_id])
    cuts = [0, *starts, whole.rfind(end_text) + len(end_text)]
    whole_ids = [i for a, b in pairwise(cuts) for i in chat.encode(whole[a:b])]
    return Transcript(ids, mask, whole_ids, history)


def _check_parse(chat: NativeChat, sampled: list[int], assistant: Message) -> None:
    turn = chat.parse_ids(sampled)
    want = [(c["function"]["name"], c["function"]["arguments"]) for c in assistant["tool_calls"]]
    got = [(c.name, c.arguments) for c in turn.calls]
    if got != want or turn.malformed:
        raise SearchRLError(
            f"the chat template writes tool calls that the {chat.format.name!r} call format does not "
            f"read back (wrote {want}, read {got}, malformed {turn.malformed}); set the format by name "
            "to the one this template speaks, or pick its template (template: hermes-fallback)"
        )


def check_template(chat: NativeChat) -> None:
    """Stop with a clear `SearchRLError` when the template is not prefix-preserving, i.e. when
    the turn-by-turn ids differ from the ids of the whole rendering, for the conversation with
    reasoning and (unless the template always writes reasoning) without."""
    for reasoning in (True, False) if not writes_reasoning(chat) else (True,):
        _check(chat, transcript(chat, reasoning=reasoning), "with" if reasoning else "without")


def _check(chat: NativeChat, t: Transcript, reasoning: str) -> None:
    if t.ids == t.whole:
        return
    at = next(
        (i for i, (a, b) in enumerate(zip(t.ids, t.whole)) if a != b), min(len(t.ids), len(t.whole))
    )
    tok = chat.tokenizer
    raise SearchRLError(
        f"the chat template is not prefix-preserving: a three-turn tool conversation {reasoning} reasoning built "
        f"turn by turn differs from its whole rendering at token {at} (turn by turn {tok.decode(t.ids[at : at + 12])!r}, "
        f"whole {tok.decode(t.whole[at : at + 12])!r}), so training would use contexts the model never saw "
        "(a template that drops earlier reasoning or rewrites history does this); pick a prefix-preserving "
        "template (template: hermes-fallback, or a model's training template) or another call format"
    )
