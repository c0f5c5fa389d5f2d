"""Fault injection in the simulated server: at start, through ``/admin/faults``, and on the CLI."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import asdict
from typing import Any

import aiohttp
import openai
import orjson
import pytest

from sluicegate.sim.faults import Faults, parse_fault_spec
from sluicegate.sim.run import fault_table
from sluicegate.sim.server import Replica

MODEL = "tiny-llama"
IGNORE_EOS = {"ignore_eos": True}
DEFAULTS = asdict(Faults())


async def wait_for(predicate: Callable[[], bool], within: float = 5.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while not predicate():
        assert loop.time() < deadline, "condition not reached in time"
        await asyncio.sleep(0.01)


async def set_faults(http: aiohttp.ClientSession, replica: Replica, **changes: Any) -> Any:
    async with http.post(replica.url + "/admin/faults", json=changes) as response:
        assert response.status == 200, await response.text()
        return await response.json()


async def get_faults(http: aiohttp.ClientSession, replica: Replica) -> Any:
    async with http.get(replica.url + "/admin/faults") as response:
        assert response.status == 200
        return await response.json()


async def read_sse_lines(
    http: aiohttp.ClientSession, url: str, body: dict[str, Any], into: list[bytes]
) -> None:
    """POST a streaming ``body``; append each non-empty line of the answer to ``into``."""
    async with http.post(url, json=body) as response:
        assert response.status == 200
        async for line in response.content:
            if line.strip():
                into.append(line.strip())


def assert_idle(replica: Replica) -> None:
    """Nothing of any request is left in the engine or the server."""
    assert replica.engine.num_requests == 0
    assert replica.engine.pool.usage == 0
    assert not replica.driver.handles
    assert not replica.metrics._last_token_time


# ---------------------------------------------------------------------------- errors


async def test_error_rate_one_answers_the_error_status(
    sim_cluster: Any, openai_client: Any, http: aiohttp.ClientSession
) -> None:
    cluster = await sim_cluster(replicas=1, faults=Faults(error_rate=1.0, error_status=503))
    replica = cluster.replicas[0]
    client = openai_client(replica)
    with pytest.raises(openai.InternalServerError) as completion:
        await client.completions.create(model=MODEL, prompt="hi", max_tokens=1)
    assert completion.value.status_code == 503
    with pytest.raises(openai.InternalServerError):
        await client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "hi"}], stream=True
        )
    async with http.post(
        replica.url + "/v1/completions", json={"model": MODEL, "prompt": "hi"}
    ) as response:
        assert response.status == 503
        assert response.headers["x-inference-pod"] == "sim-0"
        assert (await response.json())["error"]["code"] == 503
    # Only generation fails: probes and scrapes still work.
    async with http.get(replica.url + "/health") as response:
        assert response.status == 200
    async with http.get(replica.url + "/metrics") as response:
        assert response.status == 200
    assert_idle(replica)


async def test_faults_change_at_run_time(
    replica: Replica, client: openai.AsyncOpenAI, http: aiohttp.ClientSession
) -> None:
    assert await get_faults(http, replica) == DEFAULTS
    state = await set_faults(http, replica, error_rate=1, error_status=429)
    assert state == {**DEFAULTS, "error_rate": 1.0, "error_status": 429}
    with pytest.raises(openai.RateLimitError):
        await client.completions.create(model=MODEL, prompt="hi", max_tokens=1)
    await set_faults(http, replica, error_rate=0)
    response = await client.completions.create(model=MODEL, prompt="hi", max_tokens=1)
    assert response.choices[0].text


async def test_faults_apply_per_replica(sim_cluster: Any, openai_client: Any) -> None:
    cluster = await sim_cluster(replicas=2, faults={1: Faults(error_rate=1.0)})
    healthy, broken = cluster.replicas
    await openai_client(healthy).completions.create(model=MODEL, prompt="hi", max_tokens=1)
    with pytest.raises(openai.InternalServerError):
        await openai_client(broken).completions.create(model=MODEL, prompt="hi", max_tokens=1)


async def test_latency_ms_delays_generation(
    sim_cluster: Any, openai_client: Any, http: aiohttp.ClientSession
) -> None:
    replica = (await sim_cluster(replicas=1, faults=Faults(latency_ms=250))).replicas[0]
    client = openai_client(replica)
    loop = asyncio.get_running_loop()
    started = loop.time()
    await client.completions.create(model=MODEL, prompt="slow", max_tokens=1)
    assert loop.time() - started >= 0.25


# ---------------------------------------------------------------------------- hang


async def test_hang_times_the_client_out_without_leaking(
    sim_cluster: Any, openai_client: Any, http: aiohttp.ClientSession
) -> None:
    replica = (await sim_cluster(replicas=1, faults=Faults(hang=True))).replicas[0]
    client = openai_client(replica, timeout=0.3)
    with pytest.raises(openai.APITimeoutError):
        await client.completions.create(model=MODEL, prompt="anyone there?", max_tokens=5)
    with pytest.raises(openai.APITimeoutError):
        await client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "hi"}], stream=True
        )
    # The abandoned handlers are cancelled and nothing entered the engine.
    await wait_for(lambda: not replica._transports)
    assert_idle(replica)
    async with http.get(replica.url + "/health") as response:
        assert response.status == 200
    await set_faults(http, replica, hang=False)
    response = await client.completions.create(model=MODEL, prompt="back", max_tokens=2)
    assert response.usage is not None


# ---------------------------------------------------------------------------- resets


async def test_reset_after_tokens_cuts_a_stream(
    sim_cluster: Any, http: aiohttp.ClientSession
) -> None:
    replica = (await sim_cluster(replicas=1, faults=Faults(reset_after_tokens=3))).replicas[0]
    body = {"model": MODEL, "prompt": "cut me", "max_tokens": 20, "stream": True, **IGNORE_EOS}
    frames: list[bytes] = []
    with pytest.raises(aiohttp.ClientPayloadError):
        await read_sse_lines(http, replica.url + "/v1/completions", body, frames)
    assert len(frames) == 3, frames  # three tokens, then the connection drops
    assert b"data: [DONE]" not in frames
    assert all(orjson.loads(f.removeprefix(b"data: "))["choices"] for f in frames)
    await wait_for(lambda: replica.engine.num_requests == 0)
    assert_idle(replica)


async def test_reset_after_tokens_through_the_sdk(
    sim_cluster: Any, openai_client: Any, http: aiohttp.ClientSession
) -> None:
    replica = (await sim_cluster(replicas=1, faults=Faults(reset_after_tokens=2))).replicas[0]
    client = openai_client(replica)
    with pytest.raises(openai.APIConnectionError):
        await client.completions.create(
            model=MODEL, prompt="whole", max_tokens=10, extra_body=IGNORE_EOS
        )
    stream = await client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "cut"}],
        max_tokens=10,
        stream=True,
        extra_body=IGNORE_EOS,
    )
    received: list[Any] = []

    async def consume() -> None:
        async for chunk in stream:
            received.append(chunk)

    with pytest.raises(openai.APIConnectionError):
        await consume()
    assert len(received) == 3  # the role chunk and two tokens
    await wait_for(lambda: replica.engine.num_requests == 0)
    assert_idle(replica)
    # A request that ends before the limit is not affected.
    response = await client.completions.create(
        model=MODEL, prompt="short", max_tokens=1, extra_body=IGNORE_EOS
    )
    assert response.usage is not None
    # Without a reset the replica answers whole again.
    await set_faults(http, replica, reset_after_tokens=None)
    response = await client.completions.create(
        model=MODEL, prompt="whole", max_tokens=10, extra_body=IGNORE_EOS
    )
    assert response.usage is not None
    assert response.usage.completion_tokens == 10


async def test_reset_after_zero_tokens(sim_cluster: Any, http: aiohttp.ClientSession) -> None:
    replica = (await sim_cluster(replicas=1, faults=Faults(reset_after_tokens=0))).replicas[0]
    body = {"model": MODEL, "prompt": "x", "max_tokens": 5, "stream": True}
    frames: list[bytes] = []
    with pytest.raises(aiohttp.ClientPayloadError):
        await read_sse_lines(http, replica.url + "/v1/completions", body, frames)
    assert frames == []
    await wait_for(lambda: replica.engine.num_requests == 0)
    assert_idle(replica)


# ---------------------------------------------------------------------------- frozen metrics


async def test_freeze_metrics_serves_an_unchanged_scrape(
    replica: Replica, client: openai.AsyncOpenAI, http: aiohttp.ClientSession, scrape: Any
) -> None:
    async def raw_scrape() -> bytes:
        async with http.get(replica.url + "/metrics") as response:
            return await response.read()

    await client.completions.create(model=MODEL, prompt="a", max_tokens=2, extra_body=IGNORE_EOS)
    before = (await scrape(replica)).value("vllm:generation_tokens")
    assert before == 2
    await set_faults(http, replica, freeze_metrics=True)
    await client.completions.create(model=MODEL, prompt="b", max_tokens=3, extra_body=IGNORE_EOS)
    frozen = await raw_scrape()
    await client.completions.create(model=MODEL, prompt="c", max_tokens=4, extra_body=IGNORE_EOS)
    assert await raw_scrape() == frozen
    # The scrape is the one taken when the fault was set, before the later load.
    assert (await scrape(replica)).value("vllm:generation_tokens") == before

    await set_faults(http, replica, freeze_metrics=False)
    assert (await scrape(replica)).value("vllm:generation_tokens") == 2 + 3 + 4


# ---------------------------------------------------------------------------- validation


@pytest.mark.parametrize(
    ("body", "field"),
    [
        (b"{", None),
        (b"[]", None),
        (b'{"error_rate": 2}', "error_rate"),
        (b'{"error_rate": "0.5"}', "error_rate"),
        (b'{"error_rate": true}', "error_rate"),
        (b'{"error_status": 200}', "error_status"),
        (b'{"error_status": 503.5}', "error_status"),
        (b'{"latency_ms": -1}', "latency_ms"),
        (b'{"hang": "yes"}', "hang"),
        (b'{"freeze_metrics": 1}', "freeze_metrics"),
        (b'{"reset_after_tokens": -1}', "reset_after_tokens"),
        (b'{"reset_after_tokens": 1.5}', "reset_after_tokens"),
        (b'{"bogus": 1}', "bogus"),
        (b'{"error_rate": 1, "bogus": 1}', "bogus"),
    ],
)
async def test_invalid_fault_bodies_are_rejected(
    replica: Replica, http: aiohttp.ClientSession, body: bytes, field: str | None
) -> None:
    async with http.post(replica.url + "/admin/faults", data=body) as response:
        assert response.status == 400
        message = (await response.json())["error"]["message"]
    if field is not None:
        assert field in message
    # A rejected update changes nothing, even the valid part of it.
    assert await get_faults(http, replica) == DEFAULTS


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ("error_rate=0.5", (None, {"error_rate": 0.5})),
        (
            "1:error_rate=0.5,error_status=503",
            (1, {"error_rate": 0.5, "error_status": 503}),
        ),
        ("0:hang=true", (0, {"hang": True})),
        ("freeze_metrics=False", (None, {"freeze_metrics": False})),
        (
            " latency_ms = 12.5 , reset_after_tokens=null ",
            (None, {"latency_ms": 12.5, "reset_after_tokens": None}),
        ),
        ("2:reset_after_tokens=7,", (2, {"reset_after_tokens": 7})),
    ],
)
def test_parse_fault_spec(spec: str, expected: tuple[int | None, dict[str, Any]]) -> None:
    assert parse_fault_spec(spec) == expected


@pytest.mark.parametrize("spec", ["hang", "error_rate=lots", "1:latency_ms"])
def test_parse_fault_spec_rejects(spec: str) -> None:
    with pytest.raises(ValueError, match="fault"):
        parse_fault_spec(spec)


def test_fault_table() -> None:
    specs = [
        parse_fault_spec("latency_ms=5"),
        parse_fault_spec("1:error_rate=1,error_status=429"),
        parse_fault_spec("1:latency_ms=7"),
    ]
    table = fault_table(specs, replicas=3)
    assert table == {
        0: Faults(latency_ms=5),
        1: Faults(latency_ms=7, error_rate=1.0, error_status=429),
        2: Faults(latency_ms=5),
    }
    assert fault_table([], replicas=2) == {}


@pytest.mark.parametrize(
    ("spec", "match"),
    [("3:hang=true", "replica 3"), ("error_rate=2", "error_rate"), ("nope=1", "nope")],
)
def test_fault_table_rejects(spec: str, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        fault_table([parse_fault_spec(spec)], replicas=2)
