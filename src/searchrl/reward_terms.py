"""Reward terms: the named parts a stage's reward is a weighted sum of (docs/concepts/rewards.md).

A term is a pure function of one `RewardInput` (a trajectory, its question's gold answers, the
format verdict and the answer read from it) and its own keyword-only parameters, returning a
float. A stage names it in `reward.terms` with a weight and values for its parameters, checked
against the function's signature when the config loads. The name is one registered in
`REWARD_TERMS`, or the import path `package.module:function` of a user's own term, loaded as
tools are (`searchrl.registry.load_object`):

    # mypkg/rewards.py
    def length_penalty(x: RewardInput, *, per_word: float = 0.01) -> float:
        return -per_word * len((x.prediction or "").split())

named `stage2.reward.terms: {"mypkg.rewards:length_penalty": {weight: 1.0, per_word: 0.02}}`
(or registered first with `@REWARD_TERMS.register("length_penalty")` and named `length_penalty`).

Built in: `retrieve`, `format` and `answer` (the paper's R_retrieve, R_format, R_answer; every
stage has them, set by the stage preset's magnitudes in `RewardConfig`), `tool_cost` and
`duplicate_query` and `grounded` (off in the paper recipe: a stage adds them in `reward.terms`).
"""

from __future__ import annotations

import inspect
import typing
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import cache

from pydantic import ConfigDict, ValidationError, create_model

from searchrl.data.trajectory import Trajectory
from searchrl.metrics import ANSWER_METRICS, contains, normalize_answer
from searchrl.registry import Registry


@dataclass(frozen=True)
class FormatVerdict:
    """The format check's result (`Protocol.check_format`, `searchrl.protocols`): whether it passed, and the
    rules that failed."""

    ok: bool
    failed: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class RewardInput:
    """What a term scores: one rollout and what the format check read from it."""

    golds: Sequence[str]  # the question's gold answers (aliases)
    traj: Trajectory
    verdict: FormatVerdict
    prediction: str | None  # the answer (`traj.answer`, else the policy's last answer block)


RewardTerm = Callable[..., float]  # (RewardInput, *, **params) -> float
REWARD_TERMS: Registry[RewardTerm] = Registry("reward term", paths=True)


@REWARD_TERMS.register("retrieve")
def retrieve(x: RewardInput, *, hit: float = 1.0, miss: float = -1.0, requires_format: bool = False) -> float:
    """R_retrieve: `hit` when the rollout searched at least once (`traj.n_searches`: searches
    served, whichever protocol), else `miss`; with
    `requires_format` a search counts only when the format check passes too (the authors' code).

    >>> def rollout(n_searches, ok=True):
    ...     return RewardInput(["x"], Trajectory("q", "?", [], [], [], [], [], n_searches=n_searches), FormatVerdict(ok), None)
    >>> retrieve(rollout(2)), retrieve(rollout(0)), retrieve(rollout(1, ok=False))
    (1.0, -1.0, 1.0)
    >>> retrieve(rollout(1, ok=False), hit=0.5, miss=0.0, requires_format=True)
    0.0
    """
    searched = x.traj.n_searches >= 1 and (x.verdict.ok or not requires_format)
    return hit if searched else miss


@REWARD_TERMS.register("format")
def format_term(x: RewardInput, *, ok: float = 1.0, bad: float = -1.0) -> float:
    """R_format: `ok` when the format check passes, `bad` when it fails (the rules are in
    `searchrl.rewards`).

    >>> def rollout(ok):
    ...     return RewardInput(["x"], Trajectory("q", "?", [], [], [], [], []), FormatVerdict(ok), None)
    >>> format_term(rollout(True)), format_term(rollout(False)), format_term(rollout(False), ok=0.0, bad=-2.0)
    (1.0, -1.0, -2.0)
    """
    return ok if x.verdict.ok else bad


@REWARD_TERMS.register("answer")
def answer(x: RewardInput, *, metric: str = "f1", requires_format: bool = False) -> float:
    """R_answer: the answer metric (`f1`, `em`, `cem`, `cem_substr`: `ANSWER_METRICS`) of the
    prediction against the golds; with `requires_format`, 0 when the format check fails.

    >>> def rollout(prediction, ok=True):
    ...     return RewardInput(["Tessaly"], Trajectory("q", "?", [], [], [], [], []), FormatVerdict(ok), prediction)
    >>> answer(rollout("the Tessaly river"))  # F1: P=1/2, R=1
    0.6666666666666666
    >>> answer(rollout("the Tessaly river"), metric="cem"), answer(rollout("Velmar"), metric="em")
    (1.0, 0.0)
    >>> answer(rollout("Tessaly", ok=False)), answer(rollout("Tessaly", ok=False), requires_format=True)
    (1.0, 0.0)
    """
    return ANSWER_METRICS.get(metric)(x.prediction, x.golds) if (x.verdict.ok or not requires_format) else 0.0


