"""The model card (`README.md`) of an export (`searchrl.export`): base model, method and paper,
data, training config, the run's training figures and evaluation table, how to run it, limits."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

PAPER = ("R1-Searcher: Incentivizing the Search Capability in LLMs via Reinforcement Learning "
         "(Song et al., 2025, [arXiv:2503.05592](https://arxiv.org/abs/2503.05592))")


def model_card(manifest: dict, cfg, run: Path, evals: Sequence[Path], name: str, examples: tuple[str, str] | None) -> str:
    """The card's Markdown: a YAML header the Hub reads, then the sections. `name`: what users load
    (a hub repo or a folder); `examples`: a tag protocol's prompt for a question and a documents block."""
    adapter = manifest["weights"] == "adapter"
    lora = "a LoRA adapter (load it on the base model with peft)" if adapter else (
        "full weights, LoRA merged into the base" if cfg.algorithm.lora.enabled else "full weights")
    header = ["---", "library_name: " + ("peft" if adapter else "transformers"), "pipeline_tag: text-generation",
              "tags: [searchrl, r1-searcher, reinforcement-learning, retrieval-augmented-generation, tool-use]", "---", ""]
    lines = header + [
        f"# {name}", "",
        ("A language model trained with searchrl to search while it reasons: "
        "it writes queries as it thinks, reads the documents that come back, and answers."), "",
        "## Model", "",
        f"- **Base model:** `{cfg.model}`",
        (f"- **Method:** the two-stage outcome-based reinforcement learning of {PAPER}. Stage 1 rewards "
        "calling the search tool in the right format, Stage 2 rewards correct answers."),
        f"- **Checkpoint:** step {manifest['step']} of run `{run.name}` (`{manifest['checkpoint']}`)",
        f"- **Weights:** {lora}", "",
        *_data(cfg), *_config(cfg), *_results(run, evals), *_protocol(manifest, examples), *_usage(manifest, name, adapter),
        "## Limitations", "",
        ("- The model answers from what its searches return: it is as good as the index or search engine behind "
        f"it. It was trained against `{cfg.retrieval.source}`; another corpus changes what it finds."),
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


def _data(cfg) -> list[str]:
    rows = [f"| {n} | {s.kind} | `{s.dataset}` | {', '.join(s.question_types) if s.question_types else 'all'} | "
            f"{s.steps} | {s.prompts_per_step} × {s.samples_per_prompt} |"
            for n, s in ((1, cfg.stage1), (2, cfg.stage2)) if s.enabled]
    return ["## Training data", "", "| stage | kind | dataset | question types | steps | prompts × samples per step |",
            "|---|---|---|---|---:|---:|", *rows, "", f"Searches went to `{cfg.retrieval.source}`.", ""]


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
                  f"{stops} (also in `generation_config.json`). At the end-of-query tag, run the search, append "
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
        lines += ['prompt = "..."  # the prompt shown above, with your question',
                  'ids = tok(prompt, return_tensors="pt").input_ids',
                  "out = model.generate(ids, max_new_tokens=256, tokenizer=tok)  # sampling and stop strings from generation_config.json",
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
