"""The workbench of issue 43 on a one-step tiny-random run: `--model RUN` and `--model
RUN/checkpoints/latest` mean the newest complete checkpoint in every command; every run folder
records `run_info.json` and `console.log`; `--version`, `env`, `--print-config`; help whole at
80 columns and in a pipe; `train --help` lists the packaged recipes; one-line config errors;
"step k/N" with the time left."""

from __future__ import annotations

import json
import re
from pathlib import Path

import click
import pytest
import typer
import yaml
from typer.testing import CliRunner

from searchrl import __version__
from searchrl.ask import AskConfig
from searchrl.assets import load_model, resolve_model
from searchrl.checkpoint_meta import resolve_trained_model
from searchrl.cli import app
from searchrl.cli import run as cli_run
from searchrl.config import CONFIG_DIR, load_config
from searchrl.errors import SearchRLError
from searchrl.eval.config import EvalConfig
from searchrl.eval.report_config import ReportConfig
from searchrl.export import export, read_export
from searchrl.rl import trainer
from searchrl.rl.checkpoint import latest_checkpoint
from searchrl.rl.config import TrainConfig
from searchrl.runinfo import CONSOLE_LOG, RUN_INFO
from searchrl.runlog import RunLogger, format_duration


def _train(world: Path, out: Path, *extra: str) -> Path:
    cfg = load_config(TrainConfig, None, [
        "model=tiny-random", f"retrieval.index={world / 'index'}", f"out={out}", f"protocol.template={world / 'prompt.txt'}",
        f"stage1.dataset={world / 'q.jsonl'}", "stage1.steps=2", "stage2.enabled=false", "logging.checkpoint_every=1",
        "stage1.prompts_per_step=2", "stage1.samples_per_prompt=2", "rollout.max_new_tokens=4",
        "algorithm.mini_batch_size=2", "algorithm.micro_batch_size=2", "logging.progress=false", "logging.report_to=[]", *extra])
    return trainer.train(cfg)


@pytest.fixture(scope="module")
def run(world, tmp_path_factory) -> Path:
    return _train(world, tmp_path_factory.mktemp("wb") / "run")


def test_a_run_folder_or_its_latest_pointer_is_its_newest_checkpoint_everywhere(run, world, tmp_path):
    newest = latest_checkpoint(run)
    assert newest.name == "step_0002" and (run / "checkpoints" / "latest").is_file()
    for given in (str(run), str(run / "checkpoints" / "latest")):
        assert resolve_trained_model(given) == str(newest)
        assert resolve_model(given) == newest  # load_model and the vLLM backend
        assert EvalConfig(model=given, method="direct").model == str(newest)
        assert AskConfig(model=given).model == str(newest)
        assert ReportConfig(model=given).model == str(newest)
        assert load_config(TrainConfig, None, [f"model={given}"]).model == str(newest)  # a next stage's start
        assert EvalConfig(model=given, method="direct").profile == "checkpoint"  # its protocol, as a checkpoint's
    assert load_model(str(run / "checkpoints" / "latest"))[0] is not None
    for other in ("tiny-random", str(newest), "org/model"):
        assert resolve_trained_model(other) == other
    # The commands: eval run and export take both forms.
    out = tmp_path / "eval"
    result = CliRunner().invoke(app, ["eval", "run", "--model", str(run / "checkpoints" / "latest"), "--method", "direct",
                                      "--dataset", str(world / "q.jsonl"), "--limit", "1", "--answer-max-new-tokens", "1",
                                      "--out", str(out), "--json"])
    assert result.exit_code == 0, result.output
    assert yaml.safe_load((out / "config.yaml").read_text())["model"] == str(newest)
    assert read_export(export(run / "checkpoints" / "latest", tmp_path / "export"))["checkpoint"] == str(newest)
    # A run without a checkpoint says so.
    (tmp_path / "empty" / "checkpoints").mkdir(parents=True)
    with pytest.raises(SearchRLError, match="has no complete checkpoint"):
        resolve_trained_model(str(tmp_path / "empty"))


