"""Shared state on Redis Cluster: every key the replicas use is in one hash slot (the
key prefix is a hash tag), so the in-flight and backlog scripts — which read the peers'
snapshots by name — and the clean-exit transactions run on a cluster node, which refuses
any command whose keys span slots. Against a real one-node cluster."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

pytest.importorskip("redis", reason="the shared-state tests need the redis client (dev extra)")

from redis.crc import key_slot
from redis_support import RedisServer

from sluicegate.api.settings import SharedStateSettings
from sluicegate.clock import MonotonicClock
from sluicegate.datalayer.datastore import Datastore, EndpointSpec
from sluicegate.runtime._shared_keys import key_base
from sluicegate.runtime.shared import SharedState
from sluicegate.runtime.shared_backlog import BacklogSync
from sluicegate.scheduling.approximate import ApproximatePrefix

NAMES = ["sim-0", "sim-1"]
CLOCK = MonotonicClock()


class Replica:
    def __init__(self, state: SharedState) -> None:
        self.state = state
        self.waiting: dict[str, dict[int, int]] = {}
        self.backlog = BacklogSync(state, lambda: self.waiting, CLOCK)
        self.matcher = ApproximatePrefix(16, 0, 1000, auto_tune=False)
        assert state.share is not None
        self.matcher.share(state.share, "approx/16")


@pytest.fixture
async def replicas(redis_cluster_node: RedisServer) -> AsyncIterator[Callable[..., Replica]]:
    made: list[Replica] = []

    def make(**overrides: Any) -> Replica:
        spec: dict[str, Any] = {
            "redis": {"url": redis_cluster_node.url, "timeoutMs": 500},
            "leaseMs": 2000,
            "prefixFlushMs": 2,
            "retryMs": 50,
            **overrides,
        }
        ds = Datastore()
        specs = [EndpointSpec(name=n, host="127.0.0.1", port=9000 + i) for i, n in enumerate(NAMES)]
        ds.set_endpoints("pool", specs)
        replica = Replica(SharedState(SharedStateSettings.model_validate(spec), ds))
        made.append(replica)
        return replica

    yield make
    for replica in made:
        await replica.backlog.stop()
        await replica.state.stop()


def test_the_key_base_is_a_hash_tag() -> None:
    assert key_base("sluicegate") == "{sluicegate}"
    assert key_slot(b"{sluicegate}:inflight:a") == key_slot(b"{sluicegate}:backlog:b")


@pytest.mark.parametrize("prefix", ["", "a{b", "a}b", "{sluicegate}"])
def test_a_key_prefix_that_is_no_hash_tag_is_refused(prefix: str) -> None:
    # "{}" tags nothing and a brace inside ends or starts the tag early: the keys would
    # scatter over slots, and the scripts fail on a cluster.
    with pytest.raises(ValueError, match="key prefix"):
        key_base(prefix)


async def test_every_shared_key_is_in_one_slot_and_a_cluster_runs_the_scripts(
    replicas: Callable[..., Replica],
) -> None:
    a, b = replicas(replicaId="a"), replicas(replicaId="b")
    next(e for e in a.state.datastore.all_endpoints() if e.name == "sim-1").inflight.dispatch(5, 5)
    a.waiting = {"pool": {100: 3}}
    for _ in range(2):  # the second round: each has seen the other's snapshot
        for r in (a, b):
            assert await r.state.sync_inflight()  # a cross-slot script: refused (CROSSSLOT)
            assert await r.backlog.sync()
    seen = next(e for e in b.state.datastore.all_endpoints() if e.name == "sim-1")
    assert seen.peers.requests == 1
    assert b.backlog.view.reading(CLOCK.now()) == {"pool": {100: 3}}
    # The prefix stream: written by a, read by b.
    a.state.start()
    b.state.start()
    hashes = [11, 22, 33]
    assert a.state.share is not None
    a.state.share.publish("approx/16", "sim-0", hashes, None)
    loop = asyncio.get_running_loop()
    end = loop.time() + 5.0
    while b.matcher.index.match(hashes, NAMES)["sim-0"] != 3:
        assert loop.time() < end, "the prefix batch never reached b"
        await asyncio.sleep(0.01)
    keys = await a.state.client.keys("*")
    assert len(keys) >= 7  # claims, in-flight and backlog snapshots, two sets, the stream
    assert {key_slot(k) for k in keys} == {key_slot(b"{sluicegate}")}
    # A clean exit removes a's keys in one transaction (one slot, or the cluster refuses).
    await a.backlog.stop()
    await a.state.stop()
    assert a.state.fallbacks == {}
    left = await b.state.client.keys("*:a")
    assert left == []
    assert b.state.fallbacks == {}
