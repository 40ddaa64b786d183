"""The shared text / JSON-lines reader: every command that reads a file reports bad bytes,
broken JSON and directories as one line naming the file and line."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from searchrl.cli import app
from searchrl.data.textio import iter_json_lines, read_appended_jsonl, read_lines
from searchrl.errors import DataError

# Each line suits every command: a question, a prediction, a response and a passage text.
_LINE = '{"id": "%s", "question": "%s?", "answers": ["%s"], "prediction": "%s", "response": "x", "text": "%s"}\n'
LATIN1 = (_LINE % (("q1",) + ("Bern",) * 4)).encode() + (_LINE % (("q2",) + ("Z\xfcrich",) * 4)).encode("latin-1")


@pytest.mark.parametrize(
    "command",
    [
        "data show {file}",
        "eval score {file}",
        "eval format-check {file}",
        "view {file}",
        "index build {file} --out {tmp}/idx",
    ],
)
def test_commands_report_non_utf8_input_with_file_and_line(tmp_path, command):
    path = tmp_path / "latin1.jsonl"
    path.write_bytes(LATIN1)
    args = command.format(file=path, tmp=tmp_path).split()
    result = CliRunner().invoke(app, args)
    assert isinstance(result.exception, DataError), result.output
    assert str(result.exception).startswith(f"{path}:2: not UTF-8 text (byte 0xfc")


def test_read_lines_drops_the_byte_order_mark_and_reads_gzip(tmp_path):
    import gzip

    plain = tmp_path / "a.jsonl"
    plain.write_bytes(b'\xef\xbb\xbf{"a": 1}\r\n\n{"a": 2}')
    assert [v for _, v in iter_json_lines(plain)] == [{"a": 1}, {"a": 2}]
    packed = tmp_path / "a.jsonl.gz"
    packed.write_bytes(gzip.compress(b'{"a": 1}\n\xff\n'))
    with pytest.raises(DataError, match=r"a\.jsonl\.gz:2: not UTF-8 text \(byte 0xff"):
        list(read_lines(packed))


def test_torn_last_line_is_an_error_unless_the_caller_skips_it(tmp_path):
    path = tmp_path / "m.jsonl"
    path.write_text('{"a": 1}\n{"a": 2}\n{"a": ')
    with pytest.raises(DataError, match=r"m\.jsonl:3: invalid JSON at column 7"):
        list(iter_json_lines(path))
    notes: list[str] = []
    assert [v for _, v in iter_json_lines(path, on_torn_tail=notes.append)] == [{"a": 1}, {"a": 2}]
    assert notes == [f"{path}:3: the last line is cut off (no line ending, not valid JSON); skipped it"]


def test_appended_jsonl_drops_a_torn_tail_ends_the_last_line_and_names_a_bad_middle_line(tmp_path):
    path = tmp_path / "progress.jsonl"
    assert read_appended_jsonl(path, "redo") == []  # nothing written yet
    path.write_text('{"a": 1}\n{"a": 2}\n{"a": 3, "b"')  # killed mid-write
    assert read_appended_jsonl(path, "redo") == [{"a": 1}, {"a": 2}]
    assert path.read_text() == '{"a": 1}\n{"a": 2}\n'  # appending goes on after line 2
    path.write_text('{"a": 1}\n{"a": 2}')  # killed between the value and its newline
    assert read_appended_jsonl(path, "redo") == [{"a": 1}, {"a": 2}]
    assert path.read_text().endswith('{"a": 2}\n')  # the next append starts a line of its own
    path.write_text('{"a": 1}\nnot json\n{"a": 3}\n')
    with pytest.raises(DataError, match=r"progress.jsonl:2 is not JSON; delete that line \(its round"):
        read_appended_jsonl(path, "its round is then sampled again")
