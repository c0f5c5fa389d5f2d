"""The discrete-event cluster simulation on the ``tiny`` profile: determinism, accounting,
routing behaviour of the presets, scrapes, the horizon, rejections, hooks and sessions."""

from __future__ import annotations

import collections
import dataclasses
import itertools
import random
import statistics
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest

from sluicegate.bench import sharegpt
from sluicegate.bench.des import ClusterSimulation
from sluicegate.bench.des_spec import ClusterSpec, RequestRecord, RunResult
from sluicegate.bench.metrics import ideal_prefix_hit_rate, summarize
from sluicegate.bench.policies import available_policies, client_connections, policy_config
from sluicegate.bench.runner import run_entry, run_level
from sluicegate.bench.scenarios import OBJECTIVES, get_scenario
from sluicegate.bench.workloads import (
    OpenLoop,
    PriorityClass,
    RequestSpec,
    Sessions,
    Timed,
    random_text,
    shared_prefix,
    with_classes,
)
from sluicegate.datalayer.endpoint import Endpoint, Hardware
from sluicegate.errors import shed
from sluicegate.framework import LLMRequest
from sluicegate.requestcontrol.dispatch import Dispatch
from sluicegate.scheduling.config import load_preset
from sluicegate.sim.profiles import LinearOpsCurve, get_profile

TINY = get_profile("tiny")
MODEL = "tiny-llama"
BLOCK = TINY.block_size


def simulation(policy: str, replicas: int = 3, seed: int = 0, **options: Any) -> ClusterSimulation:
    picker, predictor = policy_config(policy)
    options.setdefault("predictor", predictor)
    options.setdefault("connections", client_connections(policy))
    return ClusterSimulation(ClusterSpec(TINY, replicas, picker, model=MODEL, seed=seed, **options))


def mixed(i: int, rng: random.Random) -> RequestSpec:
    """Varied prompt and output lengths, some sharing a prefix."""
    head = "shared system prompt " * 8 if rng.random() < 0.5 else ""
    return RequestSpec(
        "completions",
        MODEL,
        rng.randint(1, 120),
        prompt=head + f"{i}: " + random_text(rng, rng.randint(4, 400)),
    )


@dataclass
class Scripted:
    """Fixed arrivals, no follow-ups."""

    arrivals: list[Timed]

    def initial(self) -> Iterator[Timed]:
        yield from self.arrivals

    def follow_up(self, spec: RequestSpec, now: float, reply: str) -> list[Timed]:
        return []


def burst(times: Sequence[float], per_burst: int, seed: int) -> Scripted:
    rng = random.Random(seed)
    arrivals: list[Timed] = []
    for t in times:
        for _ in range(per_burst):
            k = len(arrivals)
            prompt = f"{k} " + random_text(rng, rng.randint(32, 600))
            arrivals.append((t, RequestSpec("completions", MODEL, rng.randint(16, 256), prompt)))
    return Scripted(arrivals)


def signature(result: RunResult) -> list[tuple[Any, ...]]:
    return [
        (
            r.arrival,
            r.endpoint,
            r.first_token,
            r.finish,
            r.output_tokens,
            r.prompt_tokens,
            r.cached_tokens,
            r.status,
            r.reply,
        )
        for r in result.records
    ]


def assert_drained(sim: ClusterSimulation, result: RunResult) -> None:
    """Nothing left anywhere: gateway counters at zero, engines idle, KV blocks free."""
    for endpoint in sim.endpoints:
        inflight = endpoint.inflight
        assert (inflight.requests, inflight.prompt_tokens, inflight.decode_tokens) == (0, 0, 0)
    for engine in result.engines:
        assert not engine.has_work()
        assert engine.pool.referenced_blocks() == 0


# --------------------------------------------------------------------------- determinism


@pytest.mark.parametrize("policy", ["default", "random"])
def test_same_seed_same_run(policy: str) -> None:
    def run(seed: int) -> tuple[list[tuple[Any, ...]], list[Any]]:
        sim = simulation(policy, seed=seed)
        result = sim.run(OpenLoop(60.0, 1.5, mixed, seed=seed), horizon_s=60.0)
        counters = [e.counters for e in result.engines]
        return signature(result), counters

    first, second = run(4), run(4)
    assert first == second
    assert len(first[0]) > 50
    other = run(5)
    assert other[0] != first[0]


