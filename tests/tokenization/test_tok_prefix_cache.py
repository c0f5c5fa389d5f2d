"""The prefix token cache: continuing a cached encoding gives exactly the whole encoding
(property test over random texts and cut points with a real byte-level BPE), and its
bounds hold."""

from __future__ import annotations

from array import array
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tokenizers import Encoding, Tokenizer, models, normalizers, pre_tokenizers

from sluicegate.model_tokenizer.prefix_cache import (
    CHUNK_BYTES,
    DENSE_TAIL_TOKENS,
    MARGIN_CHARS,
    PrefixTokenCache,
)

# pieces that stress the pre-tokenizer: whitespace runs, newlines, contractions, digits,
# punctuation runs, non-ASCII letters, special tokens of the tiny tokenizer
PIECES = [
    "ka",
    "lo",
    "mi",
    "prene",
    "The",
    " ",
    "  ",
    "   ",
    "\n",
    "\n\n",
    " \n",
    "\t",
    "\r\n",
    "'s",
    "'ll",
    "don't",
    "0",
    "12",
    "3456789",
    ".",
    "!!",
    "?!",
    ",",
    "--",
    "é",
    "naïve",
    "日本",
    "🙂",
    "<s>",
    "</s>",
    "<|user|>",
    "<|assistant|>",
]
texts = st.lists(st.sampled_from(PIECES), min_size=1, max_size=1500).map("".join)


def _tiny(tiny_dir: Path) -> Callable[[str], Encoding]:
    tok = Tokenizer.from_file(str(tiny_dir / "tokenizer.json"))
    tok.post_processor = None
    return lambda text: tok.encode(text, add_special_tokens=False)


def _whole(encode: Callable[[str], Encoding], text: str) -> array[int]:
    return array("I", encode(text).ids)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=texts, cut=st.floats(0.0, 1.0), other=texts)
def test_continuation_equals_the_whole_encoding(
    tiny_dir: Path, text: str, cut: float, other: str
) -> None:
    encode = _tiny(tiny_dir)
    cache = PrefixTokenCache(encode, 1 << 26, 64)
    at = int(len(text) * cut)
    first = text[:at] + other  # shares text[:at] with text, then differs
    assert cache.encode(first) == _whole(encode, first)
    assert cache.encode(text[:at]) == _whole(encode, text[:at])
    assert cache.encode(text) == _whole(encode, text)
    assert cache.encode(text) == _whole(encode, text)  # an exact repeat
    assert cache.counters.mismatches == 0


def test_a_new_turn_encodes_only_what_is_new(tiny_dir: Path) -> None:
    encode = _tiny(tiny_dir)
    cache = PrefixTokenCache(encode, 1 << 26, 64)
    turn = "<|user|>\nkalo mine ru sa, don't 123 ti vo!</s>\n<|assistant|>\n" * 200
    first = cache.encode(turn)
    second_text = turn + "Zepa qu de fi go.\n" * 10
    second = cache.encode(second_text)
    assert second == _whole(encode, second_text)
    assert cache.counters.prefix_hits == 1
    saved = cache.counters.tokens_saved
    assert saved > len(first) - 200  # all but about one safe step before the end
    assert len(cache) == 1  # the first turn's entry is superseded by the second's


def test_a_continuation_supersedes_exactly_its_base_among_many(tiny_dir: Path) -> None:
    encode = _tiny(tiny_dir)
    cache = PrefixTokenCache(encode, 1 << 26, 64)
    others = [f"{i} zepa qu de fi go, sol pre tra ox.\n" * 60 for i in range(20)]
    for text in others[:10]:
        cache.encode(text)
    conversation = "<|user|>\nkalo mine ru sa, don't 123 ti vo!</s>\n" * 100
    cache.encode(conversation)
    for text in others[10:]:  # the conversation's entry is neither oldest nor newest
        cache.encode(text)
    longer = conversation + "<|assistant|>\nnu ox.\n" * 5
    assert cache.encode(longer) == _whole(encode, longer)
    assert cache.counters.prefix_hits == 1
    assert len(cache) == 21  # the base gave its place to the longer text
    hits = cache.counters.hits
    for text in [*others, longer]:  # every other entry is still there, whole
        cache.encode(text)
    assert cache.counters.hits == hits + 21
    assert cache.counters.misses == 21


