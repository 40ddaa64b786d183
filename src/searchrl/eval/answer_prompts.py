"""Prompts of the `rag` and `direct` evaluation baselines, and how their answers are read (our
wording).

Every prompt shows `ANSWER_EXAMPLES` first: short worked examples of its own (with their passages
for rag, without for direct), each answered between the answer tags, then the question with the
opening answer tag already written, so the response up to the closing tag IS the answer. The
examples are what make a small model answer at all: SmolLM2-135M given only the instruction wrote
"The answer is: …" or ended its turn at once ("User:"), and closed the tag 0 of 20 times on the
toy world; with these examples it closes it 94 of 100 times (docs/results.md, "Baselines: rag and direct"). They hold
invented entities only, so they teach the format, never a benchmark answer, and they are the same
whatever prompt template the agent uses: rag/direct never see the search protocol.

The agent's template picks the form only: chat (the tokenizer's chat template; the turn ends with
EOS) or completion (`User:` / `Assistant:` turns; a new `User:` line ends the model's turn, a stop
string here as in the agent's completion templates).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from searchrl.data.types import Passage
from searchrl.protocols.prompts import CHAT_SPLIT, apply_chat, resolve_template, template_turn_end
from searchrl.protocols.tagged import TagProtocol
from searchrl.protocols.tags import TagSet

INSTRUCTION = (
    "Answer the question{source}. Give only the final answer, in a few words, between "
    "{answer_open} and {answer_close}."
)

# (question, passages, answer). A bridge question whose passage also names a city the person
# moved to (the toy world's biographies do), a comparison, and a yes/no question (HotpotQA, 2Wiki
# and the toy world ask them): without that one, the untrained SmolLM2 given passages answered
# "No, the directors ... are citizens of the same country" (3 of 11 right on the toy world).
CAMERAS = [
    Passage(
        "ex-a3",
        "Vantrel X2",
        "The Vantrel X2 is a compact film camera released in 1994 by Orrin Optics.",
    ),
    Passage(
        "ex-a4",
        "Harbel 35",
        "The Harbel 35 is a rangefinder camera released in 1961 by Velmar Works.",
    ),
]
ANSWER_EXAMPLES: list[tuple[str, list[Passage], str]] = [
    (
        "In which city was the founder of Orrin Optics born?",
        [
            Passage(
                "ex-a1",
                "Orrin Optics",
                "Orrin Optics is a camera maker founded in 1958 by Dagny Halvorsen.",
            ),
            Passage(
                "ex-a2",
                "Dagny Halvorsen",
                "Dagny Halvorsen (1921-1990) was an engineer born in the port city of Velmar. "
                "In 1950 she moved to Quellbridge.",
            ),
        ],
        "Velmar",
    ),
    (
        "Which camera came out first, the Vantrel X2 or the Harbel 35?",
        CAMERAS,
        "Harbel 35",
    ),
    (
        "Were the Vantrel X2 and the Harbel 35 made by the same company?",
        CAMERAS,
        "no",
    ),
]


def documents_text(passages: Sequence[Passage]) -> str:
    """`(1) Title: T` then the text, one passage after another."""
    lines = [f"({i}) Title: {p.title}\n{p.text}" for i, p in enumerate(passages, start=1)]
    return "\n".join(lines) or "(no documents found)"


def user_turn(question: str, passages: Sequence[Passage] | None) -> str:
    if passages is None:
        return question
    return f"Documents:\n{documents_text(passages)}\n\nQuestion: {question}"


def is_chat_template(template: str) -> bool:
    """Whether the agent's template is a chat one: built-ins by name, files by a `---user---` line."""
    resolved = resolve_template(template)
    if isinstance(resolved, Path):
        return CHAT_SPLIT.search(resolved.read_text(encoding="utf-8")) is not None
    return "chat" in resolved


def answer_prompt(
    question: str,
    passages: Sequence[Passage] | None,
    tags: TagSet,
    template: str = "base",
    tokenizer=None,
) -> str:
    """The rag (`passages` given) or direct (None) prompt: instruction, worked examples, question;
    it ends with the opening answer tag. `template` (the agent's) picks chat or completion form.

    >>> from searchrl.protocols.tags import SEARCH_R1_TAGS
    >>> print(answer_prompt("Who built Quellbridge?", None, SEARCH_R1_TAGS, "base"))
    Answer the question. Give only the final answer, in a few words, between <answer> and </answer>.
    <BLANKLINE>
    User: In which city was the founder of Orrin Optics born?
    Assistant: <answer>Velmar</answer>
    <BLANKLINE>
    User: Which camera came out first, the Vantrel X2 or the Harbel 35?
    Assistant: <answer>Harbel 35</answer>
    <BLANKLINE>
    User: Were the Vantrel X2 and the Harbel 35 made by the same company?
    Assistant: <answer>no</answer>
    <BLANKLINE>
    User: Who built Quellbridge?
    Assistant: <answer>
    """
    rag = passages is not None
    instruction = INSTRUCTION.format(source=" using the documents" if rag else "", **tags.as_dict())
    shown = [
        (user_turn(q, ps if rag else None), f"{tags.answer_open}{a}{tags.answer_close}")
        for q, ps, a in ANSWER_EXAMPLES
    ]
    if is_chat_template(template):
        messages = [{"role": "system", "content": instruction}]
        for user, reply in shown:
            messages += [{"role": "user", "content": user}, {"role": "assistant", "content": reply}]
        messages.append({"role": "user", "content": user_turn(question, passages)})
        return apply_chat(tokenizer, messages, template) + tags.answer_open
    turns = [f"User: {user}\nAssistant: {reply}" for user, reply in shown]
    turns.append(f"User: {user_turn(question, passages)}\nAssistant: {tags.answer_open}")
    return instruction + "\n\n" + "\n\n".join(turns)


def answer_protocol(protocol: TagProtocol) -> TagProtocol:
    """What rag/direct generation runs under: the run's tags, and the stop strings of the answer
    prompt's form — for a completion prompt the closing answer tag and the `User:` turn end, even
    when the agent's template is a file (whose own turns are the user's business)."""
    return TagProtocol(
        protocol.tags, "chat" if is_chat_template(protocol.template) else "base", protocol.doc_style
    )


def closed_response(response: str, stop_reason: str, tags: TagSet) -> str:
    """The response as the format check reads it. A model that wrote one line and then ended its
    turn (`User:`, EOS) closed its answer as surely as with the tag, so that line gets the closing
    tag; everything else is left as written and fails the check unless the tag is there: an empty
    turn, a second line (a made-up explanation), a line the budget cut.

    >>> from searchrl.protocols.tags import SEARCH_R1_TAGS as T
    >>> closed_response("Velmar\\n\\nUser:", "turn_end", T), closed_response("Velmar", "eos", T)
    ('Velmar</answer>', 'Velmar</answer>')
    >>> closed_response("Velmar\\nborn 1921\\n\\nUser:", "turn_end", T), closed_response("Velmar", "length", T)
    ('Velmar\\nborn 1921\\n\\nUser:', 'Velmar')
    """
    if tags.answer_close in response or stop_reason not in ("turn_end", "eos"):
        return response
    line = response.split(template_turn_end("base"), 1)[0].strip()
    return line + tags.answer_close if line and "\n" not in line else response
