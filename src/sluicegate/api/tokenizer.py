"""A pool's ``spec.tokenizer``: where the gateway gets a request's token ids.

The precise prefix index (``spec.kvEvents``) is keyed by the servers' token ids, so the
picker must tokenize each request exactly as the servers do. Three sources:

- ``builtin`` (the default): sluicegate's built-in tokenizer (4 UTF-8 bytes per token) —
  what ``sluicegate sim`` and the lab use;
- ``local``: the model's own Hugging Face ``tokenizer.json`` (the ``tokenizers``
  library), chat messages rendered with its chat template (``jinja2``) as vLLM renders
  them; files read and the template compiled when the configuration is loaded;
- ``server``: the endpoint's own ``POST /tokenize`` route (vLLM's), per request, with a
  short timeout and bounded concurrency.

Whatever the source, a request it cannot tokenize (template rejects the messages, the
server does not answer in time) is routed on the approximate match, and counted.
See docs/configuration.md#tokenizer.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator

from sluicegate.api.base import Model
from sluicegate.api.units import Bytes, Seconds


class TokenizerSettings(Model):
    """Per pool: the tokenizer of the precise prefix producer (see the module docstring)."""

    source: Literal["builtin", "local", "server"] = "builtin"
    path: str | None = None
    """``local``: a directory holding ``tokenizer.json`` (and, optionally,
    ``tokenizer_config.json`` with the chat template and special tokens), or the
    ``tokenizer.json`` file itself. Relative paths are relative to the working directory."""
    chat_template: str | None = None
    """``local``: a Jinja chat template file used instead of ``tokenizer_config.json``'s
    ``chat_template`` (vLLM's ``--chat-template``)."""
    content_format: Literal["auto", "string", "openai"] = "auto"
    """``local``: how message content reaches the template — text (``string``) or a list
    of parts (``openai``); ``auto`` detects it from the template (vLLM's
    ``--chat-template-content-format``)."""
    cache_bytes: Annotated[Bytes, Field(ge=0)] = 128 * 1024 * 1024
    """``local``: bound of the token-id cache of rendered prompts seen (0: no cache)."""
    cache_entries: Annotated[int, Field(ge=1)] = 4096
    """``local``: at most this many cached prompts (least recently used leave first)."""
    timeout: Annotated[Seconds, Field(gt=0, le=10)] = 0.05
    """``server``: how long a ``/tokenize`` call may take before the request is routed
    approximately (50 ms; it sits on the request path)."""
    max_concurrency: Annotated[int, Field(ge=1, le=1024)] = 16
    """``server``: ``/tokenize`` calls in flight per pool; a request finding them all busy
    is routed approximately at once (the servers' own work comes first)."""

    @model_validator(mode="after")
    def _paths(self) -> TokenizerSettings:
        if self.source == "local" and not self.path:
            raise ValueError(
                "tokenizer: source 'local' needs a path (tokenizer.json or its directory)"
            )
        if self.source != "local" and (self.path or self.chat_template):
            raise ValueError(
                f"tokenizer: path and chatTemplate are for source 'local', not {self.source!r}"
            )
        return self


__all__ = ["TokenizerSettings"]
