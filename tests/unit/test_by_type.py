"""`searchrl eval by-type` (`searchrl.eval.by_type`): per-type EM, F1 and cover-EM with bootstrap
intervals, on two hand-written runs of four questions whose scores are worked out in comments."""

from __future__ import annotations

import doctest
import json

import numpy as np
import pytest
from typer.testing import CliRunner

from searchrl.cli import app
from searchrl.errors import SearchRLError
from searchrl.eval import by_type as bt
from searchrl.eval.by_type import bootstrap_interval, by_type, parse_run, read_run, tables

GOLD = [("q1", "A", ["Paris"]), ("q2", "A", ["New York"]), ("q3", "B", ["1877"]), ("q4", "B", ["Kheno Muard"])]
# run x: q1 exact; q2 "York": F1 2/3 (p 1, r 1/2), no cover ("new" missing); q3 no answer: 0;
# q4 "born Kheno Muard": F1 0.8 (p 2/3, r 1), covered
X = ["Paris", "York", None, "born Kheno Muard"]
# run y answers Paris to everything: only q1 scores
Y = ["Paris"] * 4


def _write(folder, predictions, order=range(4)):
    folder.mkdir()
    lines = [json.dumps({"id": GOLD[i][0], "type": GOLD[i][1], "answers": GOLD[i][2], "prediction": predictions[i]})
             for i in order]
    (folder / "predictions.jsonl").write_text("\n".join(lines) + "\n")
    return folder


@pytest.fixture
def runs(tmp_path):
    return _write(tmp_path / "x", X), _write(tmp_path / "y", Y, order=[3, 1, 0, 2])  # y in another order


def test_doctests():
    assert doctest.testmod(bt).failed == 0


def test_bootstrap_interval_hand_computed():
    # n = 2, values 0 and 1: resampled means 0, 1/2, 1 with chances 1/4, 1/2, 1/4: both tails hold a value
    assert bootstrap_interval(np.array([0.0, 1.0]), 4000, 1) == (0.0, 1.0)
    # n = 4, one 1: the mean is Binomial(4, 1/4)/4: P(0) = .316 > 2.5 %, P(<= 1/2) = .949 < 97.5 % <= P(<= 3/4) = .996
    assert bootstrap_interval(np.array([0.0, 0.0, 0.0, 1.0]), 20_000, 0) == (0.0, 0.75)
    assert bootstrap_interval(np.array([0.4, 0.4, 0.4]), 100, 0) == pytest.approx((0.4, 0.4))
    # level 0.5: the 25 % and 75 % quantiles; P(0) = .316 > 25 %, P(<= 1/4) = .738 < 75 % <= P(<= 1/2) = .949
    assert bootstrap_interval(np.array([0.0, 0.0, 0.0, 1.0]), 20_000, 0, level=0.5) == (0.0, 0.5)


def test_scores_per_type_and_paired_differences(runs):
    result = by_type([read_run("x", runs[0]), read_run("y", runs[1])], baseline="y", resamples=20_000)
    assert result.types == {"all": 4, "A": 2, "B": 2}
    x, y = (result.scores[m]["x"] for m in ("em", "f1", "cover_em")), result.scores["f1"]["y"]
    em, f1, cem = x
    assert (em["all"].mean, em["A"].mean, em["B"].mean) == (0.25, 0.5, 0.0)
    assert f1["all"].mean == pytest.approx((1 + 2 / 3 + 0 + 0.8) / 4)
    assert f1["A"].mean == pytest.approx(5 / 6) and f1["B"].mean == pytest.approx(0.4)
    assert (cem["all"].mean, cem["A"].mean, cem["B"].mean) == (0.5, 0.5, 0.5)
    # y, read in another order, is aligned by id: its one hit is q1, of type A
    assert (y["all"].mean, y["A"].mean, y["B"].mean) == (0.25, 0.5, 0.0)
    # type A's F1 of x: values 1 and 2/3, so every resampled mean lies in [2/3, 1], both ends reached
    assert (f1["A"].low, f1["A"].high) == pytest.approx((2 / 3, 1.0))
    # x - y per question: EM 0, 0, 0, 0 (q1 both right): a zero interval
    d_em, d_cem = result.diffs["em"]["x"], result.diffs["cover_em"]["x"]
    assert (d_em["all"].mean, d_em["all"].low, d_em["all"].high) == (0.0, 0.0, 0.0)
    # cover-EM differences 0, 0, 0, 1: the Binomial(4, 1/4)/4 case above; type B: 0, 1
    assert (d_cem["all"].mean, d_cem["all"].low, d_cem["all"].high) == (0.25, 0.0, 0.75)
    assert (d_cem["B"].mean, d_cem["B"].low, d_cem["B"].high) == (0.5, 0.0, 1.0)
    assert "y" not in result.diffs["em"]  # no difference of the baseline to itself


