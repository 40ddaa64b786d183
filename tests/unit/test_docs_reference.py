"""The generated reference pages against the code they are generated from: every command and
option of the Typer app, every key of every command's config (walked here through the models'
JSON schemas, not the generator's own walk) with a description, every metric a real training step
writes described by the metric schema and no schema entry that nothing writes; and a strict
MkDocs build with the hook serves the three pages."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from searchrl import docs_reference as ref
from searchrl import metric_names as mn

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def pages() -> dict[str, str]:
    return ref.pages()


def _sections(page: str, level: str) -> dict[str, str]:
    """The page's text under each heading of `level` (`## ` or `### `), keyed by the heading."""
    parts = re.split(rf"^{level}(.+)$", page, flags=re.MULTILINE)
    return {head.strip(): body for head, body in zip(parts[1::2], parts[2::2])}


# --- the command line ---------------------------------------------------------------------------


def test_every_command_and_option_is_on_the_cli_page_with_its_help(pages):
    sections = {**_sections(pages["cli.md"], "## "), **_sections(pages["cli.md"], "### ")}
    walked = list(ref.commands())
    assert {"searchrl train", "searchrl eval run", "searchrl index build"} <= {path for path, _ in walked}
    for path, cmd in walked:
        body = sections[f"`{path}`"]  # a command without its own heading fails here
        assert cmd.help and ref.text(cmd.help.split("\n")[0]) in body, path
        for p in ref.params(cmd):
            assert p.help, f"{path} {p.name}: an option without help"
            # an argument is its metavar (`[OVERRIDES...]` when optional), an option its flags
            spelled = [p.name.upper()] if p.param_type_name == "argument" else [f"`{o}`" for o in p.opts]
            row = next((line for line in body.splitlines() if line.startswith("| ") and spelled[0] in line.split(" | ")[0]), None)
            assert row is not None, f"{path}: {spelled[0]} has no row"
            assert all(s in row for s in spelled) and ref.text(p.help) in row, (path, p.name)


def test_every_command_that_reads_a_config_has_its_section(pages):
    """A command with --config or --set reads a typed config: it must be on the config page."""
    configured = {path.removeprefix("searchrl ") for path, cmd in ref.commands()
                  if any(o in ("--config", "--set") for p in ref.params(cmd) for o in getattr(p, "opts", []))}
    assert "train" in configured and "demo" in configured
    assert configured - {"demo"} <= set(ref.config_models())  # demo's --config is a training recipe
    for command, model in ref.config_models().items():
        assert f"## `searchrl {command}`: {model.__name__}" in pages["config.md"]


# --- the configs --------------------------------------------------------------------------------


def _schema_keys(schema: dict, node: dict, prefix: str = "") -> dict[str, str | None]:
    """Every dotted key of a JSON schema object with its description, sections spelled as the
    page does: `a.b`, `terms.<name>.weight`, `parts[].dataset`."""
    out: dict[str, str | None] = {}
    for name, prop in node.get("properties", {}).items():
        key = f"{prefix}{name}"
        out[key] = prop.get("description")
        target, spelled = _object_of(schema, prop)
        if target is not None:
            out.update(_schema_keys(schema, target, f"{key}{spelled}."))
    return out


def _object_of(schema: dict, prop: dict) -> tuple[dict | None, str]:
    def resolve(p: dict) -> dict:
        return schema["$defs"][p["$ref"].rsplit("/", 1)[1]] if "$ref" in p else p

    options = [resolve(p) for p in prop.get("anyOf", [prop]) if p.get("type") != "null"]
    if len(options) != 1:
        return None, ""
    p = options[0]
    if "properties" in p:
        return p, ""
    if p.get("type") == "object" and isinstance(p.get("additionalProperties"), dict) and "properties" in resolve(p["additionalProperties"]):
        return resolve(p["additionalProperties"]), ".<name>"
    if p.get("type") == "array" and "properties" in resolve(p.get("items", {})):
        return resolve(p["items"]), "[]"
    return None, ""


