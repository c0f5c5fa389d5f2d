"""A model's own Hugging Face tokenizer and vLLM's rules for a prompt's token ids, shared
by the gateway's ``source: local`` tokenizer (:mod:`sluicegate.tokenization.local`) and the
simulated vLLM server sizing prompts in a profile's tokenizer
(:mod:`sluicegate.sim.prompt_tokens`).

- :mod:`~sluicegate.model_tokenizer.model` — ``ModelTokenizer``: a ``tokenizer.json`` with
  its ``tokenizer_config.json`` and chat template, loaded once; which text of a request
  is encoded and with which special tokens, as vLLM 0.32 builds prompts;
- :mod:`~sluicegate.model_tokenizer.chat` — the chat template's Jinja environment and
  message preparation, as vLLM and transformers render them;
- :mod:`~sluicegate.model_tokenizer.prefix_cache` — ``PrefixTokenCache``: token ids of
  prompts seen, continued so a new turn encodes only what is new.

This module itself loads neither the ``tokenizers`` nor the ``jinja2`` library (the
gateway's tokenizer service imports it; only a configured tokenizer loads them).
"""

from __future__ import annotations

from array import array
from collections.abc import Mapping


class TokenizerLoadError(ValueError):
    """A tokenizer's files cannot be read or its chat template does not compile (raised
    when the configuration or a profile is loaded, naming the file)."""


def given_token_ids(body: Mapping[str, object]) -> array[int] | None:
    """A completion body's prompt given as token ids (or a batch whose first prompt is):
    the ids the server will use as they are (vLLM adds no special tokens to them)."""
    prompt = body.get("prompt")
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], list):
        prompt = prompt[0]
    if (
        isinstance(prompt, list)
        and prompt
        and all(isinstance(t, int) and not isinstance(t, bool) and 0 <= t < 2**32 for t in prompt)
    ):
        return array("I", prompt)
    return None


__all__ = ["TokenizerLoadError", "given_token_ids"]
