"""``source: local``: the model's own Hugging Face tokenizer, in the gateway process.

Loaded once when the configuration is read (:meth:`LocalTokenizer.load`): the model's
files and chat template (:class:`~sluicegate.model_tokenizer.model.ModelTokenizer`; a
file that cannot be read or a template that does not compile is a
:class:`TokenizerLoadError` then — never an error at request time). Per request, the
prompt vLLM 0.32 builds (:meth:`ModelTokenizer.prompt
<sluicegate.model_tokenizer.model.ModelTokenizer.prompt>`: the rendered chat, a
completion's text or ids), encoded through the
:class:`~sluicegate.model_tokenizer.prefix_cache.PrefixTokenCache` (the special tokens are
added around the cached content ids, so cache entries serve both routes); what cannot be
rendered as the server would is routed approximately (counted per reason).
"""

from __future__ import annotations

import asyncio
import threading
import time
from array import array
from collections.abc import Callable, Sequence
from dataclasses import replace

from tokenizers import Encoding

from sluicegate.api.tokenizer import TokenizerSettings
from sluicegate.datalayer.endpoint import Endpoint
from sluicegate.framework import LLMRequest
from sluicegate.model_tokenizer.chat import TemplateRejectedError, UnrenderableError
from sluicegate.model_tokenizer.model import ModelTokenizer
from sluicegate.model_tokenizer.prefix_cache import PrefixTokenCache, chunk_hashes
from sluicegate.tokenization.base import PoolTokenizer
from sluicegate.tokenization.deferred import DeferredEncoder, Done
from sluicegate.tokenization.progressive import BlockKeying, Progress, advance, begin, store
from sluicegate.tokenization.selfcheck import cuts_exactly, safe_cut
from sluicegate.tokenization.selfcheck import stamp as file_stamp

Enough = Callable[[Sequence[int]], bool]
"""Given the block keys so far, whether the decision has what it needs."""

CHARS_PER_TOKEN = 4
"""Characters of text encoded per token wanted, at first, when only a prefix of the
prompt's tokens is needed (``maxPrefixTokensToMatch``): about what BPE vocabularies
average on English text and code. A text whose cut holds too few tokens is cut again twice
as long, continuing the cached encoding of the shorter cut (only the rest is encoded), so
this bounds the work, not the result."""
THREAD_PROMPT_BYTES = 8192
"""Prompts longer than this (bytes) are tokenized in a worker thread, off the event loop
(the producer's prefetch); shorter ones on it, where a thread hop would cost more than
the encode (measured: docs/configuration.md#tokenizer)."""