def test_tables_cells(runs):
    result = by_type([read_run("x", runs[0]), read_run("y", runs[1])], baseline="y", resamples=20_000)
    (title, header, rows), *rest = tables(result)
    assert title.startswith("EM %") and header == ["run", "all (n=4)", "A (n=2)", "B (n=2)"]
    assert rows[0] == ["x", "25.0 [0.0, 75.0]", "50.0 [0.0, 100.0]", "0.0 [0.0, 0.0]"]
    assert len(rest) == 5  # F1 and cover-EM, then the three differences
    diff_cem = rest[-1]
    assert diff_cem[0].startswith("cover-EM points minus y") and diff_cem[2] == [["x", "+25.0 [+0.0, +75.0]",
                                                                                  "+0.0 [+0.0, +0.0]", "+50.0 [+0.0, +100.0]"]]


def test_refuses_runs_on_other_questions_and_clashing_names(tmp_path, runs):
    few = tmp_path / "few"
    few.mkdir()
    (few / "predictions.jsonl").write_text(json.dumps({"id": "q1", "type": "A", "answers": ["Paris"], "prediction": "x"}) + "\n")
    with pytest.raises(SearchRLError, match="answered different questions .*3 only in 'x'.*--common"):
        by_type([read_run("x", runs[0]), read_run("few", few)])
    # --common: q1 alone, which x answered right and `few` wrong
    common = by_type([read_run("x", runs[0]), read_run("few", few)], common=True, resamples=100)
    assert common.types == {"all": 1, "A": 1} and common.scores["em"]["x"]["all"].mean == 1.0
    assert common.scores["em"]["few"]["A"].mean == 0.0
    with pytest.raises(SearchRLError, match="two runs share a name"):
        by_type([read_run("x", runs[0]), read_run("x", runs[1])])
    with pytest.raises(SearchRLError, match="baseline 'z' is none of the runs"):
        by_type([read_run("x", runs[0])], baseline="z")
    with pytest.raises(SearchRLError, match="no predictions here"):
        read_run("none", tmp_path / "none")


def test_parse_run_labels():
    assert parse_run("rl=runs/demo/eval-trained-agent")[0] == "rl"
    assert parse_run("runs/demo/eval-trained-agent")[0] == "eval-trained-agent"


def test_command_writes_markdown_and_plot(tmp_path, runs):
    out = tmp_path / "cmp"
    result = CliRunner().invoke(app, ["eval", "by-type", f"mine={runs[0]}", str(runs[1]), "--out", str(out),
                                      "--baseline", "y", "--resamples", "2000"], env={"TTY_COMPATIBLE": "0"})
    assert result.exit_code == 0, result.output
    text = (out / "by_type.md").read_text()
    assert text.startswith("4 questions answered by every run. 2000 bootstrap resamples, seed 0.")
    assert "| mine | 25.0 [0.0, 75.0] | 50.0 [0.0, 100.0] | 0.0 [0.0, 0.0] |" in text
    assert "EM points minus y" in text and "| mine |" in result.stdout
    png = (out / "by_type.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000


def test_common_says_what_each_run_had_beyond_the_shared_questions(tmp_path, runs):
    few = tmp_path / "few"
    few.mkdir()
    (few / "predictions.jsonl").write_text(json.dumps({"id": "q2", "type": "A", "answers": ["New York"], "prediction": "New York"}) + "\n")
    text = bt.by_type_command([str(runs[0]), str(few)], str(tmp_path / "cmp"), resamples=100, common=True)
    assert text.startswith("1 questions answered by every run. x: 3 left out. 100 bootstrap resamples")
    assert "| x | 0.0 [0.0, 0.0] | 0.0 [0.0, 0.0] |" in text and "| few | 100.0 [100.0, 100.0] |" in text
