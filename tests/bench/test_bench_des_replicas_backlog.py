"""Flow control across gateway replicas in the discrete-event lab: shared replicas run the
real per-band backlog rule over the simulated channel (``des_backlog``), independent ones
and a channel that loses everything do not, and the feed's readings expire."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from sluicegate.bench.des import ClusterSimulation
from sluicegate.bench.des_backlog import BacklogFeed
from sluicegate.bench.des_sharing import ReplicaSettings
from sluicegate.bench.des_spec import ClusterSpec, RunResult
from sluicegate.bench.policies import policy_config
from sluicegate.bench.scenarios import get_scenario
from sluicegate.flowcontrol.peers import PeerYield
from sluicegate.runtime.shared_backlog import encode_backlog

POOL = "sim-pool"


def simulation(**settings: object) -> ClusterSimulation:
    """The quick ``priority-overload`` (Critical and Standard streams saturating two
    engines) with flow control on, over the replicas ``settings`` describe."""
    scenario = get_scenario("priority-overload").quick_variant()
    picker, predictor = policy_config("priority-isolation")
    spec = ClusterSpec(
        scenario.profile,
        scenario.replicas,
        picker,
        profiles=scenario.replica_profiles(),
        predictor=predictor,
        model=scenario.model,
        adapters=scenario.adapters,
        extra_docs=list(scenario.extra_docs),
        flow_control=True,
        gateways=ReplicaSettings(**settings),  # type: ignore[arg-type]
    )
    return ClusterSimulation(spec)


def run(sim: ClusterSimulation, streams: float = 56.0, duration_s: float = 20.0) -> RunResult:
    scenario = get_scenario("priority-overload").quick_variant()
    return sim.run(scenario.workload(streams, duration_s, 0), horizon_s=4 * duration_s)


def backlog_feed(sim: ClusterSimulation) -> BacklogFeed:
    feeds = [f for f in sim.group.feeds if isinstance(f, BacklogFeed)]
    assert len(feeds) == 1
    return feeds[0]


def routes(result: RunResult) -> list[tuple[float, int, float, float, int]]:
    return [(r.arrival, r.endpoint, r.first_token, r.finish, r.status) for r in result.records]


STANDARD = 0
"""The Standard band's priority (Critical's is higher, Sheddable's negative)."""


def test_critical_work_on_one_replica_holds_standard_work_on_another(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    sim = simulation(gateways=2, state="shared")
    feed = backlog_feed(sim)
    assert all(
        g.director.peer_yield is rule for g, rule in zip(sim.gateways, feed.rules, strict=True)
    )
    above_held: list[tuple[int, int, int]] = []
    holds = PeerYield.holds

    def watch(
        rule: PeerYield,
        pool: str,
        priority: int,
        first_held: float | None,
        now: float,
        free: Callable[[int], int],
    ) -> bool:
        held = holds(rule, pool, priority, first_held, now, free)
        if held:  # what the peers had waiting above the held request, by its reading
            above_held.append((priority, *rule.backlog.above(pool, priority, now)))
        return held

    monkeypatch.setattr(PeerYield, "holds", watch)
    result = run(sim)
    assert result.sharing is not None
    assert result.sharing["peer_yields"] > 0
    # a Standard request held because Critical ones waited on the other replica
    assert any(p == STANDARD for p, _, _ in above_held)
    assert all(waiting > 0 and top > p for p, waiting, top in above_held)
    assert {(POOL, STANDARD)} >= {key for rule in feed.rules for key in rule.yielded}
    for view in feed.views:  # the run drained: the last readings show nothing waiting
        assert view.reading(sim.clock.now()) == {}


def test_independent_replicas_and_a_lost_channel_never_hold() -> None:
    independent = simulation(gateways=2)
    assert all(g.director.peer_yield is None for g in independent.gateways)
    assert not independent.group.feeds
    lost_sim = simulation(gateways=2, state="shared", loss=1.0)
    lost = run(lost_sim)
    assert routes(lost) == routes(run(independent))
    assert lost.sharing is not None
    assert lost.sharing["peer_yields"] == 0
    assert lost.sharing["copies_delivered"] == 0
    assert all(view.as_of is None or not view.reading(0.0) for view in backlog_feed(lost_sim).views)


def test_no_backlog_feed_without_flow_control() -> None:
    scenario = get_scenario("multi-turn-chat").quick_variant()
    picker, predictor = policy_config("default")
    spec = ClusterSpec(
        scenario.profile,
        scenario.replicas,
        picker,
        predictor=predictor,
        model=scenario.model,
        gateways=ReplicaSettings(2, "shared"),
    )
    sim = ClusterSimulation(spec)
    assert [f.name for f in sim.group.feeds] == ["prefix", "inflight"]
    assert all(g.director.peer_yield is None for g in sim.gateways)


def test_backlog_readings_sum_the_peers_and_expire_with_their_lease() -> None:
    sim = simulation(gateways=3, state="shared", delay_s=0.0)
    feed = backlog_feed(sim)
    pumped: list[tuple[int, float]] = []
    feed.on_update = lambda g, now: pumped.append((g, now))
    for g in sim.gateways:  # the queues exist once a request went through flow control
        g.director._room.controller(g.datastore.pools[POOL], g.director.flow)
    lease = feed.lease_s
    feed.receive(2, 0, encode_backlog({POOL: {100: 3}}), sent_at=0.0, now=0.001)
    feed.receive(2, 1, encode_backlog({POOL: {100: 2, 0: 5}}), sent_at=0.01, now=0.011)
    view = feed.views[2]
    assert view.reading(0.011) == {POOL: {100: 5, 0: 5}}
    assert view.above(POOL, 0, 0.011) == (5, 100)
    assert pumped == [(2, 0.001), (2, 0.011)]
    feed.publish(2, now=lease + 0.005)  # sender 0 went silent past its lease
    assert view.reading(lease + 0.005) == {POOL: {100: 2, 0: 5}}
    feed.publish(2, now=lease + 0.02)  # and sender 1: nothing waits elsewhere any more
    assert view.reading(lease + 0.02) == {}
    assert feed._latest[2] == {}
    assert len(pumped) == 4  # the reading that emptied pumps (held requests may go) ...
    feed.publish(2, now=lease + 0.05)
    assert len(pumped) == 4  # ... one that stays empty changes nothing: no pump
    feed.receive(1, 0, b"\x01", sent_at=0.0, now=0.0)  # not a snapshot: skipped, counted
    assert feed.bad_snapshots == 1
    assert feed._latest[1] == {}