def test_train_and_eval_folders_record_their_run(run, world, tmp_path):
    info = json.loads((run / RUN_INFO).read_text())
    assert info["command"] == "train" and info["status"] == "finished" and info["end"] >= info["start"]
    assert info["searchrl"] == __version__ and "torch" in info["libraries"] and "transformers" in info["libraries"]
    assert info["retrieval"] == {"index": str(world / "index")} and "accelerators" in info and "argv" in info
    assert (run / CONSOLE_LOG).is_file()

    out = tmp_path / "eval"
    code = cli_run(["eval", "run", "--model", "tiny-random", "--method", "direct", "--dataset", str(world / "q.jsonl"),
                    "--limit", "1", "--answer-max-new-tokens", "1", "--out", str(out), "--set", "rollout.seed=3", "--json"])
    assert code == 0
    info = json.loads((out / RUN_INFO).read_text())
    assert info["command"] == "eval run" and info["status"] == "finished"
    assert "rollout.seed=3" in info["overrides"] and 'method="direct"' in info["overrides"]
    assert "--answer-max-new-tokens" in info["argv"]
    log = (out / CONSOLE_LOG).read_text()
    assert log.startswith("==> ") and "model profile" in log  # what the command printed
    assert "Loading weights" not in log  # transformers' bars are silenced
    # A resumed (here: overwritten) run keeps the earlier record.
    code = cli_run(["eval", "run", "--model", "tiny-random", "--method", "direct", "--dataset", str(world / "q.jsonl"),
                    "--limit", "1", "--answer-max-new-tokens", "1", "--out", str(out), "--overwrite", "--json"])
    assert code == 0 and len(json.loads((out / RUN_INFO).read_text())["earlier"]) == 1


def test_version_env_and_print_config(capsys):
    assert cli_run(["--version"]) == 0
    assert capsys.readouterr().out.startswith(f"searchrl {__version__}")
    assert cli_run(["env", "--json"]) == 0
    env = json.loads(capsys.readouterr().out)
    assert env["searchrl"] == __version__ and "torch" in env["libraries"] and "cuda_available" in env["accelerators"]
    assert cli_run(["train", "--config", "demo-cpu", "stage1.steps=3", "--print-config"]) == 0
    printed = yaml.safe_load(capsys.readouterr().out)
    assert printed["stage1"]["steps"] == 3 and printed["model"] == "smollm2-135m"
    assert cli_run(["eval", "run", "--method", "rag", "--index", "toyworld", "-k", "2", "--print-config"]) == 0
    printed = yaml.safe_load(capsys.readouterr().out)
    assert (printed["method"], printed["rollout"]["k"], printed["retrieval"]["index"]) == ("rag", 2, "toyworld")


def test_a_config_error_of_the_whole_config_is_one_plain_line(capsys):
    assert cli_run(["eval", "run", "--method", "rag", "--model", "tiny-random", "--print-config"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Value error" not in err and ": :" not in err
    assert err.startswith("error: invalid EvalConfig: method 'rag' retrieves: give an index")


def _every_command(group: click.Group, path: tuple[str, ...] = ()):
    for name, cmd in group.commands.items():
        if isinstance(cmd, click.Group):
            yield from _every_command(cmd, (*path, name))
        else:
            yield (*path, name), cmd


def test_help_shows_every_option_name_whole_at_80_columns_in_a_pipe():
    runner = CliRunner()
    root = typer.main.get_command(app)
    for path, cmd in _every_command(root):
        result = runner.invoke(app, [*path, "--help"], env={"COLUMNS": "80", "TERM": "dumb"}, terminal_width=80)
        assert result.exit_code == 0, (path, result.output)
        assert "…" not in result.output, path
        words = set(re.findall(r"(?<![\w-])--?[\w][\w-]*(?:/--[\w-]+)?", result.output))
        for param in cmd.params:
            for opt in [*param.opts, *param.secondary_opts]:
                if opt.startswith("-"):
                    assert opt in words or any(opt in w.split("/") for w in words), (path, opt)
        assert max(len(line) for line in result.output.splitlines()) <= 80, path


def test_train_help_lists_every_packaged_recipe():
    result = CliRunner().invoke(app, ["train", "--help"], env={"COLUMNS": "200"})
    text = " ".join(result.output.split())
    for path in CONFIG_DIR.glob("*.yaml"):
        first = next(line for line in path.read_text().splitlines() if line.startswith("#")).lstrip("#").strip()
        said = re.search(rf"{re.escape(path.stem)}: (.*?\.)(?= [\w.-]+: | Arguments:|$)", text)
        assert said and first.startswith(said.group(1).rstrip(".")) and len(said.group(1)) > 20, path.stem


def test_training_progress_says_step_k_of_n_and_the_time_left(tmp_path, capsys):
    logger = RunLogger(tmp_path, report_to=[], stages={1: (0, 2), 2: (2, 3)})
    for stage, step in ((1, 1), (1, 2), (2, 3), (2, 5)):
        logger.log({"stage": stage, "step": step})
    lines = capsys.readouterr().err.splitlines()
    assert lines[0].startswith("stage 1 step 1/2 (run 1/5, ") and lines[0].split(" | ")[0].endswith(" left)")
    assert lines[2].startswith("stage 2 step 1/3 (run 3/5, ") and lines[3].startswith("stage 2 step 3/3 (run 5/5, done)")
    assert (format_duration(42), format_duration(185), format_duration(7620)) == ("42s", "3m05s", "2h07m")
