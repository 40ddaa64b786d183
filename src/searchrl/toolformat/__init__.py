"""Native tool calls: a model's own chat template writes the calls and renders the results.

- `parse`: call formats by name (`CALL_FORMATS`): `hermes` (Hermes / Qwen2.5 / Qwen3,
  `<tool_call>{"name": …, "arguments": …}</tool_call>`, several per turn) and `llama3-json`
  (Llama 3.1 / 3.2, one `{"name": …, "parameters": …}` per turn, results in the `ipython`
  role). `detect_format` picks one from a template's source.
- `chat.NativeChat`: prompt ids, the turn read from sampled ids, and the observation ids that
  follow them (the difference of two renderings; loss mask 0). Ids in, ids out: any backend.
- `selftest.check_template`: the start-up check that the template is prefix-preserving.

**The fallback template.** A model whose chat template has no tool section (SmolLM2-135M-
Instruct's) gets none silently: choose ours by name, `template: hermes-fallback`
(`searchrl/configs/chat_templates/hermes-fallback.jinja`). It is ChatML (the `<|im_start|>` /
`<|im_end|>` tokens SmolLM2 already has), lists the tools one per line in the system turn,
expects calls as Hermes `<tool_call>` JSON, returns each result in a `tool` turn as plain text,
injects no default system prompt and is prefix-preserving.
"""

from searchrl.toolformat.chat import NativeChat, load_chat_template, shipped_templates
from searchrl.toolformat.parse import CALL_FORMATS, CallFormat, Turn, detect_format
from searchrl.toolformat.selftest import check_template

__all__ = [
    "CALL_FORMATS",
    "CallFormat",
    "NativeChat",
    "Turn",
    "check_template",
    "detect_format",
    "load_chat_template",
    "shipped_templates",
]
