"""`searchrl export RUN_OR_CHECKPOINT --out DIR`: a trained policy as a standard Hugging Face model
folder that serves the way it was trained (docs/guides/export.md).

The folder holds safetensors weights (LoRA merged, or the adapter alone with `adapter=True`; float32
as trained, or `dtype`), the tokenizer with the chat template of the prompt the run was trained
with (a native tool-call run's, e.g. our hermes-fallback, so vLLM's server and transformers render
tools as training did; a tag run's trained prompt, `searchrl.export_chat`), a
`generation_config.json` with the run's sampling settings and end-of-turn tokens, `searchrl.json`
(protocol, tools, stop strings, sampling: what `ask`, `eval run` and the other commands read back
for `--model DIR`, see `searchrl.checkpoint_meta`) and a model card, `README.md`.

The stop strings are in `searchrl.json` and the card, not in `generation_config.json`: there
transformers refuses every `generate()` and `pipeline()` call made without the tokenizer.

The folder is written under a hidden temp name, its modes made those of the umask (safetensors
writes 0600), and renamed into place, so a folder named DIR is always complete and readable.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from searchrl.card import model_card
from searchrl.checkpoint_meta import (
    EXPORT_FILE,
    EXPORT_VERSION,
    PROMPT_FILE,
    read_checkpoint_agent,
    read_export,
)
from searchrl.data.types import Passage
from searchrl.errors import SearchRLError
from searchrl.export_chat import (
    TEMPLATE_BASE,
    TEMPLATE_NATIVE,
    TEMPLATE_TRAINED,
    trained_prompt_template,
)
from searchrl.paths import make_readable
from searchrl.protocols.prompts import resolve_template
from searchrl.rl import checkpoint as ckpt

EXAMPLE_QUESTION = "Which river flows through the capital?"  # the card's examples
EXAMPLE_PASSAGES = [Passage("p1", "Velmar", "Velmar is the capital; the river Tessaly flows through it.")]
# Our call formats -> the `--tool-call-parser` of vLLM's OpenAI-compatible server that reads them.
VLLM_TOOL_PARSERS = {"hermes": "hermes", "llama3-json": "llama3_json"}


def find_checkpoint(source: str | Path, trust_unverified: bool = False) -> Path:
    """The checkpoint to export, verified as a resume verifies it (`rl.rundir`: its checksums
    cover and match every file it holds, its state loads): `source` itself, or a run directory's
    newest intact one (newer, damaged ones are skipped with a warning, as a resume skips them, and
    a line says which is exported). A checkpoint that cannot be verified (no checksums) is refused
    unless `trust_unverified`."""
    from searchrl.rl import rundir

    path = Path(source)
    if path.is_file() and path.name == ckpt.LATEST and path.parent.name == "checkpoints":
        path = path.parent.parent
    if (path / ckpt.STATE_FILE).is_file():
        try:
            rundir.intact_state(path, trust_unverified, action="export")
        except rundir.UnverifiedCheckpoint:
            raise
        except SearchRLError as exc:
            raise SearchRLError(f"cannot export checkpoint {path}: it is damaged ({exc}); export the run folder to take "
                                "its newest intact checkpoint, or name an older one") from None
        return path
    if (path / "checkpoints").is_dir():
        if not ckpt.complete_checkpoints(path):
            raise SearchRLError(f"run {path} has no complete checkpoint under {path / 'checkpoints'}: nothing to export")
        newest = ckpt.latest_checkpoint(path)
        found = rundir.newest_intact_checkpoint(path, trust_unverified, action="export")
        if found is None:
            raise SearchRLError(f"run {path} has no intact checkpoint (see the warnings above): nothing to export")
        if found[0] != newest:
            print(f"exporting {found[0]}, the newest intact checkpoint of {path} (newer ones are damaged, see above)",
                  file=sys.stderr, flush=True)
        return found[0]
    raise SearchRLError(f"{path} is neither a training run (it has no checkpoints/) nor a checkpoint "
                        f"(it has no {ckpt.STATE_FILE}); give e.g. runs/demo/train or runs/demo/train/checkpoints/step_0013")


def run_dir_of(checkpoint: Path) -> Path:
    """The run a checkpoint belongs to: the nearest folder above it that holds a config.yaml."""
    for folder in Path(checkpoint).resolve().parents:
        if (folder / "config.yaml").is_file():
            return folder
    raise SearchRLError(f"no run config.yaml above checkpoint {checkpoint}: export needs the run directory it was "
                        "trained in (copy the whole RUN/ folder, not the checkpoint alone)")


def run_config(checkpoint: Path):
    """The resolved TrainConfig of the run that wrote `checkpoint` (sampling, stages), with the
    protocol and tools the checkpoint itself records (`read_checkpoint_agent`): a next stage may
    have changed them since the run's config was written."""
    from searchrl.config import load_config
    from searchrl.rl.config import TrainConfig

    cfg = load_config(TrainConfig, run_dir_of(checkpoint) / "config.yaml")
    agent = read_checkpoint_agent(checkpoint)
    return cfg.model_copy(update={"protocol": cfg.protocol.model_validate(agent["protocol"]), "tools": agent["tools"]}) if agent else cfg


