"""Checks before the model loads: every planned stage's data, the prompt template, the
retriever and whether rollouts fit the model's context (`rollout.bounds`), so a misspelt key or
an impossible budget fails in seconds with its name, not after Stage 1 has trained."""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import torch

from searchrl.data.types import Question
from searchrl.errors import DataWarning, SearchRLError
from searchrl.protocols.base import Protocol
from searchrl.rl.config import TrainConfig
from searchrl.rollout.agent import build_protocol
from searchrl.rollout.bounds import TokenizerCodec, check_rollout_fits, model_context
from searchrl.rollout.run_search import RunSearch


@dataclass(frozen=True)
class Prepared:
    """What the checks loaded, which the run then uses."""

    questions: dict[int, list]  # stage -> its training items: questions (kind rl), their gold paths (kind sft)
    search: RunSearch  # the run's retriever, which the rollout worker searches with
    protocol: Protocol


def stage_questions(stage_cfg, key: str) -> list[Question]:
    """The stage's training questions: its dataset, narrowed to `question_types` when set.
    `key` (stage1, stage2) names the config section in errors."""
    from searchrl.data.catalog import load_dataset

    try:
        questions = load_dataset(stage_cfg.dataset)
    except SearchRLError as exc:
        raise SearchRLError(f"{key}.dataset: {exc}") from None
    if not questions:
        raise SearchRLError(f"{key}.dataset: {stage_cfg.dataset} holds no questions")
    if stage_cfg.question_types is None:
        return questions
    wanted = set(stage_cfg.question_types)
    kept = [q for q in questions if q.type in wanted]
    if not kept:
        found = sorted({q.type for q in questions if q.type})
        raise SearchRLError(
            f"{key}.question_types: no question of {stage_cfg.dataset} has a type in {sorted(wanted)}; its types are {found}"
        )
    return kept


def preflight(cfg: TrainConfig, stages: list[int], model: str) -> Prepared:
    """Load the data of `stages`, render a prompt of each with `model`'s tokenizer (the model or
    checkpoint the run loads next) and open (and query once) the retriever; an SFT stage's
    questions become their gold search paths (those that have one)."""
    from searchrl.assets import load_tokenizer

    warn_slow_dtype(cfg)
    questions = {s: stage_questions(cfg.stage(s), f"stage{s}") for s in stages}
    tokenizer = load_tokenizer(model)
    protocol = build_protocol(cfg, tokenizer)  # tool calls: the chat template's self-test runs here
    for s in stages:
        try:
            protocol.prompt_ids(questions[s][0].question, TokenizerCodec(tokenizer))
        except SearchRLError as exc:
            raise SearchRLError(f"protocol.template={cfg.protocol.template} (stage {s}): {exc}") from None
    search = RunSearch.open(cfg.retrieval, cfg.out)  # web search: the run's budget
    context = model_context(model, tokenizer, cfg.rollout)
    planned = [q for s in stages for q in questions[s]]
    check_rollout_fits(cfg.rollout, protocol, tokenizer, context, planned, search.retriever, cfg.retrieval.index)
    for s in stages:
        if cfg.stage(s).drop_shortcuts:
            questions[s] = search.drop_shortcuts(questions[s], f"stage{s}")
        if cfg.stage(s).kind == "sft":
            questions[s] = search.gold_examples(questions[s], cfg.rollout, f"stage{s}", cfg.stage(s).evidence)
        check_step_fits(cfg.stage(s), len(questions[s]), f"stage{s}")
    return Prepared(questions, search, protocol)


def check_step_fits(stage_cfg, n: int, key: str) -> None:
    """Refuse a step that asks for more questions than the stage has (`n`, after `question_types`,
    `drop_shortcuts` and, for SFT, the questions with a gold path): the sampler would put some
    question twice in one step. An error, as every other setting that cannot hold for the data
    (`rollout.k` over the index's passages, `question_types` that match nothing) is."""
    if stage_cfg.prompts_per_step > n:
        what = "gold examples" if stage_cfg.kind == "sft" else "questions"
        raise SearchRLError(
            f"{key}.prompts_per_step={stage_cfg.prompts_per_step} is more than the {n} {what} of {key}.dataset "
            f"({stage_cfg.dataset}): a step would ask some of them twice; set {key}.prompts_per_step to {n} or less, "
            "or give a larger dataset"
        )


def warn_slow_dtype(cfg: TrainConfig) -> None:
    """bfloat16 on a CPU without bf16 instructions is emulated, several times slower than float32:
    say so before the run spends hours on it."""
    on_cpu = torch.device(cfg.device).type == "cpu"
    if on_cpu and cfg.dtype == "bfloat16" and not cpu_has_bf16():
        warnings.warn("dtype=bfloat16 on a CPU without bfloat16 instructions (AVX512-BF16 or AMX) runs emulated and "
                      "slower than float32; set dtype=float32 on this machine", DataWarning, stacklevel=2)


def cpu_has_bf16() -> bool:
    return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
