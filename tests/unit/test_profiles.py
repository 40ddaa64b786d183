"""Model profiles (`searchrl.profiles`) and checkpoints that carry their protocol
(`searchrl.checkpoint_meta`): detection from the chat template, explicit settings kept, the
shipped configs unchanged, a trained checkpoint's protocol read back by ask and eval run."""

from __future__ import annotations

import html
import json
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from searchrl.ask import AskConfig
from searchrl.checkpoint_meta import AGENT_FILE, read_checkpoint_agent
from searchrl.cli import app
from searchrl.config import load_config
from searchrl.errors import DataWarning, SearchRLError
from searchrl.eval.config import EvalConfig
from searchrl.eval.view import write_view
from searchrl.profiles import describe, profile_for, renders_tools
from searchrl.rl import trainer
from searchrl.rl.config import TrainConfig
from searchrl.rollout.agent import AgentConfig
from searchrl.select.config import SelectConfig

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
# A ChatML template without a tool section, and the same with Qwen2.5's way of listing tools.
CHAT = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
WITH_TOOLS = ("{% if tools %}<|im_start|>system\n<tools>{% for t in tools %}{{ t | tojson }}{% endfor %}</tools>"
              "<|im_end|>\n{% endif %}" + CHAT)


def _model_folder(root: Path, name: str, template: str | None, as_file: bool = False) -> str:
    """A folder with only the tokenizer config a profile reads (no weights are needed to resolve one)."""
    folder = root / name
    folder.mkdir()
    config = {"tokenizer_class": "PreTrainedTokenizerFast"}
    if template is not None and as_file:
        (folder / "chat_template.jinja").write_text(template)
    elif template is not None:
        config["chat_template"] = template
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    return str(folder)


def test_detected_from_the_chat_template(tmp_path):
    assert renders_tools(WITH_TOOLS) and not renders_tools(CHAT)
    assert not renders_tools("{{ raise_exception('no') }}")  # a template that fails renders no tools
    base = AskConfig(model=_model_folder(tmp_path, "base", None))
    assert (base.profile, base.protocol.format, base.protocol.tags, base.protocol.template) == ("base", "tags", "r1searcher", "base")
    chat = AskConfig(model=_model_folder(tmp_path, "chat", CHAT))
    assert (chat.profile, chat.protocol.format, chat.protocol.template) == ("instruct", "tags", "chat")
    tools = AskConfig(model=_model_folder(tmp_path, "tools", WITH_TOOLS, as_file=True))
    assert (tools.profile, tools.protocol.format, tools.protocol.template, tools.protocol.chat_template) == (
        "instruct-tools", "tool-calls", "tools", None)


def test_aliases_and_families_by_name():
    got = {m: (p.name, p.format) for m in ("smollm2-135m", "SmolLM2-135M-Instruct", "tiny-random", "Qwen/Qwen2.5-7B",
                                            "Qwen/Qwen2.5-7B-Instruct", "Qwen/Qwen3-8B", "meta-llama/Llama-3.1-8B-Instruct")
           for p in [profile_for(m)]}
    assert got == {
        "smollm2-135m": ("smollm2-135m", "tags"), "SmolLM2-135M-Instruct": ("smollm2-135m", "tags"),
        "tiny-random": ("tiny-random", "tags"), "Qwen/Qwen2.5-7B": ("qwen2.5-base", "tags"),
        "Qwen/Qwen2.5-7B-Instruct": ("qwen2.5-instruct", "tool-calls"), "Qwen/Qwen3-8B": ("qwen3", "tool-calls"),
        "meta-llama/Llama-3.1-8B-Instruct": ("llama3.1-instruct", "tags"),
    }
    with pytest.raises(SearchRLError, match="unknown profile 'qwen9'"):
        profile_for("tiny-random", "qwen9")


def test_smollm2_defaults_show_the_method_and_explicit_settings_win():
    plain = AskConfig()
    assert (plain.profile, plain.protocol.tags, plain.protocol.template, plain.rollout.temperature) == (
        "smollm2-135m", "search-r1", "oneshot", 0.7)
    assert plain.rollout.greedy and plain.rollout.k == 5  # evaluation's defaults stay under the profile's
    line = describe(plain)
    assert line.startswith("model profile smollm2-135m") and "tags search-r1, template oneshot, greedy" in line
    given = load_config(AskConfig, None, ["protocol.tags=r1searcher", "rollout.temperature=1.0"])
    assert (given.protocol.tags, given.protocol.template, given.rollout.temperature) == ("r1searcher", "oneshot", 1.0)
    assert load_config(AskConfig, None, ["protocol.template=base"]).protocol.template == "base"
    # The profile fills the settings of the format chosen; a tag setting chooses tags.
    native = AgentConfig(protocol={"format": "tool-calls"}, tools=["search", "open"])
    assert (native.protocol.format, native.protocol.chat_template, native.protocol.template) == (
        "tool-calls", "hermes-fallback", "tools")
    tags = AgentConfig(model="Qwen/Qwen2.5-7B-Instruct", protocol={"tags": "search-r1"})
    assert (tags.protocol.format, tags.protocol.template) == ("tags", "chat")
    off = AgentConfig(profile="none")
    assert (off.protocol.tags, off.protocol.template, off.rollout.temperature) == ("r1searcher", "base", 1.0)
    # The resolved config names its profile and validates back to itself (config.yaml, resume).
    assert AskConfig.model_validate(plain.model_dump(mode="json")) == plain


