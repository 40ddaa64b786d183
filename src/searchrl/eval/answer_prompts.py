"""Prompts of the `rag` and `direct` evaluation baselines (our wording).

The model is asked for the final answer only, between the answer tags, and the prompt already
opens the answer tag, so the response IS the answer (up to the closing tag). Rag puts the
retrieved passages in the user turn above the question. With a few-shot template (`fewshot`,
`fewshot-chat`) the prompt first shows the worked examples of `searchrl.prompts.EXAMPLES`
reduced to this format (their passages, question, final answer): a 135M model does not close the
answer tag without seeing it done.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from searchrl.data.types import Passage
from searchrl.prompts import CHAT_SPLIT, EXAMPLES, apply_chat, resolve_template
from searchrl.tags import TagSet

INSTRUCTION = (
    "Answer the question{source}. Give only the final answer, in a few words, between "
    "{answer_open} and {answer_close}."
)


def documents_text(passages: Sequence[Passage]) -> str:
    """`(1) Title: T` then the text, one passage after another."""
    lines = [f"({i}) Title: {p.title}\n{p.text}" for i, p in enumerate(passages, start=1)]
    return "\n".join(lines) or "(no documents found)"


def user_turn(question: str, passages: Sequence[Passage] | None) -> str:
    if passages is None:
        return question
    return f"Documents:\n{documents_text(passages)}\n\nQuestion: {question}"


def _examples(with_passages: bool) -> list[tuple[str, str]]:
    """(user turn, answer) of each worked example."""
    out = []
    for question, steps in EXAMPLES:
        passages = [p for step in steps if step[0] == "query" for p in step[2]]
        out.append((user_turn(question, passages if with_passages else None), steps[-1][2]))
    return out


def template_kind(template: str) -> tuple[bool, bool]:
    """(chat?, few-shot?) of the agent's template: built-ins by name, files by their text (a
    `---user---` line makes a chat template, an `{examples}` placeholder a few-shot one)."""
    resolved = resolve_template(template)
    if isinstance(resolved, Path):
        text = resolved.read_text(encoding="utf-8")
        return CHAT_SPLIT.search(text) is not None, "{examples}" in text
    return "chat" in resolved, resolved.startswith("fewshot")


def answer_prompt(
    question: str, passages: Sequence[Passage] | None, tags: TagSet, template: str = "base", tokenizer=None
) -> str:
    """The rag (`passages` given) or direct (None) prompt; it ends with the opening answer tag.

    The agent's `template` picks the form: chat (the tokenizer's chat template) or completion,
    and few-shot or not.

    >>> from searchrl.tags import SEARCH_R1_TAGS
    >>> print(answer_prompt("Who built Quellbridge?", None, SEARCH_R1_TAGS, "base"))
    Answer the question. Give only the final answer, in a few words, between <answer> and </answer>.
    <BLANKLINE>
    User: Who built Quellbridge?
    Assistant: <answer>
    """
    source = " using the documents" if passages is not None else ""
    instruction = INSTRUCTION.format(source=source, **tags.as_dict())
    chat, fewshot = template_kind(template)
    shots = _examples(passages is not None) if fewshot else []
    shown = [(u, f"{tags.answer_open}{a}{tags.answer_close}") for u, a in shots]
    if chat:
        messages = [{"role": "system", "content": instruction}]
        for user, reply in shown:
            messages += [{"role": "user", "content": user}, {"role": "assistant", "content": reply}]
        messages.append({"role": "user", "content": user_turn(question, passages)})
        return apply_chat(tokenizer, messages, template) + tags.answer_open
    turns = [f"User: {user}\nAssistant: {reply}" for user, reply in shown]
    turns.append(f"User: {user_turn(question, passages)}\nAssistant: {tags.answer_open}")
    return instruction + "\n\n" + "\n\n".join(turns)
