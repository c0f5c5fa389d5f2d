"""Fixtures for the simulated vLLM server's HTTP tests."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import aiohttp
import pytest
from openai import AsyncOpenAI
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

from sluicegate.sim.server import Replica


class Families(dict[str, Metric]):
    """A parsed scrape: metric families by name (counters without ``_total``)."""

    def value(self, name: str, suffix: str = "", **labels: str) -> float:
        """The value of the one sample of family ``name`` whose labels include ``labels``.

        ``suffix`` picks a sample of a histogram (``"_count"``, ``"_sum"``); a counter's
        sample is its ``_total``.
        """
        family = self[name]
        if not suffix and family.type == "counter":
            suffix = "_total"
        sample_name = name + suffix
        values = [
            s.value
            for s in family.samples
            if s.name == sample_name and all(s.labels.get(k) == v for k, v in labels.items())
        ]
        assert len(values) == 1, f"{name}{labels}: {len(values)} samples"
        return values[0]


Scrape = Callable[[Replica], Awaitable[Families]]

OpenAIFactory = Callable[..., AsyncOpenAI]


@pytest.fixture
async def replica(sim_cluster: Any) -> Replica:
    """One running replica of the ``tiny`` profile at ten times real speed."""
    cluster = await sim_cluster(replicas=1)
    return cluster.replicas[0]


@pytest.fixture
async def openai_client() -> AsyncIterator[OpenAIFactory]:
    """Factory of ``AsyncOpenAI`` clients for a replica (no retries); closed at teardown."""
    clients: list[AsyncOpenAI] = []

    def make(replica: Replica, timeout: float = 10.0) -> AsyncOpenAI:
        client = AsyncOpenAI(
            base_url=replica.url + "/v1", api_key="x", max_retries=0, timeout=timeout
        )
        clients.append(client)
        return client

    yield make
    for client in clients:
        await client.close()


@pytest.fixture
def client(replica: Replica, openai_client: OpenAIFactory) -> AsyncOpenAI:
    """An ``AsyncOpenAI`` client of ``replica``."""
    return openai_client(replica)


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    """A raw HTTP session for requests the OpenAI SDK would not send."""
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session:
        yield session


@pytest.fixture
def scrape(http: aiohttp.ClientSession) -> Scrape:
    """``await scrape(replica)``: its ``/metrics`` parsed (see :class:`Families`)."""

    async def scrape_(replica: Replica) -> Families:
        async with http.get(replica.url + "/metrics") as response:
            assert response.status == 200
            text = await response.text()
        return Families((f.name, f) for f in text_string_to_metric_families(text))

    return scrape_
