"""Fixtures of the unit tests that train (tests/unit/test_trainer.py, test_distributed.py)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from searchrl.data.types import Passage
from searchrl.retrieval.index import build_index
from searchrl.rl import step


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> Path:
    """A 12-passage BM25 index and 6 questions about it."""
    root = tmp_path_factory.mktemp("world")
    passages = [
        Passage(f"p{i}", f"Town {i}", f"Town {i} lies on the river R{i} and was founded in {1800 + i}.")
        for i in range(12)
    ]
    build_index(passages, root / "index", "bm25", progress=False)
    # A short prompt keeps every forward pass small (the built-in templates are ~200 tokens).
    (root / "prompt.txt").write_text("Q: {question}\nA: {think_open}")
    with (root / "q.jsonl").open("w") as fh:
        for i in range(6):
            fh.write(json.dumps({"id": f"q{i}", "question": f"Which river flows through Town {i}?", "answers": [f"R{i}"]}) + "\n")
    return root


def vary_rewards(monkeypatch: pytest.MonkeyPatch) -> None:
    """A random model never searches or answers, so every group's reward is flat and nothing
    would train; add a deterministic function of the sampled tokens to get a real signal."""
    real = step.compute_reward

    def reward(traj, golds, cfg, tags, **kw):
        r = real(traj, golds, cfg, tags, **kw)
        return dataclasses.replace(r, total=r.total + (sum(traj.token_ids) % 7) / 7)

    monkeypatch.setattr(step, "compute_reward", reward)


@pytest.fixture
def varied_rewards(monkeypatch):
    """`vary_rewards` for one test."""
    vary_rewards(monkeypatch)