def _recipes():
    return [(p, TrainConfig) for p in sorted(CONFIGS.glob("*.yaml"))] + [(p, SelectConfig) for p in sorted((CONFIGS / "data").glob("*.yaml"))]


@pytest.mark.parametrize(("path", "cls"), _recipes(), ids=lambda x: getattr(x, "name", ""))
def test_shipped_configs_resolve_as_without_a_profile(path, cls):
    cfg, off = load_config(cls, path), load_config(cls, path, ["profile=none"])
    for section in ("protocol", "tools", "rollout"):
        assert getattr(cfg, section) == getattr(off, section), section
    written = yaml.safe_load(path.read_text()).get("protocol", {})
    assert {k: v for k, v in cfg.protocol.model_dump().items() if k in written} == written


@pytest.fixture(scope="module")
def checkpoint(world, tmp_path_factory) -> Path:
    """A checkpoint of a one-step tiny training with the search-r1 tags (tiny-random's profile has r1searcher)."""
    out = tmp_path_factory.mktemp("run") / "run"
    cfg = load_config(TrainConfig, None, [
        "model=tiny-random", f"retrieval.index={world / 'index'}", f"out={out}", "protocol.tags=search-r1",
        f"protocol.template={world / 'prompt.txt'}", f"stage1.dataset={world / 'q.jsonl'}", "stage1.steps=1",
        "stage2.steps=0", "stage1.prompts_per_step=1", "stage1.samples_per_prompt=2", "rollout.max_new_tokens=4",
        "rollout.top_p=1.0", "logging.progress=false", "logging.tensorboard=false",
    ])
    run = trainer.train(cfg)
    return run / "checkpoints" / "step_0001"


def test_a_checkpoint_carries_its_protocol_and_ask_and_eval_use_it(checkpoint, world, tmp_path):
    agent = read_checkpoint_agent(checkpoint)
    assert (checkpoint / AGENT_FILE).is_file() and agent["tools"] == ["search"]
    assert (agent["protocol"]["tags"], agent["protocol"]["template"]) == ("search-r1", str(world / "prompt.txt"))
    assert read_checkpoint_agent(tmp_path) is None and read_checkpoint_agent(tmp_path / "missing") is None
    ask = AskConfig(model=str(checkpoint))
    assert (ask.profile, ask.protocol.tags, ask.protocol.template) == ("checkpoint", "search-r1", str(world / "prompt.txt"))
    assert "model profile checkpoint" in describe(ask)

    out = tmp_path / "eval"
    result = CliRunner().invoke(app, ["eval", "run", "--model", str(checkpoint), "--method", "direct", "--dataset",
                                      str(world / "q.jsonl"), "--limit", "1", "--answer-max-new-tokens", "2",
                                      "--out", str(out), "--json"])
    assert result.exit_code == 0, result.output
    saved = yaml.safe_load((out / "config.yaml").read_text())
    assert (saved["profile"], saved["protocol"]["tags"]) == ("checkpoint", "search-r1")
    assert "model profile checkpoint" in result.stderr
    # The viewer says what the run spoke: an eval run's config beside its predictions, a training
    # run's above its samples.
    page = write_view(out / "predictions.jsonl").read_text(encoding="utf-8")
    assert f"{checkpoint} (profile checkpoint): tags search-r1, template {world / 'prompt.txt'}" in html.unescape(page)
    samples = write_view(checkpoint.parents[1] / "samples" / "step_0001.jsonl").read_text(encoding="utf-8")
    assert "tiny-random (profile tiny-random): tags search-r1" in html.unescape(samples)


def test_a_protocol_set_against_the_checkpoints_is_kept_and_warned_about(checkpoint):
    with pytest.warns(DataWarning, match=r"protocol.tags='r1searcher' \(trained: 'search-r1'\)"):
        cfg = EvalConfig(model=str(checkpoint), method="direct", protocol={"tags": "r1searcher", "doc_style": "title-lines"})
    assert cfg.protocol.tags == "r1searcher" and cfg.protocol.doc_style == "title-lines"


def test_checkpoints_of_older_runs_read_their_runs_config(tmp_path):
    step = tmp_path / "run" / "checkpoints" / "step_0003"
    step.mkdir(parents=True)
    (tmp_path / "run" / "config.yaml").write_text(yaml.safe_dump({"protocol": {"tags": "search-r1", "template": "oneshot"}}))
    assert read_checkpoint_agent(step) == {"protocol": {"tags": "search-r1", "template": "oneshot"}, "tools": ["search"]}
    (step / AGENT_FILE).write_text("protocol: [1]\n")
    with pytest.raises(SearchRLError, match="agent.yaml: protocol must be a mapping"):
        read_checkpoint_agent(step)