@pytest.mark.parametrize("command", list(ref.config_models()))
def test_every_config_key_has_a_row_with_type_default_and_description(pages, command):
    model = ref.config_models()[command]
    schema = model.model_json_schema()
    keys = _schema_keys(schema, schema)
    assert len(keys) > 5
    page = _sections(pages["config.md"], "## ")[f"`searchrl {command}`: {model.__name__}"]
    tables = {"": page.split("\n### ")[0], **{h.split(": ", 1)[1].strip("`"): b for h, b in _sections(page, "### ").items()}}
    for key, description in keys.items():
        assert description and description.strip(), f"{command}: {key} has no description (Field(description=...))"
        parent = key.rpartition(".")[0]
        leaf = key[len(parent) + 1:] if parent else key
        row = next((line for line in tables[parent].splitlines() if line.startswith(f"| `{leaf}` |")), None)
        assert row is not None, f"{command}: {key} has no row"
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", row)[1:-1]]
        assert len(cells) == 4 and all(cells) and cells[3] == ref.text(description), (command, key, cells)


def test_a_key_shows_the_default_its_command_gives_it(pages):
    train = _sections(pages["config.md"], "## ")["`searchrl train`: TrainConfig"]
    stage1_reward = _sections(train, "### ")["`train`: `stage1.reward`"]
    assert "| `stage` | str | `stage1` |" in stage1_reward and "| `retrieve_weight` | float | `1.0` |" in stage1_reward
    assert "| `index` | str \\| null | `toyworld` |" in _sections(train, "### ")["`train`: `retrieval`"]


def test_table_cells_show_tags_and_pipes_as_text():
    assert ref.text("ends with <think> | `a <b>`") == "ends with &lt;think&gt; \\| `a <b>`"


# --- the metrics --------------------------------------------------------------------------------


def test_every_metric_a_training_step_writes_is_in_the_schema_and_every_entry_is_written(world, tmp_path, monkeypatch):
    """One searching RL step (tools, latencies, health values) and one SFT step (its own record),
    plus a web-search worker's spending: every key they write is described by the schema, and
    every schema entry (name or family) is written by one of them."""
    from searchrl.config import load_config
    from searchrl.data.types import Passage
    from searchrl.protocols.tags import SEARCH_R1_TAGS
    from searchrl.retrieval.index import build_index
    from searchrl.retrieval.web.budget import COUNTERS
    from searchrl.rl import trainer
    from searchrl.rl.config import TrainConfig
    from searchrl.rollout import worker as rollout_worker
    from searchrl.rollout.scripted import ScriptedBackend
    from searchrl.runlog import read_metrics

    real_create = rollout_worker.RolloutWorker.create

    def scripted(cls, actor, retriever, protocol):
        worker = real_create(actor, retriever, protocol)
        worker.engine.backend = ScriptedBackend(actor.tokenizer, lambda text: (
            " <search>Quellbridge river</search>" if SEARCH_R1_TAGS.docs_open not in text else "</think>\n<answer>R0</answer>"))
        return worker

    monkeypatch.setattr(rollout_worker.RolloutWorker, "create", classmethod(scripted))
    # SFT's gold paths search each supporting passage by its title: titles the index tells apart
    towns = ["Quellbridge", "Marrowind", "Velmar"]
    build_index([Passage(f"t{i}", t, f"{t} lies on the river R{i}.") for i, t in enumerate(towns)], tmp_path / "index", "bm25",
                progress=False)
    gold = tmp_path / "gold.jsonl"
    gold.write_text("".join(json.dumps({"id": f"g{i}", "question": f"Which river flows through {t}?",
                                        "answers": [f"R{i}"], "supporting_ids": [f"t{i}"], "type": "bridge" if i else ""}) + "\n"
                            for i, t in enumerate(towns)))
    run = tmp_path / "run"
    trainer.train(load_config(TrainConfig, None, [
        "model=tiny-random", f"retrieval.index={tmp_path / 'index'}", f"out={run}", "protocol.tags=search-r1",
        f"protocol.template={world / 'prompt.txt'}", f"stage1.dataset={gold}", f"stage2.dataset={gold}",
        "stage1.steps=1", "stage1.prompts_per_step=1", "stage1.samples_per_prompt=2", "stage1.refill_flat_groups=1",
        "stage2.kind=sft", "stage2.steps=1", "stage2.prompts_per_step=2", "stage2.samples_per_prompt=1",
        "rollout.max_new_tokens=48", "rollout.top_p=1.0", "algorithm.kl_coef=0.05",
        "logging.tensorboard=false", "logging.progress=false", "logging.sample_every=0",
    ]))
    rl, sft = read_metrics(run)
    assert mn.SFT_LOSS in sft and mn.SEARCH_RATE in rl and rl[mn.SEARCHES] == 1.0
    # the step's one question is typed or not: `all` is there either way, `bridge` only for a bridge question
    assert rl[mn.MULTIHOP_SEARCHES.key("all")] == 1.0 and rl[mn.MULTIHOP_ROLLOUTS.key("all")] == 2
    spent = rollout_worker.RolloutWorker.spent(SimpleNamespace(
        engine=SimpleNamespace(retriever=SimpleNamespace(usage=lambda: dict.fromkeys(COUNTERS, 1.0))),
        _spent=dict.fromkeys(COUNTERS, 0.0)))
    from searchrl.rollout.async_worker import AsyncRollouts

    # async mode's pipeline metrics, as its rollout source writes them (tests/unit/test_async.py runs one)
    pipeline = AsyncRollouts.pipeline(SimpleNamespace(_ready={}, _dropped=0, _waited=0.5, _links=[]), 1.0)
    written = set(rl) | set(sft) | set(spent) | set(pipeline)
    assert not {k for k in written if mn.describe(k) is None}, "keys the metric schema does not describe"
    entries = {mn.describe(k).name for k in written}
    assert set(mn.SCHEMA) - entries == set(), "schema entries that nothing writes"


