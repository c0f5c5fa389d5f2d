"""The ``kube-service`` baseline: the client's connections to a per-connection balancer.

The pool on its own (reuse, limit, idle timeout), then seeded DES runs: every request goes
to its connection's backend, backends are drawn uniformly per new connection, and one
connection per request is per-request random routing."""

from __future__ import annotations

import collections
import random
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from sluicegate.bench.connections import ClientConnections, ConnectionPool
from sluicegate.bench.des import ClusterSimulation
from sluicegate.bench.des_spec import ClusterSpec, RunResult
from sluicegate.bench.policies import (
    UnknownPolicyError,
    client_connections,
    is_lab_only,
    policy_config,
)
from sluicegate.bench.workloads import OpenLoop, RequestSpec, Timed, random_text
from sluicegate.sim.profiles import get_profile

TINY = get_profile("tiny")
MODEL = "tiny-llama"


def mixed(i: int, rng: random.Random) -> RequestSpec:
    return RequestSpec(
        "completions", MODEL, rng.randint(1, 120), prompt=f"{i}: " + random_text(rng, 300)
    )


@dataclass
class Scripted:
    arrivals: list[Timed]

    def initial(self) -> Iterator[Timed]:
        yield from self.arrivals

    def follow_up(self, spec: RequestSpec, now: float, reply: str) -> list[Timed]:
        return []


def assert_drained(sim: ClusterSimulation, result: RunResult) -> None:
    for endpoint in sim.endpoints:
        assert endpoint.inflight.requests == 0
    assert all(not engine.has_work() for engine in result.engines)
    assert not sim._on_connection
    assert sim._sender is None or sim._sender.waiting == 0


def kube_service(name: str, replicas: int = 3, seed: int = 0) -> ClusterSimulation:
    picker, predictor = policy_config(name)
    spec = ClusterSpec(
        TINY,
        replicas,
        picker,
        model=MODEL,
        seed=seed,
        predictor=predictor,
        connections=client_connections(name),
    )
    return ClusterSimulation(spec)


def pool_of(result: RunResult) -> ConnectionPool:
    assert result.connections is not None
    return result.connections


# --------------------------------------------------------------------------- the pool


def test_keep_alive_reuses_the_most_recently_released_connection() -> None:
    pool = ConnectionPool(ClientConnections(keep_alive=True), 4, random.Random(1))
    a, b = pool.acquire(0.0), pool.acquire(0.0)
    assert a is not None
    assert b is not None
    assert a is not b
    pool.release(a, 1.0)
    pool.release(b, 2.0)
    assert pool.acquire(2.5) is b  # LIFO, as aiohttp's connector
    assert pool.acquire(2.5) is a
    assert pool.opened == 2
    assert pool.open == 2
    assert sum(pool.requests_per_backend) == 4


def test_limit_makes_requests_wait_and_idle_timeout_closes() -> None:
    settings = ClientConnections(max_connections=2, idle_timeout_s=5.0, keep_alive=True)
    pool = ConnectionPool(settings, 3, random.Random(2))
    a, b = pool.acquire(0.0), pool.acquire(0.0)
    assert a is not None
    assert b is not None
    assert pool.acquire(0.0) is None  # both busy at the limit
    pool.release(a, 1.0)
    assert pool.acquire(5.9) is a  # idle 4.9 s: still open
    pool.release(a, 6.0)
    pool.release(b, 6.0)
    fresh = pool.acquire(11.5)  # both idle 5.5 s > 5 s: closed, a new one opens
    assert fresh is not None
    assert fresh is not a
    assert fresh is not b
    assert pool.carried == {2: 1, 1: 1}  # a carried 2 requests, b 1
    pool.close_all()
    assert pool.carried == {2: 1, 1: 2}
    assert pool.open == 0


def test_without_keep_alive_every_request_has_a_connection_of_its_own() -> None:
    pool = ConnectionPool(ClientConnections(), 5, random.Random(3))
    for t in range(20):
        c = pool.acquire(float(t))
        assert c is not None
        pool.release(c, t + 0.5)
    assert pool.carried == {1: 20}
    assert pool.opened == 20
    assert pool.open == 0
    draws = random.Random(3)
    expected = collections.Counter(draws.randrange(5) for _ in range(20))
    assert pool.connections_per_backend == [expected[i] for i in range(5)]


def test_settings_are_checked() -> None:
    with pytest.raises(ValueError, match="max_connections"):
        ClientConnections(max_connections=-1)
    with pytest.raises(TypeError, match="keep_alive"):
        ClientConnections(keep_alive="yes")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="at least one backend"):
        ConnectionPool(ClientConnections(), 0, random.Random(0))


# --------------------------------------------------------------------------- policy names


def test_kube_service_names_and_overrides() -> None:
    assert client_connections("kube-service") == ClientConnections()
    assert client_connections(
        "kube-service:client.keepAlive=true&client.maxConnections=7&client.idleTimeoutS=2.5"
    ) == ClientConnections(max_connections=7, idle_timeout_s=2.5, keep_alive=True)
    assert client_connections("round-robin") is None
    assert is_lab_only("kube-service:client.keepAlive=true")
    assert not is_lab_only("random")
    assert client_connections("gie-v0.3:client.maxConnections=9") == ClientConnections(
        max_connections=9, pinned=False
    )
    assert is_lab_only("round-robin:client.keepAlive=true")
    with pytest.raises(UnknownPolicyError, match="no parameter 'maxConns'"):
        client_connections("kube-service:client.maxConns=3")
    with pytest.raises(UnknownPolicyError, match="max_connections must be an integer"):
        policy_config("kube-service:client.maxConnections=many")


