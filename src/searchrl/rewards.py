"""Rewards (docs/concepts/rewards.md): the format check, and the Stage-1 / Stage-2 rewards built from it.

Everything here is a pure function of one `Trajectory` (plus gold answers and a config).
The format check reads `Trajectory.segments`, so "the model never writes a documents block" is
decided by provenance: a documents tag in a `policy` segment is forged, in an `env` segment it
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

import functools
import operator
import re
import unicodedata
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field

from pydantic import ConfigDict, Field, field_validator, model_validator

from searchrl.config import StrictModel
from searchrl.data.trajectory import Segment, Trajectory
from searchrl.metrics import ANSWER_METRICS
from searchrl.protocol import Protocol
from searchrl.registry import Registry
from searchrl.reward_terms import REWARD_TERMS, FormatVerdict, RewardInput, term_params
from searchrl.tags import TagSet, extract_answer
from searchrl.toolformat.protocol import NativeProtocol
from searchrl.tools.batch import INVALID

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

    >>> from searchrl.tags import R1SEARCHER_TAGS
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


def check_format(
    traj: Trajectory,
    protocol: Protocol | NativeProtocol | TagSet,
    *,
    think_opened_in_prompt: bool | None = None,
    max_answer_words: int | None = None,
    require_think: bool = True,
) -> FormatVerdict:
    """The format check of a trajectory under its protocol (a `TagSet`: the tag protocol of those
    tags); the question decides whether CJK text is foreign. `think_opened_in_prompt`: None for
    the protocol's (a bare `TagSet`: opened)."""
    protocol = _protocol(protocol)
    if isinstance(protocol, NativeProtocol):
        return check_turns(traj, protocol, max_answer_words=max_answer_words)
    if think_opened_in_prompt is None:
        think_opened_in_prompt = protocol.think_opened_in_prompt
    return check_segments(
        traj.segments,
        protocol.tags,
        question=traj.question,
        think_opened_in_prompt=think_opened_in_prompt,
        max_answer_words=max_answer_words,
        require_think=require_think,
    )


def _protocol(protocol: Protocol | NativeProtocol | TagSet) -> Protocol | NativeProtocol:
    """A bare `TagSet` as the tag protocol of those tags (its prompts open the think block)."""
    return Protocol(protocol) if isinstance(protocol, TagSet) else protocol


def check_turns(traj: Trajectory, protocol: NativeProtocol, *, max_answer_words: int | None = None) -> FormatVerdict:
    """The format check of a tool-call rollout (the module docstring's rules)."""
    policy_text = "".join(s.text for s in traj.segments if s.source == "policy")
    answer = traj.answer if traj.answer is not None else protocol.answer(traj.segments)
    failed = []
    if traj.stop_reason != "answer" or not answer:
        failed.append("answer")
    if is_garbled(policy_text):
        failed.append("garbled")
    if has_cjk(policy_text) and not has_cjk(traj.question):
        failed.append("script")
    if any(marker in policy_text for marker in protocol.observation_markers):
        failed.append("forged_documents")
    if answer and max_answer_words is not None and len(answer.split()) > max_answer_words:
        failed.append("answer_length")
    if any(c["error"] in INVALID for c in traj.tool_calls):
        failed.append("calls")
    return FormatVerdict(ok=not failed, failed=failed)


# ----------------------------------------------------------------------------------------------
# Stage rewards: weighted sums of named terms (searchrl.reward_terms)


# The paper's magnitudes per stage (docs/concepts/rewards.md): a stage is a preset of the same fields, so any
# stage can be given any reward (the authors' code keeps the answer reward in Stage 1, say).
REWARD_STAGES: Registry[dict[str, float]] = Registry("reward stage")
REWARD_STAGES.register("stage1")({"retrieve_weight": 1.0, "format_ok": 1.0, "format_bad": -1.0, "answer_weight": 0.0})
REWARD_STAGES.register("stage2")({"retrieve_weight": 0.0, "format_ok": 0.0, "format_bad": -2.0, "answer_weight": 1.0})


class TermConfig(StrictModel):
    """A term a stage adds to its reward: its weight, then values for the term's own parameters,
    named as in its function's signature (`searchrl.reward_terms`) and checked against it when
    the config loads, so the extra keys a strict model refuses are allowed here."""

    model_config = ConfigDict(extra="allow", validate_assignment=True)

    weight: float = 1.0
    """Multiplies the term's value in the reward (costs and penalties are negative values)."""

    @property
    def params(self) -> dict:
        return dict(self.model_extra or {})