class LocalTokenizer(PoolTokenizer):
    """A pool's tokenizer from local files (see the module docstring)."""

    source = "local"

    def __init__(self, model: ModelTokenizer, settings: TokenizerSettings) -> None:
        super().__init__(settings)
        self.model = model
        self.template = model.template
        """None: the tokenizer has no chat template (chat requests are routed
        approximately, as vLLM would refuse them)."""
        self.config = model.config
        self.prefix_ids, self.suffix_ids = model.prefix_ids, model.suffix_ids
        self.cache = model.new_prefix_cache(settings.cache_bytes, settings.cache_entries)
        self._lock = threading.Lock()
        self.stamp: tuple[tuple[int, int] | None, ...] = ()
        """The files' (mtime_ns, size) when loaded (see
        :func:`~sluicegate.tokenization.selfcheck.stamp`)."""
        # A prompt may be encoded only up to a word boundary when the tokenizer's added
        # tokens cannot straddle or swallow the space it is cut before.
        added = model.content.get_added_tokens_decoder().values()
        self.cut_prefixes = (
            self.cache.continuation
            and not any(" " in t.content or t.rstrip for t in added)
            and cuts_exactly(self._encode)
        )
        """Whether :meth:`text_ids` may encode only a prompt's prefix (see there)."""
        self.progressive = self.cut_prefixes and not self.suffix_ids
        """Whether :meth:`decide` may encode only as far as a decision needs (a
        tokenizer that puts special tokens after the text encodes it whole)."""
        self.deferred = DeferredEncoder(
            self.cache, self._encode, self._lock, lambda p: self._store(p, _on_loop())
        )
        """The worker finishing decided prompts after dispatch."""
        self.deferred_counters = self.deferred.counters

    @classmethod
    def load(cls, settings: TokenizerSettings) -> LocalTokenizer:
        """Read and compile everything ``settings`` names; raises TokenizerLoadError."""
        assert settings.path is not None  # the settings model requires it for local
        stamp = file_stamp(settings)  # before reading: a file changed meanwhile reloads next time
        model = ModelTokenizer.load(settings.path, settings.chat_template, settings.content_format)
        made = cls(model, settings)
        made.stamp = stamp
        return made

    @property
    def prefix_cache(self) -> PrefixTokenCache:
        return self.cache

    def files_unchanged(self) -> bool:
        return file_stamp(self.settings) == self.stamp

    def _encode(self, text: str) -> Encoding:
        return self.model.encode(text)

    def text_ids(self, text: str, add_special_tokens: bool, max_tokens: int = 0) -> array[int]:
        """``text``'s ids, with the tokenizer's special tokens around it when asked. With
        ``max_tokens`` > 0 only a prefix of the text may be encoded: the ids returned
        then start with the whole encoding's first ``max_tokens`` ids (and may stop
        there, without the closing special tokens)."""
        lead = len(self.prefix_ids) if add_special_tokens else 0
        ids, whole = self._bounded(text, max_tokens - lead if max_tokens else 0)
        return self.model.around(ids, add_special_tokens, whole)

    def _bounded(self, text: str, max_tokens: int) -> tuple[array[int], bool]:
        """The ids of ``text`` or of a prefix of it holding its first ``max_tokens``
        (> 0) ids; whether they are the whole text's. The prefix ends before a space
        that follows a non-space: a word boundary of byte-level BPE's pre-tokenizer
        and of Metaspace, where the words before it come out as in the whole text
        (checked at load by :func:`~sluicegate.tokenization.selfcheck.cuts_exactly`)."""
        chars = max_tokens * CHARS_PER_TOKEN
        while self.cut_prefixes and 0 < chars < len(text):
            cut = safe_cut(text, chars)
            if cut <= 0:
                break
            ids = self._cached(text[:cut])
            if len(ids) >= max_tokens:
                return ids, False
            chars *= 2
        return self._cached(text), True

    def _cached(self, text: str) -> array[int]:
        # The cache is not thread-safe: one encode at a time goes through it. On the event
        # loop a busy cache (a worker thread encoding a long prompt) is bypassed rather
        # than waited for.
        on_loop = _on_loop()
        if self._lock.acquire(blocking=not on_loop):
            try:
                return self.cache.encode(text)
            finally:
                self._lock.release()
        return array("I", self._encode(text).ids)

    def wants_fetch(self, request: LLMRequest) -> bool:
        return len(request.prompt) > THREAD_PROMPT_BYTES or request.body_bytes > (
            THREAD_PROMPT_BYTES
        )

    async def fetch(
        self, request: LLMRequest, endpoints: Sequence[Endpoint], max_tokens: int = 0
    ) -> array[int] | None:
        """:meth:`token_ids` in a worker thread (a long prompt: rendering and encoding
        take milliseconds to seconds; ``tokenizers`` releases the GIL meanwhile)."""
        return await asyncio.to_thread(self.token_ids, request, max_tokens)

    def token_ids(self, request: LLMRequest, max_tokens: int = 0) -> array[int] | None:
        started = time.perf_counter()
        try:
            ids = self._ids(request, max_tokens)
        finally:
            self.counters.seconds += time.perf_counter() - started
        if ids is not None:
            self.counters.tokenized += 1
        return ids

    def _ids(self, request: LLMRequest, max_tokens: int) -> array[int] | None:
        prompt = self._prompt(request)
        if prompt is None or isinstance(prompt, array):
            return prompt
        text, special = prompt
        return self.text_ids(text, special, max_tokens)

    def _prompt(self, request: LLMRequest) -> tuple[str, bool] | array[int] | None:
        """The text to encode and whether special tokens go around it; or the ids a
        completion gave; or None (the fallback counted)."""
        body = request.body
        if body is None or request.kind not in ("chat", "completions"):
            self.counters.fallback("kind")
            return None
        try:
            return self.model.prompt(body, request.kind == "chat")
        except TemplateRejectedError:
            self.counters.fallback("template")
        except UnrenderableError:
            self.counters.fallback("unsupported")
        return None

    # ------------------------------------------------------------ progressive encoding

    def decide(
        self,
        request: LLMRequest,
        keying: BlockKeying,
        enough: Enough,
        max_tokens: int = 0,
        resume: Progress | None = None,
    ) -> Progress | None:
        """The prompt encoded only until ``enough(keys)`` (or ``max_tokens`` ids, or its
        end), through the prefix cache (:mod:`~sluicegate.tokenization.progressive`);
        ``keying`` without the special tokens, which this adds. None: route
        approximately (counted). ``resume``: this request's progress from an earlier
        pass, continued (not counted again)."""
        started = time.perf_counter()
        if resume is not None:
            before = resume.encoded_tokens
            try:
                advance(resume, self._encode, enough, max_tokens)
            finally:
                self.counters.seconds += time.perf_counter() - started
            self.cache.counters.add(tokens_encoded=resume.encoded_tokens - before)
            return resume
        try:
            p = self._decide(request, keying, enough, max_tokens)
        finally:
            self.counters.seconds += time.perf_counter() - started
        if p is not None:
            self.counters.tokenized += 1
            p.limit = max_tokens
        return p

    def _decide(
        self, request: LLMRequest, keying: BlockKeying, enough: Enough, max_tokens: int
    ) -> Progress | None:
        prompt = self._prompt(request)
        if prompt is None:
            return None
        if isinstance(prompt, array):
            keys: list[int] = []
            keying.extend(keys, prompt)
            return Progress("", b"", [], keying, prompt, 0, keys, True)
        text, special = prompt
        if special and self.prefix_ids:
            keying = replace(keying, lead=tuple(self.prefix_ids))
        cache = self.cache
        on_loop = _on_loop()
        locked = self._lock.acquire(blocking=not on_loop)
        if locked:
            try:
                p = begin(cache, text, keying)
            finally:
                self._lock.release()
        else:  # a worker holds the cache through a whole encode: do without it (the
            # text's bytes and chunk hashes all the same, so the rest can still be
            # finished after dispatch and stored, and its speculation run)
            data = text.encode()
            p = Progress(text, data, chunk_hashes(data), keying, array("I"), 0, [], False)
        known = 0 if p.whole else len(p.ids)
        mismatched = not advance(p, self._encode, enough, max_tokens)
        if mismatched:
            known = 0
        cache.counters.add(
            mismatches=int(mismatched),
            prefix_hits=int(known > 0),
            tokens_saved=known,
            misses=int(not known and p.encoded_tokens > 0),
            tokens_encoded=p.encoded_tokens,
        )
        if p.whole:  # a partial encoding is stored when it is finished
            self._store(p, on_loop)
        return p

    def _store(self, p: Progress, on_loop: bool) -> None:
        if self._lock.acquire(blocking=not on_loop):
            try:
                store(self.cache, p)
            finally:
                self._lock.release()

    def finish_later(self, progress: Progress, done: Done | None = None) -> None:
        """Encode the rest of a decided prompt after dispatch (bounded, counted; see
        :mod:`~sluicegate.tokenization.deferred`)."""
        if progress.whole:
            if done is not None:
                done(list(progress.keys))
            return
        if not progress.data or (self.cache.max_bytes <= 0 and done is None):
            return  # nothing to finish, or nowhere to keep it
        self.deferred.submit(progress, done)  # a full queue drops it: the cache keeps what it has

    async def fetch_decision(
        self, request: LLMRequest, keying: BlockKeying, enough: Enough, max_tokens: int = 0
    ) -> Progress | None:
        """:meth:`decide` in a worker thread (a long prompt; ``enough`` must then only
        read what it looks up)."""
        return await asyncio.to_thread(self.decide, request, keying, enough, max_tokens)

    async def close(self) -> None:
        self.deferred.close()


def _on_loop() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:  # a worker thread (or no loop at all)
        return False
    return True


__all__ = ["CHARS_PER_TOKEN", "THREAD_PROMPT_BYTES", "LocalTokenizer"]
