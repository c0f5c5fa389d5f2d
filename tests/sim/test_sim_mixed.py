"""A simulated pool mixing engine profiles: ``--profile NAME:COUNT,...`` and SimCluster."""

from __future__ import annotations

import asyncio
import re

import aiohttp
import pytest
from test_sim_cli import free_port_pair, sluicegate_command, wait_until_serving

from sluicegate.sim.profiles import get_profile, profile_mix
from sluicegate.sim.server import ReplicaOptions, SimCluster


def test_profile_mix_reads_names_and_counts_in_order() -> None:
    mix = profile_mix("llama3-8b-h100:2, llama3-8b-a100:4")
    assert [(p.name, n) for p, n in mix] == [("llama3-8b-h100", 2), ("llama3-8b-a100", 4)]
    assert [(p.name, n) for p, n in profile_mix("tiny")] == [("tiny", None)]


@pytest.mark.parametrize("bad", ["tiny:0", "tiny:x", "tiny:", ":2", "tiny,,tiny"])
def test_profile_mix_refuses_malformed_entries(bad: str) -> None:
    with pytest.raises(ValueError, match="NAME:COUNT"):
        profile_mix(bad)


def test_profile_mix_names_an_unknown_profile() -> None:
    with pytest.raises(KeyError, match="no-such"):
        profile_mix("tiny:1,no-such:2")


def _blocks(text: str) -> int:
    found = re.search(r'vllm:cache_config_info\{[^}]*num_gpu_blocks="(\d+)"', text)
    assert found is not None, text[:500]
    return int(found.group(1))


async def test_a_mixed_cluster_serves_each_replica_with_its_own_profile(
    http: aiohttp.ClientSession,
) -> None:
    h100, a40 = get_profile("llama3-8b-h100"), get_profile("llama3-8b-a40")
    options = ReplicaOptions(profile=h100, time_scale=0.001)
    with pytest.raises(ValueError, match="3 profiles for 2 replicas"):
        SimCluster(options, 2, profiles=(h100, a40, a40))
    cluster = SimCluster(options, 3, profiles=(h100, a40, a40))
    await cluster.start()
    try:
        blocks = []
        for url in cluster.urls:
            async with http.get(url + "/metrics") as r:
                blocks.append(_blocks(await r.text()))
            body = {"model": h100.model_name, "prompt": "hello", "max_tokens": 4}
            async with http.post(url + "/v1/completions", json=body) as r:
                assert r.status == 200
                assert (await r.json())["usage"]["completion_tokens"] >= 1
        assert blocks == [h100.num_gpu_blocks, a40.num_gpu_blocks, a40.num_gpu_blocks]
        assert [r.options.profile.accelerator for r in cluster.replicas] == [
            "h100-80gb",
            "a40-48gb",
            "a40-48gb",
        ]
    finally:
        await cluster.stop()


async def _run_sim(*args: str) -> tuple[int, str]:
    process = await asyncio.create_subprocess_exec(
        *sluicegate_command(),
        "sim",
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    _stdout, stderr = await asyncio.wait_for(process.communicate(), timeout=20)
    assert process.returncode is not None
    return process.returncode, stderr.decode()


async def test_sim_command_refuses_counts_that_disagree() -> None:
    status, log = await _run_sim("--profile", "tiny:2,llama3-8b-a40:1", "--replicas", "2")
    assert status == 2
    assert "--replicas 2 but --profile counts 3 replicas" in log
    status, log = await _run_sim("--profile", "tiny:2,llama3-8b-a40")
    assert status == 2
    assert "give every entry of a mixed pool a count" in log


async def test_sim_command_serves_a_mixed_pool(http: aiohttp.ClientSession) -> None:
    port = free_port_pair()
    process = await asyncio.create_subprocess_exec(
        *sluicegate_command(),
        "--log-level",
        "warning",
        "sim",
        "--profile",
        "tiny:1,llama3-8b-a40:1",
        "--port",
        str(port),
        "--time-scale",
        "0.01",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        urls = [f"http://127.0.0.1:{port}", f"http://127.0.0.1:{port + 1}"]
        await wait_until_serving(http, urls, process)
        async with http.get(urls[1] + "/metrics") as r:
            assert _blocks(await r.text()) == get_profile("llama3-8b-a40").num_gpu_blocks
        process.terminate()
        stdout, stderr = await asyncio.wait_for(process.communicate(), timeout=10)
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    log = (stdout + stderr).decode()
    assert "2 replica(s) of a mixed pool" in log
    assert "llama3-8b-a40" in log
    assert "a40-48gb" in log
