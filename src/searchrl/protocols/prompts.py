"""Prompt templates (docs/concepts/protocols.md): `base`, `chat`, `fewshot`, `oneshot`, `fewshot-chat`, and user
template files.

Every built-in prompt ends with the think tag, so generation continues inside the think block
(`Protocol.think_opened_in_prompt`). The wording is ours; the tags come from the `TagSet`.

Template files are plain text with placeholders `{question}` (required), `{instruction}`,
`{examples}` (the worked examples), and the tag names of `TagSet` (`{query_open}`, `{think_open}`,
...); `{{ question }}` works too. A line `---user---` makes it a chat template: the text above is
the system message, the text below the user turn; the model's chat template is applied and the
think tag appended. Other braces are left alone.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

from searchrl.chat_render import ChatTemplateError, render, template_name
from searchrl.data.types import Passage
from searchrl.errors import SearchRLError
from searchrl.protocols.tags import TagSet, format_documents
from searchrl.registry import Registry

INSTRUCTION = (
    "Answer the user's question by reasoning step by step. You can look facts up in a Wikipedia "
    "search engine as often as you need. Reason between {think_open} and {think_close}. To search, "
    "write a short query between {query_open} and {query_close}, for example "
    "{query_open}founding year of Harbel Observatory{query_close}, and stop there: the search "
    "results will then appear between {docs_open} and {docs_close}. Never write {docs_open} "
    "yourself. Search again whenever a fact is still missing. When you know the answer, close your "
    "reasoning with {think_close} and write only the final answer, in a few words, between "
    "{answer_open} and {answer_close}."
)


def instruction_text(tags: TagSet) -> str:
    """The instruction paragraph with this preset's tags filled in."""
    return INSTRUCTION.format(**tags.as_dict())


# Tool-call prompt templates -> worked example conversations they show (searchrl.protocols.chat_tools).
TOOL_TEMPLATES = {"tools": 0, "tools-oneshot": 1, "tools-fewshot": 2}

# Worked examples for tiny models. Every entity is invented so the examples teach the protocol,
# not facts, and cannot leak a benchmark answer. Steps: ("think", text) | ("query", q, passages)
# | ("answer", reasoning_tail, answer).
EXAMPLES: list[tuple[str, list[tuple]]] = [
    (
        "Which river flows through the birthplace of the painter Ilsa Marrowind?",
        [
            ("think", " First I need to know where Ilsa Marrowind was born.\n\n"),
            (
                "query",
                "Ilsa Marrowind birthplace",
                [
                    Passage(
                        "ex-1",
                        "Ilsa Marrowind",
                        "Ilsa Marrowind (1871-1939) was a landscape painter born in "
                        "the market town of Quellbridge. She is known for her studies of coastal fog.",
                    ),
                    Passage(
                        "ex-2",
                        "Marrowind Gallery",
                        "The Marrowind Gallery is a small museum of "
                        "nineteenth-century landscape art, named after its founder's family.",
                    ),
                ],
            ),
            ("think", "She was born in Quellbridge. Now I need the river of Quellbridge.\n\n"),
            (
                "query",
                "Quellbridge river",
                [
                    Passage(
                        "ex-3",
                        "Quellbridge",
                        "Quellbridge is a market town on the river Tessaly, known "
                        "for a stone bridge built in 1602.",
                    ),
                ],
            ),
            ("answer", "The river Tessaly flows through Quellbridge, her birthplace.", "Tessaly"),
        ],
    ),
    (
        "Who founded the company that makes the Vantrel X2 camera?",
        [
            ("think", " I need the maker of the Vantrel X2 and then who founded it.\n\n"),
            (
                "query",
                "Vantrel X2 camera maker",
                [
                    Passage(
                        "ex-4",
                        "Vantrel X2",
                        "The Vantrel X2 is a compact film camera released in 1994 by Orrin Optics.",
                    ),
                    Passage(
                        "ex-5",
                        "Orrin Optics",
                        "Orrin Optics is a camera maker founded in 1958 by Dagny "
                        "Halvorsen in the port city of Velmar.",
                    ),
                ],
            ),
            (
                "answer",
                "The Vantrel X2 is made by Orrin Optics, which Dagny Halvorsen founded.",
                "Dagny Halvorsen",
            ),
        ],
    ),
]


