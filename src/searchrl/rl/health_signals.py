"""Per-rollout inputs of the health monitors, which `rl.step.record` turns into step metrics:
hedged answers (`echo_rate`), groups without signal (`flat_groups`) and repeating reasoning
(`think_repeat_rate`, `think_loop_rate`). Pure functions of text and numbers; the think text itself
is read by the format rules (`Protocol.think_text`), which own the reading of model text."""

from __future__ import annotations

import re
from collections.abc import Sequence

import numpy as np

from searchrl.metrics import normalize_answer

# "Which film came out first, Dusk Harbour or The Glass Road?" -> the two names
_CANDIDATES = re.compile(r",\s*(?P<a>[^,?]+?)\s+or\s+(?P<b>[^,?]+?)\s*\?\s*$", re.IGNORECASE)
# Joins two answers in one: "A or B", "A / B", "A, B"
_JOINER = re.compile(r"\bor\b|[/,;&]", re.IGNORECASE)


def echoes(prediction: str | None, question: str, answers: Sequence[str], qtype: str = "") -> bool | None:
    """Whether an answer to a comparison-like question hedges: it names two or more candidates
    of the question, or the gold joined to something else. None: not comparison-like.

    >>> echoes("Dusk Harbour or The Glass Road", "Which film came out first, Dusk Harbour or The Glass Road?", ["Dusk Harbour"])
    True
    >>> echoes("Dusk Harbour", "Which film came out first, Dusk Harbour or The Glass Road?", ["Dusk Harbour"])
    False
    >>> echoes("yes/no", "Are Ann Lee and Bo Kim citizens of the same country?", ["no"], "comparison")
    True
    >>> echoes("R1", "Which river flows through Town 1?", ["R1"]) is None
    True
    """
    match = _CANDIDATES.search(question)
    if match is None and "comparison" not in qtype:
        return None
    if not prediction:
        return False
    pred = f" {normalize_answer(prediction)} "
    candidates = [match["a"], match["b"]] if match else []
    if {normalize_answer(a) for a in answers} <= {"yes", "no"}:
        candidates += ["yes", "no"]
    named = sum(f" {normalize_answer(c)} " in pred for c in candidates)
    golds = [f" {normalize_answer(a)} " for a in answers]
    gold_plus = any(g in pred and g != pred for g in golds) and bool(_JOINER.search(prediction))
    return named >= 2 or gold_plus


def flat_share(rewards: Sequence[float], group_ids: Sequence[int]) -> float:
    """Share of groups whose rewards are all equal: their advantages are 0, they teach nothing.

    >>> flat_share([1.0, 1.0, 0.0, 1.0, 0.5, 0.5], [0, 0, 1, 1, 2, 2])
    0.6666666666666666
    """
    groups: dict[int, set[float]] = {}
    for r, g in zip(rewards, group_ids):
        groups.setdefault(g, set()).add(r)
    return sum(len(v) == 1 for v in groups.values()) / max(len(groups), 1)


# Word 4-grams for the repeat rate. Healthy reasoning repeats its entities' names ("Washington
# Dulles International Airport" six times in one rollout): the R1-Searcher authors' released
# Qwen-7B rollouts on HotpotQA and Bamboogle have a mean rate of 0.29, so the rate is a trend to
# watch, not a verdict. A loop is: one span of up to 32 words written three or more times back to
# back, which none of those 625 rollouts does (at most twice) and a policy stuck on "I need to
# search for X." does until its token budget runs out.
NGRAM = 4
LOOP_SPAN = 32
LOOP_TIMES = 3


def _words(text: str) -> list[str]:
    return re.findall(r"\w+", text.lower())


def repeated_ngram_share(text: str, n: int = NGRAM) -> float | None:
    """Share of the text's word n-grams that already occurred earlier in it (0: none repeats; a
    text saying one clause over and over tends to 1). None: fewer than n words.

    >>> repeated_ngram_share("I need to search. I need to search. I need to search.", n=3)  # 6 of 10
    0.6
    >>> repeated_ngram_share("The river R1 flows through Town 1.", n=3)
    0.0
    >>> repeated_ngram_share("too short", n=3) is None
    True
    """
    words = _words(text)
    grams = [tuple(words[i : i + n]) for i in range(len(words) - n + 1)]
    if not grams:
        return None
    return 1 - len(set(grams)) / len(grams)


def back_to_back(text: str, max_span: int = LOOP_SPAN) -> int:
    """The most copies of one span of 1 to `max_span` words written back to back in the text
    (1: no span repeats right after itself; 0: no words).

    >>> back_to_back("I search. I search. I search. Then I answer.")
    3
    >>> back_to_back("It is very very old."), back_to_back("R1 flows through Town 1 and Town 2.")
    (2, 1)
    """
    words = _words(text)
    if not words:
        return 0
    ids = np.unique(words, return_inverse=True)[1]
    best = 1
    for span in range(1, min(max_span, len(ids) - 1) + 1):
        # Runs of positions i with ids[i] == ids[i + span]: stretches of period `span`.
        same = np.concatenate(([0], ids[:-span] == ids[span:], [0])).astype(np.int8)
        edges = np.diff(same)
        runs = np.flatnonzero(edges == -1) - np.flatnonzero(edges == 1)
        if runs.size:
            best = max(best, (int(runs.max()) + span) // span)
    return best


def loops(text: str, times: int = LOOP_TIMES) -> bool | None:
    """Whether the text writes one span `times` times or more back to back. None: no words.

    >>> loops("Search again. " * 3), loops("Search again. " * 2), loops("")
    (True, False, None)
    """
    return back_to_back(text) >= times if _words(text) else None
