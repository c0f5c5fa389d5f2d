"""The probes behind "What the numbers say", item 3: what one request, two requests on one
server and one request on each of two servers cost on the bench's real servers, and what a
``/metrics`` scrape costs a vLLM API server.

    SLUICEGATE_VLLM_PYTHON=.venv-vllm/bin/python nice -n -15 python \
        docs/benchmarks/sim-vs-vllm/contention.py

Two servers are started exactly as ``sluicegate bench run --backend vllm`` starts them; every
prompt is 1,300 fresh token ids (no prefix-cache hit), 16 output tokens; times are the
servers' own histograms (``vllm:time_to_first_token_seconds``,
``vllm:inter_token_latency_seconds``), means over 10 rounds, two repetitions.
"""

from __future__ import annotations

import asyncio
import os
import tempfile
import time
import urllib.request
from pathlib import Path

import aiohttp

from sluicegate.bench.http.vllm import default_model_dir, server_args, server_env
from sluicegate.bench.vllm_backend import MODEL_NAME, VllmServer, ensure_model, start_servers
from sluicegate.sim.calibrate.client import ITL, TTFT, Target
from sluicegate.sim.calibrate.probes import Prober


async def rounds(label: str, targets: list[Target], pick: list[int], gap_s: float) -> None:
    """Ten rounds of one request per entry of ``pick`` (a server index), ``gap_s`` apart."""
    prober = Prober(targets[0], MODEL_NAME, seed=9)
    before = [await t.scrape() for t in targets]
    for _ in range(10):

        async def one(i: int, delay: float) -> None:
            await asyncio.sleep(delay)
            await targets[i].complete(MODEL_NAME, prober.prompt(1300), 16)

        await asyncio.gather(*(one(i, n * gap_s) for n, i in enumerate(pick)))
        await asyncio.sleep(0.3)
    await asyncio.sleep(1.0)
    for i, t in enumerate(targets):
        b, a = before[i], await t.scrape()
        assert b is not None and a is not None
        ttft, itl = b.delta(a, TTFT), b.delta(a, ITL)
        if ttft and ttft[1] and itl and itl[1]:
            print(f"{label}, server {i}: TTFT {ttft[0] / ttft[1] * 1e3:.1f} ms (n={ttft[1]:g}), "
                  f"inter-token {itl[0] / itl[1] * 1e3:.2f} ms")


async def probe(servers: list[VllmServer]) -> None:
    async with aiohttp.ClientSession() as http:
        targets = [Target(http, s.url, 60.0) for s in servers]
        for _ in range(2):
            await rounds("one request", targets, [0], 0.0)
            await rounds("two requests 10 ms apart on one server", targets, [0, 0], 0.01)
            await rounds("one request on each server at once", targets, [0, 1], 0.0)


def scrape_cpu_ms(server: VllmServer, count: int = 200) -> float:
    """CPU time (ms) the server's API process spends per ``/metrics`` scrape."""
    assert server.process is not None
    tick = os.sysconf("SC_CLK_TCK")

    def cpu() -> float:
        fields = Path(f"/proc/{server.process.pid}/stat").read_text().split()
        return (int(fields[13]) + int(fields[14])) / tick

    start = cpu()
    for _ in range(count):
        urllib.request.urlopen(server.url + "/metrics").read()
    return (cpu() - start) / count * 1e3


def main() -> None:
    python = os.environ["SLUICEGATE_VLLM_PYTHON"]
    model = ensure_model(python, default_model_dir())
    with tempfile.TemporaryDirectory() as logs:
        servers = start_servers(python, model, Path(logs), env=server_env, args=lambda i: server_args())
        try:
            asyncio.run(probe(servers))
            time.sleep(2.0)
            print(f"/metrics scrape: {scrape_cpu_ms(servers[0]):.2f} ms of API-server CPU")
        finally:
            for s in servers:
                s.stop()


if __name__ == "__main__":
    main()
