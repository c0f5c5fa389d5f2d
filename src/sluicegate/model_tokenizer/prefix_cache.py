"""Token ids of prompts already seen, reused so a new turn tokenizes only what is new.

A chat's next request renders to the previous request's text plus the new turns, so
after the first turn most of a prompt's tokens are known. :class:`PrefixTokenCache`
keeps, per rendered prompt seen (least recently used first out, bounded in bytes and
entries), its text, its token ids and *safe points*: token indices where a BPE encoding
may be cut and continued from the text alone.

**Why a cut is safe.** A Hugging Face tokenizer splits the text at its added (special)
tokens, cuts each segment into *words* with its pre-tokenizer (the regex split of
byte-level BPE: GPT-2, cl100k, Llama 3, Qwen …), and runs BPE inside each word: no
merge crosses a word boundary. The regex scan is left to right, with no look-behind or
anchor, and a word's extent depends only on the text from its start to one or two
characters past its end (a run's end, a ``(?!\\S)`` look-ahead). So a word start *p*
of text *A* at least :data:`MARGIN_CHARS` before the end of what *A* shares with text
*B* is also a word start of *B*, and encoding ``B[p:]`` gives exactly the tokens of *B*
from *p* on. The safe points are such word starts (one per :data:`SAFE_STEP_TOKENS` tokens,
and every one among the text's last :data:`DENSE_TAIL_CHARS` characters — a
conversation's next turn shares the text up to about its end — read from the encoding's
word index). A new text is then ``ids[:t]`` of the
cached entry plus the encoding of the rest from the safe point *t* before the shared
prefix's end (less the margin).

**Checked, not assumed.** The continuation re-encodes at least one safe step the
entry already holds (near the entry's end, one word); when those tokens differ from
the entry's (a tokenizer whose normalizer or pre-tokenizer looks back, e.g.
SentencePiece's ``Metaspace`` prepending to the first word only) the text is encoded
whole and the mismatch counted. The property test
(``tests/tokenization/test_tok_prefix_cache.py``) checks equality with the whole
encoding over random texts and cut points with a real byte-level BPE.

**Finding the entry.** Each entry registers chained xxh3 hashes of its text at every
:data:`CHUNK_BYTES` boundary of its UTF-8, and one of its whole text; a lookup hashes the new text's
chunks, probes from the longest, compares the text itself before trusting a hit, and
finds where the two texts first differ (a binary search over the bytes).

Entries stored by progressive encoding (:mod:`sluicegate.tokenization.progressive`) also
keep the block keys of their ids (8 bytes per block, counted in the bound), for the
keying they were made with: an opaque value of the caller's, only compared for equality
(so this package needs nothing of the tokenization layer above it).
"""

from __future__ import annotations

import bisect
import sys
import threading
from array import array
from collections import OrderedDict
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field

import xxhash
from tokenizers import Encoding

CHUNK_BYTES = 1024
"""Granularity (bytes of UTF-8) at which a new text's shared prefix with an entry is found."""
SAFE_STEP_TOKENS = 16
"""One safe point is kept per this many tokens of an entry (at the word start at or
before every 16th token: a continuation re-encodes one step, 16–32 tokens, to check
itself; a safe point costs 8 bytes, half a byte per token)."""
DENSE_TAIL_CHARS = 96
DENSE_TAIL_TOKENS = 48
"""Every word start among the last :data:`DENSE_TAIL_CHARS` characters of an encoding (at
most its last this many tokens) is a safe point too: where a conversation's next turn
continues. At most 48 more points, 8 bytes each, per entry or chunk (counted)."""
MARGIN_CHARS = 16
"""A safe point used for a continuation lies at least this far before the shared end."""
_ENTRY_OVERHEAD = 240
"""Bytes per entry beyond its arrays and text (objects, dict slots), measured roughly."""
_CHECKPOINT_BYTES = 100
"""Bytes per registered chunk hash (dict slot, int objects, list slot)."""

_xxh3 = xxhash.xxh3_64_intdigest
_WHOLE_SEED = 0x5EED