# --------------------------------------------------------------------------- in the DES


def test_requests_follow_their_connection_and_backends_are_uniform_per_connection() -> None:
    """Keep-alive with 6 connections to 3 backends under load: exactly 6 connections are
    opened (the timeout never expires one), their backends are the pool's first 6 uniform
    draws, and every request lands on its connection's backend."""
    name = "kube-service:client.keepAlive=true&client.maxConnections=6&client.idleTimeoutS=60"
    sim = kube_service(name, seed=4)
    result = sim.run(OpenLoop(60.0, 2.0, mixed, seed=4), horizon_s=200.0)
    records = result.records
    assert len(records) > 90
    assert all(r.completed for r in records)
    pool = pool_of(result)
    draws = random.Random("connections-4")
    backends = collections.Counter(draws.randrange(3) for _ in range(6))
    assert pool.opened == 6
    assert pool.connections_per_backend == [backends[i] for i in range(3)]
    landed = collections.Counter(r.endpoint for r in records)
    assert pool.requests_per_backend == [landed[i] for i in range(3)]
    assert sum(k * n for k, n in pool.carried.items()) == len(records)
    assert sum(pool.carried.values()) == 6
    assert max(pool.carried) > 10
    assert_drained(sim, result)


def test_a_request_waits_for_a_connection_at_the_limit() -> None:
    """Twelve requests at once over 2 connections: never more than 2 in flight, the wait
    counted in their latency (arrival is when the client sent them)."""
    rng = random.Random(5)
    arrivals = [
        (0.0, RequestSpec("completions", MODEL, 40, f"{i} " + random_text(rng, 200)))
        for i in range(12)
    ]
    sim = kube_service("kube-service:client.keepAlive=true&client.maxConnections=2")
    result = sim.run(Scripted(arrivals), horizon_s=300.0)
    records = result.records
    assert len(records) == 12
    assert all(r.completed and r.arrival == 0.0 for r in records)
    spans = sorted((r.first_token, r.finish) for r in records)
    for first, _ in spans:
        assert sum(1 for f, e in spans if f <= first < e) <= 2
    assert len({r.endpoint for r in records}) <= 2
    assert pool_of(result).carried == {6: 2}


@pytest.mark.parametrize("keep_alive", ["true", "false"])
def test_a_request_refused_at_parsing_hangs_up_its_connection(keep_alive: str) -> None:
    """At ``maxConnections=1`` a request the gateway refuses before routing (``max_tokens``
    below 1: 400 at parsing) gives the one connection back; the requests behind it run."""
    rng = random.Random(7)
    bad = RequestSpec("completions", MODEL, -1, "refused " + random_text(rng, 50))
    good = [
        RequestSpec("completions", MODEL, 20, f"{i} " + random_text(rng, 100)) for i in range(3)
    ]
    sim = kube_service(f"kube-service:client.keepAlive={keep_alive}&client.maxConnections=1")
    result = sim.run(Scripted([(0.0, bad)] + [(0.0, spec) for spec in good]), horizon_s=300.0)
    first, *rest = result.records
    assert (first.status, first.completed) == (400, False)
    assert len(rest) == 3
    assert all(r.completed for r in rest)
    assert_drained(sim, result)


def test_one_connection_per_request_is_random_routing() -> None:
    """The published client (a connection per request): each request's backend is the
    next independent uniform draw — per-request random routing."""
    sim = kube_service("kube-service", replicas=4, seed=6)
    result = sim.run(OpenLoop(80.0, 1.5, mixed, seed=6), horizon_s=200.0)
    records = result.records
    assert len(records) > 90
    assert all(r.completed for r in records)
    draws = random.Random("connections-6")
    assert [r.endpoint for r in records] == [draws.randrange(4) for _ in records]
    pool = pool_of(result)
    assert pool.carried == {1: len(records)}
    assert pool.opened == len(records)
    assert_drained(sim, result)


def test_the_baseline_runs_des_only() -> None:
    from sluicegate.bench.http.plan import plan_policies
    from sluicegate.bench.scenarios import get_scenario

    with pytest.raises(UnknownPolicyError, match="lab-only baseline"):
        plan_policies(["round-robin", "kube-service"], get_scenario("multi-turn-chat"))


def test_a_client_in_front_of_the_gateway_bounds_concurrency_not_routing() -> None:
    """``round-robin`` behind 2 keep-alive connections: never more than 2 requests in
    flight, but the gateway still spreads them over every backend in turn."""
    rng = random.Random(7)
    arrivals = [
        (0.0, RequestSpec("completions", MODEL, 30, f"{i} " + random_text(rng, 200)))
        for i in range(9)
    ]
    name = "round-robin:client.keepAlive=true&client.maxConnections=2"
    result = kube_service(name).run(Scripted(arrivals), horizon_s=300.0)
    records = result.records
    assert all(r.completed for r in records)
    spans = sorted((r.first_token, r.finish) for r in records)
    for first, _ in spans:
        assert sum(1 for f, e in spans if f <= first < e) <= 2
    assert collections.Counter(r.endpoint for r in records) == {0: 3, 1: 3, 2: 3}
    assert pool_of(result).opened == 2