def test_random_policy_seed_changes_only_routing() -> None:
    """With the request stream held fixed, the cluster's seed alone (the scheduler's RNG)
    changes where ``random`` sends requests."""
    workload = [(t, s) for t, s in OpenLoop(40.0, 1.0, mixed, seed=1).initial()]
    a = simulation("random", seed=1).run(Scripted(list(workload)), 60.0)
    b = simulation("random", seed=2).run(Scripted(list(workload)), 60.0)
    assert [r.arrival for r in a.records] == [r.arrival for r in b.records]
    assert [r.endpoint for r in a.records] != [r.endpoint for r in b.records]


# --------------------------------------------------------------------------- accounting


@pytest.mark.parametrize("policy", available_policies())
def test_every_request_completes_and_counters_return_to_zero(policy: str) -> None:
    sim = simulation(policy, replicas=3)
    result = sim.run(OpenLoop(80.0, 1.5, mixed, seed=2), horizon_s=120.0)
    records = result.records
    assert len(records) > 80
    assert all(r.status == 200 and r.completed for r in records), collections.Counter(
        (r.status, r.reason) for r in records
    )
    for r in records:
        assert 0 <= r.endpoint < 3
        assert r.arrival < r.first_token <= r.finish <= result.end_time
        assert r.output_tokens == r.spec.max_tokens  # ignore_eos: exactly max_tokens
        assert 0 <= r.cached_tokens < r.prompt_tokens
    assert sum(e.counters.generation_tokens for e in result.engines) == sum(
        r.output_tokens for r in records
    )
    assert_drained(sim, result)
    assert not sim._inflight


def test_shed_requests_are_recorded_and_release_nothing() -> None:
    """A request the gateway sheds is a 429 record; everything else completes."""

    class ShedSheddable:
        def admit(self, request: LLMRequest, state: Any, candidates: Sequence[Endpoint]) -> None:
            if request.sheddable:
                raise shed("test: sheddable requests are shed")

    sim = ClusterSimulation(
        ClusterSpec(TINY, 2, load_preset("default"), model=MODEL, extra_docs=list(OBJECTIVES))
    )
    sim.director.admitters = [ShedSheddable()]
    classes = (
        PriorityClass("keep", 2.0, objective="standard"),
        PriorityClass("drop", 1.0, objective="batch"),
    )
    result = sim.run(OpenLoop(50.0, 1.0, with_classes(mixed, classes), seed=3), 60.0)
    by = collections.defaultdict(list)
    for r in result.records:
        by[r.spec.klass].append(r)
    assert by["drop"]
    assert all(r.status == 429 and r.endpoint == -1 for r in by["drop"])
    assert by["keep"]
    assert all(r.completed for r in by["keep"])
    m = summarize(result.records)
    assert (m["shed"], m["completed"], m["failed"], m["incomplete"]) == (
        len(by["drop"]),
        len(by["keep"]),
        0,
        0,
    )
    assert_drained(sim, result)


def test_round_robin_spreads_evenly() -> None:
    sim = simulation("round-robin", replicas=4)
    result = sim.run(OpenLoop(40.0, 2.0, mixed, seed=6), 60.0)
    endpoints = [r.endpoint for r in sorted(result.records, key=lambda r: r.arrival)]
    counts = collections.Counter(endpoints)
    assert set(counts) == {0, 1, 2, 3}
    assert max(counts.values()) - min(counts.values()) <= 1
    # Every endpoint in turn.
    start = endpoints[0]
    assert endpoints == [(start + i) % 4 for i in range(len(endpoints))]


# --------------------------------------------------------------------------- prefix affinity


def _group_shares(result: RunResult) -> tuple[float, float]:
    """(share of requests on their group's most used replica, engine prefix hit rate)."""
    groups: dict[str, collections.Counter[int]] = collections.defaultdict(collections.Counter)
    for r in result.records:
        groups[r.spec.prompt.split("\n")[0]][r.endpoint] += 1
    share = sum(max(c.values()) for c in groups.values()) / len(result.records)
    queries = sum(e.counters.prefix_cache_queries for e in result.engines)
    hits = sum(e.counters.prefix_cache_hits for e in result.engines)
    return share, hits / queries