def whole_hash(data: bytes) -> int:
    """The hash a text is found under when seen whole."""
    return _xxh3(data, _WHOLE_SEED)


def chunk_hashes(data: bytes) -> list[int]:
    """Chained hashes of UTF-8 ``data`` at every full :data:`CHUNK_BYTES` boundary."""
    out: list[int] = []
    h = 0
    view = memoryview(data)
    for start in range(0, len(data) - CHUNK_BYTES + 1, CHUNK_BYTES):
        h = _xxh3(view[start : start + CHUNK_BYTES], h)
        out.append(h)
    return out


@dataclass(slots=True, eq=False)
class _Entry:
    data: bytes
    """The text, UTF-8 encoded (compared, never decoded)."""
    ids: array[int]
    safe_chars: array[int]
    """Character offsets of the safe points, ascending (the first is 0)."""
    safe_tokens: array[int]
    """Token index at each safe point."""
    checkpoints: list[int]
    whole: int
    nbytes: int = 0
    keys: array[int] = field(default_factory=lambda: array("Q"))
    """Block keys of its ids (progressive encoding), for :attr:`keying`."""
    keying: Hashable | None = None
    """What :attr:`keys` were made with (the caller's, compared for equality only)."""


@dataclass
class CacheCounters:
    """Totals since start: lookups answered whole from an entry (``hits``), continued from
    one (``prefix_hits``) or encoded whole (``misses``); tokens taken from entries instead
    of encoded (``tokens_saved``), tokens encoded (``tokens_encoded``), continuations that
    did not match and were encoded whole (``mismatches``), entries evicted."""

    hits: int = 0
    prefix_hits: int = 0
    misses: int = 0
    tokens_saved: int = 0
    tokens_encoded: int = 0
    mismatches: int = 0
    evictions: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def add(
        self,
        *,
        hits: int = 0,
        prefix_hits: int = 0,
        misses: int = 0,
        tokens_saved: int = 0,
        tokens_encoded: int = 0,
        mismatches: int = 0,
        evictions: int = 0,
    ) -> None:
        """Add to the totals atomically. The event loop and the tokenizer's worker
        threads count into the same totals, and not always under the cache's lock (a
        decision on the loop does without a busy cache), so a plain ``+=`` could lose
        counts; this short lock is never held across an encode."""
        with self._lock:
            self.hits += hits
            self.prefix_hits += prefix_hits
            self.misses += misses
            self.tokens_saved += tokens_saved
            self.tokens_encoded += tokens_encoded
            self.mismatches += mismatches
            self.evictions += evictions


