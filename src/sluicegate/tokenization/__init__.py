"""Request-path tokenization for precise prefix routing (issue 17): a request's token ids
as the pool's servers will compute them.

- :mod:`~sluicegate.tokenization.base` — ``PoolTokenizer`` (one per pool), its
  counters, and ``TokenizerService``, as the ``precise-prefix-cache-producer`` finds it;
- :mod:`~sluicegate.tokenization.local` — ``LocalTokenizer`` (``source: local``): the
  model's ``tokenizer.json`` and chat template, in process;
- :mod:`~sluicegate.tokenization.remote` — ``ServerTokenizer`` (``source: server``):
  the servers' ``/tokenize``;
- :mod:`~sluicegate.tokenization.build` — ``build_tokenizers``: the pools' tokenizers
  from the configuration.

The model's files, vLLM's prompt rules, the chat template and the ``PrefixTokenCache``
(token ids of prompts seen, continued so a new turn encodes only what is new) are
:mod:`sluicegate.model_tokenizer`'s, shared with the simulator.

Exports load on first use: ``base`` (what the plugin imports) stays free of the
``tokenizers`` and ``jinja2`` libraries, which only a configured ``local`` source loads.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sluicegate import lazy

_BASE = "sluicegate.tokenization.base"
_EXPORTS = {
    "FALLBACK_REASONS": _BASE,
    "TOKENIZER_SERVICE": _BASE,
    "FallbackReason": _BASE,
    "PoolTokenizer": _BASE,
    "TokenizerCounters": _BASE,
    "TokenizerLoadError": _BASE,
    "TokenizerService": _BASE,
    "LocalTokenizer": "sluicegate.tokenization.local",
    "ServerTokenizer": "sluicegate.tokenization.remote",
    "PrefixTokenCache": "sluicegate.model_tokenizer.prefix_cache",
    "CacheCounters": "sluicegate.model_tokenizer.prefix_cache",
    "build_tokenizers": "sluicegate.tokenization.build",
}

if TYPE_CHECKING:
    from sluicegate.model_tokenizer.prefix_cache import CacheCounters, PrefixTokenCache
    from sluicegate.tokenization.base import (
        FALLBACK_REASONS,
        TOKENIZER_SERVICE,
        FallbackReason,
        PoolTokenizer,
        TokenizerCounters,
        TokenizerLoadError,
        TokenizerService,
    )
    from sluicegate.tokenization.build import build_tokenizers
    from sluicegate.tokenization.local import LocalTokenizer
    from sluicegate.tokenization.remote import ServerTokenizer

__getattr__ = lazy.exports(__name__, _EXPORTS, globals())

__all__ = [
    "FALLBACK_REASONS",
    "TOKENIZER_SERVICE",
    "CacheCounters",
    "FallbackReason",
    "LocalTokenizer",
    "PoolTokenizer",
    "PrefixTokenCache",
    "ServerTokenizer",
    "TokenizerCounters",
    "TokenizerLoadError",
    "TokenizerService",
    "build_tokenizers",
]
