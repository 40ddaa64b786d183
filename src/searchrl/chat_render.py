"""Rendering a chat template, which is user code: a `.jinja` file, or the template a model's
tokenizer ships. Every rendering searchrl makes goes through `render` (the tool-call protocol's
`NativeChat`, the tag protocol's and rag's chat prompts), which

- turns what a template can raise into one `SearchRLError` line naming the template: a syntax
  error (with its line), a sandbox violation (transformers renders in Jinja's immutable sandbox),
  the template's own `raise_exception(...)`, any other error while rendering;
- bounds the rendering in time (`RENDER_TIMEOUT_S`, `searchrl.deadline`): a template that loops
  for hours stops `ask`, evaluation or training with that line instead of hanging it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from searchrl.deadline import DeadlineExceeded, within
from searchrl.errors import SearchRLError

RENDER_TIMEOUT_S = 30.0  # one rendering takes milliseconds; anything near this is a runaway loop


class ChatTemplateError(SearchRLError):
    """A chat template failed to render; the message names it and says why."""


def template_name(tokenizer, template: str | None = None) -> str:
    """How errors name a template: the shipped name or path given, else the tokenizer's own."""
    if template is not None:
        return repr(template)
    return f"of the tokenizer {getattr(tokenizer, 'name_or_path', '') or '(unnamed)'!r}"


def _one_line(text: str, most: int = 240) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= most else text[: most - 1] + "…"


def render(tokenizer, messages: Sequence[dict[str, Any]], *, name: str, chat_template: str | None = None,
           **kwargs: Any) -> str:
    """`tokenizer.apply_chat_template(messages, chat_template=..., tokenize=False, **kwargs)`,
    with its errors as `ChatTemplateError` and its time bounded (`DeadlineExceeded`); `name`
    names the template in them (`template_name`)."""
    import jinja2

    def go() -> str:
        return tokenizer.apply_chat_template(list(messages), chat_template=chat_template, tokenize=False, **kwargs)

    where = f"chat template {name}"
    try:
        return within(go, RENDER_TIMEOUT_S, where, interrupt=True)
    except DeadlineExceeded:
        raise DeadlineExceeded(
            f"{where} did not finish rendering within {RENDER_TIMEOUT_S:g} s (a loop that never ends?); "
            "fix the template or pick another (template: hermes-fallback)"
        ) from None
    except jinja2.TemplateSyntaxError as exc:
        raise ChatTemplateError(f"{where} has a syntax error on line {exc.lineno}: {_one_line(exc.message or exc)}; "
                                "fix the template or pick another") from None
    except jinja2.exceptions.SecurityError as exc:
        raise ChatTemplateError(f"{where} did something the template sandbox forbids ({_one_line(exc)}); "
                                "a chat template may only format the conversation") from None
    except jinja2.TemplateError as exc:  # raise_exception(...) in the template, an undefined name, ...
        raise ChatTemplateError(f"{where} refused to render this conversation: {_one_line(exc)}") from None
    except SearchRLError:
        raise
    except Exception as exc:  # noqa: BLE001 - a template error of another kind (a bad filter argument, a type error)
        raise ChatTemplateError(f"{where} failed while rendering: {type(exc).__name__}: {_one_line(exc)}") from None