@dataclass(eq=False)
class PrefixTokenCache:
    """Token ids of ``encode(text)`` with prefixes of texts seen reused (see module).

    ``encode`` must add no special tokens (the caller adds a BOS itself). ``max_bytes``
    and ``max_entries`` bound what is kept (0 bytes: nothing is kept).
    """

    encode_fn: Callable[[str], Encoding]
    max_bytes: int
    max_entries: int
    continuation: bool = True
    """Whether entries are continued (False: only exact repeats are served from them)."""
    counters: CacheCounters = field(default_factory=CacheCounters)
    _entries: OrderedDict[int, _Entry] = field(default_factory=OrderedDict)
    _by_chunk: dict[int, int] = field(default_factory=dict)
    _by_whole: dict[int, int] = field(default_factory=dict)
    _next_id: int = 0
    nbytes: int = 0
    """Bytes the entries are estimated to take (≤ ``max_bytes``)."""

    def __len__(self) -> int:
        return len(self._entries)

    def encode(self, text: str) -> array[int]:
        """The token ids of ``text`` (an ``array("I")``; callers must not change it)."""
        if self.max_bytes <= 0:
            ids = array("I", self.encode_fn(text).ids)
            self.counters.add(misses=1, tokens_encoded=len(ids))
            return ids
        data = text.encode()
        whole = whole_hash(data)
        hit = self.lookup_whole(data, whole)
        if hit is not None:
            return hit[1].ids
        hashes = chunk_hashes(data)
        base = self._longest(data, hashes) if self.continuation else None
        if base is not None:
            key, entry, shared = base
            made = self._continue(entry, text, data, shared)
            if made is not None:
                whole_prefix = shared == len(entry.data)
                self._store(made, hashes, whole, supersedes=key if whole_prefix else None)
                return made.ids
            self.counters.add(mismatches=1)
        encoding = self.encode_fn(text)
        made = _entry_of(data, encoding, encoding.ids, 0, None)
        self.counters.add(misses=1, tokens_encoded=len(made.ids))
        self._store(made, hashes, whole, None)
        return made.ids

    def lookup_whole(self, data: bytes, whole: int | None = None) -> tuple[int, _Entry] | None:
        """The entry of exactly ``data`` (counted as a hit), if one is kept."""
        key = self._by_whole.get(whole_hash(data) if whole is None else whole)
        if key is None:
            return None
        entry = self._entries[key]
        if entry.data != data:
            return None
        self._entries.move_to_end(key)
        self.counters.add(hits=1, tokens_saved=len(entry.ids))
        return key, entry

    def rekey(self, key: int, keys: array[int], keying: Hashable) -> None:
        """Replace entry ``key``'s cached block keys (its size bound kept: an entry that
        would outgrow the cache's bytes keeps none)."""
        entry = self._entries[key]
        grow = 8 * (len(keys) - len(entry.keys))
        if self.nbytes + grow > self.max_bytes:
            return
        entry.keys, entry.keying = keys, keying
        entry.nbytes += grow
        self.nbytes += grow

    def _longest(self, data: bytes, hashes: list[int]) -> tuple[int, _Entry, int] | None:
        """The entry sharing the longest chunk-aligned prefix with ``data`` (its key and
        itself), and the bytes they share (exactly: the entry's whole text when it is a
        prefix, else up to where they first differ)."""
        for k in range(len(hashes) - 1, -1, -1):
            key = self._by_chunk.get(hashes[k])
            if key is None:
                continue
            entry = self._entries[key]
            end = (k + 1) * CHUNK_BYTES
            if data.startswith(entry.data[:end]):
                self._entries.move_to_end(key)
                if data.startswith(entry.data):
                    return key, entry, len(entry.data)
                return key, entry, _common_end(data, entry.data, end)
        return None

    def _continue(self, entry: _Entry, text: str, data: bytes, shared: int) -> _Entry | None:
        """``text``'s entry continued from ``entry`` (shared prefix: ``shared`` bytes of
        ``data``), or None when the re-encoded overlap does not match."""
        if not text.isascii():  # the characters wholly inside the shared bytes
            shared = len(data[:shared].decode(errors="ignore"))
        limit = shared - MARGIN_CHARS
        i = bisect.bisect_right(entry.safe_chars, limit) - 1
        if i < 1:
            return None  # no safe point with a step of overlap before it
        # continue from the safe point before the last usable one: the step between them
        # is re-encoded and must come out as the entry has it
        start_char, start_tok = entry.safe_chars[i - 1], entry.safe_tokens[i - 1]
        check_tok = entry.safe_tokens[i]
        tail = self.encode_fn(text[start_char:])
        tail_ids = tail.ids
        overlap = check_tok - start_tok
        if (
            len(tail_ids) < overlap
            or array("I", tail_ids[:overlap]) != entry.ids[start_tok:check_tok]
        ):
            return None
        made = _entry_of(data, tail, tail_ids, start_char, entry, start_tok, i - 1)
        self.counters.add(prefix_hits=1, tokens_saved=start_tok, tokens_encoded=len(tail_ids))
        return made

    def _store(
        self, entry: _Entry, hashes: list[int], whole: int, supersedes: int | None
    ) -> int | None:
        """Keep ``entry`` (its key; None when it alone exceeds the bound)."""
        entry.checkpoints = hashes
        entry.whole = whole
        entry.nbytes = (
            sys.getsizeof(entry.data)
            + 4 * (len(entry.ids) + len(entry.safe_chars) + len(entry.safe_tokens))
            + 8 * len(entry.keys)
            + _CHECKPOINT_BYTES * len(hashes)
            + _ENTRY_OVERHEAD
        )
        if entry.nbytes > self.max_bytes:
            return None
        if supersedes is not None and supersedes in self._entries:
            # its text is a prefix of this one: this one serves both
            self._drop(supersedes)
        key = self._next_id
        self._next_id += 1
        self._entries[key] = entry
        self.nbytes += entry.nbytes
        for h in hashes:
            self._by_chunk[h] = key
        self._by_whole[whole] = key
        while len(self._entries) > self.max_entries or self.nbytes > self.max_bytes:
            oldest = next(iter(self._entries))
            self._drop(oldest)
            self.counters.add(evictions=1)
        return key if key in self._entries else None

    def _drop(self, key: int) -> None:
        entry = self._entries.pop(key)
        self.nbytes -= entry.nbytes
        for h in entry.checkpoints:
            if self._by_chunk.get(h) == key:
                del self._by_chunk[h]
        if self._by_whole.get(entry.whole) == key:
            del self._by_whole[entry.whole]


