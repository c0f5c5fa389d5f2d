"""Precise prefix routing end to end: a gateway subscribed to fake vLLM KV-event publishers
(one per simulated replica) routes each prompt to the replica whose events say it holds it."""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import zmq.asyncio
from gw_support import gateway_doc, wait_until_scraped

from sluicegate.api.loader import build_config
from sluicegate.gateway.app import Gateway, GatewayOptions
from sluicegate.runtime import RuntimeOptions
from sluicegate.scheduling.config import load_preset
from sluicegate.tokens import token_ids

sys.path.insert(0, str(Path(__file__).parent.parent / "datalayer"))
from kv_support import FakeVLLMPublisher, stored, until

BASE = "tiny-llama"
BS = 16


def _prompt(letter: str) -> str:
    return "".join(f"{letter}{i:03d}" for i in range(BS * 8))  # 8 blocks of 16 built-in tokens


def _pool(cluster: Any, pubs: list[FakeVLLMPublisher]) -> dict[str, Any]:
    endpoints = [
        {
            "address": url,
            "name": f"sim-{i}",
            "kvEvents": {"endpoint": pub.pub_address, "replayEndpoint": pub.replay_address},
        }
        for i, (url, pub) in enumerate(zip(cluster.urls, pubs, strict=True))
    ]
    return {
        "apiVersion": "inference.networking.k8s.io/v1",
        "kind": "InferencePool",
        "metadata": {"name": "pool"},
        "spec": {"targetPorts": [{"number": 8000}], "endpoints": endpoints, "kvEvents": {}},
    }


@pytest.fixture
async def ctx() -> AsyncIterator[zmq.asyncio.Context]:
    context = zmq.asyncio.Context()
    yield context
    context.destroy(linger=0)


async def test_events_drive_routing(
    sim_cluster: Any, ctx: zmq.asyncio.Context, http: aiohttp.ClientSession
) -> None:
    cluster = await sim_cluster(replicas=2)
    pubs = [FakeVLLMPublisher(ctx) for _ in range(2)]
    config = build_config([_pool(cluster, pubs), gateway_doc(scrapeIntervalMs=20)])
    config.picker = load_preset("precise-prefix")
    gw = Gateway(config, GatewayOptions(RuntimeOptions()))
    await gw.start("127.0.0.1", 0)
    try:
        await wait_until_scraped(gw)
        for pub in pubs:
            await pub.wait_subscribed()
        base = f"http://127.0.0.1:{gw.port}"
        async with http.get(f"{base}/health") as r:
            health = await r.json()
        assert health["status"] == "degraded"
        assert {e["endpoint"] for e in health["kv_events_unknown"]} == {"sim-0", "sim-1"}

        # replica i's events: it stored prompt "ab"[i]'s 8 blocks
        for i, letter in enumerate("ab"):
            ids = token_ids(_prompt(letter).encode())
            await pubs[i].publish([stored(list(range(1, 9)), None, ids, BS)])
        pools = gw.runtime.kv_events.service.pools
        await until(lambda: all(pools["pool"].index.size(f"sim-{i}") == 8 for i in range(2)))
        async with http.get(f"{base}/health") as r:
            assert (await r.json()) == {"status": "ok"}

        addresses = [u.removeprefix("http://") for u in cluster.urls]
        for _ in range(3):
            for i, letter in enumerate("ab"):
                body = {"model": BASE, "prompt": _prompt(letter), "max_tokens": 1}
                async with http.post(f"{base}/v1/completions", json=body) as r:
                    assert r.status == 200, await r.text()
                    assert r.headers["x-gateway-destination-endpoint-served"] == addresses[i]

        async with http.get(f"{base}/metrics") as r:
            text = await r.text()
        assert 'kvcache_index_admissions_total{pool="pool"} 16.0' in text
        assert 'sluicegate_kv_events_index_blocks{endpoint="sim-1",pool="pool"} 8.0' in text
        assert 'kvcache_index_lookup_key_total{result="hit"} 48.0' in text
    finally:
        await gw.stop()
        for pub in pubs:
            await pub.close()
    assert gw.runtime.kv_events.service.pools == {}