def test_default_keeps_shared_prefixes_on_one_replica() -> None:
    def run(policy: str) -> tuple[RunResult, float, float]:
        make = shared_prefix(
            MODEL, 4, 8, system_tokens=256, question_tokens=32, output_tokens=16, seed=1
        )
        result = simulation(policy, replicas=4).run(OpenLoop(20.0, 5.0, make, seed=2), 60.0)
        return (result, *_group_shares(result))

    result, share, hit_rate = run("default")
    assert all(r.completed for r in result.records)
    assert share >= 0.9
    assert hit_rate > 0.8
    assert summarize(result.records)["prefix_hit_rate"] > 0.8
    assert sum(e.counters.prefix_cache_hits for e in result.engines) > 0
    _, rr_share, rr_hit_rate = run("round-robin")
    assert rr_share < 0.7
    assert hit_rate > rr_hit_rate + 0.1


# --------------------------------------------------------------------------- scrapes


def test_scrapes_follow_the_interval() -> None:
    interval, replicas = 0.1, 3
    sim = simulation("default", replicas=replicas, scrape_interval_s=interval)
    scrapes: dict[int, list[float]] = collections.defaultdict(list)
    real_scrape = sim._scrape

    def spy(index: int, now: float) -> None:
        scrapes[index].append(now)
        real_scrape(index, now)

    sim._scrape = spy  # type: ignore[method-assign]
    ages: list[float] = []

    def on_complete(record: RequestRecord, dispatch: Dispatch) -> None:
        for endpoint in sim.endpoints:
            assert endpoint.metrics is not None
            ages.append(record.finish - endpoint.metrics.scraped_at)

    sim.on_complete.append(on_complete)
    result = sim.run(OpenLoop(10.0, 2.0, mixed, seed=1), 60.0)
    last_finish = max(r.finish for r in result.records)
    for i in range(replicas):
        times = scrapes[i]
        assert times[0] == 0.0
        # Phases staggered over one interval, then one scrape per interval.
        assert times[1] == pytest.approx(interval * (i + 1) / replicas)
        gaps = [b - a for a, b in itertools.pairwise(times[1:])]
        assert gaps == pytest.approx([interval] * len(gaps))
        assert times[-1] == pytest.approx(sim.endpoints[i].metrics.scraped_at)  # type: ignore[union-attr]
        # Scraping covers the run and stops once the pool is idle.
        assert last_finish - interval <= times[-1] <= last_finish + interval + 1e-9
    assert ages
    assert max(ages) <= interval + 1e-9


def test_stale_scrapes_change_default_routing_of_bursts() -> None:
    """With metrics scraped rarely, `default` sees the pool as it was and spreads bursts
    worse than with fresh metrics (its own in-flight counts only partly make up for it)."""

    def run(interval: float, seed: int) -> RunResult:
        sim = simulation("default", replicas=4, scrape_interval_s=interval, staleness_s=10.0)
        return sim.run(burst([0.0, 0.3, 0.6, 0.9, 1.2, 1.5], 24, seed), 120.0)

    def spread(result: RunResult) -> int:
        counts = collections.Counter(r.endpoint for r in result.records)
        return max(counts.values()) - min(counts.values())

    for seed in range(3):
        fresh, stale = run(0.01, seed), run(2.0, seed)
        assert all(r.completed for r in fresh.records + stale.records)
        assert [r.endpoint for r in fresh.records] != [r.endpoint for r in stale.records]
        assert spread(stale) > spread(fresh)


# --------------------------------------------------------------------------- horizon, errors


def test_horizon_cut_leaves_requests_incomplete() -> None:
    def make(i: int, rng: random.Random) -> RequestSpec:
        return RequestSpec("completions", MODEL, 600, prompt=random_text(rng, 64))

    sim = simulation("least-request", replicas=2)
    result = sim.run(OpenLoop(20.0, 3.0, make, seed=1), horizon_s=1.0)
    assert result.end_time == pytest.approx(1.0)
    records = result.records
    assert records
    assert all(r.arrival <= 1.0 for r in records)
    unfinished = [r for r in records if r.status == 0]
    assert unfinished
    for r in unfinished:
        assert not r.completed
        assert r.finish == -1.0
        assert 0 <= r.endpoint < 2
    assert all(r.finish <= 1.0 for r in records if r.completed)
    m = summarize(records)
    assert m["incomplete"] == len(unfinished)
    assert m["failed"] == 0
    assert m["completed"] + m["incomplete"] == len(records)


