"""Native tool calls (`searchrl.protocols`): the call parsers, the observation ids and the traps
of chat templates, the prefix-preservation self-test, token exactness on the tiny-random
tokenizer (SmolLM2's) with our fixture templates in tests/unit/data/chat_templates/."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest

from searchrl.assets import load_tokenizer
from searchrl.errors import SearchRLError
from searchrl.protocols.call_formats import CALL_FORMATS, detect_format
from searchrl.protocols.chat_template import NativeChat, load_chat_template, shipped_templates
from searchrl.protocols.template_selftest import check_template, sampled_ids, transcript
from searchrl.tools.base import ToolCall

FIXTURES = Path(__file__).parent / "data" / "chat_templates"
QWEN25, QWEN3, LLAMA31 = (
    str(FIXTURES / f"{n}.jinja") for n in ("qwen25-style", "qwen3-style", "llama31-style")
)
REWRITING = str(FIXTURES / "drops-all-thinking.jinja")
QUIET = str(FIXTURES / "drops-reasoning-quietly.jinja")  # the same, with no think tag in its source
LLAMA_SPECIALS = [
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|eot_id|>",
    "<|eom_id|>",
    "<|python_tag|>",
]
SCHEMAS = [
    {
        "type": "function",
        "function": {
            "name": name,
            "description": f"The {name} tool.",
            "parameters": {
                "type": "object",
                "properties": {"query": {"type": "string"}},
                "required": ["query"],
            },
        },
    }
    for name in ("search", "open")
]
SYSTEM = {"role": "system", "content": "Use the tools."}
USER = {"role": "user", "content": "Where is Town 3?"}

hermes = CALL_FORMATS.get("hermes")()
llama = CALL_FORMATS.get("llama3-json")()


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer("tiny-random")


@pytest.fixture(scope="module")
def llama_tok(tok):
    """SmolLM2's tokenizer with Llama 3's header and end-of-turn tokens, as a Llama tokenizer has."""
    t = copy.deepcopy(tok)
    t.add_tokens(LLAMA_SPECIALS, special_tokens=True)
    return t


def _chat(tok, llama_tok, template):
    return NativeChat(llama_tok if template == LLAMA31 else tok, SCHEMAS, template=template)


# -- parsers -------------------------------------------------------------------------------
def test_hermes_reads_several_calls_with_object_or_string_arguments():
    text = (
        'Let me look.\n<tool_call>\n{"name": "search", "arguments": {"query": "Town 3"}}\n</tool_call>\n'
        '<tool_call>{"name": "open", "arguments": "{\\"query\\": \\"p3\\"}"}</tool_call>'
    )
    turn = hermes.parse(text)
    assert turn.calls == [
        ToolCall("search", {"query": "Town 3"}),
        ToolCall("open", {"query": "p3"}),
    ]
    assert turn.malformed == [] and turn.final_text == "Let me look." and not turn.is_final


def test_hermes_without_calls_is_the_final_answer():
    turn = hermes.parse("Town 3 lies on the river R3.")
    assert turn.is_final and turn.final_text == "Town 3 lies on the river R3." and turn.calls == []


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        ('{"name": "search", "arguments": {"query": "x"}', "bad JSON"),
        ('{"arguments": {"query": "x"}}', 'missing "name"'),
        ('{"name": "  ", "arguments": {}}', 'missing "name"'),
        ('{"name": "search", "arguments": ["x"]}', '"arguments" is not an object'),
        ('{"name": "search", "arguments": "query=x"}', '"arguments" is a string that is not JSON'),
        ('["search"]', "not a JSON object"),
    ],
)
def test_hermes_malformed_calls_are_reported_and_never_calls(body, reason):
    good = '<tool_call>{"name": "open", "arguments": {"query": "p1"}}</tool_call>'
    turn = hermes.parse(f"{good}<tool_call>{body}</tool_call>")
    assert turn.calls == [ToolCall("open", {"query": "p1"})]
    assert (
        len(turn.malformed) == 1
        and turn.malformed[0].startswith("tool call 2: ")
        and reason in turn.malformed[0]
    )


def test_hermes_call_cut_by_the_budget_is_malformed():
    turn = hermes.parse('<tool_call>{"name": "search", "arguments": {"query": "Town')
    assert turn.calls == [] and turn.malformed == [
        "tool call 1: cut off, <tool_call> without </tool_call>"
    ]
    # A complete body without its closing tag is cut too: the budget may stop right before it.
    assert hermes.parse('<tool_call>{"name": "search", "arguments": {}}').calls == []
    assert hermes.parse("x</tool_call>").malformed == ["</tool_call> without <tool_call>"]


def test_hermes_tool_call_inside_reasoning_is_not_a_call():
    text = '<think>\nI could write <tool_call>{"name": "search", "arguments": {}}</tool_call>.\n</think>\n\nR3.'
    turn = hermes.parse(text)
    assert turn.calls == [] and turn.malformed == [] and turn.final_text == "R3." and turn.is_final
    assert turn.reasoning.startswith("I could write <tool_call>")
    # The generation prompt opened the block (Qwen3 thinking models): only `</think>` is sampled.
    opened = hermes.parse('<tool_call>{"name": "a", "arguments": {}}</tool_call></think>R3.')
    assert opened.calls == [] and opened.final_text == "R3."
    # Reasoning cut by the budget holds everything after `<think>`.
    cut = hermes.parse('<think>maybe <tool_call>{"name": "a", "arguments": {}}</tool_call>')
    assert cut.calls == [] and cut.final_text == "" and cut.reasoning.startswith("maybe")


def test_llama3_json_reads_one_call_with_parameters():
    call = ToolCall("search", {"query": "Town 3"})
    assert llama.parse('{"name": "search", "parameters": {"query": "Town 3"}}').calls == [call]
    assert llama.parse(
        '<|python_tag|>{"name": "search", "parameters": {"query": "Town 3"}}'
    ).calls == [call]
    assert llama.parse(
        ' {"name": "search", "parameters": "{\\"query\\": \\"Town 3\\"}"}\n'
    ).calls == [call]
    final = llama.parse("Town 3 lies on R3.")
    assert final.is_final and final.final_text == "Town 3 lies on R3."


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        (
            '{"name": "search", "parameters": {"query": "x"}}; {"name": "open", "parameters": {}}',
            "one call per turn",
        ),
        ('{"name": "search", "parameters": {"query": "x"}} and then I answer', "one call per turn"),
        ('{"name": "search", "parameters": {"que', "bad JSON"),
        ('<|python_tag|>search.call(query="x")', "bad JSON"),
        ('{"parameters": {}}', 'missing "name"'),
        ('{"name": "search", "parameters": 3}', '"parameters" is not an object'),
    ],
)
def test_llama3_json_malformed_calls(text, reason):
    turn = llama.parse(text)
    assert turn.calls == [] and len(turn.malformed) == 1 and reason in turn.malformed[0]


def test_format_detected_from_the_template_or_refused(tok):
    assert detect_format(load_chat_template(QWEN25)) == "hermes"
    assert detect_format(load_chat_template(QWEN3)) == "hermes"
    assert detect_format(load_chat_template("hermes-fallback")) == "hermes"
    assert detect_format(load_chat_template(LLAMA31)) == "llama3-json"
    with pytest.raises(SearchRLError, match="no tool-call section.*template: hermes-fallback"):
        NativeChat(tok, SCHEMAS)  # SmolLM2's own template: never a silent fallback
    with pytest.raises(SearchRLError, match="unknown call format 'mistral'"):
        NativeChat(tok, SCHEMAS, call_format="mistral", template="hermes-fallback")
    with pytest.raises(SearchRLError, match="neither a shipped one"):
        load_chat_template("no-such-template")
    assert "hermes-fallback" in shipped_templates()


# -- observation ids and the traps ---------------------------------------------------------
def _call_turn(chat, history, name="search", query="Town 3", content=""):
    message = {
        "role": "assistant",
        "content": content,
        "tool_calls": [
            {"type": "function", "function": {"name": name, "arguments": {"query": query}}}
        ],
    }
    return message, sampled_ids(chat, history, message)


@pytest.mark.parametrize("template", ["hermes-fallback", QWEN25, QWEN3, LLAMA31])
def test_one_turn_is_exact_and_never_repeats_a_sampled_id(tok, llama_tok, template):
    chat = _chat(tok, llama_tok, template)
    history = [SYSTEM, USER]
    prompt = chat.prompt_ids(history)
    # Qwen3 keeps a turn's reasoning once a result follows, but not an empty think block (below).
    message, sampled = _call_turn(
        chat, history, content="<think>\nLook.\n</think>\n\n" if template == QWEN3 else ""
    )
    assert sampled[-1] == chat.end_of_turn_id and chat.parse_ids(sampled).calls == [
        ToolCall("search", {"query": "Town 3"})
    ]
    tools = [chat.tool_message("search", "Town 3 lies on R3.")]
    obs = chat.observation_ids(history, sampled, tools)
    full = chat.render([*history, message, *tools], add_generation_prompt=True)
    head = chat.render(history, add_generation_prompt=True)
    # Cut where the policy's turn starts: Llama's "\n\n" prompt end is one token alone (see below).
    assert prompt + sampled + obs == chat.encode(head) + chat.encode(full[len(head) :])
    if template != LLAMA31:
        assert prompt + sampled + obs == chat.encode(full)
    assert obs[0] != chat.end_of_turn_id  # the end of turn is the policy's, not the observation's
    assert chat.tokenizer.decode(obs).startswith(
        chat.separator
    ) and "Town 3 lies on R3." in chat.tokenizer.decode(obs)


def test_separator_after_the_end_of_turn_belongs_to_the_observation(tok):
    chat = NativeChat(tok, SCHEMAS, template="hermes-fallback")
    assert chat.end_of_turn_id == tok.convert_tokens_to_ids("<|im_end|>") and chat.separator == "\n"
    _, sampled = _call_turn(chat, [USER])
    obs = chat.observation_ids([USER], sampled, [chat.tool_message("search", "R3")])
    assert tok.decode(obs) == "\n<|im_start|>tool\nR3<|im_end|>\n<|im_start|>assistant\n"
    assert obs[0] == tok.encode("\n", add_special_tokens=False)[0]


def test_several_results_go_back_in_one_block(tok):
    chat = NativeChat(tok, SCHEMAS, template=QWEN25)
    message = {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {"type": "function", "function": {"name": n, "arguments": {"query": q}}}
            for n, q in (("search", "a"), ("open", "b"))
        ],
    }
    sampled = sampled_ids(chat, [SYSTEM, USER], message)
    assert [c.name for c in chat.parse_ids(sampled).calls] == ["search", "open"]
    tools = [chat.tool_message("search", "A"), chat.tool_message("open", "B")]
    obs = tok.decode(chat.observation_ids([SYSTEM, USER], sampled, tools))
    assert obs == (
        "\n<|im_start|>user\n<tool_response>\nA\n</tool_response>\n<tool_response>\nB\n"
        "</tool_response><|im_end|>\n<|im_start|>assistant\n"
    )


def test_default_system_prompt_stays_out_of_the_observation(tok):
    chat = NativeChat(tok, SCHEMAS, template=QWEN25)
    default = "You are Quill, a helpful assistant made for tests."
    assert default in tok.decode(chat.prompt_ids([USER]))  # the template injects it...
    _, sampled = _call_turn(chat, [USER])
    obs = tok.decode(chat.observation_ids([USER], sampled, [chat.tool_message("search", "R3")]))
    assert default not in obs and "system" not in obs  # ...once, in the prompt, never again
    t = transcript(chat, system=None)
    assert t.ids == t.whole and tok.decode(t.ids).count(default) == 1


def test_qwen3_empty_thinking_renders_the_base_the_same_way_in_both(tok):
    """Qwen3 writes an empty think block for the last assistant turn only: the naive pair of
    renderings (base alone, base + tool) disagrees on the base; ours does not."""
    chat = NativeChat(tok, SCHEMAS, template=QWEN3)
    message, sampled = _call_turn(chat, [SYSTEM, USER])
    assert tok.decode(sampled).startswith("<think>\n\n</think>\n\n<tool_call>")
    tools = [chat.tool_message("search", "R3")]
    alone = chat.render([SYSTEM, USER, message], add_generation_prompt=False)
    followed = chat.render([SYSTEM, USER, message, *tools], add_generation_prompt=True)
    assert not followed.startswith(alone)  # the trap is real in this template
    obs = chat.observation_ids([SYSTEM, USER], sampled, tools)
    assert (
        tok.decode(obs)
        == "\n<|im_start|>user\n<tool_response>\nR3\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
    )


def test_llama31_one_call_per_turn_results_in_the_ipython_role(tok, llama_tok):
    chat = NativeChat(llama_tok, SCHEMAS, template=LLAMA31)
    assert chat.format.name == "llama3-json" and chat.separator == ""
    assert chat.end_of_turn_id == llama_tok.convert_tokens_to_ids("<|eot_id|>")
    _, sampled = _call_turn(chat, [SYSTEM, USER])
    assert (
        llama_tok.decode(sampled)
        == '{"name": "search", "parameters": {"query": "Town 3"}}<|eot_id|>'
    )
    obs = llama_tok.decode(
        chat.observation_ids([SYSTEM, USER], sampled, [chat.tool_message("search", "R3")])
    )
    assert (
        obs
        == "<|start_header_id|>ipython<|end_header_id|>\n\nR3<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"
    )
    # A python_tag call may end with <|eom_id|>: a stop too, and the turn is closed.
    eom = llama_tok.convert_tokens_to_ids("<|eom_id|>")
    assert eom in chat.stop_ids and chat.end_of_turn_id in chat.stop_ids
    tagged = chat.encode('<|python_tag|>{"name": "open", "parameters": {"query": "p3"}}') + [eom]
    assert chat.parse_ids(tagged).calls == [ToolCall("open", {"query": "p3"})]
    after = chat.observation_ids([SYSTEM, USER], tagged, [chat.tool_message("open", "R3")])
    assert after == chat.observation_ids([SYSTEM, USER], sampled, [chat.tool_message("open", "R3")])
    # Without Llama's special tokens the policy could not sample the end of a turn.
    with pytest.raises(SearchRLError, match="no single special token"):
        NativeChat(tok, SCHEMAS, template=LLAMA31)


def test_turn_cut_by_the_budget_is_closed_by_the_environment(tok):
    chat = NativeChat(tok, SCHEMAS, template="hermes-fallback")
    _, sampled = _call_turn(chat, [USER])
    cut = sampled[:-5]
    turn = chat.parse_ids(cut)
    assert turn.calls == [] and "cut off" in turn.malformed[0]
    obs = chat.observation_ids(
        [USER], cut, [chat.tool_message("search", "error: the call was cut off")]
    )
    assert obs[0] == chat.end_of_turn_id and obs[1:] == chat.observation_ids(
        [USER], sampled, [chat.tool_message("search", "error: the call was cut off")]
    )


# -- the start-up self-test and token exactness --------------------------------------------
@pytest.mark.parametrize("template", ["hermes-fallback", QWEN25, QWEN3, LLAMA31])
def test_self_test_passes_and_turn_by_turn_ids_equal_the_whole_rendering(tok, llama_tok, template):
    chat = _chat(tok, llama_tok, template)
    check_template(chat)
    t = transcript(chat)
    assert t.ids == t.whole and len(t.loss_mask) == len(t.ids)
    assert sum(t.loss_mask) > 0 and t.ids[-1] == chat.end_of_turn_id and t.loss_mask[-1] == 1
    whole = chat.render(t.messages, add_generation_prompt=False)
    if template != LLAMA31:
        # ChatML generation prompts end in a newline that never merges with the next token: the
        # ids are those of tokenizing the whole rendering in one go.
        assert t.ids == chat.encode(whole[: whole.rfind("<|im_end|>") + len("<|im_end|>")])
    else:
        # Llama's prompt ends in "\n\n", which SmolLM2's tokenizer writes as one token alone
        # and as two before '{"': the pieces are cut where each assistant turn starts.
        assert chat.tokenizer.decode(t.ids) == whole


def test_template_from_the_tokenizer_itself(tok):
    own = copy.deepcopy(tok)
    own.chat_template = load_chat_template(QWEN3)
    chat = NativeChat(own, SCHEMAS)
    assert chat.format.name == "hermes"
    check_template(chat)


def test_self_test_refuses_a_template_that_rewrites_history(tok):
    chat = NativeChat(tok, SCHEMAS, template=REWRITING)
    with pytest.raises(
        SearchRLError, match="not prefix-preserving.*template: hermes-fallback"
    ) as err:
        check_template(chat)
    assert "Step 1: look it up." in str(err.value)  # it shows where the two differ


def test_self_test_refuses_a_template_that_drops_reasoning_with_no_think_tag_in_its_source(tok):
    source = load_chat_template(QUIET)
    assert "<think>" not in source and "</think>" not in source
    chat = NativeChat(tok, SCHEMAS, template=QUIET)
    t = transcript(chat, reasoning=False)
    assert t.ids == t.whole  # without reasoning it is prefix-preserving...
    with pytest.raises(SearchRLError, match="conversation with reasoning built turn by turn differs") as err:
        check_template(chat)  # ...but it drops earlier reasoning from history
    assert "Step 1: look it up." in str(err.value)


@pytest.mark.parametrize("template", ["hermes-fallback", QWEN25, QWEN3, LLAMA31])
def test_self_test_checks_reasoning_whatever_the_source_and_without_it_unless_the_template_adds_it(
    tok, llama_tok, template, monkeypatch
):
    from searchrl.protocols import template_selftest as selftest

    chat = _chat(tok, llama_tok, template)
    seen = []
    real = selftest.transcript
    monkeypatch.setattr(selftest, "transcript", lambda c, **kw: seen.append(kw["reasoning"]) or real(c, **kw))
    selftest.check_template(chat)
    assert seen == ([True] if template == QWEN3 else [True, False])  # Qwen3 writes a think block into every turn
    assert selftest.writes_reasoning(chat) == (template == QWEN3)


def test_self_test_refuses_a_format_that_does_not_read_the_template(tok, llama_tok):
    chat = NativeChat(llama_tok, SCHEMAS, template=LLAMA31, call_format="hermes")
    with pytest.raises(SearchRLError, match="does not read back"):
        check_template(chat)


@pytest.mark.integration
def test_smollm2_with_the_fallback_template():
    smol = load_tokenizer("smollm2-135m")
    with pytest.raises(SearchRLError, match="no tool-call section"):
        NativeChat(smol, SCHEMAS)
    chat = NativeChat(smol, SCHEMAS, template="hermes-fallback")
    check_template(chat)
    assert chat.stop_ids == [smol.convert_tokens_to_ids("<|im_end|>")]
