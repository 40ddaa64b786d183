"""Every `searchrl` command in the README's and the docs' shell blocks parses: the command exists,
every option it gives is one of that command's, and every packaged config it names (`--config`)
is there. A renamed flag or command fails here, not in a reader's terminal."""

from __future__ import annotations

import functools
import re
import shlex
from pathlib import Path

import pytest
import typer

from searchrl.cli import app

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
SHELL = re.compile(r"^```(?:bash|sh|shell|console)\n(.*?)^```", re.M | re.S)


def _commands(text: str) -> list[str]:
    """The `searchrl …` lines of a page's shell blocks, continuations joined, comments dropped."""
    found = []
    for block in SHELL.findall(text):
        for line in block.replace("\\\n", " ").splitlines():
            line = line.strip().removeprefix("$ ")
            line = re.sub(r"^(?:[A-Z_]+=\S+\s+)*", "", line)  # environment variables set for the command
            line = re.sub(r"^torchrun\b.*?-m searchrl\b", "searchrl", line)
            if line.startswith(("searchrl ", "python -m searchrl ")):
                found.append(line.removeprefix("python -m "))
    return found


def _split(line: str) -> list[str]:
    words = shlex.split(line, comments=True)
    for stop in ("|", ">", "&&", ";", "2>&1"):  # what follows is the shell's
        if stop in words:
            words = words[: words.index(stop)]
    return words[1:]


@functools.cache
def _root_command():
    return typer.main.get_command(app)


CASES = [pytest.param(line, id=f"{page.relative_to(ROOT)}:{line[:60]}")
         for page in PAGES for line in _commands(page.read_text(encoding="utf-8"))]


def test_the_pages_have_commands_to_check():
    assert len(CASES) > 50


@pytest.mark.parametrize("line", CASES)
def test_a_documented_command_parses(line):
    args = _split(line)
    command = _root_command()
    path = ["searchrl"]
    while hasattr(command, "commands") and args and not args[0].startswith("-"):
        assert args[0] in command.commands, f"{' '.join(path)} has no command {args[0]!r}: {line}"
        command = command.commands[args[0]]
        path.append(args.pop(0))
    options = {opt for param in command.params for opt in (*param.opts, *param.secondary_opts)}
    for word in args:
        if word.startswith("--") and "…" not in word:
            name = word.split("=", 1)[0]
            assert name in options, f"`{' '.join(path)}` has no option {name}: {line}"
    if "--config" in args:  # a shipped config must be there; other names are the reader's own files
        value = args[args.index("--config") + 1]
        packaged = ROOT / "src" / "searchrl" / "configs"
        if value.startswith("configs/"):
            assert (ROOT / value).is_file() or (packaged / value.removeprefix("configs/")).is_file(), line
        elif "/" not in value and not value.endswith((".yaml", ".yml")):
            assert (packaged / f"{value}.yaml").is_file(), f"no packaged config {value!r}: {line}"


@pytest.mark.parametrize(("line", "why"), [
    ("searchrl eval run --web-allow-priv --out x", "has no option --web-allow-priv"),
    ("searchrl eval runn --out x", "has no command 'runn'"),
    ("searchrl train --config no-such-recipe", "no packaged config 'no-such-recipe'"),
])
def test_a_renamed_flag_command_or_recipe_fails(line, why):
    with pytest.raises(AssertionError, match=re.escape(why)):
        test_a_documented_command_parses(line)