def test_too_long_request_is_a_400_record_not_a_crash() -> None:
    sim = simulation("default", replicas=2)
    rng = random.Random(0)
    ok = RequestSpec("completions", MODEL, 8, prompt=random_text(rng, 100))
    too_long = RequestSpec("completions", MODEL, 200, prompt=random_text(rng, 4000))
    unknown = RequestSpec("completions", "no-such-model", 8, prompt="hello")
    empty = RequestSpec("completions", MODEL, 8, prompt="")
    result = sim.run(
        Scripted([(0.0, ok), (0.01, too_long), (0.02, unknown), (0.03, empty), (0.04, ok)]),
        60.0,
    )
    statuses = [(r.status, r.reason) for r in result.records]
    assert statuses[0] == (200, "")
    assert statuses[1] == (400, "engine-rejected")
    assert statuses[2][0] == 404
    assert statuses[3] == (400, "engine-rejected")
    assert statuses[4] == (200, "")
    assert all(r.endpoint == -1 for r in result.records[1:4])
    m = summarize(result.records)
    assert (m["completed"], m["failed"], m["shed"], m["incomplete"]) == (2, 3, 0, 0)
    assert_drained(sim, result)


def test_on_complete_hooks_fire_once_per_completed_request() -> None:
    sim = simulation("default", replicas=2)
    calls: collections.Counter[int] = collections.Counter()
    seen: list[tuple[RequestRecord, Dispatch]] = []

    def hook(record: RequestRecord, dispatch: Dispatch) -> None:
        calls[id(record)] += 1
        seen.append((record, dispatch))
        assert record.completed
        assert dispatch.finished_at == record.finish
        assert dispatch.first_byte_at == record.first_token
        assert sim.endpoints[record.endpoint] is dispatch.endpoint

    second: list[RequestRecord] = []
    sim.on_complete.append(hook)
    sim.on_complete.append(lambda record, dispatch: second.append(record))
    rng = random.Random(1)
    rejected = RequestSpec("completions", MODEL, 100, prompt=random_text(rng, 4050))
    workload = [(t, s) for t, s in OpenLoop(40.0, 1.0, mixed, seed=7).initial()]
    result = sim.run(Scripted([*workload, (0.5, rejected)]), 60.0)
    completed = [r for r in result.records if r.completed]
    assert len(completed) == len(result.records) - 1
    assert set(calls) == {id(r) for r in completed}
    assert set(calls.values()) == {1}
    assert [r for r, _ in seen] == second
    # Hooks run in completion order.
    assert [r.finish for r, _ in seen] == sorted(r.finish for r, _ in seen)


# --------------------------------------------------------------------------- sessions


def _conversations(n: int, turns: int, seed: int) -> list[sharegpt.Conversation]:
    rng = random.Random(seed)
    out = []
    for c in range(n):
        texts: list[str] = []
        for _ in range(turns):
            texts += [random_text(rng, rng.randint(20, 120)), "a" * 4 * rng.randint(10, 60)]
        out.append(sharegpt.Conversation(f"c{c}", ("user", "assistant") * turns, tuple(texts)))
    return out


@dataclass
class _Turns:
    records: dict[tuple[int, int], RequestRecord] = field(default_factory=dict)

    def follow_ups(self) -> list[tuple[RequestRecord, RequestRecord]]:
        return [
            (self.records[(s, t - 1)], r) for (s, t), r in sorted(self.records.items()) if t > 0
        ]


def _run_sessions(policy: str) -> tuple[RunResult, _Turns]:
    # More conversations than sessions: a conversation replayed twice would hit the cache
    # of its first replay (same prompts, same generated replies).
    convs = _conversations(40, 4, seed=0)
    sim = simulation(policy, replicas=3)
    result = sim.run(Sessions(convs, 4.0, 3.0, MODEL, think_s=0.5, seed=1), 120.0)
    turns = _Turns({(r.spec.session, r.spec.turn): r for r in result.records})
    assert max(s for s, _ in turns.records) < len(convs)
    return result, turns


