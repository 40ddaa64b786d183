"""The format rules of both protocols (docs/concepts/rewards.md): whether a rollout kept its
protocol's format. Each protocol's `check_format` applies them (tags: `check_segments`, tool
calls: `check_turns`); the format reward (`searchrl.rewards`) and `searchrl eval format-check`
read the verdict.

Everything here is a pure function of one `Trajectory`. The format check reads
`Trajectory.segments`, so "the model never writes a documents block" is decided by provenance: a documents tag in a `policy` segment is forged, in an `env` segment it
was inserted by the environment.

Format rules (names appear in `FormatVerdict.failed` and in the training metrics):

| rule | fails when |
|---|---|
| `think` | the think tags are not exactly one `</think>` (prompt already opened `<think>`) or one `<think>` at the start then one `</think>` |
| `answer` | not exactly one non-empty `<answer>…</answer>` right after `</think>` (only whitespace between), or text after `</answer>` |
| `garbled` | the policy wrote U+FFFD, a control character other than tab/newline/CR, a surrogate, a private-use or an unassigned code point |
| `script` | the policy wrote CJK text (outside the documents) and the question has none |
| `query` | a query tag is unclosed, nested, stray, empty, or holds another protocol tag |
| `forged_documents` | a policy segment holds a documents tag |
| `answer_tags` | the answer holds a protocol tag (query, documents, think, answer) |
| `answer_length` | the answer has more than `max_answer_words` words (the authors' code: 10) |

Tool-call rollouts (`protocol.format: tool-calls`) are checked by the rules that carry over
(`garbled`, `script`, `answer_length`) and three of their own, read from the trajectory's turns:

| rule | fails when |
|---|---|
| `answer` | the rollout did not end with a final message (a turn without calls) holding an answer |
| `calls` | a call was malformed (bad JSON, cut off), named no tool of the run, or had bad arguments |
| `forged_documents` | a policy turn holds the opening of a tool-result block (`<|im_start|>tool`, `<tool_response>`) |

`require_think=False` drops the `think` rule and the "right after `</think>`" clause: a
tiny model (SmolLM2-135M) almost never closes `</think>` before answering, and a format reward
no rollout can earn teaches nothing. Every other rule still holds.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Sequence
from typing import TYPE_CHECKING

from searchrl.data.trajectory import Segment, Trajectory
from searchrl.protocols.tags import TagSet, extract_answer, extract_reasoning
from searchrl.reward_terms import FormatVerdict
from searchrl.tools.batch import INVALID

if TYPE_CHECKING:
    from searchrl.protocols.base import Protocol

FORMAT_RULES = (
    "think",
    "answer",
    "garbled",
    "script",
    "query",
    "forged_documents",
    "answer_tags",
    "answer_length",
    "calls",
)
# The rules about the protocol's tags and calls (the others judge the text: garbled, script,
# answer_length): the share of rollouts failing one is the step's `malformed_tags`.
TAG_RULES = ("think", "answer", "query", "forged_documents", "answer_tags", "calls")

# Han (incl. extensions and compatibility), kana, Hangul, CJK symbols and full-width forms: the
# scripts a multilingual base model drifts into (the authors' code rejects CJK outside documents).
_CJK = re.compile(
    "[\u1100-\u11ff\u2e80-\u2fdf\u3000-\u303f\u3040-\u30ff\u3100-\u31ff\u3400-\u4dbf\u4e00-\u9fff"
    "\uac00-\ud7af\uf900-\ufaff\uff00-\uffef\U00020000-\U0003134f]"
)
_BAD_CATEGORIES = frozenset({"Cc", "Cs", "Co", "Cn"})


def _merge(segments: Sequence[Segment]) -> list[Segment]:
    # Adjacent segments of one source are one run of text: a tag may straddle the boundary.
    out: list[Segment] = []
    for s in segments:
        if out and out[-1].source == s.source:
            out[-1] = Segment(out[-1].text + s.text, s.source)
        elif s.text:
            out.append(Segment(s.text, s.source))
    return out


def policy_view(segments: Sequence[Segment], tags: TagSet) -> str:
    """The response as the policy shaped it: each environment block collapsed to an empty
    documents block, so its contents (which may hold anything) never count as policy text."""
    placeholder = tags.docs_open + tags.docs_close
    return "".join(s.text if s.source == "policy" else placeholder for s in _merge(segments))


def is_garbled(text: str) -> bool:
    """
    >>> is_garbled("plain text\\n\\twith tabs"), is_garbled("bad \\ufffd byte"), is_garbled("bell\\x07")
    (False, True, True)
    """
    return any(
        ch == "\ufffd" or (unicodedata.category(ch) in _BAD_CATEGORIES and ch not in "\n\t\r")
        for ch in text
    )


def has_cjk(text: str) -> bool:
    return _CJK.search(text) is not None


def _tag_pattern(tags: TagSet) -> re.Pattern:
    # Longest first so a tag that prefixes another can never shadow it.
    return re.compile(
        "|".join(re.escape(t) for t in sorted(set(tags.all_tags()), key=len, reverse=True))
    )


def _queries_ok(view: str, tags: TagSet) -> bool:
    in_query, start = False, 0
    for m in _tag_pattern(tags).finditer(view):
        tag = m.group(0)
        if tag == tags.query_open:
            if in_query:
                return False
            in_query, start = True, m.end()
        elif tag == tags.query_close:
            if not in_query or not view[start : m.start()].strip():
                return False
            in_query = False
        elif in_query:
            return False
    return not in_query


def _structure_failures(
    view: str, tags: TagSet, think_opened_in_prompt: bool, require_think: bool = True
) -> list[str]:
    failed = []
    found = [(m.group(0), m.start(), m.end()) for m in _tag_pattern(tags).finditer(view)]
    think = [t for t in found if t[0] in (tags.think_open, tags.think_close)]
    expected = [tags.think_close] if think_opened_in_prompt else [tags.think_open, tags.think_close]
    think_ok = [t[0] for t in think] == expected
    if think_ok and not think_opened_in_prompt and view[: think[0][1]].strip():
        think_ok = False
    if require_think and not think_ok:
        failed.append("think")
    opens = [t for t in found if t[0] == tags.answer_open]
    closes = [t for t in found if t[0] == tags.answer_close]
    answer_ok = len(opens) == 1 and len(closes) == 1 and opens[0][2] <= closes[0][1]
    if answer_ok:
        answer_ok = (
            bool(view[opens[0][2] : closes[0][1]].strip()) and not view[closes[0][2] :].strip()
        )
    if answer_ok and think_ok and require_think:  # the answer right after </think>
        answer_ok = think[-1][2] <= opens[0][1] and not view[think[-1][2] : opens[0][1]].strip()
    if not answer_ok:
        failed.append("answer")
    return failed


def check_segments(
    segments: Sequence[Segment],
    tags: TagSet,
    *,
    question: str = "",
    think_opened_in_prompt: bool = True,
    max_answer_words: int | None = None,
    require_think: bool = True,
) -> FormatVerdict:
    """The format check on response segments; see the module docstring for the rules.

    >>> from searchrl.protocols.tags import R1SEARCHER_TAGS
    >>> ok = [Segment(" Look it up. <|begin_of_query|>Quellbridge river<|end_of_query|>", "policy"),
    ...       Segment("\\n\\n<|begin_of_documents|>\\n(1)Title: Quellbridge Text: On the Tessaly.\\n<|end_of_documents|>\\n\\n", "env"),
    ...       Segment("It is the Tessaly.</think>\\n\\n<answer>Tessaly</answer>", "policy")]
    >>> check_segments(ok, R1SEARCHER_TAGS)
    FormatVerdict(ok=True, failed=[])
    >>> forged = [Segment("<|begin_of_documents|>made up<|end_of_documents|></think><answer>x</answer>", "policy")]
    >>> check_segments(forged, R1SEARCHER_TAGS).failed
    ['forged_documents']
    """
    merged = _merge(segments)
    view = policy_view(merged, tags)
    policy_text = "".join(s.text for s in merged if s.source == "policy")
    failed = _structure_failures(view, tags, think_opened_in_prompt, require_think)
    if is_garbled(policy_text):
        failed.append("garbled")
    if has_cjk(policy_text) and not has_cjk(question):
        failed.append("script")
    if not _queries_ok(view, tags):
        failed.append("query")
    if any(
        tags.docs_open in s.text or tags.docs_close in s.text
        for s in merged
        if s.source == "policy"
    ):
        failed.append("forged_documents")
    answer = extract_answer(view, tags)
    if answer is not None:
        if _tag_pattern(tags).search(answer):
            failed.append("answer_tags")
        if max_answer_words is not None and len(answer.split()) > max_answer_words:
            failed.append("answer_length")
    return FormatVerdict(ok=not failed, failed=failed)


def final_answer(traj: Trajectory, protocol: Protocol, *, cut_short: bool = False) -> str | None:
    """The answer of a rollout: the engine's when it stopped at one, else what `protocol` reads from
    its segments (`cut_short`: evaluation's reading, where an answer block the budget cut counts,
    its first line). The rewards, the format check and evaluation all read it here."""
    return traj.answer if traj.answer is not None else protocol.answer(traj.segments, cut_short=cut_short)


def check_turns(traj: Trajectory, answer: str | None, observation_markers: Sequence[str], *,
                max_answer_words: int | None = None) -> FormatVerdict:
    """The format check of a tool-call rollout (the module docstring's rules): `answer`, its
    answer; `observation_markers`, the text only the environment writes."""
    policy_text = "".join(s.text for s in traj.segments if s.source == "policy")
    failed = []
    if traj.stop_reason != "answer" or not answer:
        failed.append("answer")
    if is_garbled(policy_text):
        failed.append("garbled")
    if has_cjk(policy_text) and not has_cjk(traj.question):
        failed.append("script")
    if any(marker in policy_text for marker in observation_markers):
        failed.append("forged_documents")
    if answer and max_answer_words is not None and len(answer.split()) > max_answer_words:
        failed.append("answer_length")
    if any(c["error"] in INVALID for c in traj.tool_calls):
        failed.append("calls")
    return FormatVerdict(ok=not failed, failed=failed)


def policy_turns(segments: Sequence[Segment]) -> list[str]:
    """The policy's turns: its text between observations."""
    return [s.text for s in _merge(segments) if s.source == "policy"]


def tag_think_text(segments: Sequence[Segment], tags: TagSet, think_opened_in_prompt: bool) -> str:
    """The policy's reasoning in a tag rollout, tags and documents left out, for the repetition
    metrics (`rl.health_signals`): the think block (an unclosed one runs to the answer tag or the
    end), queries included.

    >>> from searchrl.protocols.tags import R1SEARCHER_TAGS
    >>> tag_think_text([Segment("Look. <|begin_of_query|>R1<|end_of_query|>", "policy"),
    ...     Segment("<|begin_of_documents|>(1) R1 flows.<|end_of_documents|>", "env"),
    ...     Segment("Found.</think><answer>R1</answer>", "policy")], R1SEARCHER_TAGS, True)
    'Look.  R1 Found.'
    """
    body = extract_reasoning(policy_view(segments, tags), tags,
                             think_opened_in_prompt=think_opened_in_prompt, drop_documents=True) or ""
    return _tag_pattern(tags).sub(" ", body)
