"""Progressive encoding: a prompt's token ids and block keys only as far as a routing
decision needs them.

Longest-prefix matching stops at the first block that no candidate still matching holds
(vLLM reuses only a contiguous prefix), so a decision needs the prompt's blocks up to
there and no further. :func:`begin` takes what the
:class:`~sluicegate.model_tokenizer.prefix_cache.PrefixTokenCache` already knows of the
text — the ids up to a safe point before the end of the longest prefix it shares with a
prompt seen, and the block keys cached with them — and :func:`advance` encodes the rest
in growing chunks (the first :data:`FIRST_CHUNK_CHARS` — after a cache entry, to a
block and :data:`PAST_SHARED_TOKENS` tokens past the shared end — then doubling), keying
the new blocks after each and asking ``enough(keys)`` whether to go on. A prompt never seen then
costs one small chunk; a new turn costs the chunk that crosses the end of the previous
turn. The rest is encoded after dispatch (:meth:`LocalTokenizer.finish_later
<sluicegate.tokenization.local.LocalTokenizer.finish_later>`), so the cache holds the
whole conversation for its next turn.

**Why the pieces are exact.** A chunk starts at a word start of the whole text (a cache
safe point, or the previous chunk's end) and ends before a space that follows a
non-space, a word boundary of byte-level BPE's regex pre-tokenizer (no merge crosses it;
the tokenizer's added tokens hold no space — :attr:`LocalTokenizer.cut_prefixes`,
checked at load). So the chunks' ids, joined, are the whole encoding's first ids. The
first chunk after a cache entry re-encodes one safe step the entry holds and compares it
(as the cache's own continuation does); a mismatch restarts from the text's start.
``tests/tokenization/test_tok_progressive.py`` checks, for random prompts, index states
and cache states, that the decision equals the one made from the whole encoding.
"""

from __future__ import annotations

import bisect
import re
from array import array
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from tokenizers import Encoding

from sluicegate.datalayer.kvevents.index import ROOT_KEY, block_keys
from sluicegate.model_tokenizer.prefix_cache import (
    CHUNK_BYTES,
    MARGIN_CHARS,
    PrefixTokenCache,
    _Entry,
    _entry_of,
    chunk_hashes,
    whole_hash,
)

FIRST_CHUNK_CHARS = 256
"""Characters encoded by the first chunk past what the cache knows (about 60 tokens of
English: four 16-token blocks); each later chunk twice the one before. Finishing a prompt
after dispatch encodes the rest in one piece."""

PAST_SHARED_TOKENS = 8
"""After a cache entry, the first chunk ends about a block and this many tokens past the
text shared with the entry (a new turn's first new block crosses that end); each later
chunk twice the one before."""


@dataclass(frozen=True, slots=True)
class BlockKeying:
    """How a prompt's blocks are keyed: tokens per block, the extra identity bytes of the
    first block and of every later one (LoRA name, cache salt), and the special token ids
    before the text (a completion's BOS). Block keys cached with a prompt are reused only
    for the same keying."""

    size: int
    first: bytes | None = None
    rest: bytes | None = None
    lead: tuple[int, ...] = ()

    def extend(self, keys: list[int], ids: Sequence[int]) -> None:
        """Append to ``keys`` (the keys of the first ``len(keys)`` blocks of ``lead +
        ids``) the keys of the further full blocks of ``lead + ids``."""
        size, lead = self.size, self.lead
        total = (len(lead) + len(ids)) // size
        k = len(keys)
        if k >= total:
            return
        start = k * size - len(lead)
        if start < 0:
            tokens = array("I", lead[k * size :])
            tokens.extend(ids[: total * size - len(lead)])
        else:
            tokens = array("I", ids[start : total * size - len(lead)])
        extras: list[bytes | None] | None = None
        if self.first is not None or self.rest is not None:
            extras = [self.rest] * (total - k)
            if k == 0:
                extras[0] = self.first
        keys.extend(block_keys(tokens, size, extras, keys[-1] if keys else ROOT_KEY))


