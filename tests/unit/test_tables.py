"""Tables readable anywhere (`searchrl.tables`): `eval compare` piped is Markdown, in an
80-column terminal it keeps whole cells and names the columns left out; paths become run names."""

from __future__ import annotations

import doctest
import io
import json

import pytest
from rich.console import Console

from searchrl import tables
from searchrl.eval.compare import compare_command

RUN = "hotpotqa-r1searcher-stage2-lr2e-6"


@pytest.fixture
def runs(tmp_path):
    folders = []
    for name, em in ((RUN, 0.4512), ("direct", 0.2)):
        folder = tmp_path / name
        folder.mkdir()
        (folder / "metrics.json").write_text(json.dumps({
            "model": "/home/me/runs/demo/train/checkpoints/step_0030", "method": "agent", "dataset": "hotpotqa:dev",
            "n": 500, "em": em, "f1": 0.5523, "cover_em": 0.51, "format_ok_rate": 0.98, "search_rate": 0.91,
            "mean_searches": 1.73, "mean_generated_tokens": 212.4, "seconds": 913.2}))
        folders.append(str(folder))
    return folders


def _render(folders, out=None, **console) -> str:
    buf = io.StringIO()
    compare_command(folders, out, Console(file=buf, color_system=None, **console))
    return buf.getvalue()


def test_piped_compare_is_a_markdown_table_of_whole_cells(runs):
    text = _render(runs, width=80, force_terminal=False)
    rows = [line for line in text.splitlines() if line.startswith("| ")]
    assert rows[0].startswith("| run | model | method | dataset | n | EM % |")
    assert rows[1].startswith(f"| {RUN} | train/step_0030 | agent | hotpotqa:dev | 500 | 45.1 | 55.2 |")


def test_compare_in_80_columns_keeps_run_names_and_numbers_whole(runs, tmp_path):
    out = str(tmp_path / "cmp.md")
    text = _render(runs, out, width=80, force_terminal=True)
    lines = text.splitlines()
    assert all(len(line) <= 80 for line in lines)
    row = next(line for line in lines if RUN in line)  # the run name unbroken, on one line
    assert "45.1" in row and "55.2" in row
    assert "not shown (model, method, dataset" in text and "cmp.md" in text
    wide = _render(runs, width=250, force_terminal=True)
    assert "not shown" not in wide and "train/step_0030" in wide and "913.2" in wide


def test_short_path_names_runs():
    assert doctest.testmod(tables).failed == 0
