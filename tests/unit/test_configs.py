"""The commands' configs: `train`, `eval run` and `ask` nest the same sub-config classes, the flags
of `eval run` and `ask` are spellings of nested keys, and the retrieval rules per command."""

from __future__ import annotations

import pytest
import yaml
from typer.testing import CliRunner

import searchrl.ask
import searchrl.eval.run
from searchrl.ask import AskConfig
from searchrl.cli import app
from searchrl.config import load_config, resolve_config_path
from searchrl.errors import SearchRLError
from searchrl.eval.run import EvalConfig
from searchrl.protocols.config import ProtocolConfig
from searchrl.retrieval import RetrievalConfig
from searchrl.rl.config import TrainConfig
from searchrl.rollout.config import RolloutConfig

runner = CliRunner()


@pytest.mark.parametrize("command", [TrainConfig, EvalConfig, AskConfig])
def test_commands_nest_the_same_sub_config_classes(command):
    fields = command.model_fields
    assert fields["protocol"].annotation is ProtocolConfig
    assert fields["rollout"].annotation is RolloutConfig
    assert fields["retrieval"].annotation is RetrievalConfig


@pytest.fixture
def captured(monkeypatch):
    """The config each command would run with; nothing is loaded or generated."""
    seen = []

    def fake_eval(cfg, progress=True, resume=False, overwrite=False):
        seen.append(cfg)
        return {}

    monkeypatch.setattr(searchrl.eval.run, "run_eval", fake_eval)
    monkeypatch.setattr(searchrl.ask, "ask", lambda question, cfg, as_json: seen.append(cfg))
    return seen


def _invoke(args):
    result = runner.invoke(app, args)
    assert result.exit_code == 0, (result.output, result.exception)


EVAL_FLAGS = [
    ("--method", "rag", "method"), ("--model", "tiny-random", "model"), ("--backend", "vllm", "rollout.backend"),
    ("--dataset", "q.jsonl", "dataset"), ("--index", "idx", "retrieval.index"),
    ("--retriever-api", "search-r1", "retrieval.api"), ("--limit", "2", "limit"), ("-k", "3", "rollout.k"),
    ("--tags", "search-r1", "protocol.tags"), ("--template", "fewshot", "protocol.template"),
    ("--doc-style", "title-lines", "protocol.doc_style"), ("--max-searches", "2", "rollout.max_searches"),
    ("--max-new-tokens", "40", "rollout.max_new_tokens"), ("--answer-max-new-tokens", "9", "answer_max_new_tokens"),
    ("--batch-size", "4", "rollout.batch_size"), ("--out", "o", "out"),
]


def test_eval_flags_equal_their_nested_set(captured):
    _invoke(["eval", "run", "--json", "--dump-tokens", *[a for flag, value, _ in EVAL_FLAGS for a in (flag, value)]])
    _invoke(["eval", "run", "--json", "--set", "dump_tokens=true", *[a for _, value, key in EVAL_FLAGS for a in ("--set", f"{key}={value}")]])
    by_flags, by_set = captured
    assert by_flags == by_set
    assert (by_flags.rollout.k, by_flags.retrieval.index, by_flags.protocol.doc_style) == (3, "idx", "title-lines")
    assert by_flags.rollout.greedy and by_flags.rollout.samples_per_question == 1  # eval defaults kept


def test_eval_config_file_is_the_nested_tree(tmp_path, captured):
    path = tmp_path / "eval.yaml"
    path.write_text(yaml.safe_dump({"method": "agent", "retrieval": {"url": "http://127.0.0.1:9"}, "rollout": {"k": 2}}))
    _invoke(["eval", "run", "--json", "--config", str(path), "-k", "4", "--out", "o"])
    (cfg,) = captured
    assert (cfg.retrieval.url, cfg.retrieval.index, cfg.rollout.k, cfg.rollout.batch_size) == ("http://127.0.0.1:9", None, 4, 16)


