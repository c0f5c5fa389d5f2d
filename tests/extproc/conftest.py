"""Fixtures for the endpoint-picker tests.

``picker(cluster, docs=..., stream=..., synced=...)`` starts an
:class:`~sluicegate.extproc.server.ExtProcServer` on free loopback ports in front of a
:class:`~sluicegate.sim.server.SimCluster`, scrapes every endpoint once, and returns a
:class:`~ep_support.Picker` with a gRPC channel to it; everything is stopped at teardown.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any, Protocol

import grpc
import pytest
from ep_support import Picker, gateway_doc, new_stub, pool_doc

from sluicegate.api.loader import build_config
from sluicegate.extproc.server import ExtProcOptions, ExtProcServer
from sluicegate.extproc.stream import StreamSettings
from sluicegate.runtime import Runtime, RuntimeOptions
from sluicegate.sim.server import SimCluster


class PickerFactory(Protocol):
    async def __call__(
        self,
        cluster: SimCluster,
        *,
        docs: Sequence[dict[str, Any]] = (),
        settings: dict[str, Any] | None = None,
        stream: StreamSettings | None = None,
        synced: Callable[[], bool] | None = None,
        scrape: bool = True,
        queueing: bool = False,
    ) -> Picker: ...


@pytest.fixture
async def picker() -> AsyncIterator[PickerFactory]:
    started: list[Picker] = []

    async def make(
        cluster: SimCluster,
        *,
        docs: Sequence[dict[str, Any]] = (),
        settings: dict[str, Any] | None = None,
        stream: StreamSettings | None = None,
        synced: Callable[[], bool] | None = None,
        scrape: bool = True,
        queueing: bool = False,
    ) -> Picker:
        spec = {"scrapeIntervalMs": 20, "metricsStalenessMs": 2000, **(settings or {})}
        config = build_config(
            [pool_doc(cluster.urls, queueing=queueing), gateway_doc(**spec), *docs]
        )
        runtime = Runtime(config, RuntimeOptions(seed=1))
        options = ExtProcOptions(
            host="127.0.0.1",
            grpc_port=0,
            health_port=0,
            metrics_port=0,
            stream=stream or StreamSettings(),
            readiness_interval_s=0.05,
            grace_period_s=0.5,
        )
        server = ExtProcServer(runtime, options, synced=synced)
        await server.start()
        channel = grpc.aio.insecure_channel(f"127.0.0.1:{server.grpc_port}")
        made = Picker(server, runtime, channel, new_stub(channel))
        started.append(made)
        if scrape:
            assert runtime.collector is not None
            for endpoint in runtime.datastore.all_endpoints():
                await runtime.collector.refresh(endpoint)
                assert endpoint.metrics is not None, f"{endpoint.name} was not scraped"
        return made

    yield make
    for made in reversed(started):
        await made.channel.close()
        await made.server.stop(0.5)
