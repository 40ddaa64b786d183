"""The chat template of a tag-protocol export (`searchrl export`, docs/guides/export.md): the
prompt the run was trained with, so a chat client (`apply_chat_template`, a text-generation
pipeline given messages, vLLM's chat completions) builds exactly that prompt, and refuses what it
was never trained on.

A tag run's prompt is text with the question in it (`base`, `fewshot`, `oneshot`, a template
file): the template renders one user message, the question, as that prompt; a second, assistant
message is its text so far (the documents a search loop appended included), continued as is
(`continue_final_message=True`). Any other conversation (a system message, several turns) raises
an error that says so, instead of rendering a prompt the model never saw.

Templates that are themselves rendered through the base model's chat template (`chat`,
`fewshot-chat`, a file with a `---user---` line) keep the base model's: our own commands render
their prompt through it, so it cannot be replaced; the card then says loudly that chat
completions do not build the trained prompt (`TEMPLATE_BASE`).
"""

from __future__ import annotations

from searchrl.protocols.prompts import template_uses_chat

# What `searchrl.json` records as `chat_template`: whose template the tokenizer carries.
TEMPLATE_TRAINED = "trained-prompt"  # renders the prompt the run trained on (tag runs)
TEMPLATE_NATIVE = "native"  # the chat template a tool-call run rendered
TEMPLATE_BASE = "base"  # the base model's (or none): chat completions do not build the trained prompt

_QUESTION = "\u2063SEARCHRL-QUESTION\u2063"  # split marker: invisible separators no template writes
_CHECKS = ("Which river flows through the capital?", ' Who wrote "Tessaly\'s Song" ({name}) \\ ? \n')
REFUSAL = ("this model was trained on one prompt, not on chat: send one user message holding the question "
           "(and, to continue it, the assistant's text so far); see the model card, section 'Chat template'")


_NAMED = {"\n": "\\n", "\t": "\\t", "\r": "\\r"}


def jinja_string(text: str) -> str:
    """`text` as a Jinja string literal (double-quoted; Jinja decodes its escapes as Python's)."""
    out = []
    for ch in text:
        if ch in '\\"':
            out.append("\\" + ch)
        elif ch in _NAMED:
            out.append(_NAMED[ch])
        elif ord(ch) < 32 or ord(ch) == 127:
            out.append(f"\\x{ord(ch):02x}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def trained_prompt_template(protocol, tokenizer, about: str) -> str | None:
    """A chat template rendering the trained prompt of the tag `protocol`, checked against it
    through `tokenizer`'s own rendering; None when the prompt is not the question set in fixed
    text (then the base model's template stays, `TEMPLATE_BASE`). `about`: a line naming the
    protocol, kept as a Jinja comment."""
    if template_uses_chat(protocol.template):
        return None
    rendered = protocol.prompt(_QUESTION, tokenizer)
    if rendered.count(_QUESTION) != 1:
        return None
    prefix, suffix = rendered.split(_QUESTION)
    if any(protocol.prompt(q, tokenizer) != prefix + q + suffix for q in _CHECKS):
        return None
    multi = "messages | length == 2 and messages[1]['role'] == 'assistant'"
    template = (
        f"{{#- searchrl: the prompt this model was trained with ({about.replace('#}', '# }')}). -#}}\n"
        f"{{%- if messages | length == 0 or messages[0]['role'] != 'user' or (messages | length > 1 and not ({multi})) -%}}\n"
        f"{{{{- raise_exception({jinja_string(REFUSAL)}) -}}}}\n"
        "{%- endif -%}\n"
        f"{{{{- {jinja_string(prefix)} -}}}}{{{{- messages[0]['content'] -}}}}{{{{- {jinja_string(suffix)} -}}}}\n"
        "{%- if messages | length == 2 -%}{{- messages[1]['content'] -}}{%- endif -%}\n"
    )
    return template if _renders(template, tokenizer, protocol) else None


def _renders(template: str, tokenizer, protocol) -> bool:
    """Whether transformers renders `template` to the trained prompt for one user message."""
    original = tokenizer.chat_template
    try:
        tokenizer.chat_template = template
        return all(tokenizer.apply_chat_template([{"role": "user", "content": q}], tokenize=False,
                                                 add_generation_prompt=True) == protocol.prompt(q, None) for q in _CHECKS)
    except Exception:  # noqa: BLE001  (a template that does not compile or render is simply not used)
        return False
    finally:
        tokenizer.chat_template = original
