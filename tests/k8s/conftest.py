"""Fixtures for the Kubernetes discovery tests.

``apiserver`` is a running :class:`FakeApiServer`; ``discovery(...)`` builds a
:class:`KubernetesDiscovery` on the real kubernetes-asyncio client pointed at it (fast
timings), starts it and stops it at teardown. Deliveries are recorded by a
:class:`~k8s_support.Recorder`.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any

import pytest
from k8s_fake_apiserver import FakeApiServer
from k8s_support import FAST, WAIT_S, DiscoveryFactory, Recorder
from kubernetes_asyncio.client import ApiClient

from sluicegate.api.loader import Config
from sluicegate.k8s import DiscoverySettings, KubernetesDiscovery, api_client_for


@pytest.fixture
async def apiserver() -> AsyncIterator[FakeApiServer]:
    server = FakeApiServer()
    await server.start()
    yield server
    await server.stop()


@pytest.fixture
async def api(apiserver: FakeApiServer) -> AsyncIterator[ApiClient]:
    client = api_client_for(apiserver.url)
    yield client
    await client.close()


@pytest.fixture
async def discovery(api: ApiClient) -> AsyncIterator[DiscoveryFactory]:
    started: list[KubernetesDiscovery] = []

    async def make(
        pool_name: str | None = None,
        *,
        debounce_s: float = 0.02,
        base: Config | None = None,
        wait: bool = True,
        **reflector: Any,
    ) -> tuple[KubernetesDiscovery, Recorder]:
        recorder = Recorder()
        settings = DiscoverySettings(debounce_s=debounce_s, reflector=replace(FAST, **reflector))
        disc = KubernetesDiscovery(
            api, "default", pool_name, recorder, base=base, settings=settings, seed=1
        )
        started.append(disc)
        await disc.start()
        if wait:
            async with asyncio.timeout(WAIT_S):
                await disc.wait_synced()
        return disc, recorder

    yield make
    for disc in started:
        await disc.stop()
