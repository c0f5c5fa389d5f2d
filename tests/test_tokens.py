"""The built-in tokenizer and chained prefix-block hashing (``sluicegate.tokens``)."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sluicegate.tokens import (
    BYTES_PER_TOKEN,
    block_hashes,
    count_bytes_tokens,
    count_tokens,
    hash_seed,
    token_ids,
)

BLOCK = 16
BLOCK_BYTES = BLOCK * BYTES_PER_TOKEN
SEED = hash_seed("meta-llama/Meta-Llama-3-8B", "")


def _data(n_bytes: int, tag: str = "x") -> bytes:
    """ASCII bytes whose every 4-byte token differs from its neighbours."""
    text = "".join(f"{tag}{i:07d}|" for i in range(n_bytes // 8 + 1))
    return text.encode()[:n_bytes]


# ---------------------------------------------------------------- count_tokens


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("", 0),
        ("a", 1),
        ("abcd", 1),
        ("abcde", 2),
        ("abcdefgh", 2),
        ("é", 1),  # 2 bytes
        ("éé", 1),  # 4 bytes
        ("ééé", 2),  # 6 bytes
        ("日本語", 3),  # 9 bytes
        ("🦀🦀", 2),  # 8 bytes
        ("a🦀", 2),  # 5 bytes: ASCII fast path must not count characters
    ],
)
def test_count_tokens_examples(text: str, expected: int) -> None:
    assert count_tokens(text) == expected


@settings(max_examples=200, deadline=None)
@given(st.text())
def test_count_tokens_is_ceil_of_utf8_bytes_over_4(text: str) -> None:
    n_bytes = len(text.encode())
    assert count_tokens(text) == math.ceil(n_bytes / BYTES_PER_TOKEN)
    assert count_bytes_tokens(text.encode()) == count_tokens(text)


def test_count_tokens_of_concatenation_at_token_boundary_adds() -> None:
    a, b = "abcd" * 5, "héllo wörld"
    assert count_tokens(a + b) == count_tokens(a) + count_tokens(b)


# ---------------------------------------------------------------- block_hashes


def test_block_hashes_only_full_blocks_by_default() -> None:
    assert block_hashes(b"", BLOCK, SEED) == []
    assert block_hashes(_data(BLOCK_BYTES - 1), BLOCK, SEED) == []
    assert len(block_hashes(_data(BLOCK_BYTES), BLOCK, SEED)) == 1
    assert len(block_hashes(_data(3 * BLOCK_BYTES + 5), BLOCK, SEED)) == 3


@settings(max_examples=100, deadline=None)
@given(total=st.integers(0, 12 * BLOCK_BYTES), cut=st.integers(0, 12 * BLOCK_BYTES))
def test_block_hashes_of_a_prefix_are_a_prefix_of_the_hashes(total: int, cut: int) -> None:
    data = _data(total)
    prefix = data[: min(cut, total)]
    full = block_hashes(data, BLOCK, SEED)
    part = block_hashes(prefix, BLOCK, SEED)
    assert part == full[: len(part)]
    assert len(part) == len(prefix) // BLOCK_BYTES


def test_shared_prefix_gives_shared_hashes_whatever_follows() -> None:
    prefix = _data(5 * BLOCK_BYTES)
    a = block_hashes(prefix + _data(3 * BLOCK_BYTES, "a"), BLOCK, SEED)
    b = block_hashes(prefix + _data(3 * BLOCK_BYTES, "b"), BLOCK, SEED)
    assert a[:5] == b[:5]
    # Chained: every block after the divergence differs.
    assert all(x != y for x, y in zip(a[5:], b[5:], strict=True))


def test_hashes_are_chained_on_the_whole_prefix() -> None:
    data = bytearray(_data(6 * BLOCK_BYTES))
    before = block_hashes(bytes(data), BLOCK, SEED)
    data[2 * BLOCK_BYTES + 7] ^= 0x01  # flip one bit in block 2
    after = block_hashes(bytes(data), BLOCK, SEED)
    assert before[:2] == after[:2]
    assert all(x != y for x, y in zip(before[2:], after[2:], strict=True))


def test_same_block_content_at_different_positions_hashes_differently() -> None:
    block = _data(BLOCK_BYTES)
    hashes = block_hashes(block * 3, BLOCK, SEED)
    assert len(set(hashes)) == 3


def test_seed_changes_every_hash() -> None:
    data = _data(8 * BLOCK_BYTES)
    a = block_hashes(data, BLOCK, hash_seed("model-a", ""))
    b = block_hashes(data, BLOCK, hash_seed("model-b", ""))
    c = block_hashes(data, BLOCK, hash_seed("model-a", "salt"))
    assert len(a) == len(b) == len(c) == 8
    assert all(x != y for x, y in zip(a, b, strict=True))
    assert all(x != y for x, y in zip(a, c, strict=True))


def test_hash_seed_separates_parts() -> None:
    assert hash_seed("ab", "c") != hash_seed("a", "bc")
    assert hash_seed("m", "") == hash_seed("m", "")
    assert hash_seed("m") != hash_seed("m", "")


def test_hashes_are_deterministic_and_depend_on_block_size() -> None:
    data = _data(8 * BLOCK_BYTES)
    assert block_hashes(data, BLOCK, SEED) == block_hashes(bytes(data), BLOCK, SEED)
    by32 = block_hashes(data, 32, SEED)
    assert len(by32) == 4
    assert by32[0] != block_hashes(data, BLOCK, SEED)[1]


def test_include_partial_adds_one_hash_for_a_trailing_partial_block() -> None:
    data = _data(3 * BLOCK_BYTES + 9)
    full = block_hashes(data, BLOCK, SEED)
    partial = block_hashes(data, BLOCK, SEED, include_partial=True)
    assert len(full) == 3
    assert len(partial) == 4
    assert partial[:3] == full
    # The partial hash covers the tail: different tails give different last hashes.
    other = block_hashes(data[:-1] + b"#", BLOCK, SEED, include_partial=True)
    assert other[:3] == full
    assert other[3] != partial[3]


def test_include_partial_adds_nothing_when_data_ends_on_a_block() -> None:
    data = _data(4 * BLOCK_BYTES)
    assert block_hashes(data, BLOCK, SEED, include_partial=True) == block_hashes(data, BLOCK, SEED)
    assert block_hashes(b"abc", BLOCK, SEED) == []
    assert len(block_hashes(b"abc", BLOCK, SEED, include_partial=True)) == 1


@pytest.mark.parametrize("include_partial", [False, True])
def test_max_blocks_truncates(include_partial: bool) -> None:
    data = _data(6 * BLOCK_BYTES + 3)

    def hashes(max_blocks: int) -> list[int]:
        return block_hashes(
            data, BLOCK, SEED, max_blocks=max_blocks, include_partial=include_partial
        )

    full = hashes(0)  # 0 means no limit
    assert len(full) == (7 if include_partial else 6)
    assert hashes(1) == full[:1]
    assert hashes(2) == full[:2]
    assert hashes(6) == full[:6]
    assert hashes(100) == full


def test_token_ids_are_little_endian_words_and_prefix_stable() -> None:
    assert token_ids(b"") == []
    assert token_ids(b"abcd") == [int.from_bytes(b"abcd", "little")]
    assert token_ids(b"abcdef") == [int.from_bytes(b"abcd", "little"), ord("e") + (ord("f") << 8)]
    text = "héllo wörld, a longer prompt".encode()
    whole = token_ids(text)
    assert len(whole) == -(-len(text) // 4)
    cut = token_ids(text[:12])
    assert whole[:3] == cut
    assert token_ids(text, max_tokens=2) == whole[:2]