@dataclass(slots=True, eq=False)
class Progress:
    """A prompt's text, encoded up to ``chars`` characters: the content ``ids`` (without
    special tokens), the block ``keys`` of ``lead + ids`` and whether that is the whole
    text. Owned by one request at a time (not thread-safe)."""

    text: str
    data: bytes
    hashes: list[int]
    keying: BlockKeying
    ids: array[int]
    chars: int
    keys: list[int]
    whole: bool
    safe_chars: array[int] = field(default_factory=lambda: array("I"))
    safe_tokens: array[int] = field(default_factory=lambda: array("I"))
    check: tuple[int, array[int]] | None = None
    """(characters the first chunk must cover, the ids it must start with) after a
    cache entry, until the first chunk is encoded."""
    base: int | None = None
    """The cache entry continued when its text is a prefix of this one (superseded)."""
    stored: int | None = None
    """The cache key this progress was last stored under (superseded by the next)."""
    chunk: int = FIRST_CHUNK_CHARS
    encoded_tokens: int = 0
    """Tokens BPE-encoded for it so far (the counters' ``tokens_encoded``)."""
    limit: int = 0
    """Content ids the decision considers at most (``maxPrefixTokensToMatch``; 0: all):
    finishing after dispatch stops there too, so a huge prompt costs the worker no more
    than the decision's limit."""

    def estimated_blocks(self) -> int:
        """The prompt's full blocks: exact when whole, else the keys so far plus the
        rest of the text at the encoded part's tokens per character."""
        if self.whole:
            return len(self.keys)
        rest = len(self.text) - self.chars
        per_char = len(self.ids) / self.chars if self.chars else 0.25
        tokens = len(self.keying.lead) + len(self.ids) + int(rest * per_char)
        return max(len(self.keys), tokens // self.keying.size)


def begin(cache: PrefixTokenCache, text: str, keying: BlockKeying) -> Progress:
    """What ``cache`` knows of ``text`` (call under the cache's lock): the whole ids of a
    prompt seen, else those up to a safe point of the longest prefix shared with one."""
    data = text.encode()
    hit = cache.lookup_whole(data)
    if hit is not None:
        key, entry = hit
        return Progress(
            text,
            data,
            [],
            keying,
            entry.ids,
            len(text),
            _cached_keys(entry, keying),
            True,
            stored=key,
        )
    hashes = chunk_hashes(data)
    found = cache._longest(data, hashes) if cache.continuation else None
    empty = array("I")
    if found is None:
        return Progress(text, data, hashes, keying, empty, 0, [], False)
    key, entry, shared = found
    if not text.isascii():  # the characters wholly inside the shared bytes
        shared = len(data[:shared].decode(errors="ignore"))
    i = bisect.bisect_right(entry.safe_chars, shared - MARGIN_CHARS) - 1
    if i < 1:
        return Progress(text, data, hashes, keying, empty, 0, [], False)
    start_char, start_tok = entry.safe_chars[i - 1], entry.safe_tokens[i - 1]
    ids = entry.ids[:start_tok]
    keys = _cached_keys(entry, keying)
    del keys[(len(keying.lead) + start_tok) // keying.size :]
    covers = entry.safe_chars[i] - start_char
    check = (covers, entry.ids[start_tok : entry.safe_tokens[i]])
    # the first chunk reaches past the shared end by PAST_SHARED_TOKENS more than a block
    # (at the entry's own characters per token): enough for the block that crosses it
    per_token = len(entry.data) / max(1, len(entry.ids))
    past = int(per_token * (keying.size + PAST_SHARED_TOKENS)) + 1
    return Progress(
        text, data, hashes, keying, ids, start_char, keys, False,
        entry.safe_chars[: i - 1], entry.safe_tokens[: i - 1], check,
        base=key if shared >= len(entry.data) else None,
        chunk=max(1, shared - start_char) + past,
    )  # fmt: skip


def advance(
    p: Progress,
    encode: Callable[[str], Encoding],
    enough: Callable[[Sequence[int]], bool] | None,
    limit: int = 0,
) -> bool:
    """Encode ``p`` further until ``enough(p.keys)`` (None: to the end), ``limit`` ids
    (> 0) or the end; the BPE runs without any lock. Whether the continued entry's
    re-encoded step matched (False: ``p`` restarted from the text's start)."""
    p.keying.extend(p.keys, p.ids)
    matched = True
    text = p.text
    while not p.whole and (enough is None or not enough(p.keys)):
        if limit and len(p.ids) >= limit:
            break
        end = len(text) if enough is None and not limit else p.chars + p.chunk
        if p.check is not None:
            end = max(end, p.chars + p.check[0] + MARGIN_CHARS)
        cut = _safe_cut(text, end, p.chars) if end < len(text) else len(text)
        encoding = encode(text[p.chars : cut])
        ids = encoding.ids
        if p.check is not None:
            want = p.check[1]
            if len(ids) < len(want) or array("I", ids[: len(want)]) != want:
                _restart(p)
                matched = False
                continue
            p.check = None
        if p.stored is not None:  # the stored entry keeps its arrays: write to copies
            p.ids, p.safe_chars, p.safe_tokens = p.ids[:], p.safe_chars[:], p.safe_tokens[:]
        made = _entry_of(b"", encoding, ids, p.chars, None, at_end=cut >= len(text))
        start = len(p.ids)
        p.safe_chars.extend(made.safe_chars)
        p.safe_tokens.extend(t + start for t in made.safe_tokens)
        p.ids.extend(ids)
        p.encoded_tokens += len(ids)
        p.chunk = max(p.chunk, cut - p.chars) * 2
        p.chars = cut
        p.whole = cut >= len(text)
        p.keying.extend(p.keys, p.ids)
    return matched


def store(cache: PrefixTokenCache, p: Progress) -> None:
    """Keep what ``p`` encoded in ``cache`` (call under the cache's lock), superseding the
    entry it continued and its own earlier entry."""
    if p.chars == 0 or cache.max_bytes <= 0:
        return
    if p.whole:
        data, hashes = p.data, p.hashes
    else:
        data = p.data[: p.chars] if p.text.isascii() else p.text[: p.chars].encode()
        hashes = p.hashes[: len(data) // CHUNK_BYTES]
    if p.stored is not None and p.stored in cache._entries:
        kept = cache._entries[p.stored]
        if kept.data == data:  # nothing new but, perhaps, the block keys
            if kept.keying != p.keying and len(p.keys) >= len(kept.keys):
                cache.rekey(p.stored, array("Q", p.keys), p.keying)
            return
        cache._drop(p.stored)
    entry = _Entry(data, p.ids, p.safe_chars, p.safe_tokens, [], 0)
    entry.keys = array("Q", p.keys)
    entry.keying = p.keying
    supersedes = p.base
    p.base = None
    p.stored = cache._store(entry, hashes, whole_hash(data), supersedes)


def _cached_keys(entry: _Entry, keying: BlockKeying) -> list[int]:
    return list(entry.keys) if entry.keying == keying else []


def _restart(p: Progress) -> None:
    p.ids, p.keys, p.chars, p.check, p.base = array("I"), [], 0, None, None
    p.safe_chars, p.safe_tokens = array("I"), array("I")
    p.stored = None


def _safe_cut(text: str, chars: int, after: int) -> int:
    """The last index in (``after``, ``chars``] of a space preceded by a non-space, else
    the first one past ``chars``, else the text's end. A few spaces each way with
    ``str.(r)find``, then the regex (C): a client's long runs of whitespace cost no Python
    loop per space."""
    at = text.rfind(" ", after + 1, chars + 1)
    for _ in range(_BACK_STEPS):
        if at <= after:
            break
        if not text[at - 1].isspace():
            return at
        at = text.rfind(" ", after + 1, at)
    else:  # spaces after whitespace all the way back: the window's first cut, if any
        found = _CUT.search(text, after, chars + 1)
        if found is not None:
            return found.end() - 1
    at = chars
    for _ in range(_BACK_STEPS):
        at = text.find(" ", at + 1)
        if at < 0:
            return len(text)
        if not text[at - 1].isspace():
            return at
    found = _CUT.search(text, at)
    return len(text) if found is None else found.end() - 1


_CUT = re.compile(r"\S ")
"""A space after a non-space (``\\S`` is exactly ``not str.isspace()``): a chunk may end
before that space."""
_BACK_STEPS = 64
"""Spaces looked at each way from the wanted end before the regex takes over."""


__all__ = ["FIRST_CHUNK_CHARS", "BlockKeying", "Progress", "advance", "begin", "store"]
