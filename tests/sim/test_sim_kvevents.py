"""The simulator's KV-cache events, read by the gateway's own subscriber (issue 17, item 5).

A real :class:`KVEventSubscribers` subscribes over ZeroMQ to running simulated replicas;
after a workload that evicts, its :class:`PreciseIndex` must hold exactly the blocks the
engines' prefix caches hold, and answer prefix lookups as the engines do.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any

import aiohttp
import msgspec
import pytest
import zmq
import zmq.asyncio

from sluicegate.bench.sim_kvevents_cost import churn
from sluicegate.datalayer.kvevents import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KVEventSource,
    KVEventSubscribers,
    PreciseIndex,
    View,
    block_keys,
    decode_batch,
    extra_key_bytes,
)
from sluicegate.kv_wire import WireStoredMap
from sluicegate.sim.engine import Engine, new_sequence
from sluicegate.sim.faults import Faults
from sluicegate.sim.kvevents import KVEventLog, KVEventsConfig, replica_endpoint
from sluicegate.sim.kvpublisher import KVEventPublisher
from sluicegate.sim.profiles import get_profile
from sluicegate.sim.server import Replica, SimCluster
from sluicegate.tokens import block_hashes, token_ids

MODEL = "tiny-llama"
BLOCKS = 48
"""KV blocks per replica: small, so the workload evicts."""
FREE_PORTS = KVEventsConfig(
    enable_kv_cache_events=True,
    publisher="zmq",
    endpoint="tcp://127.0.0.1:0",
    replay_endpoint="tcp://127.0.0.1:0",
)


def source(replica: Replica) -> KVEventSource:
    publisher = replica.kv_publisher
    assert publisher is not None
    return KVEventSource(publisher.pub_address, publisher.replay_address, "", BLOCKS)


async def caught_up(subs: KVEventSubscribers, replicas: list[Replica], within: float = 5.0) -> None:
    """Until every subscriber has applied every batch its replica published."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while True:
        done = all(
            r.kv_publisher is not None
            and subs.streams[f"r{r.index}"].next_seq == r.kv_publisher.seq
            for r in replicas
        )
        if done:
            return
        assert loop.time() < deadline, {
            k: (s.next_seq, s.counters) for k, s in subs.streams.items()
        }
        await asyncio.sleep(0.01)


@pytest.fixture
async def pool(sim_cluster: Any) -> SimCluster:
    profile = replace(get_profile("tiny"), num_gpu_blocks=BLOCKS)
    cluster: SimCluster = await sim_cluster(
        replicas=2, profile=profile, time_scale=0.02, kv_events=FREE_PORTS
    )
    return cluster


@pytest.fixture
async def subscribers(pool: SimCluster) -> AsyncIterator[KVEventSubscribers]:
    subs = KVEventSubscribers(PreciseIndex(default_capacity=BLOCKS))
    await subs.sync({f"r{r.index}": source(r) for r in pool.replicas})
    await subscribed(subs, pool.replicas)
    yield subs
    await subs.close()


async def subscribed(subs: KVEventSubscribers, replicas: list[Replica]) -> None:
    """Until each subscriber hears its replica. A PUB socket sends nothing to a subscriber
    whose connection is not up yet (ZeroMQ's slow joiner, as with vLLM): requests until a
    batch arrives, and the subscriber replays what it missed."""
    async with aiohttp.ClientSession() as http:
        for attempt in range(200):
            waiting = [r for r in replicas if not subs.streams[f"r{r.index}"].counters.received]
            if not waiting:
                await caught_up(subs, replicas)
                return
            for r in waiting:
                await complete(http, r, f"warm-up {attempt}")
            await asyncio.sleep(0.02)
    raise AssertionError("no subscriber heard its replica")