def test_the_cache_is_bounded_by_entries_and_bytes(tiny_dir: Path) -> None:
    encode = _tiny(tiny_dir)
    cache = PrefixTokenCache(encode, 1 << 26, 3)
    prompts = [f"{i} kalo mine ru sa ti vo " * 80 for i in range(5)]
    for p in prompts:
        cache.encode(p)
    assert len(cache) == 3
    assert cache.counters.evictions == 2
    cache.encode(prompts[2])  # touched: now the most recent
    cache.encode("fresh text " * 50)
    hits = cache.counters.hits
    cache.encode(prompts[2])
    assert cache.counters.hits == hits + 1  # kept (least recently used went first)
    cache.encode(prompts[3])
    assert cache.counters.hits == hits + 1  # prompts[3] was the oldest: evicted
    # bytes: an entry of ~9 KB of text and its ids; room for about two
    small = PrefixTokenCache(encode, 40_000, 100)
    for i in range(10):
        small.encode(f"{i} " + "ka lo mi ne ru sa " * 500)
        assert small.nbytes <= 40_000
    assert 1 <= len(small) <= 3
    assert sum(e.nbytes for e in small._entries.values()) == small.nbytes
    # 0 bytes: nothing kept, still right
    none = PrefixTokenCache(encode, 0, 100)
    assert none.encode(prompts[0]) == _whole(encode, prompts[0])
    assert len(none) == 0


def test_a_tokenizer_that_looks_back_is_encoded_whole() -> None:
    """A normalizer that prepends "▁" to the text (Llama 2's legacy tokenizer.json): a
    continuation re-encoded from a cut point starts with an extra "▁", is detected, and
    the text is encoded whole."""
    vocab = {"<unk>": 0, "▁": 1, "a": 2, "b": 3, "▁a": 4, "▁b": 5}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[("▁", "a"), ("▁", "b")], unk_token="<unk>"))
    tok.normalizer = normalizers.Prepend("▁")
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()

    def encode(text: str) -> Encoding:
        return tok.encode(text, add_special_tokens=False)

    cache = PrefixTokenCache(encode, 1 << 26, 8)
    text = "a b " * CHUNK_BYTES
    cache.encode(text)
    longer = text + "b a " * 100
    assert cache.encode(longer) == _whole(encode, longer)
    assert cache.counters.mismatches == 1
    assert cache.counters.prefix_hits == 0


@pytest.mark.parametrize("n", [CHUNK_BYTES - 1, CHUNK_BYTES, 3 * CHUNK_BYTES + 5])
def test_texts_around_a_chunk(tiny_dir: Path, n: int) -> None:
    encode = _tiny(tiny_dir)
    cache = PrefixTokenCache(encode, 1 << 26, 8)
    text = ("kalo mi ne, ru sa " * 400)[:n]
    for end in (n, n + 1, n + 40):
        longer = ("kalo mi ne, ru sa " * 400)[:end] + " tail"
        assert cache.encode(text) == _whole(encode, text)
        assert cache.encode(longer) == _whole(encode, longer)


def test_a_turn_diverging_just_before_the_end_re_encodes_a_word_or_two(tiny_dir: Path) -> None:
    """The next turn replaces the previous prompt's last characters (a generation prompt):
    the continuation starts at a dense safe point a word or two before the shared end
    less the margin, not one or two regular steps (16–32 tokens) before it."""
    encode = _tiny(tiny_dir)
    cache = PrefixTokenCache(encode, 1 << 26, 8)
    turn = "<|user|>\nkalo mine ru sa, don't 123 ti vo!</s>\n" * 100 + "<|assistant|>\n"
    first = cache.encode(turn)
    shared = len(turn) - len("<|assistant|>\n")
    second_text = turn[:shared] + "<|user|>\nzepa qu de fi go.\n"
    assert cache.encode(second_text) == _whole(encode, second_text)
    assert cache.counters.prefix_hits == 1
    re_encoded = len(first) - cache.counters.tokens_saved  # the previous prompt's tail
    # what lies within the margin and two words of the shared end, and the part not shared
    near_end = len(encode(turn[shared - MARGIN_CHARS - 12 :]).ids)
    assert re_encoded <= near_end
    # bounded: one point per regular step, plus the dense tail of each encoding
    for entry in cache._entries.values():
        assert len(entry.safe_chars) <= len(entry.ids) // 16 + 1 + 2 * DENSE_TAIL_TOKENS
        assert list(entry.safe_chars) == sorted(set(entry.safe_chars))
