"""The runtime's KV-event host: subscriptions follow the endpoint set and configuration,
capacities follow the scraped ``num_gpu_blocks``, stop closes everything."""

from __future__ import annotations

from typing import Any

import zmq.asyncio
from kv_support import FakeVLLMPublisher, stored, until

from sluicegate.api.loader import Config, build_config
from sluicegate.clock import ManualClock
from sluicegate.datalayer.datastore import Datastore
from sluicegate.datalayer.endpoint import EngineMetrics
from sluicegate.datalayer.kvevents import View
from sluicegate.datalayer.pools import static_endpoints, sync_pools
from sluicegate.runtime import Runtime
from sluicegate.runtime.kvevents import KVEventsHost


def _config(pubs: dict[str, str], kv: dict[str, Any] | None = None) -> Config:
    """Pool ``p``: one endpoint per name, publishing at the given address."""
    endpoints = [
        {"address": f"127.0.0.1:{9000 + i}", "name": name, "kvEvents": {"endpoint": address}}
        for i, (name, address) in enumerate(pubs.items())
    ]
    spec: dict[str, Any] = {"targetPorts": [{"number": 8000}], "endpoints": endpoints}
    if kv is not None:
        spec["kvEvents"] = kv
    pool = {
        "apiVersion": "inference.networking.k8s.io/v1",
        "kind": "InferencePool",
        "metadata": {"name": "p"},
        "spec": spec,
    }
    return build_config([pool])


def _synced(datastore: Datastore, config: Config) -> Datastore:
    sync_pools(datastore, config, static_endpoints(config))
    return datastore


async def test_follows_the_endpoint_set_and_stops() -> None:
    ctx = zmq.asyncio.Context()
    a, b = FakeVLLMPublisher(ctx), FakeVLLMPublisher(ctx)
    host = KVEventsHost(ManualClock())
    try:
        both = _config({"a": a.pub_address, "b": b.pub_address}, kv={})
        datastore = _synced(Datastore(), both)
        host.request_sync(both, datastore)
        host.start()
        await a.wait_subscribed()
        await b.wait_subscribed()
        subs = host.service.pools["p"]
        assert sorted(subs.streams) == ["a", "b"]
        assert host.unknown_views() == [
            {"pool": "p", "endpoint": "a"},
            {"pool": "p", "endpoint": "b"},
        ]
        await b.publish([stored([1], None, list(range(16)), 16)])
        await until(lambda: subs.index.size("b") == 1)
        assert subs.view("b") is View.SYNCED
        assert host.unknown_views() == [{"pool": "p", "endpoint": "a"}]

        # b leaves the pool: its subscriber and its entries go
        only_a = _config({"a": a.pub_address}, kv={})
        host.request_sync(only_a, _synced(datastore, only_a))
        await until(lambda: "b" not in subs.streams)
        assert subs.index.size("b") == 0
        assert "b" not in subs.index.endpoints()
        assert sorted(subs.streams) == ["a"]
    finally:
        await host.stop()
        await a.close()
        await b.close()
        ctx.destroy(linger=0)
    assert host.service.pools == {}


async def test_capacity_from_the_scraped_gpu_blocks() -> None:
    ctx = zmq.asyncio.Context()
    a = FakeVLLMPublisher(ctx)
    host = KVEventsHost(ManualClock())
    try:
        config = _config({"a": a.pub_address}, kv={"capacityMarginPercent": 10})
        datastore = _synced(Datastore(), config)
        host.request_sync(config, datastore)
        host.start()
        await a.wait_subscribed()
        endpoint = datastore.pools["p"].endpoints[0]
        endpoint.metrics = EngineMetrics(scraped_at=0.0, block_size=16, num_gpu_blocks=100)
        host.on_scrape(endpoint)
        subs = host.service.pools["p"]
        for i in range(200):
            await a.publish([stored([i + 1], None, [i] * 16, 16)])
        await until(lambda: subs.streams["a"].counters.decoded == 200)
        assert subs.index.size("a") == 110  # 100 blocks + 10 %
        assert subs.index.counters.evictions == 90
    finally:
        await host.stop()
        await a.close()
        ctx.destroy(linger=0)


def test_runtime_turns_it_on_and_off_with_the_configuration() -> None:
    # addresses only: nothing subscribes until the runtime starts
    on = _config({"a": "tcp://127.0.0.1:1"}, kv={})
    off = _config({"a": "tcp://127.0.0.1:1"})
    off.pools["p"].spec.endpoints[0].kv_events = None
    runtime = Runtime(off)
    assert not runtime.kv_events.active
    runtime.apply_config(on)
    assert runtime.kv_events.active
    runtime.apply_config(off)
    assert not runtime.kv_events.active
