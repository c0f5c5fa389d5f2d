"""KV-event delivery in the discrete-event lab: the precise index equals the engines'
caches when events arrive at once, lags them by exactly the configured delay otherwise,
and the ``precise-prefix`` policy routes on it."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest

from sluicegate import cli
from sluicegate.bench import sharegpt
from sluicegate.bench.des import ClusterSimulation
from sluicegate.bench.des_kvevents import DEFAULT_DELAY_S, KVEventDelivery
from sluicegate.bench.des_sharing import ReplicaSettings
from sluicegate.bench.des_spec import ClusterSpec
from sluicegate.bench.policies import policy_config
from sluicegate.bench.workloads import OpenLoop, Sessions, random_text, shared_prefix
from sluicegate.builtins import default_registry
from sluicegate.clock import ManualClock
from sluicegate.framework import PluginContext
from sluicegate.scheduling.config import build_scheduler
from sluicegate.sim.profiles import get_profile

TINY = get_profile("tiny")
MODEL = "tiny-llama"


def simulation(policy: str, replicas: int = 3, **options: Any) -> ClusterSimulation:
    picker, predictor = policy_config(policy)
    return ClusterSimulation(
        ClusterSpec(TINY, replicas, picker, model=MODEL, predictor=predictor, **options)
    )


def workload(seed: int = 0, rate: float = 40.0, duration: float = 6.0) -> OpenLoop:
    # 40 groups × 600-token prefixes (1,500 blocks) on 3 × 512-block caches: evictions
    return OpenLoop(rate, duration, shared_prefix(MODEL, 40, 5, 600, 100, 30, seed), seed)


def assert_mirrors(delivery: KVEventDelivery, name: str, held: set[int]) -> None:
    """The index holds exactly the engine's cached blocks — except those it could not key
    because their parent was gone (``orphans``): the simulator keeps one copy per hash, so
    when another request's copy of a parent is evicted, a running sequence may still
    register the parent's child. No prefix lookup reaches such a block on the engine
    either (its parent is not cached)."""
    got = set(delivery.index.entries(name))
    assert got <= held
    assert len(held - got) <= delivery.index.counters.orphans


def test_events_on_only_for_the_precise_producer() -> None:
    assert simulation("precise-prefix").kv_events is not None
    assert simulation("default").kv_events is None
    assert simulation("default", kv_events=True).kv_events is not None
    assert simulation("precise-prefix", kv_events=False).kv_events is None


def test_without_delay_the_index_equals_the_caches_after_a_run() -> None:
    sim = simulation("precise-prefix", kv_event_delay_s=0.0)
    sim.run(workload(), horizon_s=60.0)
    delivery = sim.kv_events
    assert delivery is not None
    assert delivery.index.counters.removed > 0  # the run evicted blocks, events said so
    assert delivery.index.counters.evictions == 0
    for name, engine in zip(delivery.names, sim.engines, strict=True):
        held = engine.pool.cached_hashes()
        assert held  # something to compare
        assert_mirrors(delivery, name, held)


@pytest.mark.parametrize("delay", [0.0, 0.003, 0.05])
def test_the_index_lags_the_caches_by_exactly_the_delay(
    delay: float, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each batch is applied ``delay`` after the end of the step that logged it, and once
    applied the index holds exactly what that engine's cache held at that step's end."""
    sim = simulation("precise-prefix", kv_event_delay_s=delay)
    delivery = sim.kv_events
    assert delivery is not None
    published: dict[tuple[int, bytes], tuple[float, set[int]]] = {}
    take, deliver = KVEventDelivery.take, KVEventDelivery.deliver
    checked = 0

    def recording_take(self: KVEventDelivery, engine: int, at: float) -> bytes | None:
        payload = take(self, engine, at)
        if payload is not None:
            published[engine, payload] = (at, sim.engines[engine].pool.cached_hashes())
        return payload

    def checking_deliver(self: KVEventDelivery, engine: int, payload: bytes) -> None:
        nonlocal checked
        at, held = published.pop((engine, payload))
        assert sim.clock.now() == pytest.approx(at + delay, abs=1e-12)
        deliver(self, engine, payload)
        assert_mirrors(self, self.names[engine], held)
        checked += 1

    monkeypatch.setattr(KVEventDelivery, "take", recording_take)
    monkeypatch.setattr(KVEventDelivery, "deliver", checking_deliver)
    sim.run(workload(), horizon_s=60.0)
    assert checked > 50
    assert not published  # every batch was delivered


def test_a_delayed_index_misses_what_the_engines_just_stored() -> None:
    """With a long delay, requests see less of the servers' caches than with none."""
    hits = {}
    for delay in (0.0, 0.5):
        sim = simulation("precise-prefix", kv_event_delay_s=delay)
        sim.run(workload(), horizon_s=60.0)
        assert sim.kv_events is not None
        lookups = sim.kv_events.service.lookups
        hits[delay] = lookups.hit_blocks / (lookups.hit_blocks + lookups.miss_blocks)
    assert hits[0.5] < hits[0.0]


