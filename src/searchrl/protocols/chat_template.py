"""Native tool calls through a model's own chat template, token in / token out.

`NativeChat` renders the prompt with `apply_chat_template(messages, tools=schemas, ...)`, reads
the policy's sampled ids into a `Turn` (see `parse`), and gives the ids that follow them: the
tool-result block(s) and the next assistant generation prompt, taken from the template's own
rendering and appended with loss mask 0. The sampled ids are never decoded and re-encoded into
the sequence; only what the environment adds is tokenized.

One trajectory, as the rollout engine runs it (any backend: ids in, ids out)::

    chat = NativeChat(tokenizer, [t.schema() for t in tools], template="hermes-fallback")
    check_template(chat)                            # once, at start-up (`selftest`)
    history = [system_message, user_message]
    ids = chat.prompt_ids(history)                  # loss mask 0
    while True:
        sampled = generate(ids, stop=chat.stop_ids)  # loss mask 1, ends with a stop id or is cut
        turn = chat.parse_ids(sampled)
        if turn.is_final: break                     # turn.final_text is the answer
        results = [chat.tool_message(c.name, text) for c, text in zip(turn.calls, run(turn.calls))]
        results += [chat.tool_message("error", m) for m in turn.malformed]  # readable, counted
        ids += sampled + chat.observation_ids(history, sampled, results)    # loss mask 0
        history += [chat.assistant_message(turn), *results]
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from importlib import resources
from pathlib import Path
from typing import Any

from searchrl import datatext
from searchrl.chat_render import render, template_name
from searchrl.errors import SearchRLError
from searchrl.protocols.call_formats import CALL_FORMATS, Turn, detect_format
from searchrl.tools.base import ToolCall

Message = dict[str, Any]

# Stands in for a tool result's content, so that two renderings share everything before it.
_SENTINEL = "SEARCHRL_TOOL_RESULT_SENTINEL"
TEMPLATE_DIR = "configs/chat_templates"


def shipped_templates() -> list[str]:
    """Names of the chat templates shipped with searchrl (`hermes-fallback`, ...)."""
    folder = resources.files("searchrl").joinpath(TEMPLATE_DIR)
    return sorted(p.name[: -len(".jinja")] for p in folder.iterdir() if p.name.endswith(".jinja"))


def load_chat_template(name_or_path: str) -> str:
    """A chat template's source: a shipped name (`hermes-fallback`) or a `.jinja` file path."""
    if name_or_path in shipped_templates():
        return (
            resources.files("searchrl")
            .joinpath(f"{TEMPLATE_DIR}/{name_or_path}.jinja")
            .read_text("utf-8")
        )
    path = Path(os.path.expanduser(name_or_path))
    if path.suffix == ".jinja" and path.is_file():
        return path.read_text(encoding="utf-8")
    raise SearchRLError(
        f"chat template {name_or_path!r} is neither a shipped one ({', '.join(shipped_templates())}) "
        "nor a .jinja file; give one of those names or the path of a .jinja file"
    )


