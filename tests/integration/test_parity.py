"""Metric parity: our scorer on the authors' released predictions gives their published figures.

Figures (percent, 1 decimal) from shared/data/SOURCES.md; cover-EM there is the token-cover variant.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from searchrl.eval.score import score_file

pytestmark = pytest.mark.integration

PUBLISHED = {
    # file: (EM, cover-EM, F1, ACC_L)
    "hotpotqa_qwen.jsonl": (58.0, 65.4, 71.9, 75.0),
    "bamboogle_qwen.jsonl": (45.6, 52.8, 57.7, 54.4),
}


def as_percent(scores: dict) -> tuple[float, ...]:
    return tuple(round(100 * scores[k], 1) for k in ("em", "cover_em", "f1", "acc_l"))


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_score_file_matches_published(shared_data: Path, name: str) -> None:
    scores = score_file(shared_data / "r1-searcher-results" / name)
    assert scores["n"] == {"hotpotqa_qwen.jsonl": 500, "bamboogle_qwen.jsonl": 125}[name]
    assert as_percent(scores) == PUBLISHED[name]


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_cli_json_matches_published(shared_data: Path, name: str) -> None:
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            "from searchrl.cli import main; main()",
            "eval",
            "score",
            str(shared_data / "r1-searcher-results" / name),
            "--json",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    lines = proc.stdout.strip().splitlines()
    assert len(lines) == 1
    scores = json.loads(lines[0])
    assert set(scores) == {"n", "em", "f1", "cover_em", "cover_em_substring", "acc_l"}
    assert as_percent(scores) == PUBLISHED[name]
