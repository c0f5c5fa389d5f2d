"""Fixtures of the reliability suite: gateways in front of simulated (or recording) servers,
in this process or in a child process."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
import uvloop
from support import (
    API_KEY,
    F_API_KEY_FILE,
    LISTENING,
    GatewayFactory,
    GatewayProcess,
    ServeFactory,
    spawn_gateway,
    start_gateway,
    write_config,
)

from sluicegate.gateway.app import Gateway


@pytest.fixture
async def relgw() -> AsyncIterator[GatewayFactory]:
    """Factory: :func:`support.start_gateway`; every gateway it made is stopped at teardown."""
    started: list[Gateway] = []

    async def make(
        urls: Sequence[str],
        settings: dict[str, Any] | None = None,
        docs: Sequence[dict[str, Any]] = (),
        *,
        keys: bool = True,
        access_log: bool = False,
        scrape: bool = True,
    ) -> Gateway:
        gw = await start_gateway(
            urls, settings, docs, keys=keys, access_log=access_log, scrape=scrape
        )
        started.append(gw)
        return gw

    yield make
    for gw in reversed(started):
        await gw.stop()


@pytest.fixture
async def served(tmp_path: Path) -> AsyncIterator[ServeFactory]:
    """Factory: ``sluicegate serve --config FILE`` in a child process on a free port (with
    ``--api-key-file`` holding the suite's key when ``key_file``). Stopped at teardown."""
    children: list[GatewayProcess] = []

    async def make(
        docs: Sequence[dict[str, Any]], *extra: str, key_file: bool = False
    ) -> GatewayProcess:
        config = tmp_path / "gateway.yaml"
        write_config(config, docs)
        args = ["--port", "0", *extra]
        if key_file:
            keys = tmp_path / "keys.txt"
            keys.write_text(API_KEY + "\n")
            keys.chmod(0o600)
            args += [F_API_KEY_FILE, str(keys)]
        child, out = spawn_gateway(config, *args)
        proc = child.proc
        children.append(child)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            found = next((m for line in out + child.log if (m := LISTENING.search(line))), None)
            if found:
                child.port = int(found.group(1))
                return child
            if proc.poll() is not None:
                await asyncio.sleep(0.1)  # the last lines of its output
                raise AssertionError(
                    f"gateway exited {proc.returncode}: {' | '.join(out + child.log)}"
                )
            await asyncio.sleep(0.05)
        raise AssertionError(f"gateway did not start: {' | '.join(out + child.log)}")

    yield make
    for child in children:
        await asyncio.to_thread(child.stop)


def pytest_asyncio_loop_factories(
    config: pytest.Config, item: pytest.Item
) -> Mapping[str, Callable[[], asyncio.AbstractEventLoop]]:
    """The bad-input catalogue runs on asyncio's loop and on uvloop (the one ``serve``
    runs on): transports differ in how they close and pause."""
    if item.path.name == "test_bad_input.py":
        return {"asyncio": asyncio.new_event_loop, "uvloop": uvloop.new_event_loop}
    return {"asyncio": asyncio.new_event_loop}