BUILT_IN_TERMS = {"retrieve": "retrieve_*", "format": "format_ok / format_bad", "answer": "answer_*"}


class RewardConfig(StrictModel):
    """Reward = retrieve_weight · R_retrieve + R_format + answer_weight · R_answer + Σ weight · term
    over `terms`. `stage` names the preset that fills every magnitude not set (defaults: the
    paper's table, docs/concepts/rewards.md); the authors' code differs in places (e.g. Stage 1 adds +0.5 for
    retrieval only when the format is right), so each is here."""

    stage: str = "stage2"
    """Preset: `stage1` (R_retrieve + R_format: learn to call search) or `stage2` (R_answer +
    R_format: learn to use the results). `1` and `2` are accepted too. Single-stage runs (the
    skip-Stage-1 ablation) use stage2, hence the default."""
    retrieve_weight: float
    """Weight of R_retrieve (stage1: 1, stage2: 0). Kept in Stage 2 it stops a model that can guess
    some answers without searching (a 135M one picking between the two names of a comparison)
    from unlearning search: search fell from 1.0 to 0.0 within 20 steps of our long CPU run at 0."""
    retrieve_hit: float = 1.0
    """R_retrieve when the rollout searched at least once (paper: +1; authors' code: +0.5)."""
    retrieve_miss: float = -1.0
    """R_retrieve when it never searched (paper: -1; authors' code: 0)."""
    retrieve_requires_format: bool = False
    """Pay retrieve_hit only when the format check passes too (the authors' code does)."""
    format_ok: float
    """R_format for a correct format (stage1: +1; stage2: 0, so the answer is the main signal)."""
    format_bad: float
    """R_format for a violation (stage1: -1; stage2: -2, a strong penalty against format collapse)."""
    answer_weight: float
    """Weight of R_answer (stage1: 0; stage2: 1; the authors' code keeps 1 in Stage 1 too)."""
    answer_metric: str = "f1"
    """R_answer metric: `f1` (paper default; avg CEM 60.6 in its Table 5), `cem` (59.5; invites
    long answers), `em` (39.7; sparse signal), or `cem_substr` (substring cover)."""
    answer_requires_format: bool = False
    """Zero R_answer when the format check fails (stops a malformed rollout from earning credit)."""
    max_answer_words: int | None = Field(default=None, ge=1)
    """Format rule `answer_length`: answers longer than this many words fail (authors' code: 10;
    paper: no cap). None = no cap."""
    require_think: bool = True
    """Format rule `think`: the reasoning sits in one think block closed right before the answer
    (paper). False drops that rule, for models too small to close `</think>` (the CPU demo)."""
    terms: dict[str, TermConfig] = Field(default_factory=dict)
    """Terms added to the three above, by name (`REWARD_TERMS`: `tool_cost`, `duplicate_query`, one
    a user registered, or a user's own by import path `package.module:function`), each with a
    weight and its parameters:
    `{duplicate_query: {weight: 1.0, penalty: 0.5}, tool_cost: {per_call: 0.05}}` (a term with
    no keys: weight 1, its defaults). Logged as `reward/<name>` like the built-in three. None in
    the paper recipe."""

    @model_validator(mode="before")
    @classmethod
    def _preset(cls, data):
        if not isinstance(data, dict):
            return data
        stage = data.get("stage", "stage2")
        name = f"stage{stage}" if isinstance(stage, int) or str(stage).isdigit() else str(stage)
        return {**REWARD_STAGES.get(name), **data, "stage": name}

    @field_validator("answer_metric")
    @classmethod
    def _metric_name(cls, v: str) -> str:
        ANSWER_METRICS.get(v)
        return v

    @field_validator("terms", mode="before")
    @classmethod
    def _empty_term_is_defaults(cls, v):
        # `terms: {duplicate_query: }` in YAML is a term with no keys
        return {name: {} if t is None else t for name, t in v.items()} if isinstance(v, dict) else v

    @field_validator("terms")
    @classmethod
    def _known_terms(cls, v: dict[str, TermConfig]) -> dict[str, TermConfig]:
        for name in v:
            if name in BUILT_IN_TERMS:
                raise ValueError(f"{name!r} is a term of every stage: set its magnitudes with {BUILT_IN_TERMS[name]} instead")
        return {name: TermConfig(weight=t.weight, **term_params(name, t.params)) for name, t in v.items()}

    def stage_terms(self) -> list[tuple[str, float, dict]]:
        """The stage's reward as (term, weight, parameters), summed in this order: R_retrieve,
        R_format and R_answer from the magnitudes above (the paper's formula), then `terms`."""
        return [
            ("retrieve", self.retrieve_weight,
             {"hit": self.retrieve_hit, "miss": self.retrieve_miss, "requires_format": self.retrieve_requires_format}),
            ("format", 1.0, {"ok": self.format_ok, "bad": self.format_bad}),
            ("answer", self.answer_weight, {"metric": self.answer_metric, "requires_format": self.answer_requires_format}),
            *((name, t.weight, t.params) for name, t in self.terms.items()),
        ]