def test_sessions_hit_the_cache_for_previous_turns() -> None:
    result, turns = _run_sessions("default")
    assert all(r.completed for r in result.records)
    pairs = turns.follow_ups()
    assert len(pairs) >= 20
    # `default` keeps a conversation on its replica (load may move one now and then).
    stayed = [(prev, cur) for prev, cur in pairs if cur.endpoint == prev.endpoint]
    assert len(stayed) >= 0.9 * len(pairs)
    for prev, cur in pairs:
        # The history sent is the previous request plus the reply actually generated.
        assert cur.spec.messages[:-1] == [
            *prev.spec.messages,
            {"role": "assistant", "content": prev.reply},
        ]
        assert len(prev.reply.encode()) == 4 * prev.output_tokens
        assert cur.arrival == pytest.approx(prev.finish + 0.5)
        # Its rendered prompt extends the previous prompt and reply.
        assert cur.prompt_bytes.startswith(prev.prompt_bytes + prev.reply.encode())
    for prev, cur in stayed:
        # Every full block the previous turn computed (all but its last sampled token) is
        # a hit on the replica that computed it.
        assert cur.cached_tokens == (prev.prompt_tokens + prev.output_tokens - 1) // BLOCK * BLOCK
    engines = result.engines
    hits = sum(e.counters.prefix_cache_hits for e in engines)
    queries = sum(e.counters.prefix_cache_queries for e in engines)
    assert hits > 0
    ideal = ideal_prefix_hit_rate(
        (r.prompt_bytes, r.reply.encode()) for r in sorted(result.records, key=lambda r: r.arrival)
    )
    assert hits / queries >= 0.9 * ideal


def test_sessions_round_robin_loses_the_cache() -> None:
    default, _ = _run_sessions("default")
    rr, turns = _run_sessions("round-robin")
    moved = [cur for prev, cur in turns.follow_ups() if cur.endpoint != prev.endpoint]
    assert moved
    rr_rate = summarize(rr.records)["prefix_hit_rate"]
    assert rr_rate < summarize(default.records)["prefix_hit_rate"]


# --------------------------------------------------------------------------- mixed pools


def test_a_mixed_pool_runs_each_replica_on_its_profile_with_its_hardware() -> None:
    slow = dataclasses.replace(
        TINY,
        name="tiny-slow",
        linear_ops=LinearOpsCurve.affine(6.0, 0.016),  # 4 × the tiny engine's step time
        accelerator="slow-gpu",
        cost_per_hour=1.0,
    )
    fast = dataclasses.replace(TINY, accelerator="fast-gpu", cost_per_hour=3.0)
    picker, _ = policy_config("round-robin")
    spec = ClusterSpec(TINY, 4, picker, profiles=(fast, slow, slow, slow), model=MODEL, seed=3)
    sim = ClusterSimulation(spec)
    assert [e.hardware for e in sim.endpoints] == [
        Hardware("fast-gpu", 3.0),
        *[Hardware("slow-gpu", 1.0)] * 3,
    ]
    result = sim.run(OpenLoop(40.0, 2.0, mixed, seed=6), 60.0)
    assert_drained(sim, result)
    assert [e.profile.name for e in result.engines] == ["tiny"] + ["tiny-slow"] * 3
    on = collections.defaultdict(list)
    for r in result.records:
        assert r.completed
        on[r.endpoint in (1, 2, 3)].append(r.e2e)
    # Round-robin sends the same share everywhere; the slow engines take longer for it.
    assert sum(on[True]) / len(on[True]) > 2 * sum(on[False]) / len(on[False])
    busy = [e.counters.busy_s for e in result.engines]
    assert all(b > 0 for b in busy)
    assert min(busy[1:]) > busy[0]
    with pytest.raises(ValueError, match="2 profiles for 4 replicas"):
        ClusterSimulation(ClusterSpec(TINY, 4, picker, profiles=(fast, slow), model=MODEL))


def test_the_servable_prefix_bounds_what_was_served() -> None:
    """Without flow control the quick ``priority-overload`` queues requests in the
    engines, where they are served blocks other requests computed after their dispatch:
    more than any engine held when they were dispatched. The servable share counts that,
    so it bounds the served one (served / servable read 337 % here when it did not)."""
    scenario = get_scenario("priority-overload").quick_variant()
    level = scenario.levels[0]
    result = run_level(scenario, "priority-isolation", level, scenario.duration_s, seed=0)
    done = [r for r in result.records if r.completed]
    gained = [r for r in done if r.cached_tokens > r.servable_tokens]
    assert gained, "no request found more cached than at its dispatch: the case is not made"
    rest = [r for r in done if r.cached_tokens <= r.servable_tokens]
    # they found it while waiting in their engine's queue
    assert statistics.median(r.first_token - r.arrival for r in gained) > statistics.median(
        r.first_token - r.arrival for r in rest
    )
    metrics = run_entry(scenario, "priority-isolation", level, result, wall_s=0.0)["metrics"]
    assert metrics["servable_prefix_hit_rate"] >= metrics["prefix_hit_rate"]
    assert 0.0 < metrics["prefix_hits_of_servable"] <= 1.0
