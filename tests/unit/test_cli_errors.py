"""The CLI's one error printer and its exit codes; every command driven with hostile arguments.

Commands are enumerated from the Typer app, so a new command is driven too: its required
parameters get each hostile value, and a command without required parameters fails the coverage
test until SLOTS says where a hostile value goes. Cases run in this interpreter through
`cli.run` (what `searchrl` runs, less the `sys.exit`), so the heavy imports are paid once.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import typer

from searchrl import cli
from searchrl.errors import (
    EXIT_INTERNAL,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_USAGE,
    DataWarning,
    SearchRLError,
)

REPO = Path(__file__).resolve().parents[2]

# Hostile values: markup in a name that does not exist (relative, then absolute), a directory
# where a file is expected. Each must be named literally in the one-line error.
HOSTILE = {"markup": "[bold]x[/]", "missing": "{tmp}/res[v2].jsonl", "folder": "{tmp}/d[v2]"}
# Where a command without required parameters takes the hostile value "{X}" (None: it takes no
# input at all); also commands whose required parameters are not where hostile input belongs.
SLOTS: dict[str, list[str] | None] = {
    "ask": ["What is it?", "--model", "tiny-random", "--index", "{X}"],
    "data compose": ["--take", "{X}", "--out", "{tmp}/composed.jsonl"],
    "data list": None,
    "env": None,  # no input
    "data localwiki": None,  # only --out: a new folder is valid input (see OUT)
    "data select": ["--dataset", "{X}", "--model", "tiny-random", "--out", "{tmp}/select"],
    "data toyworld": None,  # only --out, as data localwiki
    "demo": ["--config", "{X}", "--out", "{tmp}/demo"],
    "eval report": ["--config", "{X}", "--out", "{tmp}/report"],
    "eval retrieval": ["--dataset", "{X}", "--index", "toyworld"],
    "export": ["{X}", "--out", "{tmp}/export"],
    "eval run": ["--model", "tiny-random", "--dataset", "{X}", "--index", "toyworld", "--out", "{tmp}/run"],
    "eval second-hop": ["--model", "tiny-random", "--dataset", "{X}", "--index", "toyworld", "--out", "{tmp}/second-hop"],
    "index search": ["{X}", "a query"],
    "model prepare": ["{X}"],
    "train": ["--config", "{X}", "--out", "{tmp}/train"],
}
# An existing file where an output folder goes, or a folder where an output file goes; every
# other argument valid, so the output is what must be refused, leaving both as they were.
OUT = {
    "data compose": ["--take", "toyworld:train=2", "--out", "{folder}"],
    "data localwiki": ["--out", "{file}"],
    "data select": ["--dataset", "toyworld:train", "--limit", "1", "--model", "tiny-random", "--out", "{file}"],
    "data toyworld": ["--out", "{file}", "--passages", "100", "--train", "5", "--test", "5"],
    "demo": ["--out", "{file}", "--no-train", "--eval-limit", "1"],
    "eval compare": ["{evaldir}", "--out", "{folder}"],
    "eval by-type": ["{evaldir}", "--out", "{file}"],
    "eval second-hop": ["--model", "tiny-random", "--index", "toyworld", "--no-probe", "--out", "{file}"],
    "eval report": ["--model", "tiny-random", "--datasets", "bamboogle", "--methods", "direct", "--limit", "1", "--out", "{file}"],
    "eval run": ["--model", "tiny-random", "--method", "direct", "--limit", "1", "--out", "{file}"],
    "export": ["{traindir}", "--out", "{file}"],
    "eval score": ["{evaldir}/predictions.jsonl", "--judged-out", "{folder}"],
    "index build": ["{corpus}", "--out", "{file}"],
    "plot": ["{traindir}", "--out", "{file}"],
    "train": ["--config", "{repo}/configs/demo-cpu.yaml", "model=tiny-random", "--out", "{file}"],
    "view": ["{evaldir}/predictions.jsonl", "--out", "{folder}"],
}
OUT_OPTIONS = ("--out", "--judged-out")
# Hostile content (issue 29, "Tracebacks shown to users"): each must be one error line too.
CONTENT = {
    "data show <deep json>": ["data", "show", "{deep}"],
    "eval score <deep json>": ["eval", "score", "{deep}"],
    "view <deep json>": ["view", "{deep}", "--out", "{tmp}/deep.html"],
    "index build <deep json>": ["index", "build", "{deep}", "--out", "{tmp}/deep-index"],
    "data show <question 123>": ["data", "show", "{q123}"],
    "eval run <yaml tag in --set>": ["eval", "run", "--model", "tiny-random", "--limit", "1",
                                     "--set", 'rollout.k=!!python/object/apply:os.system ["true"]'],
}


def _commands() -> dict[str, typer.core.TyperCommand]:
    def walk(command, path):
        if hasattr(command, "commands"):
            for name, sub in command.commands.items():
                yield from walk(sub, (*path, name))
        else:
            yield " ".join(path), command

    return dict(sorted(walk(typer.main.get_command(cli.app), ())))


COMMANDS = _commands()


def _slots(name: str) -> list[str] | None:
    """Where the hostile value goes: SLOTS, else every required parameter."""
    if name in SLOTS:
        return SLOTS[name]
    args: list[str] = []
    for param in COMMANDS[name].params:
        if param.required:
            args += ["{X}"] if param.param_type_name == "argument" else [param.opts[0], "{X}"]
    assert args, f"command {name!r} has no required parameter: say in SLOTS where a hostile value goes"
    return args


def _hostile_cases() -> list:
    cases = []
    for name in COMMANDS:
        slots = _slots(name)
        for label in HOSTILE if slots is not None else ():
            case_id = f"{name} <{label}>"
            cases.append(pytest.param(name.split() + slots, HOSTILE[label], id=case_id))
    return cases


def _cases(table: dict[str, list[str]]) -> list:
    """pytest params of `table` (case id -> command line)."""
    return [pytest.param(args, id=case_id) for case_id, args in table.items()]


@pytest.fixture(scope="module")
def place(tmp_path_factory) -> dict[str, str]:
    """The files the cases name: hostile ones, and valid inputs for the --out cases."""
    tmp = tmp_path_factory.mktemp("hostile")
    (tmp / "d[v2]").mkdir()
    (tmp / "folder[v2]").mkdir()
    (tmp / "out[v2].txt").write_text("not yours\n")
    corpus = tmp / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"id": f"p{i}", "title": f"T{i}", "text": f"Town {i} lies on a river."}) + "\n" for i in range(4)))
    evaldir = tmp / "eval"
    evaldir.mkdir()
    record = {"question_id": "q1", "question": "Where?", "answers": ["Tessaly"], "prediction": "Tessaly",
              "segments": [{"text": "<answer>Tessaly</answer>", "source": "policy"}]}
    (evaldir / "predictions.jsonl").write_text(json.dumps(record) + "\n")
    (evaldir / "metrics.json").write_text(json.dumps({"n": 1, "em": 1.0, "f1": 1.0}))
    traindir = tmp / "train"
    traindir.mkdir()
    (traindir / "metrics.jsonl").write_text("".join(
        json.dumps({"stage": 1, "step": s, "reward": 0.5, "response_tokens": 50, "searches": 1.0, "format_ok": 0.5, "answer_f1": 0.1})
        + "\n" for s in (1, 2)))
    (tmp / "deep.jsonl").write_text("[" * 100_000 + "]" * 100_000 + "\n")
    (tmp / "q123.jsonl").write_text(json.dumps({"id": "a", "question": 123, "answers": ["x"]}) + "\n")
    (tmp / "many.jsonl").write_text(json.dumps({**record, "n_searches": "many"}) + "\n")
    return {"repo": str(REPO), "tmp": str(tmp), "deep": str(tmp / "deep.jsonl"), "q123": str(tmp / "q123.jsonl"),
            "many": str(tmp / "many.jsonl"), "folder": str(tmp / "folder[v2]"), "file": str(tmp / "out[v2].txt"),
            "corpus": str(corpus), "evaldir": str(evaldir), "traindir": str(traindir)}


def _fill(args: list[str], values: dict[str, str]) -> list[str]:
    return [a.format(**values) for a in args]


def _one_error_line(code: int, out: str, err: str, args: list[str]) -> str:
    shown = f"searchrl {' '.join(args)}\nexit {code}\nstderr: {err!r}"
    assert code == EXIT_USAGE, shown
    assert err.startswith("error: ") and err.count("\n") == 1 and err.endswith("\n"), shown
    assert "Traceback" not in out + err, shown
    return err


def test_every_command_is_driven():
    assert {"ask", "eval run", "index build", "serve", "view", "health"} <= set(COMMANDS)
    for name in COMMANDS:
        _slots(name)  # raises for a command nobody said how to drive
    for name, command in COMMANDS.items():
        if any(o in OUT_OPTIONS for p in command.params for o in getattr(p, "opts", [])):
            assert name in OUT, f"command {name!r} writes to an output path: add an existing-file case to OUT"
    assert set(SLOTS) | set(OUT) <= set(COMMANDS)  # no case for a command that is gone


@pytest.fixture
def crash_reports_in_tmp(monkeypatch, tmp_path):
    """Tracebacks of failing cases saved under tmp_path, not in the user's cache."""
    real = cli._save_traceback

    def save(exc, argv):
        with monkeypatch.context() as patch:
            patch.setenv("SEARCHRL_HOME", str(tmp_path / "home"))
            return real(exc, argv)

    monkeypatch.setattr(cli, "_save_traceback", save)