def example_response(steps: list[tuple], tags: TagSet, doc_style: str) -> str:
    """One worked example's response text, from after the prompt's think tag to `</answer>`."""
    out = []
    for step in steps:
        if step[0] == "think":
            out.append(step[1])
        elif step[0] == "query":
            out.append(f"{tags.query_open}{step[1]}{tags.query_close}")
            out.append(format_documents(step[2], tags, doc_style))
        else:
            out.append(
                f"{step[1]}{tags.think_close}\n\n{tags.answer_open}{step[2]}{tags.answer_close}"
            )
    return "".join(out)


def examples_text(tags: TagSet, doc_style: str, n: int | None = None) -> str:
    """The first `n` (default all) worked examples as completion-style turns, blank-line separated."""
    return "\n\n".join(
        f"User: {q}\nAssistant: {tags.think_open}{example_response(steps, tags, doc_style)}"
        for q, steps in EXAMPLES[:n]
    )


def apply_chat(tokenizer, messages: list[dict], template: str) -> str:
    """`messages` in the tokenizer's chat template, up to the assistant's turn; `template` names
    the prompt template in the error raised when the tokenizer has no chat template."""
    if tokenizer is None or not getattr(tokenizer, "chat_template", None):
        raise SearchRLError(
            f"prompt template {template!r} needs a tokenizer with a chat template; "
            "for a base (completion) model use template 'base' or 'fewshot'"
        )
    name = template_name(tokenizer)
    try:
        return render(tokenizer, messages, name=name, add_generation_prompt=True)
    except ChatTemplateError:  # templates without a system role raise (e.g. Gemma)
        if messages[0]["role"] != "system":
            raise
        first_user = dict(
            messages[1], content=messages[0]["content"] + "\n\n" + messages[1]["content"]
        )
        return render(tokenizer, [first_user, *messages[2:]], name=name, add_generation_prompt=True)


PromptBuilder = Callable[[str, TagSet, object, str], str]
PROMPT_TEMPLATES: Registry[PromptBuilder] = Registry("prompt template")


@PROMPT_TEMPLATES.register("base")
def base_prompt(question: str, tags: TagSet, tokenizer=None, doc_style: str = "r1searcher") -> str:
    return f"{instruction_text(tags)}\n\nUser: {question}\nAssistant: {tags.think_open}"


@PROMPT_TEMPLATES.register("chat")
def chat_prompt(question: str, tags: TagSet, tokenizer=None, doc_style: str = "r1searcher") -> str:
    messages = [
        {"role": "system", "content": instruction_text(tags)},
        {"role": "user", "content": question},
    ]
    return apply_chat(tokenizer, messages, "chat") + tags.think_open


def _examples_prompt(question: str, tags: TagSet, doc_style: str, n: int | None) -> str:
    return (
        f"{instruction_text(tags)}\n\n{examples_text(tags, doc_style, n)}\n\n"
        f"User: {question}\nAssistant: {tags.think_open}"
    )


@PROMPT_TEMPLATES.register("fewshot")
def fewshot_prompt(
    question: str, tags: TagSet, tokenizer=None, doc_style: str = "r1searcher"
) -> str:
    return _examples_prompt(question, tags, doc_style, None)


@PROMPT_TEMPLATES.register("oneshot")
def oneshot_prompt(
    question: str, tags: TagSet, tokenizer=None, doc_style: str = "r1searcher"
) -> str:
    # The two-search example alone: ~220 fewer prompt tokens than `fewshot`, which every rollout
    # and every update pass reads (a third of a CPU training step).
    return _examples_prompt(question, tags, doc_style, 1)


@PROMPT_TEMPLATES.register("fewshot-chat")
def fewshot_chat_prompt(
    question: str, tags: TagSet, tokenizer=None, doc_style: str = "r1searcher"
) -> str:
    messages = [{"role": "system", "content": instruction_text(tags)}]
    for q, steps in EXAMPLES:
        messages.append({"role": "user", "content": q})
        messages.append(
            {
                "role": "assistant",
                "content": tags.think_open + example_response(steps, tags, doc_style),
            }
        )
    messages.append({"role": "user", "content": question})
    return apply_chat(tokenizer, messages, "fewshot-chat") + tags.think_open


# ----------------------------------------------------------------------------------------------
# Template files