def test_the_metrics_page_lists_every_entry_and_the_families_members(pages):
    for m in mn.SCHEMA.values():
        assert f"| `{m.name}` | {ref.text(m.meaning)}" in pages["metrics.md"]
    assert "`tools/search/calls`" in pages["metrics.md"] and "`health_search_collapse`" in pages["metrics.md"]


def test_families_spell_and_match_their_members():
    assert mn.TOOL_CALLS.key("open") == "tools/open/calls" and mn.TOOL_CALLS.matches("tools/open/calls")
    assert not mn.TOOL_CALLS.matches("tools//calls") and not mn.TOOL_CALLS.matches("tools/open/latency_s")
    assert mn.describe("tools/open/latency_s") is mn.TOOL_LATENCY and mn.describe("nonsense") is None
    assert mn.is_timing("tools/open/latency_s") and mn.is_timing("health_step_time") and not mn.is_timing("reward")


# --- the site ------------------------------------------------------------------------------------


def test_a_strict_mkdocs_build_with_the_hook_serves_the_generated_pages(tmp_path):
    docs = tmp_path / "docs"
    (docs / "reference").mkdir(parents=True)
    (docs / "index.md").write_text("# Home\n\n[Commands](reference/cli.md)\n")
    (docs / "reference" / "cli.md").write_text("# stale copy\n")  # replaced by the generated page
    (tmp_path / "mkdocs.yml").write_text(
        f"site_name: t\nhooks: [{ROOT / 'docs' / 'hooks' / 'reference.py'}]\n"
        "nav: [index.md, reference/cli.md, reference/config.md, reference/metrics.md]\n")
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-q"], check=False, cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    cli = (tmp_path / "site" / "reference" / "cli" / "index.html").read_text()
    assert "stale copy" not in cli and "searchrl eval run" in cli and "--max-searches" in cli
    config = (tmp_path / "site" / "reference" / "config" / "index.html").read_text()
    assert "<code>rollout.vllm</code>" in config and "<code>max_searches</code>" in config
    assert "health_search_collapse" in (tmp_path / "site" / "reference" / "metrics" / "index.html").read_text()


def test_the_committed_reference_pages_are_the_generated_ones(tmp_path):
    # docs/reference/ is what readers of the repository see; the site regenerates it at build.
    # Generated in a fresh interpreter: tools and reward terms other tests register are no page's.
    subprocess.run([sys.executable, "-m", "searchrl.docs_reference", str(tmp_path)], check=True, capture_output=True)
    folder = ROOT / "docs" / "reference"
    stale = [p.name for p in sorted(tmp_path.glob("*.md")) if (folder / p.name).read_text() != p.read_text()]
    assert not stale, f"stale: {stale}; renew with `python -m searchrl.docs_reference docs/reference`"
