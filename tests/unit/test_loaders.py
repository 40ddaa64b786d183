"""Every question-file format, on tiny files, plus the errors people see for bad rows."""

from __future__ import annotations

import json
import re
import sys
import types

import pytest

from searchrl.data.loaders import detect_format, load_hf, load_questions, read_records
from searchrl.data.types import Question
from searchrl.errors import DataError, DataWarning, SearchRLError


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def write_json(path, rows):
    path.write_text(json.dumps(rows, indent=1), encoding="utf-8")
    return path


def test_own_format_roundtrips(tmp_path):
    q = Question("q1", "Who?", ("Ann", "Anne"), ("lw-000001", "lw-000002"), "bridge", "toy")
    path = write_jsonl(tmp_path / "own.jsonl", [q.to_dict()])
    assert load_questions(path) == [q]


def test_r1searcher_string_and_list_answers(tmp_path):
    path = write_jsonl(
        tmp_path / "bamboogle.jsonl",
        [
            {"idx": 7, "question": " Who founded X? ", "answer": "james madison", "gen_text_store": ""},
            {"idx": 8, "question": "Which?", "answer": ["a", "b", "a", ""]},
        ],
    )
    qs = load_questions(path)
    assert [q.id for q in qs] == ["7", "8"]
    assert qs[0].question == "Who founded X?"
    assert qs[0].answers == ("james madison",)
    assert qs[1].answers == ("a", "b")  # duplicates and blanks dropped, order kept
    assert qs[0].source == "bamboogle"  # defaults to the file stem
    assert load_questions(path, source="bb")[0].source == "bb"


def test_flashrag(tmp_path):
    path = write_jsonl(tmp_path / "f.jsonl", [{"id": "test_0", "question": "Q?", "golden_answers": ["x", "y"]}])
    (q,) = load_questions(path)
    assert (q.id, q.answers, q.supporting_ids) == ("test_0", ("x", "y"), ())


HOTPOT = {
    "_id": "h1",
    "question": "Which band?",
    "answer": "Rush",
    "type": "bridge",
    "supporting_facts": [["Neil Peart", 1], ["Nobody's Hero", 0]],
    "context": [
        ["Jeff Porcaro", ["Jeffrey Porcaro was a drummer.", " He played with Toto."]],
        ["Neil Peart", ["Neil Peart was a drummer.", " He played with Rush."]],
        ["Nobody's Hero", ["Nobody's Hero is a song by Rush."]],
    ],
}


def test_hotpotqa_json_list_with_gold_context(tmp_path):
    path = write_json(tmp_path / "hotpot.json", [HOTPOT])
    (rec,) = read_records(path)
    assert rec.question.id == "h1" and rec.question.type == "bridge" and rec.question.answers == ("Rush",)
    assert [p.title for p in rec.context] == ["Jeff Porcaro", "Neil Peart", "Nobody's Hero"]
    assert [p.supporting for p in rec.context] == [False, True, True]
    # sentences with their own leading space are rejoined with exactly one space
    assert rec.context[0].text == "Jeffrey Porcaro was a drummer. He played with Toto."


def test_hotpotqa_as_json_lines_despite_json_suffix(tmp_path):
    # Several upstream `.json` files (hotpot.json, wikihop.json) are really JSON lines.
    path = write_jsonl(tmp_path / "hotpot.json", [HOTPOT, {**HOTPOT, "_id": "h2"}])
    assert [q.id for q in load_questions(path)] == ["h1", "h2"]


def test_2wiki_rows_without_context_are_kept_without_gold(tmp_path):
    two_wiki = {**HOTPOT, "_id": "w1", "type": "compositional", "evidences": [["a", "b", "c"]]}
    no_ctx = {k: v for k, v in two_wiki.items() if k != "context"} | {"_id": "w2"}
    path = write_jsonl(tmp_path / "wikihop.json", [two_wiki, no_ctx])
    recs = read_records(path)
    assert [r.has_context for r in recs] == [True, False]
    assert recs[1].question.answers == ("Rush",)


def test_hotpotqa_hugging_face_shape(tmp_path):
    hf_row = {
        "id": "h9",
        "question": "Q?",
        "answer": "A",
        "supporting_facts": {"title": ["T2"], "sent_id": [0]},
        "context": {"title": ["T1", "T2"], "sentences": [["one."], ["two.", " three."]]},
    }
    (rec,) = read_records(write_jsonl(tmp_path / "hf.jsonl", [hf_row]))
    assert rec.question.id == "h9"
    assert [(p.title, p.text, p.supporting) for p in rec.context] == [("T1", "one.", False), ("T2", "two. three.", True)]