def test_ask_flags_and_config_file(tmp_path, captured):
    _invoke(["ask", "Q?", "--model", "tiny-random", "--backend", "vllm", "--retriever-url", "http://127.0.0.1:9",
             "--retriever-api", "r1searcher", "--tags", "search-r1", "--template", "oneshot", "-k", "2",
             "--max-searches", "3", "--max-new-tokens", "30", "--sample", "--seed", "7"])
    path = tmp_path / "ask.yaml"
    path.write_text(yaml.safe_dump({"model": "tiny-random", "protocol": {"tags": "search-r1", "template": "oneshot"},
                                    "rollout": {"backend": "vllm", "k": 2, "max_searches": 3, "max_new_tokens": 30, "greedy": False, "seed": 7},
                                    "retrieval": {"url": "http://127.0.0.1:9", "api": "r1searcher"}}))
    _invoke(["ask", "Q?", "--config", str(path)])
    _invoke(["ask", "Q?"])
    by_flags, by_file, plain = captured
    assert by_flags == by_file
    assert (by_flags.retrieval.index, by_flags.rollout.greedy, by_flags.rollout.batch_size) == (None, False, 16)
    assert plain == AskConfig()
    assert (plain.retrieval.index, plain.rollout.greedy, plain.rollout.k) == ("toyworld", True, 5)


def test_retrieval_none_both_and_what_each_command_asks_for():
    none = RetrievalConfig()
    assert none.source is None and EvalConfig(method="direct", retrieval=none).retrieval.source is None
    with pytest.raises(SearchRLError, match="no retriever configured"):
        none.open()
    with pytest.raises(ValueError, match="not both"):
        RetrievalConfig(index="toyworld", url="http://127.0.0.1:9")
    assert RetrievalConfig(url="http://127.0.0.1:9/retrieve").source == "http://127.0.0.1:9/retrieve"
    with pytest.raises(ValueError, match="--index toyworld"):
        EvalConfig(method="agent")
    with pytest.raises(SearchRLError, match="training searches: set retrieval.index"):
        load_config(TrainConfig, None, ["retrieval.index=null"])
    with pytest.raises(SearchRLError, match="ask searches: give an index"):
        load_config(AskConfig, None, ["retrieval.api=search-r1"])
    with pytest.raises(SearchRLError, match="retrieval.api"):
        load_config(TrainConfig, None, ["retrieval.api=solr"])
    # A server URL alone is enough: the command's default index is not merged into it.
    assert load_config(TrainConfig, None, ["retrieval.url=http://127.0.0.1:9"]).retrieval.index is None
    assert TrainConfig().retrieval.source == "toyworld"


def test_web_and_judge_flags_equal_their_nested_set(tmp_path, captured):
    flags = [("--web", "brave", "retrieval.web.provider"), ("--web-site", "en.wikipedia.org", "retrieval.web.site"),
             ("--judge-url", "http://127.0.0.1:9/v1", "judge.url"), ("--judge-model", "m", "judge.model")]
    _invoke(["eval", "run", "--json", "--out", "o", *[a for flag, value, _ in flags for a in (flag, value)]])
    _invoke(["eval", "run", "--json", "--out", "o", *[a for _, value, key in flags for a in ("--set", f"{key}={value}")]])
    path = tmp_path / "eval.yaml"
    path.write_text(yaml.safe_dump({"out": "o", "retrieval": {"web": {"provider": "brave"}}, "judge": {"url": "http://127.0.0.1:9/v1", "model": "m"}}))
    _invoke(["eval", "run", "--json", "--config", str(path), "--web-site", "en.wikipedia.org"])
    _invoke(["ask", "Q?", "--web", "searxng"])
    by_flags, by_set, by_file, asked = captured
    assert by_flags == by_set == by_file
    assert (by_flags.retrieval.source, by_flags.retrieval.web.site, by_flags.judge.model) == ("web:brave", "en.wikipedia.org", "m")
    assert (asked.retrieval.source, asked.retrieval.index) == ("web:searxng", None)  # the toy world index is not added
    with pytest.raises(SearchRLError, match=r"goes inside retrieval.web, which another override set to 'brave'"):
        load_config(TrainConfig, None, ["retrieval.web=brave", "retrieval.web.site=x"])  # once an AttributeError


def test_a_packaged_config_loads_by_name_and_a_wrong_name_or_path_is_a_clear_error(tmp_path):
    assert resolve_config_path("demo-cpu").name == "demo-cpu.yaml"
    # by name, `extends` included: multihop-cpu states only what differs from demo-cpu
    cfg = load_config(TrainConfig, "multihop-cpu")
    assert cfg.stage1.kind == "sft" and cfg.rollout.max_searches == 4 and cfg.rollout.k == 1
    with pytest.raises(SearchRLError, match="neither a file nor a packaged config.*demo-cpu.*multihop-cpu"):
        load_config(TrainConfig, "no-such-recipe")
    # a path stays a path: its error names the file, not the packaged list
    with pytest.raises(SearchRLError, match=r"config file .*nope\.yaml does not exist"):
        load_config(TrainConfig, tmp_path / "nope.yaml")
