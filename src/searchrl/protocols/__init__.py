"""What the model's text means (docs/guides/protocols.md): one `Protocol` interface
(`protocols.base`) and a registry of its implementations keyed by `protocol.format`. Nothing
outside this package reads model text.

- `tagged`: the tag protocol (`format: tags`, the paper's); its tags (`tags`), prompt templates
  (`prompts`) and documents blocks.
- `chat_tools`: the model's chat template's native tool calls (`format: tool-calls`); the
  template bound to a tokenizer (`chat_template`), its call formats (`call_formats`) and the
  start-up check that it is prefix-preserving (`template_selftest`).
- `format_rules`: the format rules both check.

Adding a protocol is one module implementing `Protocol` and one registry line (below).
"""

from searchrl.protocols.base import Protocol, Script, Step, TurnRead
from searchrl.protocols.config import PROTOCOLS, protocol_class

# Each import registers its format in PROTOCOLS.
from searchrl.protocols import chat_tools, tagged  # noqa: F401  isort: skip

__all__ = ["PROTOCOLS", "Protocol", "Script", "Step", "TurnRead", "protocol_class"]