class NativeChat:
    """One chat template, one call format and the tools' schemas, bound to a tokenizer.

    `template`: None for the tokenizer's own, else a shipped name or a .jinja path (never
    chosen silently). `call_format`: None to detect it from the template, else a registered
    name. `template_kwargs` go to every rendering (e.g. `enable_thinking` for Qwen3)."""

    def __init__(
        self,
        tokenizer,
        tools: Sequence[dict[str, Any]],
        call_format: str | None = None,
        template: str | None = None,
        template_kwargs: dict[str, Any] | None = None,
    ) -> None:
        self.tokenizer = tokenizer
        self.tools = list(tools)
        self.template_name = template_name(tokenizer, template)  # how errors name it
        if template is not None:
            self.template = load_chat_template(template)
        elif getattr(tokenizer, "chat_template", None):
            self.template = tokenizer.chat_template
        else:
            raise SearchRLError(
                "the tokenizer has no chat template; pick one explicitly (template: hermes-fallback)"
            )
        self.format = CALL_FORMATS.get(call_format or detect_format(self.template))()
        self.template_kwargs = dict(template_kwargs or {})
        self.end_of_turn_id, self.separator = self._end_of_turn()
        ids = {self.end_of_turn_id, tokenizer.eos_token_id}
        for token in self.format.extra_stops:  # e.g. Llama's <|eom_id|> after a python_tag call
            if token in tokenizer.get_vocab():
                ids.add(tokenizer.convert_tokens_to_ids(token))
        self.stop_ids: list[int] = sorted(i for i in ids if i is not None)  # where a turn ends

    # -- rendering -------------------------------------------------------------------------
    def render(self, messages: Sequence[Message], add_generation_prompt: bool) -> str:
        # User code: its errors become one line naming the template, its time is bounded.
        return render(
            self.tokenizer,
            messages,
            name=self.template_name,
            chat_template=self.template,
            tools=self.tools or None,
            add_generation_prompt=add_generation_prompt,
            **self.template_kwargs,
        )

    def encode(self, text: str) -> list[int]:
        # The template writes its own BOS and special tokens: the tokenizer must add none. Data
        # marks (`searchrl.datatext`): text from outside never becomes a control token.
        return datatext.encode(self.tokenizer, text)

    def prompt_ids(self, messages: Sequence[Message]) -> list[int]:
        """The ids of the first prompt (system and user messages, tool section, generation prompt).
        Pass the system message explicitly: a template that injects a default one when there is
        none would otherwise put a system prompt in the model's context you never chose. User
        and tool messages are data: their text never becomes a control token."""
        return self.encode(self.render(datatext.data_messages(messages), add_generation_prompt=True))

    def _end_of_turn(self) -> tuple[int, str]:
        """(the id that ends an assistant turn, the text the template writes after it that the
        model never samples, e.g. ChatML's newline), read from a probe rendering."""
        probe = [{"role": "user", "content": "ping"}]
        head = self.render(probe, add_generation_prompt=True)
        full = self.render(
            [*probe, {"role": "assistant", "content": "pong"}], add_generation_prompt=False
        )
        if not full.startswith(head) or "pong" not in full[len(head) :]:
            raise SearchRLError(
                "the chat template's generation prompt is not the start of its assistant message; "
                "pick another template (template: hermes-fallback)"
            )
        tail = full[len(head) :].split("pong", 1)[1]
        ids = self.encode(tail)
        end = self.tokenizer.decode(ids[:1]) if ids else ""
        if (
            not ids
            or not tail.startswith(end)
            or self.encode(end) != ids[:1]
            or ids[0] not in self._special_ids()
        ):
            raise SearchRLError(
                f"the chat template ends an assistant turn with {tail!r}, which this tokenizer has no "
                "single special token for, so the policy cannot sample the end of a turn; use a "
                "template written for this tokenizer (template: hermes-fallback for ChatML models)"
            )
        return ids[0], tail[len(end) :]

    def _special_ids(self) -> set[int]:
        added = getattr(self.tokenizer, "added_tokens_decoder", {}) or {}
        return set(self.tokenizer.all_special_ids) | set(added)

    # -- one turn --------------------------------------------------------------------------
    def parse_ids(self, sampled_ids: Sequence[int]) -> Turn:
        """The turn the policy sampled, read by the call format (the closing stop id removed)."""
        ids = list(sampled_ids)
        if ids and ids[-1] in self.stop_ids:
            ids = ids[:-1]
        return self.format.parse(
            self.tokenizer.decode(
                ids, skip_special_tokens=False, clean_up_tokenization_spaces=False
            )
        )

    def assistant_message(self, turn: Turn) -> Message:
        """The turn as a chat message for the history: well-formed calls as `tool_calls`, the
        text without them (reasoning kept, for templates that read it back) as `content`."""
        content = (
            f"<think>\n{turn.reasoning}\n</think>\n\n{turn.final_text}"
            if turn.reasoning
            else turn.final_text
        )
        return self.call_message(content, turn.calls)

    @staticmethod
    def call_message(content: str, calls: Sequence[ToolCall] = ()) -> Message:
        """An assistant message with `calls` in the shape chat templates (and HF datasets) take."""
        message: Message = {"role": "assistant", "content": content}
        if calls:
            message["tool_calls"] = [
                {"type": "function", "function": {"name": c.name, "arguments": c.arguments}}
                for c in calls
            ]
        return message

    @staticmethod
    def tool_message(name: str, text: str) -> Message:
        """A tool result as the template's tool-role message (Llama 3.1 renders it as `ipython`)."""
        return {"role": "tool", "name": name, "content": text}

    def observation_ids(
        self,
        history: Sequence[Message],
        sampled_ids: Sequence[int],
        tool_messages: Sequence[Message],
    ) -> list[int]:
        """The ids to append (loss mask 0) after the policy's `sampled_ids`: the separator the
        template writes after the end-of-turn token, the tool-result block(s) and the next
        generation prompt. `history`: the messages before this assistant turn.

        Both renderings hold the assistant message followed by tool messages, so a template that
        renders the last assistant message differently from a later one (Qwen3's empty think)
        renders it the same way in both; what differs starts inside the first tool result. A turn
        cut by the budget (no end-of-turn id) gets that id first, from the environment.

        The results are data (`searchrl.datatext`): a result holding `<|im_end|>` or
        `<|endoftext|>` is tokenized as those characters, never as the control tokens."""
        if not tool_messages:
            raise ValueError("observation_ids needs at least one tool message")
        base = [*history, self.assistant_message(self.parse_ids(sampled_ids))]
        stub = [{**tool_messages[0], "content": _SENTINEL}]
        real = self.render([*base, *datatext.data_messages(tool_messages, ("tool",))], add_generation_prompt=True)
        probe = self.render([*base, *stub], add_generation_prompt=False)
        common = 0
        for a, b in zip(real, probe):
            if a != b:
                break
            common += 1
        end_text = self.tokenizer.decode([self.end_of_turn_id])
        cut = real.rfind(end_text, 0, common)
        # The end of turn found must close this assistant turn: after the history, before the result.
        if (
            cut < len(self.render(history, add_generation_prompt=False))
            or probe.find(_SENTINEL) < cut
        ):
            raise SearchRLError(
                "the chat template rewrites the conversation when a tool result follows (the assistant "
                "turn is not closed by its end-of-turn token before the tool block); pick a "
                "prefix-preserving template (template: hermes-fallback) or another call format"
            )
        ids = self.encode(real[cut + len(end_text) :])
        closed = bool(sampled_ids) and sampled_ids[-1] in self.stop_ids
        return ids if closed else [self.end_of_turn_id, *ids]