def _common_end(a: bytes, b: bytes, start: int) -> int:
    """The length of the common prefix of ``a`` and ``b``, known to be ≥ ``start``: a
    binary search comparing slices (C memcmp), O(length − start) bytes compared."""
    lo, hi = start, min(len(a), len(b))
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[lo:mid] == b[lo:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


def _entry_of(
    data: bytes,
    tail: Encoding,
    tail_ids: list[int],
    start_char: int,
    base: _Entry | None,
    start_tok: int = 0,
    base_points: int = 0,
    at_end: bool = True,
) -> _Entry:
    """An entry for ``data`` whose tokens from character ``start_char`` on are ``tail``
    (and before it ``base``'s first ``start_tok`` tokens, its first ``base_points`` safe
    points). ``at_end``: the tail ends the text (its last characters get dense safe
    points; a chunk of progressive encoding that does not end it gets none)."""
    if base is None:
        ids = array("I", tail_ids)
        safe_chars, safe_tokens = array("I"), array("I")
    else:
        ids = base.ids[:start_tok]
        ids.extend(tail_ids)
        safe_chars = base.safe_chars[:base_points]
        safe_tokens = base.safe_tokens[:base_points]
    # safe points of the tail: word starts, one per SAFE_STEP_TOKENS tokens (the tail's
    # own start first), and every word start among its last DENSE_TAIL_CHARS characters
    # (at most DENSE_TAIL_TOKENS tokens): a conversation's next turn shares the text up to
    # about its end, and its continuation then starts a word or two before the shared end
    # rather than up to two steps (16–32 tokens) before it. Token → word and token →
    # characters are O(1) lookups in the encoding (characters → word is a scan: not used).
    word_of, chars_of = tail.token_to_word, tail.token_to_chars
    n = len(tail_ids)
    dense = n
    end_span = chars_of(n - 1) if n and at_end else None
    while end_span is not None and dense > max(0, n - DENSE_TAIL_TOKENS):
        span = chars_of(dense - 1)
        if span is None or span[0] < end_span[1] - DENSE_TAIL_CHARS:
            break
        dense -= 1
    last = -1
    for t in range(0, dense, SAFE_STEP_TOKENS):
        word = word_of(t)
        if word is None:
            continue
        # back to the word's first token (words are a few tokens; bounded walk)
        stop = max(last + 1, t - SAFE_STEP_TOKENS)
        while t > stop and word_of(t - 1) == word:
            t -= 1
        if t == last or (t > 0 and word_of(t - 1) == word):
            continue
        span = chars_of(t)
        if span is None:
            continue
        safe_chars.append(span[0] + start_char)
        safe_tokens.append(t + start_tok)
        last = t
    for t in range(max(last + 1, dense), n):
        word = word_of(t)
        if word is None or (t > 0 and word_of(t - 1) == word):
            continue
        span = chars_of(t)
        if span is None:
            continue
        safe_chars.append(span[0] + start_char)
        safe_tokens.append(t + start_tok)
    return _Entry(data, ids, safe_chars, safe_tokens, [], 0)


__all__ = ["CHUNK_BYTES", "CacheCounters", "PrefixTokenCache", "chunk_hashes", "whole_hash"]
