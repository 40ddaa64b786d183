"""Tables readable anywhere (`searchrl.tables`): `eval compare` piped is Markdown, a column per run
so it stays narrow; in an 80-column terminal it keeps whole cells and names the runs left out;
paths become run names; runs on other questions are compared with a warning."""

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


def test_piped_compare_is_a_narrow_markdown_table_a_column_per_run(runs):
    text = _render(runs, width=80, force_terminal=False)
    rows = [line for line in text.splitlines() if line.startswith("| ")]
    assert rows[0] == f"|  | {RUN} | direct |"
    assert rows[1] == "| model | train/step_0030 | train/step_0030 |"
    assert "| EM % | 45.1 | 20.0 |" in rows and "| F1 % | 55.2 | 55.2 |" in rows
    assert not any(row.startswith("| ACC_L %") for row in rows)  # measured by no run: left out
    assert all(len(line) <= 80 for line in text.splitlines())


def test_markdown_flag_prints_markdown_on_a_terminal(runs):
    buf = io.StringIO()
    compare_command(runs, None, Console(file=buf, color_system=None, width=80, force_terminal=True), markdown=True)
    assert f"|  | {RUN} | direct |" in buf.getvalue()


def test_compare_in_80_columns_keeps_run_names_and_numbers_whole(runs, tmp_path):
    out = str(tmp_path / "cmp.md")
    text = _render(runs, out, width=80, force_terminal=True)
    lines = text.splitlines()
    assert all(len(line) <= 80 for line in lines)
    assert any(RUN in line for line in lines)  # the run name unbroken, on one line
    row = next(line for line in lines if "EM %" in line)
    assert "45.1" in row and "20.0" in row and "not shown" not in text
    narrow = _render(runs, out, width=50, force_terminal=True)
    assert all(len(line) <= 50 for line in narrow.splitlines())
    assert "not shown (direct)" in narrow and "cmp.md" in narrow


def test_runs_on_other_questions_are_compared_with_a_warning(runs, tmp_path, capsys):
    _render(runs, width=120, force_terminal=True)
    assert "warning" not in capsys.readouterr().err
    metrics = json.loads((tmp_path / "direct" / "metrics.json").read_text())
    (tmp_path / "direct" / "metrics.json").write_text(json.dumps({**metrics, "n": 3}))
    _render(runs, width=120, force_terminal=True)
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "different questions" in err and "direct: 3 of hotpotqa:dev" in err


def test_same_count_but_other_question_ids_warns(runs, tmp_path, capsys):
    for folder, ids in zip(runs, (["q1", "q2"], ["q1", "q3"])):
        (tmp_path / folder / "predictions.jsonl").write_text("".join(json.dumps({"question_id": i}) + "\n" for i in ids))
    _render(runs, width=120, force_terminal=True)
    assert "different questions" in capsys.readouterr().err


def test_short_path_names_runs():
    assert doctest.testmod(tables).failed == 0