def test_musique_answers_aliases_and_paragraphs(tmp_path):
    row = {
        "id": "3hop1__1_2_3",
        "question": "Who?",
        "answer": "G. Stanley Hall",
        "answer_aliases": ["Stanley Hall", "G. Stanley Hall"],
        "answerable": True,
        "paragraphs": [
            {"idx": 0, "title": "A", "paragraph_text": "alpha  text", "is_supporting": False},
            {"idx": 1, "title": "B", "paragraph_text": "beta\ntext", "is_supporting": True},
        ],
    }
    (rec,) = read_records(write_json(tmp_path / "musique.json", [row]))
    assert rec.question.answers == ("G. Stanley Hall", "Stanley Hall")
    assert rec.question.type == "3hop1"
    assert [(p.text, p.supporting) for p in rec.context] == [("alpha text", False), ("beta text", True)]


def test_ircot_processed(tmp_path):
    row = {
        "question_id": "5a8c",
        "question_text": "What position?",
        "answers_objects": [{"number": "", "date": {"day": "", "month": "", "year": ""}, "spans": ["Chief of Protocol"]}],
        "contexts": [
            {"id": "0", "title": "Meet Corliss Archer", "paragraph_text": "A radio show.", "is_supporting": False},
            {"id": "1", "title": "Shirley Temple", "paragraph_text": "An actress.", "is_supporting": True},
        ],
    }
    (rec,) = read_records(write_jsonl(tmp_path / "dev_subsampled.jsonl", [row]))
    assert (rec.question.id, rec.question.question, rec.question.answers) == ("5a8c", "What position?", ("Chief of Protocol",))
    assert [p.supporting for p in rec.context] == [False, True]


def test_ircot_number_answer_when_no_span(tmp_path):
    row = {"question_id": "n", "question_text": "How many?", "answers_objects": [{"number": "3", "spans": []}]}
    (q,) = load_questions(write_jsonl(tmp_path / "n.jsonl", [row]))
    assert q.answers == ("3",)


def test_plain_question_answer_list(tmp_path):
    path = write_json(tmp_path / "qa.json", [{"question": "Q1?", "answer": "yes"}, {"question": "Q2?", "answer": "no"}])
    qs = load_questions(path, source="hp")
    assert [(q.id, q.answers) for q in qs] == [("hp-0", ("yes",)), ("hp-1", ("no",))]


@pytest.mark.parametrize(
    "row, fmt",
    [
        ({"id": "1", "question": "q", "answers": ["a"]}, "searchrl"),
        ({"idx": 1, "question": "q", "answer": "a"}, "r1searcher"),
        ({"id": "1", "question": "q", "golden_answers": ["a"]}, "flashrag"),
        ({"_id": "1", "question": "q", "answer": "a"}, "hotpotqa"),
        ({"id": "1", "question": "q", "answer": "a", "paragraphs": []}, "musique"),
        ({"question_id": "1", "question_text": "q", "answers_objects": []}, "ircot"),
        ({"question": "q", "answer": "a"}, "qa"),
    ],
)
def test_detect_format(row, fmt):
    assert detect_format(row) == fmt


