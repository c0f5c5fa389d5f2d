"""What every pool tokenizer offers, what it counts, and the service plugins find it in.

The host builds one :class:`PoolTokenizer` per pool whose ``spec.tokenizer`` is not
``builtin`` (:func:`sluicegate.tokenization.build.build_tokenizers`) and offers them under
:data:`TOKENIZER_SERVICE`; a pool absent from :attr:`TokenizerService.pools` uses the
built-in tokenizer (:func:`sluicegate.tokens.token_id_array`).
"""

from __future__ import annotations

import abc
from array import array
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Final, Literal

from sluicegate.api.tokenizer import TokenizerSettings
from sluicegate.datalayer.endpoint import Endpoint
from sluicegate.framework import LLMRequest
from sluicegate.model_tokenizer import TokenizerLoadError, given_token_ids

if TYPE_CHECKING:  # the cache module loads the tokenizers library
    from sluicegate.model_tokenizer.prefix_cache import PrefixTokenCache
    from sluicegate.tokenization.deferred import Done
    from sluicegate.tokenization.local import Enough
    from sluicegate.tokenization.progressive import BlockKeying, Progress

TOKENIZER_SERVICE: Final = "tokenizer"
"""The name under which the host provides a :class:`TokenizerService`
(``PluginContext.services``)."""

FallbackReason = Literal["template", "unsupported", "timeout", "error", "busy", "kind"]
"""Why a request was routed on the approximate match instead of its token ids: the chat
template rejected its messages (``template``); it holds what the gateway does not render
as the server would (``unsupported``: images, ``continue_final_message`` …); the
``/tokenize`` call timed out, failed, or found every slot busy; the route is not a
completion or chat (``kind``)."""

FALLBACK_REASONS: Final[tuple[FallbackReason, ...]] = (
    "template",
    "unsupported",
    "timeout",
    "error",
    "busy",
    "kind",
)


@dataclass
class TokenizerCounters:
    """Totals since start: requests given token ids, requests routed approximately per
    :data:`FallbackReason`, and seconds spent producing token ids (rendering, encoding,
    waiting for ``/tokenize``)."""

    tokenized: int = 0
    fallbacks: dict[FallbackReason, int] = field(
        default_factory=lambda: dict.fromkeys(FALLBACK_REASONS, 0)
    )
    seconds: float = 0.0

    def fallback(self, reason: FallbackReason) -> None:
        self.fallbacks[reason] += 1


@dataclass
class DeferredCounters:
    """Totals since start of prompts finished after dispatch (progressive encoding):
    finished, dropped for a full queue, failed (logged), and the worker's CPU seconds."""

    finished: int = 0
    dropped: int = 0
    failed: int = 0
    seconds: float = 0.0


class PoolTokenizer(abc.ABC):
    """One pool's tokenizer: a request's token ids as the pool's servers will see them."""

    source: str
    """``local`` or ``server`` (the configuration's ``source``)."""
    needs_io: bool = False
    """True when ids come from :meth:`fetch` (an awaited call) rather than :meth:`token_ids`."""
    deferred_counters: DeferredCounters | None = None
    """Its worker's counters, if it finishes prompts after dispatch (for metrics)."""
    progressive: bool = False
    """Whether it offers :meth:`decide`: a prompt encoded only as far as a decision
    needs (:mod:`sluicegate.tokenization.progressive`), the rest after dispatch."""

    def __init__(self, settings: TokenizerSettings) -> None:
        self.settings = settings
        """The pool's ``spec.tokenizer`` this was built from."""
        self.counters = TokenizerCounters()

    @property
    def prefix_cache(self) -> PrefixTokenCache | None:
        """Its cache of prompts seen, if it keeps one (for metrics)."""
        return None

    @abc.abstractmethod
    def token_ids(self, request: LLMRequest, max_tokens: int = 0) -> array[int] | None:
        """The request's prompt token ids (an ``array("I")`` the caller must not change),
        or None — counted — when it must be routed approximately. Never raises. With
        ``max_tokens`` > 0 only the first ``max_tokens`` ids are needed: the ids may
        stop after them."""

    def wants_fetch(self, request: LLMRequest) -> bool:
        """Whether ``request``'s ids should come from :meth:`fetch`, awaited before
        scheduling (I/O, or work too long for the event loop), not :meth:`token_ids`."""
        return self.needs_io

    async def fetch(
        self, request: LLMRequest, endpoints: Sequence[Endpoint], max_tokens: int = 0
    ) -> array[int] | None:
        """:meth:`token_ids` for a request it :meth:`wants_fetch` for, asking one of
        ``endpoints`` when it needs I/O."""
        return self.token_ids(request, max_tokens)

    def decide(
        self,
        request: LLMRequest,
        keying: BlockKeying,
        enough: Enough,
        max_tokens: int = 0,
        resume: Progress | None = None,
    ) -> Progress | None:
        """The prompt encoded until ``enough(keys)`` says the decision has what it needs
        (only when :attr:`progressive`)."""
        raise NotImplementedError(f"{type(self).__name__} encodes prompts whole")

    async def fetch_decision(
        self, request: LLMRequest, keying: BlockKeying, enough: Enough, max_tokens: int = 0
    ) -> Progress | None:
        """:meth:`decide` for a request it :meth:`wants_fetch` for."""
        return self.decide(request, keying, enough, max_tokens)

    def finish_later(self, progress: Progress, done: Done | None = None) -> None:
        """Encode the rest of a decided prompt after dispatch; ``done`` gets its whole
        block keys (only when :attr:`progressive`)."""
        raise NotImplementedError(f"{type(self).__name__} encodes prompts whole")

    def files_unchanged(self) -> bool:
        """Whether the files it was loaded from are as they were (a reload with the same
        settings keeps it then); true for one that reads none."""
        return True

    async def close(self) -> None:  # noqa: B027 - optional: most hold nothing open
        """Release what the tokenizer holds open (at shutdown, on the event loop)."""


def prompt_token_ids(request: LLMRequest) -> array[int] | None:
    """A completion prompt given as token ids (or a batch whose first prompt is): the
    ids the server will use as they are (vLLM adds no special tokens to them)."""
    if request.kind != "completions" or request.body is None:
        return None
    return given_token_ids(request.body)


@dataclass(eq=False)
class TokenizerService:
    """Per pool name, its tokenizer (pools without one use the built-in tokenizer)."""

    pools: dict[str, PoolTokenizer] = field(default_factory=dict)

    @property
    def fetching(self) -> bool:
        """Whether any pool has a tokenizer (the producer may prefetch then: a ``server``
        one's ``/tokenize`` call, a ``local`` one's long prompts in a worker thread)."""
        return bool(self.pools)


__all__ = [
    "FALLBACK_REASONS",
    "TOKENIZER_SERVICE",
    "DeferredCounters",
    "FallbackReason",
    "PoolTokenizer",
    "TokenizerCounters",
    "TokenizerLoadError",
    "TokenizerService",
    "prompt_token_ids",
]