_PLACEHOLDER = re.compile(r"\{\{\s*([A-Za-z_]\w*)\s*\}\}|\{([A-Za-z_]\w*)\}")
CHAT_SPLIT = re.compile(r"^---user---[ \t]*$", re.MULTILINE)


def resolve_template(template: str) -> str | Path:
    """A built-in template name, or the Path of an existing template file; else a clear error."""
    if template in PROMPT_TEMPLATES:
        return template
    path = Path(template).expanduser()
    if path.is_file():
        text = path.read_text(encoding="utf-8")
        if not any(
            m.group(1) == "question" or m.group(2) == "question"
            for m in _PLACEHOLDER.finditer(text)
        ):
            raise SearchRLError(
                f"template file {path} has no {{question}} placeholder; add one where the question goes"
            )
        return path
    raise SearchRLError(
        f"unknown prompt template {template!r}: choose one of {', '.join(PROMPT_TEMPLATES.names())} "
        "or give the path of an existing template file"
    )


def _render(text: str, values: dict[str, str], path: Path) -> str:
    def sub(m: re.Match) -> str:
        name = m.group(1) or m.group(2)
        if name not in values:
            line = text.count("\n", 0, m.start()) + 1
            raise SearchRLError(
                f"{path}:{line}: unknown placeholder {{{name}}}; known: {', '.join(sorted(values))}"
            )
        return values[name]

    return _PLACEHOLDER.sub(sub, text)


def file_prompt(
    path: Path, question: str, tags: TagSet, tokenizer=None, doc_style: str = "r1searcher"
) -> str:
    values = {
        "question": question,
        "instruction": instruction_text(tags),
        "examples": examples_text(tags, doc_style),
    }
    values.update(tags.as_dict())
    text = path.read_text(encoding="utf-8")
    parts = CHAT_SPLIT.split(text, maxsplit=1)
    if len(parts) == 1:
        return _render(text, values, path)
    system, user = (_render(p.strip("\n"), values, path) for p in parts)
    messages = ([{"role": "system", "content": system}] if system.strip() else []) + [
        {"role": "user", "content": user}
    ]
    return apply_chat(tokenizer, messages, str(path)) + tags.think_open


def build_prompt(
    question: str,
    tags: TagSet,
    template: str = "base",
    tokenizer=None,
    *,
    doc_style: str = "r1searcher",
) -> str:
    """The prompt for one question. `template` is a built-in name or a template file path;
    `tokenizer` (a Hugging Face tokenizer) is needed by the chat templates only.

    >>> from searchrl.protocols.tags import SEARCH_R1_TAGS
    >>> build_prompt("Who built Quellbridge?", SEARCH_R1_TAGS).endswith("User: Who built Quellbridge?\\nAssistant: <think>")
    True
    """
    resolved = resolve_template(template)
    if isinstance(resolved, Path):
        return file_prompt(resolved, question, tags, tokenizer, doc_style)
    return PROMPT_TEMPLATES.get(resolved)(question, tags, tokenizer, doc_style)


# Completion templates frame the exchange as "User: ... / Assistant: ..."; a model that writes a
# new "User:" line has ended its turn and goes on to invent the next question.
_COMPLETION_TURN_END = "\nUser:"


def template_turn_end(template: str) -> str | None:
    """The text that ends the model's turn under a built-in completion template (`base`,
    `fewshot`, `oneshot`), else None (chat templates end turns with EOS; template files are the user's)."""
    return _COMPLETION_TURN_END if template in ("base", "fewshot", "oneshot") else None


def template_uses_chat(template: str) -> bool:
    """Whether prompts of this template are rendered through the tokenizer's chat template
    (`chat`, `fewshot-chat`, a file with a `---user---` line)."""
    resolved = resolve_template(template)
    if not isinstance(resolved, Path):
        return resolved in ("chat", "fewshot-chat")
    return bool(CHAT_SPLIT.search(resolved.read_text(encoding="utf-8")))


def template_opens_think(template: str, tags: TagSet) -> bool:
    """Whether prompts of this template end with the think tag. Built-ins and chat files always do."""
    resolved = resolve_template(template)
    if not isinstance(resolved, Path):
        return True
    text = resolved.read_text(encoding="utf-8")
    if CHAT_SPLIT.search(text):
        return True
    return file_prompt(resolved, "", tags).rstrip().endswith(tags.think_open)