@pytest.mark.usefixtures("crash_reports_in_tmp")
@pytest.mark.parametrize(("args", "value"), _hostile_cases())
def test_hostile_argument_is_one_error_line(args, value, place, capsys, monkeypatch):
    monkeypatch.chdir(place["tmp"])
    value = value.format(**place)
    args = _fill(args, {**place, "X": value})
    err = _one_error_line(cli.run(args), *capsys.readouterr(), args)
    assert Path(value).name in err  # named, literally: markup was not parsed away
    if Path(value).is_dir():
        assert not re.search(r"does not exist|no such", err, re.IGNORECASE), err  # it exists: say what it is


@pytest.mark.usefixtures("crash_reports_in_tmp")
@pytest.mark.parametrize("args", _cases({f"{name} <out>": name.split() + args for name, args in OUT.items()}))
def test_an_output_that_is_not_writable_is_one_error_line(args, place, capsys, monkeypatch):
    monkeypatch.chdir(place["tmp"])
    before = Path(place["file"]).read_text()
    args = _fill(args, place)
    _one_error_line(cli.run(args), *capsys.readouterr(), args)
    assert Path(place["file"]).read_text() == before and not any(Path(place["folder"]).iterdir())


@pytest.mark.usefixtures("crash_reports_in_tmp")
@pytest.mark.parametrize("args", _cases(CONTENT))
def test_hostile_content_is_one_error_line(args, place, capsys, monkeypatch):
    monkeypatch.chdir(place["tmp"])
    args = _fill(args, place)
    _one_error_line(cli.run(args), *capsys.readouterr(), args)


