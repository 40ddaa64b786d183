"""`Trajectory`: one rollout, as the rollout engine recorded it. Rewards and the trainer read only this."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Literal

Source = Literal["policy", "env"]

# Why a rollout stopped.
# answer: the answer tag closed (tags), or a turn without calls (tool calls: the final message);
# max_searches: every call of a turn was over its tool's budget, unserved (tags: the first such turn,
#   tool calls: the second; the first gets error results saying so);
# context_full: the model's context has no room left (to generate, or for an observation).
STOP_REASONS = ("answer", "eos", "turn_end", "length", "max_searches", "empty_query", "context_full")


# The token-level lists, left out of records written without tokens.
TOKEN_FIELDS = ("prompt_ids", "token_ids", "loss_mask", "logprobs", "token_versions")


@dataclass
class Segment:
    """A run of response text with one provenance: sampled by the policy or inserted by the env."""

    text: str
    source: Source


@dataclass
class Trajectory:
    """One search-interleaved rollout. Token lists share the response length T (prompt excluded)."""

    question_id: str
    question: str
    prompt_ids: list[int]  # [P] the prompt, as fed to the model
    token_ids: list[int]  # [T] response tokens exactly as sampled or inserted (never re-tokenized)
    loss_mask: list[int]  # [T] 1 = sampled by the policy, 0 = inserted by the environment
    logprobs: list[float]  # [T] sampling log-probs; 0.0 at environment tokens
    segments: list[Segment]  # response text in order, split by provenance
    queries: list[str] = field(default_factory=list)
    retrieved_ids: list[list[str]] = field(default_factory=list)  # per query, passage ids
    # per query, which env segment (counted among the env segments) shows its results; a turn's
    # searches share one under tool calls (rollout.engine); empty in records of older runs
    search_blocks: list[int] = field(default_factory=list)
    n_searches: int = 0
    answer: str | None = None
    stop_reason: str = "eos"
    truncated_documents: int = 0  # documents blocks cut to fit the model's context (rollout.engine)
    # Every call the policy made, in order: {"name", "arguments", "ok", "error"}; a malformed one
    # has name / arguments None and error "malformed" (rollout.engine). Their wall time is in
    # `timing` as "tools/<name>_s".
    tool_calls: list[dict] = field(default_factory=list)
    timing: dict[str, float] = field(default_factory=dict)
    # The policy version that sampled the rollout: the trainer's count of applied updates when the
    # rollout worker got its weights (`Actor.version`); the loss's staleness is the trainer's
    # version minus this. Files written before it existed load as 0.
    policy_version: int = 0
    # [T] the version that sampled each token, only when it changed within the rollout (a rollout
    # that goes on with new weights); empty = every token by `policy_version`.
    token_versions: list[int] = field(default_factory=list)

    @property
    def response_text(self) -> str:
        return "".join(s.text for s in self.segments)

    def calls_of(self, name: str) -> int:
        """How many calls of tool `name` the policy made (served or not)."""
        return sum(c["name"] == name for c in self.tool_calls)

    def versions(self) -> list[int]:
        """[T] the policy version that sampled each response token (`token_versions`, or
        `policy_version` for all when they were not recorded one by one)."""
        return list(self.token_versions) if self.token_versions else [self.policy_version] * len(self.token_ids)

    def to_dict(self, tokens: bool = True) -> dict:
        d = asdict(self)
        if not tokens:
            for key in TOKEN_FIELDS:
                d.pop(key)
        return d

    @classmethod
    def from_dict(cls, d: dict) -> Trajectory:
        d = dict(d)
        d["segments"] = [Segment(**s) for s in d.get("segments", [])]
        for key in TOKEN_FIELDS:
            d.setdefault(key, [])
        known = set(cls.__dataclass_fields__)
        return cls(**{k: v for k, v in d.items() if k in known})
