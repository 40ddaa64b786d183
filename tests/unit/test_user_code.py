"""User code held to its contract (docs/security.md): a chat template that does not parse, breaks
out of the sandbox, raises or loops forever, and a user's tool that returns something else than
observations, raises or never answers, each end as one line naming the template or the tool (exit
2), or, for a slow tool, as an error result of that round; nothing hangs `ask` or a round."""

from __future__ import annotations

import sys
import textwrap
import threading
import time

import pytest

from searchrl import chat_render, cli
from searchrl.assets import load_tokenizer
from searchrl.deadline import DeadlineExceeded, within
from searchrl.errors import EXIT_USAGE, SearchRLError
from searchrl.protocols.chat_template import NativeChat
from searchrl.protocols.prompts import apply_chat
from searchrl.tools.base import Observation, Tool, ToolCall
from searchrl.tools.batch import run_calls

TEMPLATES = {  # each has <tool_call> in it, so the call format is found and the rendering runs
    "syntax": ("{% for m in messages %}{{ m.content }<tool_call>", "has a syntax error on line 1"),
    "sandbox": ("{{ ''.__class__.__mro__[1].__subclasses__() }}<tool_call>", "sandbox forbids"),
    "raise": ("{{ raise_exception('no system role here') }}<tool_call>", "refused to render this conversation: no system role here"),
    "type": ("{{ messages[0].content + 1 }}<tool_call>", "failed while rendering: TypeError"),
}
LOOP = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}<tool_call>"


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer("tiny-random")


@pytest.mark.parametrize("kind", TEMPLATES)
def test_a_broken_chat_template_is_one_line_naming_it(tok, tmp_path, kind):
    source, says = TEMPLATES[kind]
    path = tmp_path / f"{kind}.jinja"
    path.write_text(source)
    with pytest.raises(chat_render.ChatTemplateError) as err:
        NativeChat(tok, [], template=str(path))
    assert says in str(err.value) and str(path) in str(err.value) and "\n" not in str(err.value)


def test_a_tokenizers_own_template_that_raises_is_named_too(tok):
    broken = type(tok).__new__(type(tok))
    broken.__dict__.update(tok.__dict__)
    broken.chat_template = "{{ raise_exception('Conversation roles must alternate') }}"
    with pytest.raises(SearchRLError, match=r"chat template of the tokenizer .* Conversation roles must alternate"):
        apply_chat(broken, [{"role": "user", "content": "hi"}], "chat")


def test_a_template_that_loops_forever_is_stopped_at_its_deadline(tok, tmp_path, monkeypatch):
    monkeypatch.setattr(chat_render, "RENDER_TIMEOUT_S", 0.5)
    path = tmp_path / "loop.jinja"
    path.write_text(LOOP)
    started = time.monotonic()
    with pytest.raises(DeadlineExceeded, match=r"loop\.jinja' did not finish rendering within 0.5 s"):
        NativeChat(tok, [], template=str(path))
    assert time.monotonic() - started < 5
    # The runaway rendering was interrupted, not left burning a core; rendering goes on working.
    time.sleep(0.2)
    assert sum(t.name == "searchrl-deadline" for t in threading.enumerate()) <= 1
    assert "<|im_start|>user" in NativeChat(tok, [], template="hermes-fallback").render([{"role": "user", "content": "x"}], True)


def test_ask_with_a_looping_template_exits_2_with_one_line(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(chat_render, "RENDER_TIMEOUT_S", 0.5)
    path = tmp_path / "loop.jinja"
    path.write_text(LOOP)
    code = cli.run(["ask", "Which river?", "--model", "tiny-random", "--index", "toyworld",
                    "--format", "tool-calls", "--chat-template", str(path)])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == EXIT_USAGE
    assert err[-1].startswith("error: chat template") and "did not finish rendering within 0.5 s" in err[-1]


def test_the_deadline_passes_errors_and_values_through():
    assert within(lambda: 7, 1, "x") == 7
    with pytest.raises(KeyError):
        within(lambda: {}["k"], 1, "x")
    with pytest.raises(DeadlineExceeded, match="slow thing did not finish within 0.1 s"):
        within(lambda: time.sleep(1), 0.1, "slow thing")


# -- user tools ----------------------------------------------------------------------------------
USER_TOOLS = textwrap.dedent('''
    import time
    from searchrl.tools.base import Observation, Tool

    class _Base(Tool):
        description = "A user's tool."
        parameters = {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]}

    class Text(_Base):
        name = "text"
        def call(self, calls):
            return ["a plain string" for _ in calls]

    class Short(_Base):
        name = "short"
        def call(self, calls):
            return []

    class Number(_Base):
        name = "number"
        def call(self, calls):
            return [Observation(42) for _ in calls]

    class Raises(_Base):
        name = "raises"
        def call(self, calls):
            raise ConnectionError("weather service down")

    class Slow(_Base):
        name = "slow"
        timeout_s = 0.3
        def call(self, calls):
            time.sleep(float(calls[0]["q"]))
            return [Observation("late") for _ in calls]
''')


@pytest.fixture
def user_tools(tmp_path, monkeypatch):
    (tmp_path / "usertools_x.py").write_text(USER_TOOLS)
    monkeypatch.syspath_prepend(str(tmp_path))
    import usertools_x

    yield usertools_x
    sys.modules.pop("usertools_x", None)


@pytest.mark.parametrize("cls, says", [
    ("Text", "returned a str for call 1 of 2, not an Observation"),
    ("Short", "returned 0 observations for 2 calls"),
    ("Number", "returned an Observation whose text is a int for call 1 of 2"),
    ("Raises", "raised ConnectionError: weather service down"),
])
def test_a_user_tool_breaking_its_contract_is_an_error_naming_it(user_tools, cls, says):
    tool = getattr(user_tools, cls)()
    with pytest.raises(SearchRLError) as err:
        run_calls({tool.name: tool}, [ToolCall(tool.name, {"q": "a"}), ToolCall(tool.name, {"q": "b"})])
    assert says in str(err.value) and f"tool {tool.name!r} (usertools_x:{cls})" in str(err.value)


def test_a_slow_user_tool_gets_an_error_result_and_the_round_goes_on(user_tools, caplog):
    slow = user_tools.Slow()
    tools = {"slow": slow, "text": user_tools.Text()}
    started = time.monotonic()
    out = run_calls(tools, [ToolCall("slow", {"q": "3"}), Observation.refused("budget spent", "budget")])
    assert time.monotonic() - started < 2
    assert (out[0].ok, out[0].error) == (False, "timeout") and "tool 'slow' did not answer within 0.3 s" in out[0].text
    assert out[1].error == "budget" and "did not answer within 0.3 s" in caplog.text
    # While that call still runs, the tool's next calls get the same answer at once.
    started = time.monotonic()
    again = run_calls(tools, [ToolCall("slow", {"q": "0"})])
    assert time.monotonic() - started < 0.2 and again[0].error == "timeout" and "still running" in again[0].text
    # A fast answer within the deadline is served as usual.
    fresh = user_tools.Slow()
    assert run_calls({"slow": fresh}, [ToolCall("slow", {"q": "0"})])[0].text == "late"


def test_built_in_tools_have_no_such_deadline():
    from searchrl.tools import TOOLS

    assert all(TOOLS.get(name).timeout_s is None for name in ("search", "open", "calculate"))
    assert Tool.timeout_s == 60.0
