"""What `searchrl view` knows of the run behind a file: which file a run folder means, the page's
title, the prompt its model was given, and a training sample's standing in its group.

A run folder is an eval run's (its predictions.jsonl) or a training run's (its newest
samples/step_XXXX.jsonl). The prompt is rebuilt from the run's config.yaml for the tag protocols
(tool-call prompts need the model's chat template and tokenizer: not shown). The advantage shown
on a training sample is its reward minus its group's mean reward, the group baseline every
advantage estimator here starts from (Reinforce++ then normalises over the batch, GRPO by the
group's spread): its sign says whether the update pushed the sample up or down.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import yaml

from searchrl.errors import SearchRLError
from searchrl.tables import short_path


def resolve_input(path: Path) -> Path:
    """The trajectory file a path means: itself, a run folder's predictions.jsonl, or a training
    run's newest sample dump."""
    if not path.is_dir():
        return path
    if (path / "predictions.jsonl").is_file():
        return path / "predictions.jsonl"
    dumps = sorted((path / "samples").glob("step_*.jsonl"))
    if dumps:
        return dumps[-1]
    raise SearchRLError(f"{path}: no predictions.jsonl and no samples/step_*.jsonl; give a run folder of "
                        "`searchrl eval run` or `searchrl train`, or a trajectory file")


def run_config(predictions: Path) -> dict | None:
    """The config.yaml of the run that wrote `predictions` (an eval run's beside it, a training
    run's above its samples/); None when there is no readable one."""
    for config in (predictions.parent / "config.yaml", predictions.parent.parent / "config.yaml"):
        try:
            data = yaml.safe_load(config.read_text(encoding="utf-8")) if config.is_file() else None
        except (OSError, yaml.YAMLError):
            data = None
        if isinstance(data, dict):
            return data
    return None


def page_title(predictions: Path, metrics: dict | None) -> str:
    """`RUN · MODEL` for an eval run, `RUN · step_XXXX samples` for a training dump, else the file name."""
    if predictions.parent.name == "samples":
        return f"{predictions.parent.parent.name} · {predictions.stem} samples"
    model = (metrics or {}).get("model") or (run_config(predictions) or {}).get("model")
    if model is None:
        return predictions.name
    return f"{predictions.parent.name} · {short_path(str(model))}"


def prompt_builder(predictions: Path) -> Callable[[str], str] | None:
    """question -> the prompt the run gave its model, for tag-protocol runs with a readable config."""
    from searchrl.protocols.prompts import build_prompt
    from searchrl.protocols.tags import get_tags

    protocol = (run_config(predictions) or {}).get("protocol")
    if not isinstance(protocol, dict) or protocol.get("format", "tags") != "tags":
        return None
    try:
        tags = get_tags(protocol.get("tags") or "r1searcher")
        template, style = protocol.get("template") or "base", protocol.get("doc_style") or "r1searcher"
        build_prompt("?", tags, template, doc_style=style)  # a chat template needs a tokenizer: no prompt then
    except (SearchRLError, OSError, ValueError, TypeError, KeyError):
        return None
    return lambda question: build_prompt(question, tags, template, doc_style=style)


def group_advantages(groups: Sequence[int | None], rewards: Sequence[float | None]) -> list[float | None]:
    """Each sample's reward minus the mean reward of its group (None without both).

    >>> group_advantages([0, 0, 1, 1, None], [1.0, 0.0, 0.5, 0.5, 1.0])
    [0.5, -0.5, 0.0, 0.0, None]
    """
    members: dict[int, list[float]] = {}
    for g, r in zip(groups, rewards):
        if g is not None and r is not None:
            members.setdefault(g, []).append(r)
    return [r - sum(members[g]) / len(members[g]) if g is not None and r is not None else None
            for g, r in zip(groups, rewards)]
