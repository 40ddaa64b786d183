"""`searchrl plot RUN`: paper-style training curves from metrics.jsonl."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from searchrl.cli import app
from searchrl.errors import SearchRLError
from searchrl.eval.plots import CURVES, _smooth, plot_run


def _run(tmp_path):
    run = tmp_path / "run"
    run.mkdir(parents=True)
    with (run / "metrics.jsonl").open("w") as fh:
        for step in range(1, 9):
            stage = 1 if step <= 4 else 2
            fh.write(json.dumps({
                "stage": stage, "step": step, "reward": step / 8, "response_tokens": 50 + step,
                "searches": step / 4, "format_ok": 0.5, "answer_f1": 0.1 * stage, "kl": None,
            }) + "\n")
    return run


def test_plot_writes_one_png_per_curve_and_a_grid(tmp_path):
    paths = plot_run(_run(tmp_path))
    assert [p.name for p in paths] == [f"{key}.png" for key, _, _ in CURVES] + ["training_curves.png"]
    for p in paths:
        assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and p.stat().st_size > 5000


def test_plot_cli_and_errors(tmp_path):
    run = _run(tmp_path)
    result = CliRunner().invoke(app, ["plot", str(run), "--out", str(tmp_path / "figs"), "--window", "2"])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "figs" / "reward.png").is_file()
    with pytest.raises(SearchRLError, match="metrics.jsonl"):
        plot_run(tmp_path / "nothing-here")
    torn = tmp_path / "torn"
    torn.mkdir()
    (torn / "metrics.jsonl").write_text('{"stage": 1, "st')  # killed while writing its first step
    with pytest.raises(SearchRLError, match="metrics.jsonl is missing or holds no complete step record"):
        plot_run(torn)


def test_smooth_is_a_trailing_mean():
    assert _smooth([1.0, 3.0, 5.0, 7.0], 2) == [1.0, 2.0, 4.0, 6.0]


def test_plot_skips_a_torn_last_line_with_a_note(tmp_path, capsys):
    run = _run(tmp_path)
    with (run / "metrics.jsonl").open("a") as fh:
        fh.write('{"stage": 2, "step": 9, "rew')  # a crash mid-write
    result = CliRunner().invoke(app, ["plot", str(run)])
    assert result.exit_code == 0, result.output
    assert "metrics.jsonl:9: the last line is cut off" in result.stderr
    assert (run / "plots" / "training_curves.png").is_file()


def test_alarms_and_rolled_back_steps_are_marked(tmp_path, monkeypatch):
    import matplotlib.axes

    run = _run(tmp_path)
    (run / "alarms.jsonl").write_text(json.dumps({"monitor": "answer_echo", "stage": 2, "step": 7}) + "\n")
    (run / "rollbacks.jsonl").write_text(json.dumps({"rollback": 1, "monitor": "search_collapse", "step": 6, "to_step": 4}) + "\n")
    with (run / "metrics.rolled_back.jsonl").open("w") as fh:
        for step in (5, 6):
            fh.write(json.dumps({"stage": 2, "step": step, "rollback": 1, "searches": 0.0, "reward": -1.0}) + "\n")
    drawn = []
    real_axvline, real_plot = matplotlib.axes.Axes.axvline, matplotlib.axes.Axes.plot
    monkeypatch.setattr(matplotlib.axes.Axes, "axvline",
                        lambda ax, x, **kw: drawn.append(("vline", x, kw.get("color"))) or real_axvline(ax, x, **kw))
    monkeypatch.setattr(matplotlib.axes.Axes, "plot",
                        lambda ax, *a, **kw: drawn.append(("plot", a[:2], kw.get("color"))) or real_plot(ax, *a, **kw))
    plot_run(run)
    per_figure = len(CURVES) * 2  # one PNG per curve and the grid
    assert drawn.count(("vline", 7, "tab:red")) == per_figure
    assert drawn.count(("plot", ((5, 6), (0.0, 0.0)), "gray")) == 2  # searches: its own PNG and the grid
    assert drawn.count(("plot", (6, 0.0), "tab:red")) == 2  # the cross where the alarm rolled it back


def test_odd_lines_are_skipped_with_one_warning_and_odd_numbers_still_plot(tmp_path):
    run = _run(tmp_path)
    with (run / "metrics.jsonl").open("a") as fh:
        fh.write('"step 9"\n{"stage": 2, "reward": 1.0}\n{"stage": 2, "step": 9, "reward": "high"}\n')
        fh.write('{"stage": 2, "step": 10, "reward": NaN, "searches": Infinity, "response_tokens": 1e999}\n')
    (run / "alarms.jsonl").write_text('{"monitor": "x", "step": null}\n')
    result = CliRunner().invoke(app, ["plot", str(run)])
    assert result.exit_code == 0, (result.output, result.exception)
    assert (f"warning: {run / 'metrics.jsonl'}: skipped 3 line(s) that are not records of this file: line 9 (a JSON string, "
            'not an object); line 10 (no `step`); line 11 (`reward` is "high", not a number)') in result.stderr
    assert "alarms.jsonl: skipped 1 line(s) that are not records of this file: line 1 (`step` is null, not an integer)" in result.stderr
    assert (run / "plots" / "training_curves.png").stat().st_size > 5000


def test_two_runs_are_overlaid_a_colour_and_a_legend_entry_each(tmp_path, monkeypatch):
    import doctest

    import matplotlib.axes

    from searchrl.eval import plots

    first = _run(tmp_path / "a")
    second = _run(tmp_path / "b")
    with (second / "metrics.jsonl").open("a") as fh:  # a longer run
        fh.write(json.dumps({"stage": 2, "step": 9, "reward": 0.0, "response_tokens": 60, "searches": 1.0,
                             "format_ok": 1.0, "answer_f1": 0.5}) + "\n")
    labels = []
    real_plot = matplotlib.axes.Axes.plot
    monkeypatch.setattr(matplotlib.axes.Axes, "plot",
                        lambda ax, *a, **kw: labels.append((kw.get("label"), kw.get("color"), len(a[0]))) or real_plot(ax, *a, **kw))
    result = CliRunner().invoke(app, ["plot", str(first), str(second), "--out", str(tmp_path / "figs")])
    assert result.exit_code == 0, result.output
    path = tmp_path / "figs" / "overlay.png"
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and "2 runs overlaid" in result.output
    legend = [entry for entry in labels if entry[0]]
    assert legend == [("a/run", "C0", 8), ("b/run", "C1", 9)] * len(CURVES)  # same-named runs told apart
    assert plots.overlay_series(plots.read_metrics(second), "answer_f1") == (list(range(1, 10)), [0.1] * 4 + [0.2] * 4 + [0.5])
    assert doctest.testmod(plots).failed == 0
