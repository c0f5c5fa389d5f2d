"""SIGTERM to a real ``sluicegate serve`` under load: readiness fails first, requests go on
for the drain delay, streams in flight finish, the process exits 0 and no request that was
sent is lost."""

from __future__ import annotations

import asyncio
import json
import signal
import socket
import time
from pathlib import Path
from typing import Any

import aiohttp
from serve_support import start_serve, write_config


async def stream(http: aiohttp.ClientSession, port: int, prompt: str, tokens: int) -> bool:
    """A streamed completion; True when it arrived whole (status 200, ``[DONE]`` last)."""
    body = {
        "model": "tiny-llama",
        "prompt": prompt,
        "max_tokens": tokens,
        "ignore_eos": True,
        "stream": True,
    }
    async with http.post(f"http://127.0.0.1:{port}/v1/completions", json=body) as r:
        text = (await r.read()).decode()
    if r.status != 200:
        return False
    events = [line[6:] for line in text.splitlines() if line.startswith("data: ")]
    chunks = [json.loads(e) for e in events[:-1]]
    return events[-1:] == ["[DONE]"] and len(chunks) >= tokens


async def test_sigterm_drains_without_losing_a_request(sim_cluster: Any, tmp_path: Path) -> None:
    cluster = await sim_cluster(replicas=2, time_scale=1.0)
    config = write_config(tmp_path / "gw.yaml", cluster.urls)
    proc, port = start_serve(config, "--drain-delay", "2.0", "--shutdown-grace", "10")
    base = f"http://127.0.0.1:{port}"
    sent: list[asyncio.Task[bool]] = []
    ready_seen: list[int] = []
    try:
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as http:
            deadline = time.monotonic() + 10
            while True:  # ready once the endpoints are scraped
                async with http.get(f"{base}/ready") as r:
                    if r.status == 200:
                        break
                assert time.monotonic() < deadline
                await asyncio.sleep(0.05)
            # Long streams in flight when the signal comes (~1.5 s of tokens each).
            long = [asyncio.create_task(stream(http, port, f"long {i}", 600)) for i in range(4)]
            await asyncio.sleep(0.3)
            signalled_at: float | None = None
            i = 0
            # A load balancer's view: new requests only while /ready says 200.
            while True:
                async with http.get(f"{base}/ready") as r:
                    ready_seen.append(r.status)
                    if r.status != 200:
                        assert (await r.json())["draining"] is True
                        break
                for _ in range(3):
                    sent.append(asyncio.create_task(stream(http, port, f"short {i}", 4)))
                    i += 1
                if signalled_at is None and i >= 30:
                    proc.send_signal(signal.SIGTERM)
                    signalled_at = time.monotonic()
                await asyncio.sleep(0.03)
            assert signalled_at is not None
            not_ready_after = time.monotonic() - signalled_at
            short_ok = await asyncio.gather(*sent)
            long_ok = await asyncio.gather(*long)
        code = await asyncio.to_thread(proc.wait, 20)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert code == 0
    # Readiness failed first: /ready answered 503 while the listener was still open, and
    # before the drain delay (2 s) ran out.
    assert ready_seen[-1] == 503
    assert not_ready_after < 2.0
    assert all(long_ok), long_ok
    assert len(short_ok) >= 30
    assert all(short_ok), short_ok
    with socket.socket() as s:  # gone: the listener is closed
        assert s.connect_ex(("127.0.0.1", port)) != 0


async def _ready_is(port: int, status: int) -> None:
    """Until ``/ready`` answers ``status`` (at most 10 s)."""
    async with aiohttp.ClientSession() as http:
        deadline = time.monotonic() + 10
        while True:
            async with http.get(f"http://127.0.0.1:{port}/ready") as r:
                if r.status == status:
                    return
            assert time.monotonic() < deadline
            await asyncio.sleep(0.05)


async def test_sigint_or_a_second_signal_stops_at_once(sim_cluster: Any, tmp_path: Path) -> None:
    cluster = await sim_cluster(replicas=1, time_scale=1.0)
    config = write_config(tmp_path / "gw.yaml", cluster.urls)
    # A drain would take 120 s and more: any exit within 30 s did not drain.
    slow_drain = ("--drain-delay", "120", "--shutdown-grace", "60")
    cases = [[signal.SIGINT], [signal.SIGTERM, signal.SIGTERM], [signal.SIGTERM, signal.SIGINT]]
    for signals in cases:
        proc, port = start_serve(config, *slow_drain)
        try:
            await _ready_is(port, 200)
            for n, sig in enumerate(signals):
                if n:  # the first signal started a drain: wait until /ready says so
                    await _ready_is(port, 503)
                proc.send_signal(sig)
            code = await asyncio.to_thread(proc.wait, 30)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        assert code == 0, signals