def test_bad_json_line_names_file_and_line(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"idx": 1, "question": "q", "answer": "a"}\n\n{"idx": 2, "question": \n', encoding="utf-8")
    with pytest.raises(DataError, match=r"bad\.jsonl:3: invalid JSON"):
        load_questions(path)


def test_missing_answer_names_file_line_and_field(tmp_path):
    path = write_jsonl(
        tmp_path / "r1.jsonl",
        [{"idx": 1, "question": "q", "answer": "a"}, {"idx": 2, "question": "q2", "answer": ""}],
    )
    with pytest.raises(DataError, match=r"r1\.jsonl:2: missing or empty field 'answer'"):
        load_questions(path)


def test_missing_question_in_json_list_names_record_index(tmp_path):
    path = write_json(tmp_path / "list.json", [HOTPOT, {"_id": "x", "answer": "a"}])
    with pytest.raises(DataError, match=r"list\.json, record \[1\]: missing or empty field 'question'"):
        load_questions(path)


def test_broken_json_list_reports_line(tmp_path):
    path = tmp_path / "broken.json"
    path.write_text('[\n {"question": "q", "answer": "a"},\n {"question": }\n]', encoding="utf-8")
    with pytest.raises(DataError, match=r"broken\.json:3: invalid JSON at column \d+"):
        load_questions(path)


def test_not_a_question_file(tmp_path):
    corpus = write_jsonl(tmp_path / "corpus.jsonl", [{"title": "T", "text": "x"}])
    with pytest.raises(DataError, match=r"corpus\.jsonl:1: no 'question' field"):
        load_questions(corpus)
    obj = tmp_path / "titles.json"
    obj.write_text('{\n "Demon Dice": ["a", "b"]\n}', encoding="utf-8")
    with pytest.raises(DataError, match="one JSON object"):
        load_questions(obj)


def test_empty_and_absent_files(tmp_path):
    (tmp_path / "empty.jsonl").write_text("\n", encoding="utf-8")
    with pytest.raises(DataError, match="no records"):
        load_questions(tmp_path / "empty.jsonl")
    with pytest.raises(DataError, match="no such file"):
        load_questions(tmp_path / "absent.jsonl")


def test_unknown_format_name(tmp_path):
    path = write_jsonl(tmp_path / "x.jsonl", [{"question": "q", "answer": "a"}])
    with pytest.raises(SearchRLError, match="unknown question format 'squad'.*r1searcher"):
        load_questions(path, fmt="squad")


def test_explicit_format_checks_every_row(tmp_path):
    path = write_jsonl(tmp_path / "x.jsonl", [{"id": "1", "question": "q", "answer": "a"}])
    with pytest.raises(DataError, match=r"x\.jsonl:1: missing or empty field 'golden_answers'"):
        load_questions(path, fmt="flashrag")


def test_load_hf_without_datasets_package(monkeypatch):
    monkeypatch.setitem(sys.modules, "datasets", None)  # makes `import datasets` fail
    with pytest.raises(SearchRLError, match="needs the `datasets` package"):
        load_hf("RUC-NLPIR/FlashRAG_datasets", "dev", "hotpotqa")


def test_load_hf_parses_rows_and_reports_hub_errors(monkeypatch):
    calls = []

    def fake_load_dataset(name, config, split):
        calls.append((name, config, split))
        if name == "offline/x":
            raise ConnectionError("no network")
        return [{"id": "dev_0", "question": "Q?", "golden_answers": ["A"], "metadata": {}}]

    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=fake_load_dataset))
    (q,) = load_hf("RUC-NLPIR/FlashRAG_datasets", "dev", "hotpotqa")
    assert (q.id, q.answers, q.source) == ("dev_0", ("A",), "FlashRAG_datasets")
    assert calls == [("RUC-NLPIR/FlashRAG_datasets", "hotpotqa", "dev")]
    with pytest.raises(SearchRLError, match="could not load Hugging Face dataset 'offline/x'.*no network"):
        load_hf("offline/x")


def test_non_utf8_question_file_names_file_and_line(tmp_path):
    path = tmp_path / "latin1.jsonl"
    path.write_bytes(b'{"question": "q", "answer": "a"}\n{"question": "Z\xfcrich?", "answer": "b"}\n')
    with pytest.raises(DataError, match=r"latin1\.jsonl:2: not UTF-8 text \(byte 0xfc.*re-save it as UTF-8"):
        load_questions(path)
    listed = tmp_path / "latin1.json"
    listed.write_bytes(b'[\n {"question": "q", "answer": "a"},\n {"question": "\xfc", "answer": "b"}\n]')
    with pytest.raises(DataError, match=r"latin1\.json:3: not UTF-8 text"):
        load_questions(listed)
    with pytest.raises(DataError, match=r"is a directory"):
        load_questions(tmp_path)


def test_duplicate_question_ids_are_listed_in_a_warning(tmp_path):
    rows = [{"id": i, "question": f"q{n}", "answers": ["a"]} for n, i in enumerate(["x", "y", "x", "z", "y"])]
    path = write_jsonl(tmp_path / "dupes.jsonl", rows)
    with pytest.warns(DataWarning, match=r"dupes\.jsonl: 2 question id\(s\) occur more than once: 'x', 'y'"):
        assert len(load_questions(path)) == 5


@pytest.mark.parametrize("gold", ["NaN", "Infinity", "-Infinity", "1e400", '["a", NaN]'])
def test_non_finite_number_answers_are_rejected_with_the_line(tmp_path, gold):
    path = tmp_path / "nan.jsonl"
    path.write_text('{"idx": 1, "question": "q", "answer": "a"}\n' f'{{"idx": 2, "question": "q", "answer": {gold}}}\n')
    with pytest.raises(DataError, match=r"nan\.jsonl:2: answer -?(nan|inf) is not a finite number"):
        load_questions(path)


def test_json_error_names_the_column_once(tmp_path):
    path = tmp_path / "cut.jsonl"
    path.write_text('{"question": "q", "answer": "a"}\n{"question": "unterminated')
    with pytest.raises(DataError) as info:
        load_questions(path)
    message = str(info.value)
    assert message.startswith(f"{path}:2: invalid JSON at column 14 (Unterminated string starting)")
    assert "at at" not in message