@dataclass(frozen=True)
class RewardBreakdown:
    """One trajectory's reward and its parts (all logged; `total` is what the trainer uses)."""

    total: float
    retrieve: float
    format: float
    answer: float
    format_ok: bool
    failed_rules: list[str]
    answer_score: float  # the raw answer metric, reported in both stages
    terms: dict[str, float] = field(default_factory=dict)  # weight · value per term (the three above too)

    def to_dict(self) -> dict:
        return asdict(self)


def compute_reward(
    traj: Trajectory,
    golds: Sequence[str],
    cfg: RewardConfig,
    protocol: Protocol | NativeProtocol | TagSet,
    *,
    think_opened_in_prompt: bool | None = None,
) -> RewardBreakdown:
    """The reward of one trajectory under `cfg`: the sum of its stage's weighted terms.
    `protocol`: the run's (a `TagSet`: the tag protocol of those tags).

    The answer is `traj.answer` as the engine recorded it, else the protocol's reading of the
    policy's text (`Protocol.answer`).

    >>> from searchrl.tags import R1SEARCHER_TAGS
    >>> t = Trajectory("q1", "Which river?", [], [], [], [],
    ...     [Segment("<|begin_of_query|>river<|end_of_query|>", "policy"),
    ...      Segment("\\n\\n<|begin_of_documents|>\\n(1)Title: T Text: x\\n<|end_of_documents|>\\n\\n", "env"),
    ...      Segment("</think><answer>the Tessaly river</answer>", "policy")], n_searches=1,
    ...     tool_calls=[{"name": "search", "arguments": {"query": "river"}, "ok": True, "error": None}])
    >>> compute_reward(t, ["Tessaly"], RewardConfig(stage=2), R1SEARCHER_TAGS).total  # F1: P=1/2, R=1
    0.6666666666666666
    >>> compute_reward(t, ["Tessaly"], RewardConfig(stage=1), R1SEARCHER_TAGS).terms
    {'retrieve': 1.0, 'format': 1.0, 'answer': 0.0}
    >>> cfg = RewardConfig(stage=1, terms={"tool_cost": {"weight": 2, "per_call": 0.25}})
    >>> r = compute_reward(t, ["Tessaly"], cfg, R1SEARCHER_TAGS)
    >>> r.total, r.terms["tool_cost"]
    (1.5, -0.5)
    """
    protocol = _protocol(protocol)
    verdict = check_format(
        traj,
        protocol,
        think_opened_in_prompt=think_opened_in_prompt,
        max_answer_words=cfg.max_answer_words,
        require_think=cfg.require_think,
    )
    prediction = traj.answer if traj.answer is not None else protocol.answer(traj.segments)
    x = RewardInput(golds, traj, verdict, prediction)
    parts = {name: weight * float(REWARD_TERMS.get(name)(x, **params)) for name, weight, params in cfg.stage_terms()}
    return RewardBreakdown(
        # left to right from the first term, as `retrieve + format + answer` was: the same floats
        total=functools.reduce(operator.add, parts.values()),
        retrieve=parts["retrieve"],
        format=parts["format"],
        answer=parts["answer"],
        format_ok=verdict.ok,
        failed_rules=list(verdict.failed),
        answer_score=ANSWER_METRICS.get(cfg.answer_metric)(prediction, golds),
        terms=parts,
    )
