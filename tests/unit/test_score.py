"""Scoring prediction files: the three record shapes, verdicts, and errors that name file:line."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from searchrl.cli import app
from searchrl.errors import DataError, DataWarning
from searchrl.eval.score import SCORE_KEYS, read_predictions, score_file, score_records


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def test_all_three_shapes_score_alike(tmp_path: Path) -> None:
    ours = write_jsonl(
        tmp_path / "ours.jsonl",
        [
            {"answers": ["Paris"], "prediction": "Paris, France", "judge": True},
            {"answers": ["Rome", "Roma"], "prediction": None, "judge": False},
        ],
    )
    r1 = write_jsonl(
        tmp_path / "r1.jsonl",
        [
            {
                "question": "q",
                "answer": "Paris",
                "pred_ans": " Paris, France ",
                "gpt4o_output": "True",
            },
            {
                "question": "q",
                "answer": ["Rome", "Roma"],
                "pred_ans": None,
                "gpt4o_output": "False",
            },
        ],
    )
    # FlashRAG writes a JSON array with the prediction under `output`.
    flash = tmp_path / "flash.json"
    flash.write_text(
        json.dumps(
            [
                {"golden_answers": ["Paris"], "output": {"pred": "Paris, France"}},
                {"golden_answers": ["Rome", "Roma"], "pred": ""},
            ]
        )
    )
    expected = {
        "n": 2,
        "em": 0.0,
        "f1": pytest.approx(1 / 3),
        "cover_em": 0.5,
        "cover_em_substring": 0.5,
    }
    for path in (ours, r1):
        scores = score_file(path)
        assert tuple(scores) == SCORE_KEYS
        assert scores == {**expected, "acc_l": 0.5}
    assert score_file(flash) == {**expected, "acc_l": None}


def test_acc_l_counts_only_judged_records() -> None:
    rows = [
        {"answers": ["a b"], "prediction": "x", "judge": True},
        {"answers": ["a b"], "prediction": "x", "judge": None},
        {"answers": ["a b"], "prediction": "x"},
    ]
    assert score_records(rows)["acc_l"] == 1.0
    assert score_records(rows[1:])["acc_l"] is None


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("{not json", "invalid JSON"),
        ('{"answers": [], "prediction": "x"}', "non-empty list"),
        ('{"answers": ["a"], "prediction": 3}', "`prediction` must be a string or null"),
        ('{"answer": "a", "pred_ans": "a", "gpt4o_output": "maybe"}', "gpt4o_output"),
        ('{"golden_answers": ["a"]}', "no `pred`"),
        ('{"q": 1}', "unknown record shape"),
        ("[1", "invalid JSON"),
    ],
)
def test_malformed_line_names_file_and_line(tmp_path: Path, line: str, message: str) -> None:
    path = tmp_path / "preds.jsonl"
    path.write_text('{"answers": ["a"], "prediction": "a"}\n' + line + "\n", encoding="utf-8")
    with pytest.raises(DataError, match=message) as info:
        read_predictions(path)
    assert f"{path}:2" in str(info.value)


def test_missing_and_empty_files(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="no such predictions file"):
        score_file(tmp_path / "absent.jsonl")
    (tmp_path / "empty.jsonl").write_text("\n\n")
    with pytest.raises(DataError, match="holds no predictions"):
        score_file(tmp_path / "empty.jsonl")


def test_cli_json_and_table(tmp_path: Path) -> None:
    path = write_jsonl(
        tmp_path / "p.jsonl", [{"answers": ["Paris"], "prediction": "paris", "judge": True}]
    )
    runner = CliRunner()
    out = runner.invoke(app, ["eval", "score", str(path), "--json"])
    assert out.exit_code == 0, out.output
    assert json.loads(out.stdout) == {
        "n": 1,
        "em": 1.0,
        "f1": 1.0,
        "cover_em": 1.0,
        "cover_em_substring": 1.0,
        "acc_l": 1.0,
    }
    table = runner.invoke(app, ["eval", "score", str(path)])
    assert table.exit_code == 0
    assert "token cover" in table.stdout and "100.0" in table.stdout


def test_cli_reports_bad_file_without_traceback(tmp_path: Path) -> None:
    import subprocess
    import sys

    path = tmp_path / "bad.jsonl"
    path.write_text('{"answers": ["a"]}\n')
    proc = subprocess.run(
        [sys.executable, "-c", "from searchrl.cli import main; main()", "eval", "score", str(path)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 2
    assert f"{path}:1" in proc.stderr and "Traceback" not in proc.stderr


def test_doctests_pass() -> None:
    import doctest

    from searchrl.eval import score

    result = doctest.testmod(score)
    assert result.attempted >= 1 and result.failed == 0


def test_directory_and_non_utf8_files_are_clear_errors(tmp_path: Path) -> None:
    with pytest.raises(DataError, match=r"is a directory; pass the predictions file in it"):
        score_file(tmp_path)
    path = tmp_path / "latin1.jsonl"
    path.write_bytes(b'{"answers": ["a"], "prediction": "a"}\n{"answers": ["\xe9"], "prediction": "a"}\n')
    result = CliRunner().invoke(app, ["eval", "score", str(path)])
    assert isinstance(result.exception, DataError)
    assert str(result.exception).startswith(f"{path}:2: not UTF-8 text")


@pytest.mark.parametrize("gold", ["NaN", "Infinity", "1e400", "[1, NaN]"])
def test_non_finite_gold_numbers_are_rejected(tmp_path: Path, gold: str) -> None:
    # Python's json reads them as floats whose text ("nan", "inf") a prediction could match.
    path = tmp_path / "preds.jsonl"
    path.write_text('{"answers": ["a"], "prediction": "a"}\n' f'{{"answers": {gold}, "prediction": "nan"}}\n')
    with pytest.raises(DataError, match=rf"{path}:2: `answers` holds (nan|inf), not a finite number"):
        read_predictions(path)


def test_repeated_ids_are_scored_once_at_their_first_record_with_a_warning(tmp_path: Path) -> None:
    rows = [
        {"id": "a", "answers": ["x"], "prediction": "x"},
        {"id": "b", "answers": ["y"], "prediction": "no"},
        {"id": "a", "answers": ["x"], "prediction": "wrong"},  # e.g. a second run appended
        {"id": "b", "answers": ["y"], "prediction": "y"},
        {"id": "b", "answers": ["y"], "prediction": "y"},
        {"answers": ["z"], "prediction": "z"},  # records without ids are all kept
        {"answers": ["z"], "prediction": "z"},
    ]
    path = write_jsonl(tmp_path / "twice.jsonl", rows)
    with pytest.warns(DataWarning) as caught:
        result = CliRunner().invoke(app, ["eval", "score", str(path), "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["n"] == 4 and json.loads(result.stdout)["em"] == 0.75  # a, b (first: wrong), z, z
    (warning,) = [str(w.message) for w in caught if issubclass(w.category, DataWarning)]
    assert warning == (
        f"{path}: 2 id(s) occur more than once (3 extra record(s)): 'a', 'b'; scored each id once, at its first record"
    )
    with pytest.warns(DataWarning):
        assert score_file(path)["n"] == 4


@pytest.mark.parametrize(
    "field, value, message",
    [("id", {"k": 1}, "`id` must be a string or an integer, got dict"), ("question", ["Q?"], "`question` must be a string or null, got list")],
)
def test_ids_and_questions_must_be_text(tmp_path: Path, field: str, value, message: str) -> None:
    path = write_jsonl(tmp_path / "p.jsonl", [{"answers": ["a"], "prediction": "a", field: value}])
    with pytest.raises(DataError, match=re.escape(f"{path}:1: {message}")):
        read_predictions(path)
    write_jsonl(path, [{"id": 3, "answers": ["a"], "prediction": "a"}])
    assert read_predictions(path)[0].id == "3"