DTYPES = ("float32", "bfloat16", "float16")


def _load_weights(checkpoint: Path, cfg, adapter: bool, dtype: str = "float32"):
    """(model to save, tokenizer): the checkpoint's full weights, its LoRA adapter merged into the
    run's base model, or (`adapter`) the PeftModel whose `save_pretrained` writes the adapter alone;
    loaded in float32 (a merge is exact there) and cast to `dtype`."""
    import torch

    from searchrl.assets import load_model

    if dtype not in DTYPES:
        raise SearchRLError(f"--dtype {dtype!r}: choose one of {', '.join(DTYPES)}")
    if not (checkpoint / "adapter_config.json").is_file():
        if adapter:
            raise SearchRLError(f"--adapter: checkpoint {checkpoint} holds full weights (the run trained without LoRA); "
                                "export it without --adapter")
        model, tokenizer = load_model(str(checkpoint), dtype="float32")
        return model.to(getattr(torch, dtype)), tokenizer
    from transformers import AutoTokenizer

    from searchrl.rl.policy import _require_peft

    base, _ = load_model(cfg.model, dtype="float32")
    model = _require_peft().PeftModel.from_pretrained(base, str(checkpoint))
    tokenizer = AutoTokenizer.from_pretrained(checkpoint)  # saved beside the adapter: the one training used
    return (model if adapter else model.merge_and_unload()).to(getattr(torch, dtype)), tokenizer


def _served_protocol(cfg, tokenizer) -> tuple[dict, list[str], object, str]:
    """(the protocol's config as the export records it, its stop strings, the built protocol,
    whose chat template the tokenizer now carries: `searchrl.export_chat`). A native run's chat
    template is bound to the tokenizer, so the export's own template is the one the run rendered
    and the manifest names none; a tag run's is its trained prompt where that is fixed text
    around the question, else the base model's stays."""
    from searchrl.rollout.agent import AgentConfig, build_protocol

    protocol = build_protocol(AgentConfig(model=cfg.model, protocol=cfg.protocol, tools=cfg.tools), tokenizer)
    recorded = cfg.protocol.model_dump(mode="json")
    if cfg.protocol.format == "tool-calls":
        tokenizer.chat_template = protocol.chat.template
        recorded.update(chat_template=None, call_format=protocol.chat.format.name)
        return recorded, protocol.stop_strings(), protocol, TEMPLATE_NATIVE
    about = f"tags {cfg.protocol.tags}, template {Path(str(cfg.protocol.template)).name}"
    template = trained_prompt_template(protocol, tokenizer, about)
    if template is not None:
        tokenizer.chat_template = template
    return recorded, protocol.stop_strings(), protocol, TEMPLATE_TRAINED if template is not None else TEMPLATE_BASE


