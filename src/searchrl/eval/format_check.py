"""`searchrl eval format-check FILE`: the share of trajectories that pass the format check (docs/concepts/rewards.md).

Reads JSONL records of three shapes: ours (`segments`: [{text, source}], provenance recorded by
the engine), the authors' released outputs (`gen_text_store`), or plain `response` text. For the
last two, provenance is rebuilt from the documents tags (every complete block counts as inserted
by the environment), which is right for released outputs whose engine inserted every block.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from searchrl.data.textio import iter_json_lines
from searchrl.data.trajectory import Segment
from searchrl.errors import DataError
from searchrl.protocols.format_rules import FORMAT_RULES, check_segments
from searchrl.protocols.tags import TagSet, get_tags, segments_from_text


def record_segments(rec: dict, tags: TagSet, where: str = "record") -> list[Segment]:
    """A record's response as segments with provenance."""
    if isinstance(rec.get("segments"), list):
        try:
            return [Segment(s["text"], s["source"]) for s in rec["segments"]]
        except (KeyError, TypeError):
            raise DataError(f"{where}: each of `segments` needs `text` and `source`") from None
    for key in ("gen_text_store", "response"):
        if isinstance(rec.get(key), str):
            return segments_from_text(rec[key], tags)
    raise DataError(f"{where}: no `segments`, `gen_text_store` or `response` field to check")


def format_pass_rate(records: Sequence[dict], tags: TagSet, **check_kwargs) -> dict:
    """{"n", "ok", "rate", "failures": {rule: count}} over `records` (see `record_segments`).

    `check_kwargs` go to `check_segments` (think_opened_in_prompt, max_answer_words).
    """
    failures = {rule: 0 for rule in FORMAT_RULES}
    ok = 0
    for i, rec in enumerate(records):
        segments = record_segments(rec, tags, where=f"record {i + 1}")
        verdict = check_segments(
            segments, tags, question=str(rec.get("question") or ""), **check_kwargs
        )
        ok += verdict.ok
        for rule in verdict.failed:
            failures[rule] += 1
    n = len(records)
    return {"n": n, "ok": ok, "rate": ok / n if n else 0.0, "failures": failures}


def read_jsonl(path: Path) -> list[dict]:
    if not path.exists():
        raise DataError(f"{path} does not exist")
    return [rec for _, rec in iter_json_lines(path)]


def format_check_command(
    path: Path, tags: str, max_answer_words: int | None, think_in_prompt: bool, as_json: bool
) -> dict:
    """Print (and return) the pass rate and the count of each failed rule."""
    result = format_pass_rate(
        read_jsonl(path),
        get_tags(tags),
        think_opened_in_prompt=think_in_prompt,
        max_answer_words=max_answer_words,
    )
    if as_json:
        print(json.dumps(result))
        return result
    print(
        f"{path}: {result['ok']}/{result['n']} pass the format check ({100 * result['rate']:.1f}%)"
    )
    for rule, count in result["failures"].items():
        print(f"  {rule:<18}{count}")
    return result