def test_a_count_that_is_no_number_is_one_warning_line_not_an_error(place, capsys, monkeypatch):
    monkeypatch.chdir(place["tmp"])
    args = _fill(["view", "{many}", "--out", "{tmp}/many.html"], place)
    with pytest.warns(DataWarning, match=r"`n_searches` is not a valid number on line\(s\) 1 \(e.g. \"many\"\)"):
        assert cli.run(args) == EXIT_OK
    assert Path(place["tmp"], "many.html").is_file()


# --- the printer itself ------------------------------------------------------------------------


def _fail_with(monkeypatch, exc: BaseException) -> None:
    """Make `searchrl eval score` raise `exc` (the command imports its function when it runs)."""
    from searchrl.eval import score

    def fail(*args, **kwargs):
        raise exc

    monkeypatch.setattr(score, "score_command", fail)


def test_a_searchrl_error_is_one_literal_line_and_exit_2(monkeypatch, capsys):
    _fail_with(monkeypatch, SearchRLError("invalid EvalConfig in res[v2].yaml:\n  rollout.k: [/] too big\n  seed: \x1b[2Jbad"))
    assert cli.run(["eval", "score", "x"]) == EXIT_USAGE
    out, err = capsys.readouterr()
    assert err == "error: invalid EvalConfig in res[v2].yaml: rollout.k: [/] too big; seed: \\x1b[2Jbad\n"
    assert out == ""


def test_a_long_error_is_not_wrapped(monkeypatch, capsys):
    _fail_with(monkeypatch, SearchRLError("word " * 100))
    cli.run(["eval", "score", "x"])
    assert capsys.readouterr().err.count("\n") == 1