def test_precise_routing_finds_more_cached_prefix_than_random() -> None:
    rates = {}
    for policy in ("random", "precise-prefix"):
        sim = simulation(policy)
        result = sim.run(workload(), horizon_s=60.0)
        queried = sum(e.counters.prefix_cache_queries for e in result.engines)
        rates[policy] = sum(e.counters.prefix_cache_hits for e in result.engines) / queried
    assert rates["precise-prefix"] > rates["random"] + 0.1


def chats(seed: int = 0) -> Sessions:
    """60 four-turn chats (distinct texts, so only a conversation's own history is shared)
    on the chat route: each turn's prompt is the history and the replies generated."""
    rng = random.Random(seed)
    convs = []
    for c in range(60):
        texts: list[str] = []
        for _ in range(4):
            texts += [random_text(rng, rng.randint(40, 160)), "a" * 4 * rng.randint(20, 80)]
        convs.append(sharegpt.Conversation(f"c{c}", ("user", "assistant") * 4, tuple(texts)))
    return Sessions(convs, 8.0, 5.0, MODEL, think_s=0.5, seed=seed)


def test_precise_routing_matches_chat_requests() -> None:
    """Chat requests are keyed by the tokens the simulator renders and publishes for them
    (not the serialised messages): follow-up turns find their history in the index, and
    precise routing keeps conversations where their cache is."""
    rates = {}
    for policy in ("round-robin", "precise-prefix"):
        sim = simulation(policy)
        result = sim.run(chats(), horizon_s=120.0)
        assert all(r.completed for r in result.records)
        queried = sum(e.counters.prefix_cache_queries for e in result.engines)
        rates[policy] = sum(e.counters.prefix_cache_hits for e in result.engines) / queried
        if policy == "precise-prefix":
            assert sim.kv_events is not None
            lookups = sim.kv_events.service.lookups
            assert lookups.requests >= 100
            assert lookups.fallbacks == 0
            assert lookups.hit_blocks > 0.3 * (lookups.hit_blocks + lookups.miss_blocks)
    assert rates["precise-prefix"] > rates["round-robin"] + 0.2


def test_negative_delay_is_refused() -> None:
    with pytest.raises(ValueError, match="delay"):
        simulation("precise-prefix", kv_event_delay_s=-0.001)


def test_default_delay_is_a_few_milliseconds() -> None:
    assert 0.001 <= DEFAULT_DELAY_S <= 0.02
    assert ClusterSpec(TINY, 1, policy_config("default")[0]).kv_event_delay_s == DEFAULT_DELAY_S


def test_predicted_latency_precise_reads_the_precise_index() -> None:
    """The latency features' prefix share comes from the precise producer: it answers every
    decision from the index (no fallback) and no approximate producer is added."""
    picker, predictor = policy_config("predicted-latency-precise")
    assert predictor == "model"
    built = build_scheduler(picker, PluginContext(ManualClock()), default_registry())
    types = {type(p).type_name for p in built.plugins.values()}
    assert "precise-prefix-cache-producer" in types
    assert "approx-prefix-cache-producer" not in types
    sim = simulation("predicted-latency-precise")
    sim.run(workload(duration=3.0), horizon_s=30.0)
    assert sim.kv_events is not None
    lookups = sim.kv_events.service.lookups
    assert lookups.requests > 50
    assert lookups.fallbacks == 0
    assert lookups.hit_blocks > 0


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--kv-event-delay-ms", "-1"], "--kv-event-delay-ms must be 0"),
        (["--kv-event-delay-ms", "5", "--mode", "http"], "applies to --mode des only"),
    ],
)
def test_cli_refuses_a_bad_kv_event_delay(
    args: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        cli.main(["bench", "run", "cache-pressure", "--quick", *args, "--out", str(tmp_path)])
    assert exited.value.code == 2
    assert message in capsys.readouterr().err


def test_cli_delay_reaches_the_results(tmp_path: Path) -> None:
    out = tmp_path / "out"
    with pytest.raises(SystemExit) as exited:
        cli.main(
            [
                "bench",
                "run",
                "cache-pressure",
                "--quick",
                "--policies",
                "precise-prefix",
                "--kv-event-delay-ms",
                "12",
                "--out",
                str(out),
            ]
        )
    assert exited.value.code == 0
    results = json.loads((out / "results.json").read_text())
    assert results["kv_event_delay_s"] == pytest.approx(0.012)
    assert all(run["kv_events"] for run in results["runs"])
    assert "12 ms after the step ends" in (out / "report.md").read_text()


def test_every_gateway_replica_subscribes_to_every_engine() -> None:
    """With several gateway replicas each has its own index, fed every engine's batches:
    after a run each mirrors the engines' caches (independent replicas share no index
    object)."""
    sim = simulation(
        "precise-prefix", kv_event_delay_s=0.0, gateways=ReplicaSettings(3, "independent")
    )
    sim.run(workload(), horizon_s=60.0)
    delivery = sim.kv_events
    assert delivery is not None
    assert len(delivery.views) == 3
    assert len({id(v.index) for v in delivery.views}) == 3
    published = sum(delivery.seq)
    for view in delivery.views:
        decoded = sum(s.counters.decoded for s in view.subscribers.streams.values())
        assert decoded == published > 0
        for name, engine in zip(delivery.names, sim.engines, strict=True):
            held = engine.pool.cached_hashes()
            got = set(view.index.entries(name))
            assert got <= held
            assert len(held - got) <= view.index.counters.orphans
