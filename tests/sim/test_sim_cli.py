"""The ``sluicegate sim`` command, run as a real process."""

from __future__ import annotations

import asyncio
import signal
import socket
import sys
from pathlib import Path

import aiohttp
import openai
import pytest

MODEL = "tiny-llama"


def free_port_pair() -> int:
    """A port ``p`` of 127.0.0.1 such that ``p`` and ``p + 1`` are both free right now."""
    for _ in range(100):
        with socket.socket() as first:
            first.bind(("127.0.0.1", 0))
            port: int = first.getsockname()[1]
            with socket.socket() as second:
                try:
                    second.bind(("127.0.0.1", port + 1))
                except OSError:
                    continue
        return port
    raise RuntimeError("no pair of free ports")


def sluicegate_command() -> list[str]:
    script = Path(sys.executable).with_name("sluicegate")
    if script.exists():
        return [str(script)]
    return [sys.executable, "-c", "from sluicegate.cli import main; main()"]


async def wait_until_serving(
    http: aiohttp.ClientSession, urls: list[str], process: asyncio.subprocess.Process
) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 20
    pending = list(urls)
    while pending:
        assert process.returncode is None, "sluicegate sim exited early"
        assert loop.time() < deadline, "sluicegate sim did not start"
        try:
            async with http.get(pending[0] + "/health") as response:
                if response.status == 200:
                    pending.pop(0)
                    continue
        except aiohttp.ClientConnectionError:
            pass
        await asyncio.sleep(0.05)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
async def test_sim_command_serves_and_exits_on_signal(
    http: aiohttp.ClientSession, sig: signal.Signals
) -> None:
    port = free_port_pair()
    process = await asyncio.create_subprocess_exec(
        *sluicegate_command(),
        "--log-level",
        "warning",
        "sim",
        "--replicas",
        "2",
        "--profile",
        "tiny",
        "--port",
        str(port),
        "--time-scale",
        "0.1",
        "--fault",
        "1:latency_ms=1",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        urls = [f"http://127.0.0.1:{port}", f"http://127.0.0.1:{port + 1}"]
        await wait_until_serving(http, urls, process)
        for index, url in enumerate(urls):
            async with openai.AsyncOpenAI(
                base_url=url + "/v1", api_key="x", max_retries=0, timeout=10
            ) as client:
                raw = await client.completions.with_raw_response.create(
                    model=MODEL, prompt="hello", max_tokens=3, extra_body={"ignore_eos": True}
                )
                assert raw.headers["x-inference-pod"] == f"sim-{index}"
                assert raw.headers["x-inference-port"] == str(port + index)
                completion = raw.parse()
                assert completion.usage is not None
                assert completion.usage.completion_tokens == 3

        process.send_signal(sig)
        _stdout, stderr = await asyncio.wait_for(process.communicate(), timeout=10)
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    assert process.returncode == 0, stderr.decode()
    log = stderr.decode()
    assert "sluicegate sim" in log
    assert str(port + 1) in log
    assert "Traceback" not in log
    with pytest.raises(aiohttp.ClientConnectionError):
        await http.get(urls[0] + "/health")


async def test_sim_command_rejects_bad_options() -> None:
    process = await asyncio.create_subprocess_exec(
        *sluicegate_command(),
        "sim",
        "--profile",
        "no-such-profile",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    _stdout, stderr = await asyncio.wait_for(process.communicate(), timeout=20)
    assert process.returncode == 2
    assert "no-such-profile" in stderr.decode()


async def test_sim_command_rejects_a_bad_kv_events_config() -> None:
    process = await asyncio.create_subprocess_exec(
        *sluicegate_command(),
        "sim",
        "--kv-events-config",
        '{"enable_kv_cache_events": true, "endpont": "tcp://*:5557"}',
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    _stdout, stderr = await asyncio.wait_for(process.communicate(), timeout=20)
    assert process.returncode == 2
    assert "unknown kv-events field 'endpont'" in stderr.decode()


async def test_sim_command_reports_a_port_in_use() -> None:
    port = free_port_pair()
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", port + 1))
        taken.listen()
        process = await asyncio.create_subprocess_exec(
            *sluicegate_command(),
            "sim",
            "--replicas",
            "2",
            "--profile",
            "tiny",
            "--port",
            str(port),
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        _stdout, stderr = await asyncio.wait_for(process.communicate(), timeout=20)
    assert process.returncode == 1
    log = stderr.decode()
    assert "cannot serve" in log
    assert "Traceback" not in log