@pytest.mark.parametrize(
    "row, field, got",
    [
        ({"id": "1", "question": 123, "answers": ["a"]}, "question", "a number"),
        ({"id": "1", "question": ["Who?"], "answers": ["a"]}, "question", "a list"),
        ({"idx": 1, "question": {"q": "Who?"}, "answer": "a"}, "question", "an object"),
        ({"question": "   ", "answer": "a"}, "question", "blank"),
        ({"question_id": "1", "question_text": 7, "answers_objects": [{"spans": ["a"]}]}, "question_text", "a number"),
    ],
)
def test_a_question_that_is_not_text_names_file_line_and_field(tmp_path, row, field, got):
    path = write_jsonl(tmp_path / "q.jsonl", [row])
    with pytest.raises(DataError, match=rf"q\.jsonl:1: field '{field}' must be a non-empty string, got {got} "):
        load_questions(path)


@pytest.mark.parametrize(
    "row, field, got",
    [
        ({"id": "1", "question": "q", "answers": ["a", None]}, "answers", "null"),
        ({"id": "1", "question": "q", "answers": [{"text": "a"}]}, "answers", "an object"),
        ({"idx": 1, "question": "q", "answer": [["a"]]}, "answer", "a list"),
        ({"id": "1", "question": "q", "golden_answers": [True, None]}, "golden_answers", "null"),
        ({"question": "q", "answer": {"entity": {"nested": 1}}}, "answer", "an object"),
        ({"_id": "1", "question": "q", "answer": [None]}, "answer", "null"),
    ],
)
def test_an_answer_that_is_null_or_an_object_names_file_line_and_field(tmp_path, row, field, got):
    path = write_jsonl(tmp_path / "a.jsonl", [row])
    with pytest.raises(DataError, match=rf"a\.jsonl:1: field '{field}' holds {got} where an answer belongs"):
        load_questions(path)


def test_numbers_ids_and_fanoutqa_objects_are_read_as_strings(tmp_path):
    rows = [
        {"idx": 7, "question": "When?", "answer": [2006, 1995.5]},  # R1-Searcher's integer idx
        {"id": "f1", "question": "Who?", "answer": {"A": 1, "B": "x", "C": False}},  # FanoutQA {entity: answer}
    ]
    path = write_json(tmp_path / "mixed.json", rows)
    (r1, fanout) = load_questions(path, fmt="qa")
    assert r1.answers == ("2006", "1995.5") and fanout.answers == ("A: 1; B: x; C: False",)
    (q,) = load_questions(write_jsonl(tmp_path / "r1.jsonl", rows[:1]))
    assert (q.id, q.answers) == ("7", ("2006", "1995.5"))


@pytest.mark.parametrize(
    "row, message",
    [
        ({"id": {"x": 1}, "question": "q", "answers": ["a"]}, "field 'id' must be a string or an integer id, got an object"),
        ({"idx": True, "question": "q", "answer": "a"}, "field 'idx' must be a string or an integer id, got true/false"),
        ({"id": "1", "question": "q", "answers": ["a"], "supporting_ids": "p1"}, "field 'supporting_ids' must be a list"),
        ({"id": "1", "question": "q", "answers": ["a"], "type": ["bridge"]}, "field 'type' must be a string, got a list"),
        ({"id": "1", "question": "q", "answer": "a", "answer_aliases": "b", "paragraphs": []}, "field 'answer_aliases' must be a list"),
        ({"question_id": "1", "question_text": "q", "answers_objects": ["a"]}, "field 'answers_objects' must be a list of objects"),
    ],
)
def test_other_mistyped_fields_are_errors_not_stringified(tmp_path, row, message):
    path = write_jsonl(tmp_path / "t.jsonl", [row])
    with pytest.raises(DataError, match=r"t\.jsonl:1: " + re.escape(message)):
        load_questions(path)


def test_every_question_file_of_the_shared_data_still_loads(shared_data):
    corpora = {"2wikimultihopqa_corpus.json", "hotpotqa_train_corpus.json", "musique_train_corpus.json",
               "filtered_kilt_sample_100.jsonl", "sample_data.jsonl"}
    files = [p for p in sorted(shared_data.rglob("*.json*")) if p.name not in corpora]
    counts = {p.name: len(read_records(p)) for p in files}
    assert len(counts) == 19 and counts["fanout-final-dev.json"] == 310 and counts["stage_2.jsonl"] == 8148
