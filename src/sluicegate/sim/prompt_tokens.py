"""Sizing simulated prompts in a real model's tokens (a profile's ``tokenizer``).

The simulator counts a prompt in built-in tokens: 4 UTF-8 bytes each
(:mod:`sluicegate.tokens`). That is close to a large vocabulary's count on English text,
but a small one makes many more tokens of the same text (the lab's tiny vLLM test model:
about 3 × more), so a scenario run on real servers and in the simulator would put
different numbers of tokens into the engines and the KV caches. A profile that names a
Hugging Face ``tokenizer.json`` (``tokenizer:`` in a profile file, e.g. the one
``sluicegate sim calibrate`` measured with) makes the simulated server do what vLLM does
with a text prompt: render chat messages with the model's chat template and encode the
text with the model's tokenizer (:class:`~sluicegate.model_tokenizer.model.ModelTokenizer`,
vLLM 0.32's rules for special tokens — the same rules the gateway's ``source: local``
tokenizer follows). The token ids are then packed as 4-byte built-in
tokens (little-endian, as a prompt of token ids already is), so every count, KV block and
block hash downstream is in the model's tokens — a prompt of ``n`` model tokens is ``n``
simulated tokens, and two prompts share cached blocks exactly when their token ids do, as
in vLLM. A prompt the tokenizer cannot render (a chat without a template, an unsupported
shape) keeps its built-in tokens.
"""

from __future__ import annotations

import sys
from array import array
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sluicegate.model_tokenizer.model import ModelTokenizer
    from sluicegate.model_tokenizer.prefix_cache import PrefixTokenCache

CACHE_BYTES = 16 * 1024 * 1024
"""Bound of the tokenizer's cache of prompts seen (a simulated server sees the same
shared prefixes and conversation histories again and again)."""
CACHE_ENTRIES = 1024


class PromptTokens:
    """A model tokenizer sizing one simulated server's prompts."""

    def __init__(self, model: ModelTokenizer, cache: PrefixTokenCache) -> None:
        self.model = model
        self.cache = cache
        """Content ids of the prompts seen (bounded: :data:`CACHE_BYTES`,
        :data:`CACHE_ENTRIES`). Single-threaded: call :meth:`encode` from the simulated
        server's event loop only — the cache has no lock of its own (the gateway's
        ``local`` tokenizer, which encodes on worker threads, guards its cache with one)."""

    @classmethod
    def load(cls, path: str) -> PromptTokens:
        """The tokenizer at ``path`` (a ``tokenizer.json`` or its folder, with
        ``tokenizer_config.json`` and ``chat_template.jinja`` beside it when present);
        :class:`~sluicegate.model_tokenizer.TokenizerLoadError` if it cannot be read."""
        # imported here: the engine imports this module, and most simulations never load
        # a tokenizer (tokenizers and jinja2 cost ~0.15 s of start-up)
        from sluicegate.model_tokenizer.model import ModelTokenizer

        model = ModelTokenizer.load(Path(path).expanduser())
        return cls(model, model.new_prefix_cache(CACHE_BYTES, CACHE_ENTRIES))

    def encode(self, body: Mapping[str, object], chat: bool) -> bytes | None:
        """The prompt of request ``body`` (chat ``messages`` if ``chat``, else a
        completion ``prompt``) as packed model token ids; None when the tokenizer cannot
        render it."""
        from sluicegate.model_tokenizer.chat import UnrenderableError  # loaded with the model

        try:
            prompt = self.model.prompt(body, chat)
        except UnrenderableError:
            return None
        if isinstance(prompt, array):
            ids = prompt
        else:
            text, special = prompt
            ids = self.model.around(self.cache.encode(text), special)
        return pack(ids) if ids else None


def pack(ids: array[int]) -> bytes:
    """Token ids as built-in tokens: 4 bytes each, little-endian."""
    packed = array("I", ids)
    if sys.byteorder != "little":
        packed.byteswap()
    return packed.tobytes()


def load_prompt_tokens(path: str | None) -> PromptTokens | None:
    """:meth:`PromptTokens.load` of a profile's ``tokenizer`` (None: built-in tokens)."""
    return None if path is None else PromptTokens.load(path)


def load_shared(paths: Iterable[str | None]) -> dict[str, PromptTokens]:
    """Each distinct tokenizer of ``paths`` loaded once, for the engines of one run to
    share (a large vocabulary's tokenizer takes seconds and tens of MB per load; the
    cache it keeps serves every engine, within its one bound)."""
    return {path: PromptTokens.load(path) for path in dict.fromkeys(paths) if path is not None}


__all__ = ["PromptTokens", "load_prompt_tokens", "load_shared", "pack"]