def prompt(prefix: int, suffix: int, prefix_tokens: int = 100) -> str:
    """A prompt of a shared ``prefix`` (``prefix_tokens`` built-in tokens) and its own tail."""
    head = f"system prompt {prefix:03d} " * (prefix_tokens * 4 // 18 + 1)
    return head[: prefix_tokens * 4] + f" question {suffix} " + "x" * (suffix % 37)


async def complete(
    http: aiohttp.ClientSession, replica: Replica, text: str, **extra: Any
) -> dict[str, Any]:
    body = {"model": MODEL, "prompt": text, "max_tokens": 20, "ignore_eos": True, **extra}
    async with http.post(replica.url + "/v1/completions", json=body) as response:
        assert response.status == 200, await response.text()
        answer: dict[str, Any] = await response.json()
        return answer


async def workload(replicas: list[Replica], requests: int = 60) -> None:
    """Requests of 8 prefixes, 4 at a time per replica: far more than 48 blocks hold."""
    async with aiohttp.ClientSession() as http:
        sem = asyncio.Semaphore(8)

        async def one(i: int) -> None:
            async with sem:
                replica = replicas[i % len(replicas)]
                salt = {"cache_salt": "tenant-a"} if i % 5 == 0 else {}
                await complete(http, replica, prompt(i % 8, i), **salt)

        await asyncio.gather(*(one(i) for i in range(requests)))


def assert_index_matches(subs: KVEventSubscribers, replica: Replica) -> None:
    key = f"r{replica.index}"
    engine_hashes = replica.engine.pool.cached_hashes()
    assert set(subs.index.entries(key)) == engine_hashes
    assert subs.view(key) is View.SYNCED


async def test_index_matches_the_engines_after_evictions(
    pool: SimCluster, subscribers: KVEventSubscribers
) -> None:
    await workload(pool.replicas)
    await caught_up(subscribers, pool.replicas)
    for replica in pool.replicas:
        assert_index_matches(subscribers, replica)
    assert subscribers.index.counters.orphans == 0
    assert subscribers.index.counters.removed > 0, "the workload should have evicted"
    # prefix lookups: the index's keys from the prompt's token ids match what each engine
    # would reuse for the same prompt (its hashes from the prompt's bytes)
    engine: Engine = pool.replicas[0].engine
    bs = engine.profile.block_size
    for p in range(8):
        data = prompt(p, 0).encode()
        keys = block_keys(token_ids(data), bs)
        matched = subscribers.index.longest_prefix(keys)
        for replica in pool.replicas:
            seq = new_sequence(
                "probe", data, arrival=0, max_tokens=1, ignore_eos=True,
                max_model_len=4096, model=MODEL,
            )  # fmt: skip
            hashes = block_hashes(data, bs, seq.hash_seed)
            held = len(replica.engine.pool.longest_cached_prefix(hashes, len(hashes)))
            assert matched.get(f"r{replica.index}", 0) == held


async def test_cache_salt_is_in_the_first_blocks_extra_keys(
    pool: SimCluster, subscribers: KVEventSubscribers
) -> None:
    replica = pool.replicas[0]
    data = prompt(1, 1)
    async with aiohttp.ClientSession() as http:
        await complete(http, replica, data, cache_salt="tenant-b")
    await caught_up(subscribers, [replica])
    bs = replica.engine.profile.block_size
    ids = token_ids(data.encode())
    salted = block_keys(ids, bs, [extra_key_bytes(("tenant-b",))])
    assert subscribers.index.longest_prefix(salted).get("r0", 0) >= len(ids) // bs - 1
    assert "r0" not in subscribers.index.longest_prefix(block_keys(ids, bs))


async def test_a_dropped_batch_is_replayed(
    pool: SimCluster, subscribers: KVEventSubscribers
) -> None:
    replica = pool.replicas[0]
    async with aiohttp.ClientSession() as http:
        await complete(http, replica, prompt(0, 0))  # the subscriber is in step
        await caught_up(subscribers, [replica])
        replica.faults.update({"kv_events_drop_rate": 1.0})
        await complete(http, replica, prompt(1, 1))
        publisher = replica.kv_publisher
        assert publisher is not None
        assert publisher.dropped > 0
        replica.faults.update({"kv_events_drop_rate": 0.0})
        await complete(http, replica, prompt(2, 2))  # shows the gap
    await caught_up(subscribers, [replica])
    stream = subscribers.streams["r0"]
    assert stream.counters.gaps >= 1
    assert stream.counters.replays >= 1
    assert stream.counters.replay_failures == 0
    assert_index_matches(subscribers, replica)


async def test_reordered_batches_still_end_in_the_engines_state(
    pool: SimCluster, subscribers: KVEventSubscribers
) -> None:
    replica = pool.replicas[0]
    replica.faults.update({"kv_events_reorder_rate": 0.5})
    await workload([replica], requests=20)
    replica.faults.update({"kv_events_reorder_rate": 0.0})
    async with aiohttp.ClientSession() as http:
        await complete(http, replica, prompt(3, 99))  # flushes a held batch
    await caught_up(subscribers, [replica])
    publisher = replica.kv_publisher
    assert publisher is not None
    assert publisher.reordered > 0
    # an early batch shows a gap (replayed); the late one then looks like a restart, and
    # the subscriber rebuilds from the replay buffer, which still reaches back to seq 0
    stream = subscribers.streams["r0"]
    assert stream.counters.gaps >= 1
    assert stream.counters.replay_failures == 0
    assert_index_matches(subscribers, replica)


async def test_reset_prefix_cache_clears_the_index(
    pool: SimCluster, subscribers: KVEventSubscribers
) -> None:
    replica = pool.replicas[1]
    async with aiohttp.ClientSession() as http:
        await complete(http, replica, prompt(4, 4))
        await caught_up(subscribers, [replica])
        assert subscribers.index.size("r1") > 0
        async with http.post(replica.url + "/reset_prefix_cache") as response:
            assert response.status == 200
    await caught_up(subscribers, [replica])
    assert subscribers.index.size("r1") == 0
    assert replica.engine.pool.cached_hashes() == set()


async def test_a_restarted_replica_counts_from_zero_on_the_same_ports(
    pool: SimCluster, subscribers: KVEventSubscribers
) -> None:
    """The subscriber tells a restart by the sequence going back, so the old run must have
    published more batches than the new one has when the SUB socket reconnects (ZeroMQ
    retries every 100 ms): a long first run, then requests one at a time."""
    replica = pool.replicas[0]
    await workload([replica], requests=40)
    await caught_up(subscribers, [replica])
    before = source(replica)
    await replica.restart()
    assert source(replica) == before  # same addresses: the subscriber reconnects by itself
    stream = subscribers.streams["r0"]
    async with aiohttp.ClientSession() as http:
        for i in range(200):
            if stream.counters.restarts:
                break
            await complete(http, replica, prompt(5, 100 + i))
            await asyncio.sleep(0.05)
    assert stream.counters.restarts == 1
    await caught_up(subscribers, [replica])
    assert_index_matches(subscribers, replica)


async def test_replay_socket_answers_as_vllm(pool: SimCluster) -> None:
    """A DEALER asking from seq 1 gets every buffered batch from 1 on, then (-1, b"")."""
    replica = pool.replicas[0]
    publisher = replica.kv_publisher
    assert publisher is not None
    assert publisher.replay_address is not None
    async with aiohttp.ClientSession() as http:
        for i in range(3):
            await complete(http, replica, prompt(i, i))
    ctx = zmq.asyncio.Context()
    dealer = ctx.socket(zmq.DEALER)
    dealer.setsockopt(zmq.LINGER, 0)
    try:
        dealer.connect(publisher.replay_address)
        await dealer.send_multipart([b"", (1).to_bytes(8, "big")])
        got: list[int] = []
        async with asyncio.timeout(5):
            while True:
                # vLLM 0.32's answer: (b"", topic, seq, payload); end (b"", b"", -1, b"")
                empty, topic, seq_frame, payload = await dealer.recv_multipart()
                assert empty == b""
                seq = int.from_bytes(seq_frame, "big", signed=True)
                if seq == -1:
                    assert (topic, payload) == (b"", b"")
                    break
                assert topic == publisher.topic
                decode_batch(payload)
                got.append(seq)
        assert got == list(range(1, publisher.seq))
    finally:
        dealer.close(linger=0)
        ctx.term()


async def test_the_replay_buffer_keeps_buffer_steps_batches() -> None:
    config = replace(FREE_PORTS, buffer_steps=5)
    publisher = KVEventPublisher(config, 0, Faults())
    try:
        for i in range(12):
            publisher.publish([WireStoredMap([i], None, [1] * 4, 4)])
        assert [seq for seq, _ in publisher.buffer] == list(range(7, 12))
    finally:
        await publisher.close()


def test_payload_is_vllm_0_32s_layout() -> None:
    log = KVEventLog()
    log.stored([11, 12], None, list(range(8)), 4, "adapter", [["adapter"], ["adapter"]])
    log.removed(5)
    log.removed(6)
    log.cleared()
    events = log.take()
    assert log.events == []
    assert len(events) == 4  # one BlockRemoved per evicted block, as vLLM sends them
    publisher_payload = _encode(events)
    batch = decode_batch(publisher_payload)
    stored, removed, removed_too, cleared = batch.events
    assert isinstance(stored, BlockStored)
    assert isinstance(removed, BlockRemoved)
    assert isinstance(cleared, AllBlocksCleared)
    assert stored.block_hashes == (11, 12)
    assert stored.medium == "GPU"
    assert stored.lora_name == "adapter"
    assert isinstance(removed_too, BlockRemoved)
    assert (removed.block_hashes, removed_too.block_hashes) == ((5,), (6,))
    assert stored.group_idx == removed.group_idx == 0
    # vLLM 0.32: the batch a msgpack array (fixarray), its events maps (fixmap)
    assert publisher_payload[0] & 0xF0 == 0x90
    raw = msgspec.msgpack.decode(publisher_payload)
    assert all(isinstance(event, dict) for event in raw[1])


def _encode(events: list[Any]) -> bytes:
    from sluicegate.kv_wire import WireBatchArray

    return msgspec.msgpack.encode(WireBatchArray(time.time(), events, 0))


@pytest.mark.parametrize(
    ("endpoint", "index", "expected"),
    [
        ("tcp://*:5557", 0, "tcp://*:5557"),
        ("tcp://*:5557", 3, "tcp://*:5560"),
        ("tcp://127.0.0.1:0", 2, "tcp://127.0.0.1:0"),
        ("ipc:///tmp/kv", 1, "ipc:///tmp/kv_dp1"),
    ],
)
def test_replica_endpoints_offset_the_port(endpoint: str, index: int, expected: str) -> None:
    assert replica_endpoint(endpoint, index) == expected


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[]", "a JSON object"),
        ("{nope", "not JSON"),
        ('{"enable_kv_cache_events": "yes"}', "true or false"),
        ('{"enable_kv_cache_events": true, "publisher": "nats"}', "publisher must be"),
        ('{"enable_kv_cache_events": true, "buffer_steps": 0}', "buffer_steps must be"),
        ('{"enable_kv_cache_events": true, "endpoint": "tcp://host"}', "needs host:port"),
        ('{"enable_kv_cache_events": true, "endpont": "tcp://*:1"}', "unknown kv-events field"),
    ],
)
def test_bad_configs_are_refused(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        KVEventsConfig.parse(text)


async def test_kv_event_faults_are_set_and_checked_over_http(pool: SimCluster) -> None:
    replica = pool.replicas[0]
    async with aiohttp.ClientSession() as http:
        url = replica.url + "/admin/faults"
        async with http.post(url, json={"kv_events_reorder_rate": 0.25}) as response:
            assert response.status == 200
            assert (await response.json())["kv_events_reorder_rate"] == 0.25
        async with http.post(url, json={"kv_events_drop_rate": 2}) as response:
            assert response.status == 400
            assert "kv_events_drop_rate" in await response.text()
    assert replica.faults.kv_events_drop_rate == 0.0


def test_config_defaults_as_vllms() -> None:
    on = KVEventsConfig.parse('{"enable_kv_cache_events": true}')
    assert on.active
    assert on.publisher == "zmq"
    assert on.endpoint == "tcp://*:5557"
    assert on.replay_endpoint is None
    assert on.buffer_steps == 10_000
    assert on.hwm == 100_000
    assert not KVEventsConfig.parse("{}").active


async def test_every_published_batch_arrives_with_the_blocks_the_engine_stored() -> None:
    """A short churn that evicts, published on a real PUB socket: the subscriber gets
    every batch in order (seq 0, 1, …), as many as the engine's steps that changed the
    cache, and their BlockStored events carry exactly the blocks the churn counted.
    (The cost of events: ``sluicegate bench micro sim-kv-events``.)"""
    engine = Engine(replace(get_profile("tiny"), num_gpu_blocks=64))
    engine.log_kv_events(KVEventLog())
    publisher = KVEventPublisher(FREE_PORTS, 0, Faults())
    ctx = zmq.Context()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.RCVHWM, 0)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.connect(publisher.pub_address)
    try:
        # ZeroMQ's slow joiner: publish empty batches until one arrives, then drain
        for _ in range(500):
            publisher.publish([])
            if sub.poll(10):
                break
        else:
            raise AssertionError("the subscriber never connected")
        while sub.poll(50):
            sub.recv_multipart()
        warm = publisher.seq
        result = churn(engine, publisher, 24)
        assert result.batches == publisher.seq - warm > 0
        assert publisher.sent == publisher.seq  # no fault: every batch was sent
        seqs, stored, removed = [], 0, 0
        while sub.poll(1000):
            _topic, seq, payload = sub.recv_multipart()
            seqs.append(int.from_bytes(seq, "big"))
            for event in decode_batch(payload).events:
                if isinstance(event, BlockStored):
                    stored += len(event.block_hashes)
                elif isinstance(event, BlockRemoved):
                    removed += len(event.block_hashes)
            if len(seqs) == result.batches:
                break
        assert seqs == list(range(warm, publisher.seq))
        assert stored == result.stored_blocks > 64  # more than fit: the churn evicted
        assert removed > 0
    finally:
        sub.close(linger=0)
        ctx.term()
        await publisher.close()


async def test_adapter_blocks_carry_the_adapters_name(sim_cluster: Any) -> None:
    """Blocks computed for a LoRA adapter are keyed with its name, as vLLM's extra keys."""
    profile = replace(get_profile("tiny"), num_gpu_blocks=BLOCKS)
    cluster: SimCluster = await sim_cluster(
        replicas=1, profile=profile, time_scale=0.02, kv_events=FREE_PORTS, lora=["sql"]
    )
    replica = cluster.replicas[0]
    subs = KVEventSubscribers(PreciseIndex(default_capacity=BLOCKS))
    try:
        await subs.sync({"r0": source(replica)})
        await subscribed(subs, [replica])
        data = prompt(6, 6)
        async with aiohttp.ClientSession() as http:
            await complete(http, replica, data, model="sql")
        await caught_up(subs, [replica])
        assert_index_matches(subs, replica)
        ids = token_ids(data.encode())
        bs = replica.engine.profile.block_size
        n = len(ids) // bs
        keyed = block_keys(ids, bs, [extra_key_bytes(("sql",))] * n)
        assert subs.index.longest_prefix(keyed).get("r0", 0) == n
        assert "r0" not in subs.index.longest_prefix(block_keys(ids, bs))
    finally:
        await subs.close()