def export(source: str | Path, out: str | Path, *, adapter: bool = False, evals: Sequence[str | Path] = (),
           repo: str | None = None, dtype: str = "float32", license: str | None = None,
           trust_unverified: bool = False) -> Path:
    """Export the checkpoint `source` names (a run: its newest intact one, `find_checkpoint`) into
    the new folder `out`; `evals`: evaluation folders (`eval run --out`) for the card besides the
    ones found beside the run; `repo`: the Hub repo it will be uploaded to (the name the card's
    title and examples use, else the folder's name); `dtype`: of the saved weights; `license`: the
    card's (default: the base model's, where known); `trust_unverified`: export a checkpoint
    without checksums."""
    out = Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise SearchRLError(f"--out {out} already exists and is not an empty folder; choose another --out or remove it")
    checkpoint = find_checkpoint(source, trust_unverified)
    run = run_dir_of(checkpoint)
    cfg, evals = run_config(checkpoint), eval_dirs(run, evals)  # before the weights: a bad input fails at once
    model, tokenizer = _load_weights(checkpoint, cfg, adapter, dtype)
    examples = None
    if cfg.protocol.format == "tags":  # before the tokenizer carries the trained prompt as its chat template
        from searchrl.rollout.agent import AgentConfig, build_protocol

        trained = build_protocol(AgentConfig(model=cfg.model, protocol=cfg.protocol, tools=cfg.tools), tokenizer)
        examples = (trained.prompt(EXAMPLE_QUESTION, tokenizer), trained.format_documents(EXAMPLE_PASSAGES))
    recorded, stops, protocol, chat = _served_protocol(cfg, tokenizer)

    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    try:
        model.save_pretrained(tmp)  # safetensors; with `adapter`, the adapter's files alone
        tokenizer.save_pretrained(tmp)
        _generation_config(model, tokenizer, cfg, stops, protocol).save_pretrained(tmp)
        if cfg.protocol.format == "tags" and isinstance(resolve_template(recorded["template"]), Path):
            shutil.copyfile(recorded["template"], tmp / PROMPT_FILE)  # the run's own file travels along
            recorded["template"] = PROMPT_FILE
        state = json.loads((checkpoint / ckpt.STATE_FILE).read_text(encoding="utf-8"))
        manifest = {"version": EXPORT_VERSION, "base_model": cfg.model, "checkpoint": str(checkpoint),
                    "step": state["step"], "weights": "adapter" if adapter else "full", "dtype": dtype,
                    "protocol": recorded, "tools": cfg.tools, "stop": stops, "chat_template": chat,
                    "sampling": {"temperature": cfg.rollout.temperature, "top_p": cfg.rollout.top_p},
                    "vllm_tool_call_parser": VLLM_TOOL_PARSERS.get(recorded["call_format"])}
        (tmp / EXPORT_FILE).write_text(json.dumps(manifest, indent=1) + "\n")
        card = model_card(manifest, cfg, run, evals, repo or out.name, examples, license=license)
        (tmp / "README.md").write_text(card)
        make_readable(tmp)  # safetensors and mkdtemp make theirs private: 0644 / 0755 under umask 022
        if out.exists():  # an empty folder
            out.rmdir()
        os.rename(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def _generation_config(model, tokenizer, cfg, stops: list[str], protocol):
    """The model's generation config with the run's sampling and the protocol's token stops: every
    end-of-turn token of a native chat is an EOS id (servers stop there by themselves). A tag
    protocol's stop strings are not set here: transformers refuses every `generate()` (and
    `pipeline()`) call without `tokenizer=` when the config holds any; `searchrl.json` and the
    card carry them, and our own commands stop there."""
    from transformers import GenerationConfig

    gen = getattr(model, "generation_config", None) or GenerationConfig.from_model_config(model.config)
    gen.stop_strings = None
    eos = gen.eos_token_id if isinstance(gen.eos_token_id, list) else [gen.eos_token_id]
    if cfg.protocol.format == "tool-calls":
        eos = eos + list(protocol.chat.stop_ids)
    ids = sorted({i for i in eos if i is not None})
    gen.eos_token_id = ids[0] if len(ids) == 1 else ids
    gen.pad_token_id = tokenizer.pad_token_id
    gen.do_sample = True
    gen.temperature, gen.top_p = cfg.rollout.temperature, cfg.rollout.top_p
    return gen


def eval_dirs(run: Path, extra: Sequence[str | Path] = ()) -> list[Path]:
    """Evaluation folders (`metrics.json`) for the card: `extra`, the run's own `eval*/` folders,
    and in a demo's folder (`searchrl demo` writes OUT/train beside OUT/eval-*) its evaluations."""
    found = [Path(p) for p in extra]
    for p in found:
        if not (p / "metrics.json").is_file():
            raise SearchRLError(f"--eval {p}: no metrics.json there; give folders written by `searchrl eval run --out`")
    found += sorted(p.parent for p in run.glob("eval*/metrics.json"))
    if (run.parent / "report.md").is_file() and run.name == "train":
        found += sorted(p.parent for p in run.parent.glob("eval-*/metrics.json"))
    return list(dict.fromkeys(found))


def push_to_hub(folder: Path, repo: str) -> str:
    """Upload an export folder to the Hub repo `repo` (created if missing); its URL. Offline or
    refused, one line says why and that the export itself is complete."""
    from huggingface_hub import HfApi, constants

    try:
        api = HfApi()
        api.create_repo(repo, exist_ok=True)
        info = api.upload_folder(folder_path=str(folder), repo_id=repo, commit_message="searchrl export")
    except Exception as exc:  # noqa: BLE001  (network, auth and hub errors come in many types; all mean 'not uploaded')
        why = " ".join(str(exc).split())[:200] or type(exc).__name__
        raise SearchRLError(f"cannot upload {folder} to the Hugging Face Hub repo {repo!r} at {constants.ENDPOINT} "
                            f"({type(exc).__name__}: {why}); the export in {folder} is complete: upload it later with "
                            f"`hf upload {repo} {folder}` (logged in with `hf auth login`)") from None
    return str(getattr(info, "commit_url", None) or f"{constants.ENDPOINT}/{repo}")


def export_command(source: str, out: str, adapter: bool, evals: Sequence[str], repo: str | None,
                   dtype: str = "float32", license: str | None = None, trust_unverified: bool = False) -> None:
    """`searchrl export`: write the folder, print what it holds, upload it if asked."""
    folder = export(source, out, adapter=adapter, evals=evals, repo=repo, dtype=dtype, license=license,
                    trust_unverified=trust_unverified)
    manifest = read_export(folder)
    print(f"exported step {manifest['step']} of {manifest['checkpoint']} to {folder} "
          f"({'LoRA adapter' if adapter else 'full weights'}, {dtype}; protocol {manifest['protocol']['format']}; "
          f"model card README.md)")
    if manifest["chat_template"] == TEMPLATE_BASE:
        print("note: its chat template is the base model's, not the prompt it was trained with: chat completions "
              "build a prompt it never saw (the card says how to prompt it)")
    if repo is not None:
        print(f"uploaded to {push_to_hub(folder, repo)}")
