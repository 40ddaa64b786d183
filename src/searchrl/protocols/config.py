"""`ProtocolConfig`: which protocol a run speaks (its format) and how (tags, template, chat template)."""

from __future__ import annotations

from typing import Any

from pydantic import Field, field_validator, model_validator

from searchrl.config import StrictModel
from searchrl.protocols.tags import TAG_PRESETS
from searchrl.registry import Registry
from searchrl.tools.passages import DOC_STYLES

# The protocols by `protocol.format`: `Protocol` classes (`protocols.base`), each registered by its module.
PROTOCOLS: Registry[type] = Registry("protocol format")


def protocol_class(fmt: str) -> type:
    """The `Protocol` class registered for `protocol.format` `fmt`."""
    return PROTOCOLS.get(fmt)


class ProtocolConfig(StrictModel):
    """Which protocol a run speaks. Search limits and k belong to the rollout config."""

    format: str = "tags"
    """A protocol of the registry (`searchrl.protocols.PROTOCOLS`). `tags`: the paper's protocol,
    search queries between tags (the keys below). `tool-calls`: the chat template's native tool
    calls, with the run's `tools`."""
    tags: str = "r1searcher"
    """Tag preset: `r1searcher` (barred tags of the authors' checkpoints) or `search-r1`
    (single-word tags; the ones tiny models learn)."""
    template: str | None = None
    """Prompt template. Tags (default `base`): `base` (completion models), `chat` (instruct models,
    needs the tokenizer's chat template), `fewshot` / `fewshot-chat` (two worked examples, for very
    small models), `oneshot` (the first example only: a shorter prompt, faster on CPU), or the
    path of a template file with `{question}` and `{instruction}` / tag placeholders. Tool calls
    (default `tools`): `tools`, `tools-oneshot`, `tools-fewshot` (0, 1, 2 worked conversations)."""
    doc_style: str = "r1searcher"
    """Documents block lines: `r1searcher` = `(1)Title: T Text: X` as in the authors' released
    trajectories; `title-lines` = `(1) Title: T` then the text on the next line."""

    chat_template: str | None = Field(
        None, description="Tool calls: the chat template, null = the tokenizer's own; a shipped name (hermes-fallback, "
        "for models whose template has no tool section: SmolLM2) or a .jinja file. Never chosen silently."
    )
    call_format: str | None = Field(
        None, description="Tool calls: how calls are written (hermes, llama3-json); null = detected from the chat template."
    )
    template_kwargs: dict[str, Any] = Field(
        default_factory=dict, description="Tool calls: extra variables of every rendering (e.g. enable_thinking for Qwen3)."
    )

    @field_validator("format")
    @classmethod
    def _known_format(cls, v: str) -> str:
        if v not in PROTOCOLS:
            raise ValueError(f"unknown protocol format {v!r}; choose one of: {', '.join(PROTOCOLS.names())}")
        return v

    @model_validator(mode="after")
    def _template_of_format(self) -> ProtocolConfig:
        protocol = protocol_class(self.format)
        if self.template is None:  # a default, not a setting: `model_fields_set` keeps telling what was given
            self.__dict__["template"] = protocol.default_template
        protocol.check_config(self)
        return self

    @field_validator("tags")
    @classmethod
    def _known_tags(cls, v: str) -> str:
        TAG_PRESETS.get(v)
        return v

    @field_validator("doc_style")
    @classmethod
    def _known_style(cls, v: str) -> str:
        DOC_STYLES.get(v)
        return v
