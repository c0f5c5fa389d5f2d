"""Fixtures for gateway tests: a running :class:`Gateway` in front of a simulated pool."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from typing import Any

import aiohttp
import pytest
from gw_support import GatewayFactory, gateway_doc, pool_doc, wait_until_scraped

from sluicegate.api.loader import build_config
from sluicegate.gateway.app import Gateway, GatewayOptions
from sluicegate.runtime import RuntimeOptions
from sluicegate.scheduling.config import load_preset
from sluicegate.sim.server import SimCluster


@pytest.fixture
async def gateway() -> AsyncIterator[GatewayFactory]:
    """Factory starting a gateway on a free port in front of a :class:`SimCluster`."""
    started: list[Gateway] = []

    async def make(
        cluster: SimCluster,
        *,
        docs: Sequence[dict[str, Any]] = (),
        preset: str | None = None,
        settings: dict[str, Any] | None = None,
        api_keys: Sequence[str] = (),
        wait_ready: bool = True,
        runtime: RuntimeOptions | None = None,
    ) -> Gateway:
        spec = {"scrapeIntervalMs": 20, "metricsStalenessMs": 2000, **(settings or {})}
        config = build_config([pool_doc(cluster.urls), gateway_doc(**spec), *docs])
        if preset is not None:
            config.picker = load_preset(preset)
        gw = Gateway(config, GatewayOptions(runtime or RuntimeOptions(), api_keys=list(api_keys)))
        await gw.start("127.0.0.1", 0)
        started.append(gw)
        if wait_ready:
            await wait_until_scraped(gw)
        return gw

    yield make
    for gw in reversed(started):
        await gw.stop()


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    connector = aiohttp.TCPConnector(limit=0)  # tests may hold many requests open at once
    async with aiohttp.ClientSession(connector=connector) as session:
        yield session
