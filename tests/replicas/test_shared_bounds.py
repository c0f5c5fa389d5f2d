"""Bounds a peer cannot lift: the local prefix index's size per endpoint and the blocks one
wire record may carry."""

from __future__ import annotations

import struct

import pytest

from sluicegate.datalayer.endpoint import Endpoint, EngineMetrics
from sluicegate.datalayer.sharing import PrefixRecord, PrefixShare
from sluicegate.framework import PrefixMatch
from sluicegate.runtime.shared_wire import (
    MAX_RECORD_BLOCKS,
    WireError,
    decode_prefix,
    encode_prefix,
)
from sluicegate.scheduling.approximate import ApproximatePrefix

_HUGE = 2**31 - 1


def _shared(auto_tune: bool) -> tuple[ApproximatePrefix, PrefixShare]:
    # 256 blocks of 16 tokens by default.
    m = ApproximatePrefix(16, 0, 256, auto_tune=auto_tune)
    share = PrefixShare(lambda name: name.startswith("sim-"))
    m.share(share, "approx/16")
    return m, share


def _flood(share: PrefixShare, endpoint: str) -> None:
    """100 records of 1,000 new blocks each, every one claiming the largest capacity."""
    for i in range(100):
        hashes = list(range(i * 1000, (i + 1) * 1000))
        for batch in encode_prefix([PrefixRecord("approx/16", endpoint, hashes, _HUGE)]):
            for record in decode_prefix(batch):
                assert share.deliver(record)


def test_a_peers_capacity_cannot_raise_the_default_bound() -> None:
    m, share = _shared(auto_tune=False)
    _flood(share, "sim-0")
    assert m.index.endpoint_size("sim-0") == m.index.default_capacity == 256


def test_a_peers_capacity_cannot_raise_this_replicas_own_bound() -> None:
    m, share = _shared(auto_tune=True)
    # This replica sizes sim-1 at 100 blocks of 16 tokens, and routes to it once.
    scrape = EngineMetrics(scraped_at=0.0, block_size=16, num_gpu_blocks=100)
    target = Endpoint("sim-1", "127.0.0.1", 9001, metrics=scrape)
    m.remember(target, PrefixMatch([1], 16, {}, m.index))
    _flood(share, "sim-1")
    assert m.index.endpoint_size("sim-1") == 100
    # A smaller capacity from a peer still lowers it (it may know the server better).
    share.deliver(PrefixRecord("approx/16", "sim-1", [5, 6, 7], 10))
    assert m.index.endpoint_size("sim-1") == 10
    # Forgetting the endpoint forgets its capacity: back to the default.
    m.forget(target)
    _flood(share, "sim-1")
    assert m.index.endpoint_size("sim-1") == 256


def test_a_record_carries_at_most_max_record_blocks() -> None:
    long = list(range(MAX_RECORD_BLOCKS + 500))
    (batch,) = encode_prefix([PrefixRecord("approx/16", "sim-0", long, None)])
    (record,) = decode_prefix(batch)
    assert list(record.hashes) == long[:MAX_RECORD_BLOCKS]  # the head is what is kept
    # Another writer's longer record makes its batch refused whole.
    blocks = MAX_RECORD_BLOCKS + 1
    forged = struct.pack("<HHIi", 9, 5, blocks, -1) + b"approx/16sim-0" + bytes(8 * blocks)
    with pytest.raises(WireError, match="blocks"):
        decode_prefix(forged)