def test_a_bug_is_one_line_naming_its_saved_traceback_and_exit_3(monkeypatch, capsys, tmp_path):
    monkeypatch.setenv("SEARCHRL_HOME", str(tmp_path / "home"))
    _fail_with(monkeypatch, KeyError("[bold]key[/]"))
    assert cli.run(["eval", "score", "res[v2].jsonl"]) == EXIT_INTERNAL
    err = capsys.readouterr().err
    match = re.fullmatch(r"internal error: KeyError: '\[bold\]key\[/\]' — the traceback is in (\S+); please report it\n", err)
    assert match, err
    saved = Path(match.group(1))
    assert saved.parent == tmp_path / "home" / "crash" and re.fullmatch(rf"\d{{8}}-\d{{6}}-{os.getpid()}\.txt", saved.name)
    report = saved.read_text()
    assert report.startswith("searchrl eval score res[v2].jsonl\n")
    assert "Traceback (most recent call last)" in report and "in fail" in report and "KeyError: '[bold]key[/]'" in report


def test_a_bug_with_an_unwritable_cache_still_is_one_line(monkeypatch, capsys, tmp_path):
    (tmp_path / "home").write_text("a file where the cache folder should be")
    monkeypatch.setenv("SEARCHRL_HOME", str(tmp_path / "home"))
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path / "tmp"))
    _fail_with(monkeypatch, RuntimeError("boom"))
    assert cli.run(["eval", "score", "x"]) == EXIT_INTERNAL
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and str(tmp_path / "tmp" / "searchrl-crash") in err


def test_an_os_error_on_a_path_is_bad_input(monkeypatch, capsys):
    _fail_with(monkeypatch, FileExistsError(17, "File exists", "out[v2].txt"))
    assert cli.run(["eval", "score", "x"]) == EXIT_USAGE
    assert capsys.readouterr().err == "error: out[v2].txt: File exists\n"


def test_ctrl_c_is_one_line_and_exit_130(monkeypatch, capsys):
    _fail_with(monkeypatch, KeyboardInterrupt())
    assert cli.run(["eval", "score", "x"]) == EXIT_INTERRUPTED == 130
    assert capsys.readouterr().err == "error: interrupted\n"


def test_only_rank_0_prints_under_torchrun(monkeypatch, capsys):
    monkeypatch.setenv("RANK", "1")
    _fail_with(monkeypatch, SearchRLError("every rank fails alike"))
    assert cli.run(["eval", "score", "x"]) == EXIT_USAGE
    assert capsys.readouterr().err == ""


def test_usage_errors_exit_2_and_help_lists_the_exit_codes(capsys):
    assert cli.run(["eval", "score", "--no-such-flag"]) == EXIT_USAGE
    assert "No such option" in capsys.readouterr().err
    assert cli.run(["data", "show", "x", "--limit", "[bold]many[/]"]) == EXIT_USAGE
    assert "Invalid value for '--limit'" in capsys.readouterr().err
    assert cli.run(["--help"]) == EXIT_OK
    text = " ".join(capsys.readouterr().out.split())
    assert "Exit codes, the same for every command: 0 success; 1 a finding" in text and "3 an internal error" in text


def test_data_warnings_are_one_line():
    line = cli._format_warning(DataWarning("ids repeat:\n  q1 [x]\n  q2"), DataWarning, "f.py", 1)
    assert line == "warning: ids repeat: q1 [x]; q2\n"
    with warnings.catch_warnings():
        assert "UserWarning" in cli._format_warning(UserWarning("other"), UserWarning, "f.py", 1)


def test_the_installed_entry_point_exits_with_the_code(tmp_path):
    """`python -m searchrl` (what torchrun and the console script run): exit code and one line."""
    proc = subprocess.run(
        [sys.executable, "-m", "searchrl", "eval", "score", str(tmp_path / "res[v2].jsonl")],
        env={**os.environ, "PYTHONPATH": str(REPO / "src")}, capture_output=True, text=True, timeout=120, check=False,
    )
    assert proc.returncode == EXIT_USAGE
    assert proc.stderr == f"error: {tmp_path}/res[v2].jsonl: no such predictions file\n"
