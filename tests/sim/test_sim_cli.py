"""The ``sluicegate sim`` command, run as a real process."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import sys
from pathlib import Path

import aiohttp
import openai
import pytest

from sluicegate.sim.run import completion_command

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


async def test_sim_banner_command_pastes_into_a_shell() -> None:
    """On a 60-column console the start-up curl lines come out as built, each under 80
    columns, and bash given them as pasted gets a completion from the simulator."""
    port = free_port_pair()
    process = await asyncio.create_subprocess_exec(
        *sluicegate_command(),
        "sim",
        "--profile",
        "tiny",
        "--port",
        str(port),
        "--time-scale",
        "0.1",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={**os.environ, "COLUMNS": "60"},
    )
    try:
        assert process.stderr is not None
        lines: list[str] = []
        while "Try:" not in lines or len(lines) < lines.index("Try:") + 5:
            raw = await asyncio.wait_for(process.stderr.readline(), timeout=20)
            assert raw, f"sluicegate sim exited: {lines}"
            lines.append(raw.decode().rstrip("\n"))
        start = lines.index("Try:") + 1
        commands = lines[start : start + 4]
        assert commands == completion_command(f"http://127.0.0.1:{port}", MODEL)
        assert all(len(line) < 80 for line in commands), commands
        # As pasted, with curl standing in for a function printing its argv (curl itself
        # need not be installed); the argv is then sent as curl would send it.
        shell = "curl() { printf '%s\\0' \"$@\"; }\n" + "\n".join(commands) + "\n"
        bash = await asyncio.create_subprocess_exec(
            "bash", "-c", shell, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
        )
        out, err = await asyncio.wait_for(bash.communicate(), timeout=15)
        assert bash.returncode == 0, err
        argv = out.decode().split("\0")[:-1]
        assert argv[0] == f"http://127.0.0.1:{port}/v1/completions"
        assert argv[1:3] == ["-H", "content-type: application/json"]
        assert argv[3] == "-d"
        async with (
            aiohttp.ClientSession() as http,
            http.post(argv[0], data=argv[4], headers={"content-type": "application/json"}) as r,
        ):
            assert r.status == 200, await r.text()
            answer = await r.json()
        assert answer["model"] == MODEL
        assert answer["usage"]["completion_tokens"] >= 1
    finally:
        if process.returncode is None:
            process.send_signal(signal.SIGINT)
            await asyncio.wait_for(process.communicate(), timeout=10)
