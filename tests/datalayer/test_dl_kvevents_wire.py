"""The KV-event decoder against vLLM's payload layouts, hand-built and struct-encoded."""

from __future__ import annotations

import time

import msgpack
import pytest
from kv_support import cleared, encode_batch, removed, stored

from sluicegate.datalayer.kvevents.wire import (
    END_SEQ,
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KVEventDecodeError,
    decode_batch,
    decode_seq,
    encode_seq,
    extra_key_bytes,
)


def test_newest_layout_hand_built_with_msgpack() -> None:
    # vLLM's newest KVEventBatch: a map; events tagged maps ("type"), defaults omitted
    payload = msgpack.packb(
        {
            "ts": 1767225600.25,
            "events": [
                {
                    "type": "BlockStored",
                    "block_hashes": [11, 12],
                    "parent_block_hash": None,
                    "token_ids": [1, 2, 3, 4, 5, 6, 7, 8],
                    "block_size": 4,
                    "lora_id": None,
                    "medium": "GPU",
                    "lora_name": None,
                    "extra_keys": [None, ["sql-lora", "salt"]],
                    "kv_cache_spec_kind": "full_attention",  # newer than our structs: skipped
                },
                {"type": "BlockRemoved", "block_hashes": [9], "medium": "GPU"},
                {"type": "AllBlocksCleared"},
            ],
            "data_parallel_rank": 1,
        }
    )
    batch = decode_batch(payload)
    assert batch.ts == 1767225600.25
    assert batch.data_parallel_rank == 1
    first, second, third = batch.events
    assert first == BlockStored(
        block_hashes=(11, 12),
        parent_block_hash=None,
        token_ids=[1, 2, 3, 4, 5, 6, 7, 8],
        block_size=4,
        extra_keys=(None, extra_key_bytes(("sql-lora", "salt"))),
        medium="GPU",
    )
    assert second == BlockRemoved((9,), "GPU")
    assert third == AllBlocksCleared()


def test_early_array_layout_with_bytes_hashes_and_trailing_fields() -> None:
    h1, h2 = bytes(range(32)), bytes(range(1, 33))
    payload = msgpack.packb(
        [
            12.5,
            [
                ["BlockStored", [h1], None, [5, 6], 2, None],  # v0.9: ends at lora_id
                # a later version: medium, lora_name, extra_keys, group_idx, then fields
                # this decoder has never heard of
                ["BlockStored", [h2], h1, [7, 8], 2, None, "GPU", "a", None, 0, "x", 3],
                ["BlockRemoved", [h1]],
                ["AllBlocksCleared"],
            ],
        ]
    )
    batch = decode_batch(payload)
    assert batch.data_parallel_rank is None
    a, b, c, d = batch.events
    assert a == BlockStored((h1,), None, [5, 6], 2)
    assert b == BlockStored((h2,), h1, [7, 8], 2, lora_name="a", medium="GPU", group_idx=0)
    assert c == BlockRemoved((h1,))
    assert d == AllBlocksCleared()


@pytest.mark.parametrize("layout", ["map", "array"])
def test_struct_encoded_batches_decode(layout: str) -> None:
    payload = encode_batch(
        [
            stored([1, 2], None, range(8), 4, layout=layout, lora_name="l"),  # type: ignore[arg-type]
            removed([2], layout=layout),  # type: ignore[arg-type]
            cleared(layout=layout),  # type: ignore[arg-type]
        ],
        layout=layout,  # type: ignore[arg-type]
        rank=3,
    )
    batch = decode_batch(payload)
    assert batch.data_parallel_rank == 3
    assert batch.events == (
        BlockStored((1, 2), None, list(range(8)), 4, lora_name="l", medium="GPU"),
        BlockRemoved((2,), "GPU"),
        AllBlocksCleared(),
    )


def test_envelope_and_events_in_different_layouts() -> None:
    # the envelope array_like while the events are maps (an intermediate vLLM)
    payload = msgpack.packb([3.0, [{"type": "BlockRemoved", "block_hashes": [1], "medium": None}]])
    assert decode_batch(payload).events == (BlockRemoved((1,)),)


def test_unknown_event_kind_is_skipped_and_counted() -> None:
    payload = msgpack.packb(
        {"ts": 1.0, "events": [{"type": "BlockPinned", "x": 1}, {"type": "AllBlocksCleared"}]}
    )
    batch = decode_batch(payload)
    assert batch.events == (AllBlocksCleared(),)
    assert batch.skipped == 1


@pytest.mark.parametrize(
    "payload",
    [
        b"",
        b"\xc1",  # never used in msgpack
        b"not msgpack at all",
        msgpack.packb({"events": []}),  # no ts
        msgpack.packb({"ts": "now", "events": []}),
        msgpack.packb([1.0, [["BlockStored", ["h"], None, [1, 2], 2, None]]]),  # str hash
        msgpack.packb([1.0, [["BlockRemoved"]]]),  # no hashes
        msgpack.packb(
            {"ts": 1.0, "events": [{"type": "BlockStored", "block_hashes": [1], "extra_keys": []}]}
        ),
    ],
)
def test_malformed_payloads_raise_a_decode_error(payload: bytes) -> None:
    with pytest.raises(KVEventDecodeError):
        decode_batch(payload)


def test_cpu_offload_store_without_tokens_decodes() -> None:
    # vLLM's CPU offload stores carry hashes only; the index ignores them, the batch stays
    payload = msgpack.packb([1.0, [["BlockStored", [5], None, [], 16, None, "CPU"]]])
    assert decode_batch(payload).events == (BlockStored((5,), None, [], 16, medium="CPU"),)


def test_sequence_frames() -> None:
    assert decode_seq((5).to_bytes(8, "big")) == 5
    assert decode_seq((-1).to_bytes(8, "big", signed=True)) == END_SEQ
    assert encode_seq(2**40) == (2**40).to_bytes(8, "big")
    with pytest.raises(KVEventDecodeError):
        decode_seq(b"\x00" * 4)


def test_extra_key_bytes_tuple_and_list_agree() -> None:
    assert extra_key_bytes(("a", "salt")) == extra_key_bytes(["a", "salt"])
    assert extra_key_bytes(None) is None
    assert extra_key_bytes(()) is None


def test_decode_cost_report() -> None:
    """Reports the decode cost of a 16-block store batch (the figure in wire.py)."""
    payload = encode_batch([stored(list(range(16)), 7, list(range(256)), 16)])
    n = 2000
    start = time.perf_counter()
    for _ in range(n):
        decode_batch(payload)
    per_batch_us = (time.perf_counter() - start) / n * 1e6
    print(f"decode 16-block BlockStored batch: {per_batch_us:.1f} µs")
    assert per_batch_us < 500  # a loose ceiling for a shared machine; the figure is the point