@REWARD_TERMS.register("tool_cost")
def tool_cost(x: RewardInput, *, per_call: float = 0.1, per_tool: dict[str, float] | None = None) -> float:
    """Minus the cost of the rollout's tool calls (`traj.tool_calls`, served or not; malformed
    ones are the format's business): `per_tool[name]` per call of tool `name`, `per_call` for a
    tool not listed.

    >>> calls = [{"name": n, "arguments": {}, "ok": True, "error": None} for n in ("search", "search", "open", None)]
    >>> three = RewardInput(["x"], Trajectory("q", "?", [], [], [], [], [], tool_calls=calls), FormatVerdict(True), None)
    >>> tool_cost(three, per_call=0.25), tool_cost(three, per_call=0.25, per_tool={"search": 0.5, "open": 0.0})
    (-0.75, -1.0)
    """
    costs = per_tool or {}
    return -sum(costs.get(c["name"], per_call) for c in x.traj.tool_calls if c["name"] is not None)


def _same_query(query: str) -> str:
    # Casefold and collapse whitespace only: two queries a retriever may treat differently
    # (punctuation, articles) are never called repeats.
    return " ".join(query.casefold().split())


@REWARD_TERMS.register("duplicate_query")
def duplicate_query(x: RewardInput, *, penalty: float = 0.5) -> float:
    """Minus `penalty` per query that repeats an earlier one of the same rollout, compared
    casefolded with whitespace collapsed ("Tessaly  river" repeats "tessaly river").

    >>> queries = ["Tessaly river", "tessaly  River", "Quellbridge", "Tessaly river", "Tessaly river?"]
    >>> x = RewardInput(["x"], Trajectory("q", "?", [], [], [], [], [], queries=queries, n_searches=5), FormatVerdict(True), None)
    >>> duplicate_query(x), duplicate_query(x, penalty=0.25)
    (-1.0, -0.5)
    """
    return -penalty * (len(x.traj.queries) - len({_same_query(q) for q in x.traj.queries}))


@REWARD_TERMS.register("grounded")
def grounded(x: RewardInput, *, penalty: float = 0.5) -> float:
    """Minus `penalty` when the answer stands in no document the environment showed the rollout
    (word-bounded, normalised): a guess searched and answered whatever came back. Yes/no answers
    and no answer (the format's business) cost nothing. A deviation from the paper's outcome
    reward (it reads the trajectory), off unless a stage names it.

    >>> from searchrl.data.trajectory import Segment
    >>> def rollout(prediction, docs):
    ...     t = Trajectory("q", "?", [], [], [], [], [Segment(d, "env") for d in docs])
    ...     return RewardInput(["x"], t, FormatVerdict(True), prediction)
    >>> grounded(rollout("Tessbridge", ["(no results)"])), grounded(rollout("Heldix", ["born in Heldix."]))
    (-0.5, 0.0)
    >>> grounded(rollout("yes", [])), grounded(rollout(None, []))
    (0.0, 0.0)
    """
    said = normalize_answer(x.prediction or "")
    if not said or said in ("yes", "no"):
        return 0.0
    shown = "\n".join(s.text for s in x.traj.segments if s.source == "env")
    return 0.0 if contains(shown, said) else -penalty


def _check_signature(name: str, fn: object) -> None:
    """`fn` is a term: a function of one `RewardInput`, then keyword-only parameters. ValueError
    otherwise (pydantic reports it under the config key)."""
    shape = "a function (x: RewardInput, *, param=default, ...) -> float"
    if not callable(fn):
        raise ValueError(f"reward term {name!r} is a {type(fn).__name__}, not {shape}")  # noqa: TRY004
    try:
        hints = typing.get_type_hints(fn)
    except Exception as exc:  # noqa: BLE001  a user's annotations may name anything
        raise ValueError(f"reward term {name!r}: cannot resolve its annotations ({exc})") from None
    first, *rest = list(inspect.signature(fn).parameters.values()) or [None]
    takes_input = first is not None and first.kind in (first.POSITIONAL_ONLY, first.POSITIONAL_OR_KEYWORD)
    if (not takes_input or hints.get(first.name, RewardInput) is not RewardInput
            or any(p.kind is not p.KEYWORD_ONLY for p in rest)):
        raise ValueError(f"reward term {name!r} takes {inspect.signature(fn)}; it must be {shape}")


@cache
def _params_model(fn: RewardTerm):
    """A pydantic model of `fn`'s keyword-only parameters (their annotations and defaults)."""
    hints = typing.get_type_hints(fn)
    fields = {
        p.name: (hints.get(p.name, typing.Any), ... if p.default is p.empty else p.default)
        for p in inspect.signature(fn).parameters.values()
        if p.kind is p.KEYWORD_ONLY
    }
    return create_model(f"{fn.__name__}_params", __config__=ConfigDict(extra="forbid"), **fields)


def term_params(name: str, given: dict) -> dict:
    """`given` checked against term `name`'s keyword-only parameters and converted to their
    types; a wrong value, or a function that is no term, raises ValueError naming the term, the
    parameter and the fix (a name that is neither registered nor importable: `SearchRLError`).

    >>> term_params("duplicate_query", {"penalty": 1})
    {'penalty': 1.0}
    """
    fn = REWARD_TERMS.get(name)
    _check_signature(name, fn)
    model = _params_model(fn)
    if "weight" in model.model_fields:
        raise ValueError(f"reward term {name!r} has a parameter named weight, which the stage's weight of a term shadows; rename it")
    try:
        return model(**given).model_dump()
    except ValidationError as exc:
        known = ", ".join(model.model_fields) or "(none)"
        problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
        raise ValueError(f"reward term {name!r}: {problems} (its parameters: {known})") from None
