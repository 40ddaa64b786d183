"""The model card (`README.md`) of an export (`searchrl.export`): base model, method and paper,
data, training config, the run's training figures and evaluation table, how to run it, limits."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import yaml

from searchrl.export_chat import TEMPLATE_BASE, TEMPLATE_TRAINED

PAPER = ("R1-Searcher: Incentivizing the Search Capability in LLMs via Reinforcement Learning "
         "(Song et al., 2025, [arXiv:2503.05592](https://arxiv.org/abs/2503.05592))")


def model_card(manifest: dict, cfg, run: Path, evals: Sequence[Path], name: str, examples: tuple[str, str] | None,
               license: str | None = None) -> str:
    """The card's Markdown: a YAML header the Hub reads (`front_matter`), then the sections. `name`:
    what users load and the title (a hub repo or the folder's name); `examples`: a tag protocol's
    prompt for a question and a documents block; `license`: the card's (default: the base model's)."""
    adapter = manifest["weights"] == "adapter"
    lora = "a LoRA adapter (load it on the base model with peft)" if adapter else (
        "full weights, LoRA merged into the base" if cfg.algorithm.lora.enabled else "full weights")
    lora += f", {manifest.get('dtype', 'float32')}"
    header = front_matter(cfg, adapter, license)
    lines = header + [
        f"# {name}", "",
        ("A language model trained with searchrl to search while it reasons: "
        "it writes queries as it thinks, reads the documents that come back, and answers."), "",
        "## Model", "",
        f"- **Base model:** `{cfg.model}`",
        (f"- **Method:** the two-stage outcome-based reinforcement learning of {PAPER}. Stage 1 rewards "
        "calling the search tool in the right format, Stage 2 rewards correct answers."),
        f"- **Checkpoint:** step {manifest['step']} of run `{run.name}` (`{Path(manifest['checkpoint']).name}`)",
        f"- **Weights:** {lora}", "",
        *_data(cfg, run), *_config(cfg), *_results(run, evals), *_protocol(manifest, examples), *_chat(manifest),
        *_usage(manifest, name, adapter),
        "## Limitations", "",
        ("- The model answers from what its searches return: it is as good as the index or search engine behind "
        f"it. It was trained against {describe_retrieval(cfg, run)}; another corpus changes what it finds."),
        ("- It only searches when driven by a loop that runs its queries and appends the documents "
        "(`searchrl ask`, or your own as described above); plain generation stops at its first query."),
        ("- The numbers above are this run's, on the datasets named; small models and short runs learn the "
        "format long before they learn to answer well. Check the evaluation before relying on it."),
        "- Outputs can be wrong or invented like any language model's; cite the retrieved documents, not the model.", "",
        "## Citation", "",
        "```bibtex",
        "@article{song2025r1searcher,",
        "  title={R1-Searcher: Incentivizing the Search Capability in LLMs via Reinforcement Learning},",
        ("  author={Song, Huatong and Jiang, Jinhao and Min, Yingqian and Chen, Jie and Chen, Zhipeng and Zhao, "
        "Wayne Xin and Fang, Lei and Wen, Ji-Rong},"),
        "  journal={arXiv preprint arXiv:2503.05592},", "  year={2025}", "}", "```", "",
    ]
    return "\n".join(lines)


# Built-in model names -> (the Hub model they are, the license their weights and tokenizer carry).
BUILTIN_BASES = {"smollm2-135m": ("HuggingFaceTB/SmolLM2-135M-Instruct", "apache-2.0"),
                 "tiny-random": ("tiny-random", "apache-2.0")}  # random weights, SmolLM2's tokenizer: a test model
TAGS = ["searchrl", "r1-searcher", "reinforcement-learning", "retrieval-augmented-generation", "tool-use"]


def front_matter(cfg, adapter: bool, license: str | None = None) -> list[str]:
    """The card's YAML header: library, pipeline, `base_model`, `license`, `datasets` (those on
    the Hub), tags."""
    base = base_model_of(cfg.model)
    datasets = hub_datasets(cfg)
    data = {"library_name": "peft" if adapter else "transformers", "pipeline_tag": "text-generation",
            "base_model": base, "license": license or license_of(cfg.model, base), "datasets": datasets, "tags": TAGS}
    lines = ["---", *(yaml.safe_dump({k: v}, sort_keys=False, width=1000).rstrip() for k, v in data.items() if v or k != "datasets")]
    if not datasets:
        lines.append("# datasets: none of the training sets is on the Hub (see 'Training data')")
    return lines + ["---", ""]


def base_model_of(model: str, depth: int = 0) -> str:
    """The Hub model a run's `model` started from: a built-in's Hub id, a hub id itself, and for a
    checkpoint or an export (a next stage's start) the base model of the run that wrote it; a
    folder of unknown origin gives its own name."""
    from searchrl.checkpoint_meta import EXPORT_FILE

    key = model.strip().lower()
    if key in BUILTIN_BASES:
        return BUILTIN_BASES[key][0]
    path = Path(model).expanduser()
    if not path.exists():
        return model  # a hub id
    if depth < 8:
        try:
            if (path / EXPORT_FILE).is_file():
                return base_model_of(str(json.loads((path / EXPORT_FILE).read_text(encoding="utf-8"))["base_model"]), depth + 1)
            for folder in path.resolve().parents:
                if (folder / "config.yaml").is_file() and (folder / "checkpoints").is_dir():
                    return base_model_of(str(yaml.safe_load((folder / "config.yaml").read_text(encoding="utf-8"))["model"]),
                                         depth + 1)
        except (OSError, ValueError, KeyError, TypeError, yaml.YAMLError):
            pass
    return path.resolve().name


def license_of(model: str, base: str) -> str:
    """The license of the base model: a built-in's, else the `license` of the Hub model's card in
    the local Hugging Face cache; `unknown` when neither says."""
    for key in (model.strip().lower(), base.lower()):
        for name, (hub, lic) in BUILTIN_BASES.items():
            if key in (name, hub.lower()):
                return lic
    try:
        from huggingface_hub import try_to_load_from_cache

        cached = try_to_load_from_cache(base, "README.md")
        if isinstance(cached, str):
            text = Path(cached).read_text(encoding="utf-8")
            if text.startswith("---"):
                meta = yaml.safe_load(text.split("---", 2)[1]) or {}
                if isinstance(meta, dict) and isinstance(meta.get("license"), str):
                    return meta["license"]
    except Exception:  # noqa: BLE001, S110  (no cache, an odd id or card: the license is then unknown)
        pass
    return "unknown"


def hub_datasets(cfg) -> list[str]:
    """The Hub datasets (`hf:NAME...` specs) the enabled stages trained on."""
    found = []
    for s in (cfg.stage1, cfg.stage2):
        spec = str(s.dataset) if s.enabled and s.dataset else ""
        if spec.startswith("hf:"):
            found.append(spec[3:].split("@")[0].split(":")[0])
    return list(dict.fromkeys(n for n in found if n))


def describe_retrieval(cfg, run: Path) -> str:
    """Where the run's searches went, for a reader: the index by name and kind (a catalog name or
    an index folder's name, never a path of the exporting machine), the retrieval server a run
    recorded in `run_info.json` (the demo's temporary one: the index it served), a lasting
    server's URL, or the web search provider."""
    r = cfg.retrieval
    if r.web.provider is not None:
        return f"web search (`{r.web.provider}`" + (f", site {r.web.site})" if r.web.site else ")")
    if r.index is not None:
        return _index_words(r.index)
    served = _served_index(run)
    if served:
        return served + " (served over HTTP during training)"
    from urllib.parse import urlsplit

    host = urlsplit(str(r.url)).hostname or ""
    if host in ("127.0.0.1", "localhost", "::1"):
        return "a retrieval server on the training machine (a temporary address; its index was not recorded)"
    return f"the retrieval server `{r.url}` (API {r.api})"


def _index_words(index: str) -> str:
    from searchrl.retrieval.store import read_manifest

    path = Path(index).expanduser()
    name = index if not path.exists() else path.resolve().name
    try:
        if path.is_dir():
            manifest = read_manifest(path)
        else:
            from searchrl.retrieval.catalog import INDEXES, named_index_dir

            manifest = read_manifest(named_index_dir(index)) if index in INDEXES else None
    except Exception:  # noqa: BLE001  (the index need not be on the exporting machine)
        manifest = None
    if not manifest:
        return f"the index `{name}`"
    count = manifest.get("count")
    return f"the index `{name}` ({manifest['kind']}" + (f", {count:,} passages)" if isinstance(count, int) else ")")


def _served_index(run: Path) -> str | None:
    """What the retrieval server of a run served, as the run recorded it (`run_info.json`)."""
    try:
        info = json.loads((run / "run_info.json").read_text(encoding="utf-8")).get("retrieval") or {}
    except (OSError, ValueError, AttributeError):
        return None
    name, kind, count = info.get("index"), info.get("kind"), info.get("passages")
    if not name and not kind:
        return None
    words = f"the index `{name}`" if name else "an index"
    details = [str(kind)] if kind else []
    if isinstance(count, int):
        details.append(f"{count:,} passages")
    return words + (f" ({', '.join(details)})" if details else "")


def _dataset_name(spec) -> str:
    """A stage's dataset for a reader: a catalog name or Hub spec as given, a file by its name
    (not a path of the exporting machine)."""
    path = Path(str(spec)).expanduser()
    return path.name if path.is_absolute() or path.exists() else str(spec)


def _data(cfg, run: Path) -> list[str]:
    rows = [f"| {n} | {s.kind} | `{_dataset_name(s.dataset)}` | {', '.join(s.question_types) if s.question_types else 'all'} | "
            f"{s.steps} | {s.prompts_per_step} × {s.samples_per_prompt} |"
            for n, s in ((1, cfg.stage1), (2, cfg.stage2)) if s.enabled]
    return ["## Training data", "", "| stage | kind | dataset | question types | steps | prompts × samples per step |",
            "|---|---|---|---|---:|---:|", *rows, "", f"Searches went to {describe_retrieval(cfg, run)}.", ""]


def _config(cfg) -> list[str]:
    a, r, lora = cfg.algorithm, cfg.rollout, cfg.algorithm.lora
    items = [("advantage", a.advantage), ("learning rate", a.lr), ("KL coefficient", f"{a.kl_coef} ({a.kl_kind})"),
             ("PPO clip", a.clip_eps), ("PPO epochs", a.ppo_epochs), ("LR schedule", a.lr_schedule),
             ("LoRA", f"r={lora.r}, alpha={lora.alpha}" if lora.enabled else "no"),
             ("sampling", f"temperature {r.temperature}, top-p {r.top_p}"),
             ("policy tokens per rollout", r.max_new_tokens), ("searches per rollout", r.max_searches),
             ("passages per search (k)", r.k), ("dtype", cfg.dtype), ("seed", cfg.seed)]
    return ["## Training config", "", "| setting | value |", "|---|---|",
            *[f"| {k} | {v} |" for k, v in items], "", "The whole resolved config is the run's `config.yaml`.", ""]


def _results(run: Path, evals: Sequence[Path]) -> list[str]:
    from searchrl.demo import stage_summary
    from searchrl.eval.compare import compare_markdown
    from searchrl.runlog import read_metrics

    lines = ["## Results", "", "### Training", ""]
    summary = stage_summary(read_metrics(run)) if (run / "metrics.jsonl").is_file() else {}
    s1, s2 = summary.get("stage1"), summary.get("stage2")
    if s1:
        lines.append(f"- Stage 1, {s1['steps']} steps: share of rollouts that search {s1['search_rate_first']:.2f} at the "
                     f"first step -> {s1['search_rate_last']:.2f} at the last; format-ok {s1['format_ok_first']:.2f} -> "
                     f"{s1['format_ok_last']:.2f}")
    if s2:
        lines.append(f"- Stage 2, {s2['steps']} steps: mean answer F1 {s2['answer_f1_first_quarter']:.3f} in the first "
                     f"quarter of steps -> {s2['answer_f1_last_quarter']:.3f} in the last")
    for key in ("sft1", "sft2"):
        if key in summary:
            s = summary[key]
            lines.append(f"- Stage {key[-1]} (SFT), {s['steps']} steps: loss {s['loss_first']:.3f} -> {s['loss_last']:.3f}")
    if not summary:
        lines.append("No training records (metrics.jsonl) were found in the run.")
    lines += ["", "### Evaluation", ""]
    if evals:
        lines += ["Greedy decoding; fractions in percent (`searchrl eval compare`).", "", compare_markdown(evals).rstrip()]
    else:
        lines.append("None: no evaluation of this run was found (`searchrl eval run --model CHECKPOINT --out DIR`, "
                     "then export with `--eval DIR`).")
    return lines + [""]


def _protocol(manifest: dict, examples: tuple[str, str] | None) -> list[str]:
    p, stops = manifest["protocol"], ", ".join(f"`{json.dumps(s)}`" for s in manifest["stop"])  # JSON: "\nUser:" shows
    lines = ["## How it talks to its tools", ""]
    if p["format"] == "tags":
        where = " (the run's own template file, in this folder)" if p["template"].endswith(".txt") else ""
        lines += [(f"Tag protocol `{p['tags']}`, prompt template `{p['template']}`{where}, documents style "
                  f"`{p['doc_style']}`. The prompt for a question, as training wrote it:"), "", "```text", examples[0], "```",
                  "", (f"The model writes a query between the query tags and stops at the closing one. Stop strings: "
                  f"{stops} (in `searchrl.json`; pass them to `generate` with `stop_strings=` and `tokenizer=`). At the end-of-query tag, run the search, append "
                  "the documents block (on lines of its own) and let it go on, until it closes the answer tag. A documents block:"),
                  "", "```text", examples[1].strip("\n"), "```"]
    else:
        parser = manifest["vllm_tool_call_parser"]
        lines += [f"Native tool calls ({p['call_format']} format) through the chat template in `tokenizer_config.json` / "
                  f"`chat_template.jinja` (the one training rendered), tools: {', '.join(manifest['tools'])}. "
                  f"A turn ends at {stops}, which `generation_config.json` lists as end-of-sequence tokens."
                  + (f" vLLM's tool-call parser for it: `{parser}`." if parser else "")]
    lines += ["", (f"`searchrl.json` records all of this (protocol, tools: {', '.join(manifest['tools'])}, stop strings), so "
              "`searchrl ask` and `searchrl eval run` with `--model THIS_FOLDER` need no protocol flags."), ""]
    return lines


def _chat(manifest: dict) -> list[str]:
    """The chat template: what chat clients (`apply_chat_template`, pipelines given messages, vLLM
    chat completions) build, said loudly when it is not the trained prompt."""
    kind = manifest.get("chat_template")
    if kind == TEMPLATE_TRAINED:
        return ["## Chat template", "", ("The chat template renders the prompt this model was trained with: one user "
                "message, the question, becomes exactly the prompt above; a second, assistant message (its text so far, "
                "with the documents your search loop appended) is continued as is (`continue_final_message=True`). "
                "It was never trained on chat, so anything else (a system message, several turns) raises an error "
                "rather than build a prompt it never saw."), ""]
    if kind == TEMPLATE_BASE:
        return ["## Not a chat model: chat completions do not build its prompt", "",
                ("**The chat template in this folder is the base model's, not the prompt this model was trained with.** "
                 "Chat completions (vLLM's `/v1/chat/completions`, `apply_chat_template`, a pipeline given messages) "
                 "build a prompt it never saw, without its instructions and tags, and its answers there are not the "
                 "ones evaluated. Send the prompt shown above as plain text (completions), or use `searchrl ask`."), ""]
    return []


def _usage(manifest: dict, name: str, adapter: bool) -> list[str]:
    p, stops = manifest["protocol"], json.dumps(manifest["stop"])
    lines = ["## How to run it", "", "With searchrl (the search loop, live in the terminal):", "", "```bash",
             f'searchrl ask "Which river flows through the capital?" --model {name}',
             "# searches the toy world by default: --index DIR or --retriever-url URL for your corpus", "```", ""]
    if adapter:
        return lines + ["With transformers and peft:", "", "```python", "from peft import AutoPeftModelForCausalLM",
                        "from transformers import AutoTokenizer", "",
                        f'model = AutoPeftModelForCausalLM.from_pretrained("{name}").merge_and_unload()',
                        f'tok = AutoTokenizer.from_pretrained("{name}")', "```", "",
                        "For vLLM, export the run again without `--adapter` (merged weights).", ""]
    lines += ["With transformers (one turn: it stops at the first query, where your loop runs the search):", "",
              "```python", "from transformers import AutoModelForCausalLM, AutoTokenizer", "",
              f'model = AutoModelForCausalLM.from_pretrained("{name}")', f'tok = AutoTokenizer.from_pretrained("{name}")']
    if p["format"] == "tags":
        trained = manifest.get("chat_template") == TEMPLATE_TRAINED
        lines += [('messages = [{"role": "user", "content": "Which river flows through the capital?"}]\n'
                   'ids = tok.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt")  # the prompt above')
                  if trained else 'ids = tok("...", return_tensors="pt").input_ids  # the prompt shown above, with your question',
                  f"out = model.generate(ids, max_new_tokens=256, stop_strings={stops}, tokenizer=tok)  # sampling from generation_config.json",
                  "print(tok.decode(out[0, ids.shape[1]:]))", "```", "",
                  "With vLLM's OpenAI-compatible server (completions; the stop strings go with each request):", "",
                  "```bash", f"vllm serve {name}",
                  (f"curl localhost:8000/v1/completions -H 'Content-Type: application/json' "
                  f"-d '{{\"model\": \"{name}\", \"prompt\": \"...\", \"stop\": {stops}, \"max_tokens\": 256}}'"), "```", ""]
    else:
        parser = manifest["vllm_tool_call_parser"]
        lines += ['messages = [{"role": "user", "content": "Which river flows through the capital?"}]',
                  "tools = [...]  # the JSON schemas of the tools above (searchrl's `tool_class(name).schema()`)",
                  "ids = tok.apply_chat_template(messages, tools=tools, add_generation_prompt=True, return_tensors=\"pt\")",
                  "out = model.generate(ids, max_new_tokens=256)", "print(tok.decode(out[0, ids.shape[1]:]))", "```", "",
                  "With vLLM's OpenAI-compatible server (chat completions with `tools`; the calls come back parsed):", "",
                  "```bash", f"vllm serve {name} --enable-auto-tool-choice --tool-call-parser {parser or 'PARSER'}", "```", ""]
    return lines
