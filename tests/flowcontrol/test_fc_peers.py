"""Flow control across replicas: a replica's lower-priority request holds while the other
replicas' higher bands wait and the pool is saturated, and only then — never when there is
room for both, never on a stale reading, never past ``max_yield_s``. The director of
test_fc_director (two endpoints, utilization detector: 5 waiting fill one) with a
:class:`PeerBacklogView` fed by hand."""

from __future__ import annotations

import pytest
from test_fc_director import POOL, FlowEnv, gated

from sluicegate.flowcontrol.controller import FlowController
from sluicegate.flowcontrol.peers import (
    MAX_BANDS,
    MAX_POOLS,
    NoPeerBacklog,
    PeerBacklogView,
    PeerYield,
    add_backlog,
    local_backlog,
)
from sluicegate.framework import ItemState

LEASE_S = 2.0
CRITICAL, STANDARD = 100, 0


def env_with_peers(max_yield_s: float = 5.0) -> tuple[FlowEnv, PeerBacklogView, PeerYield]:
    env = FlowEnv(gated())
    view = PeerBacklogView(max_age_s=LEASE_S)
    rule = PeerYield(view, max_yield_s)
    env.director.peer_yield = rule
    return env, view, rule


def free_one(env: FlowEnv) -> None:
    """One request of the saturating fill finishes: one endpoint has room for one."""
    for _item, dispatch in env.dispatched:
        if dispatch.finished_at is None:
            env.finish(dispatch)
            return
    raise AssertionError("nothing left to finish")


def test_saturated_pool_holds_standard_for_a_peers_critical_and_counts_it() -> None:
    env, view, rule = env_with_peers()
    env.saturate()
    s = env.queued("standard", "s")
    view.update({POOL: {CRITICAL: 3}}, env.clock.now())
    free_one(env)  # one endpoint with room ≤ 3 critical waiting elsewhere: saturated
    assert env.director.pump() == 0
    assert s.state is ItemState.QUEUED
    assert rule.yielded == {(POOL, STANDARD): 1}
    env.director.pump()  # holding again is the same request: counted once
    assert rule.yielded == {(POOL, STANDARD): 1}
    view.update({POOL: {}}, env.clock.now())  # the peer's critical requests left
    assert env.director.pump() == 1
    assert s.state is ItemState.DISPATCHED
    assert rule.released == {}
    env.finish_all()
    env.assert_balanced()


def test_without_a_peer_backlog_the_same_request_goes() -> None:
    """The control of the test above: the hold is the peer backlog's doing."""
    env, _view, rule = env_with_peers()
    env.saturate()
    s = env.queued("standard", "s")
    free_one(env)
    assert env.director.pump() == 1
    assert s.state is ItemState.DISPATCHED
    assert rule.yielded == {}


def test_room_for_both_holds_nothing() -> None:
    env, view, rule = env_with_peers()
    env.saturate()
    s = env.queued("standard", "s")
    view.update({POOL: {CRITICAL: 1}}, env.clock.now())
    env.finish_all()  # both endpoints free: 2 endpoints with room > 1 waiting elsewhere
    assert env.director.pump() == 1
    assert s.state is ItemState.DISPATCHED
    assert rule.yielded == {}


def test_unsaturated_pool_never_queues_behind_peers() -> None:
    env, view, rule = env_with_peers()
    env.scrape_all()  # idle
    view.update({POOL: {CRITICAL: 1}}, env.clock.now())
    for i in range(4):
        env.at_once("standard", f"s{i}")
    assert rule.yielded == {}


def test_equal_or_lower_peer_bands_and_other_pools_hold_nothing() -> None:
    env, view, rule = env_with_peers()
    env.saturate()
    c = env.queued("critical", "c")
    s = env.queued("standard", "s")
    now = env.clock.now()
    view.update({POOL: {CRITICAL: 5, STANDARD: 5, -10: 5}, "other-pool": {1000: 9}}, now)
    free_one(env)
    assert env.director.pump() == 1  # critical: nothing above it waits elsewhere
    assert c.state is ItemState.DISPATCHED
    view.update({POOL: {STANDARD: 5, -10: 5}, "other-pool": {1000: 9}}, now)
    free_one(env)
    assert env.director.pump() == 1  # standard: peers' standard is its equal
    assert s.state is ItemState.DISPATCHED
    assert rule.yielded == {}


def test_a_stale_reading_holds_nothing() -> None:
    """A reading older than the lease (the sync stalled, the peer is gone) is ignored."""
    env, view, rule = env_with_peers()
    env.saturate()
    view.update({POOL: {CRITICAL: 3}}, env.clock.now())
    s = env.queued("standard", "s")
    env.clock.advance(LEASE_S + 0.01)
    env.scrape_all()
    for dispatch in [d for _, d in env.dispatched][:1]:
        env.finish(dispatch)
    assert env.director.pump() == 1
    assert s.state is ItemState.DISPATCHED
    assert rule.yielded == {}


def test_a_cleared_reading_redis_down_holds_nothing() -> None:
    env, view, _rule = env_with_peers()
    env.saturate()
    s = env.queued("standard", "s")
    view.update({POOL: {CRITICAL: 3}}, env.clock.now())
    free_one(env)
    assert env.director.pump() == 0
    view.clear()
    assert env.director.pump() == 1
    assert s.state is ItemState.DISPATCHED


def test_no_starvation_a_request_holds_max_yield_at_most() -> None:
    """A peer whose critical requests never leave (they wait for endpoints this replica's
    request does not need, say) delays the standard request by max_yield_s, no more."""
    env, view, rule = env_with_peers(max_yield_s=0.5)
    env.saturate()
    s = env.queued("standard", "s")
    free_one(env)
    view.update({POOL: {CRITICAL: 3}}, env.clock.now())
    assert env.director.pump() == 0
    for _ in range(4):  # the peer keeps publishing its backlog; time passes
        env.clock.advance(0.1)
        view.update({POOL: {CRITICAL: 3}}, env.clock.now())
        env.scrape_all()
        assert env.director.pump() == 0
    env.clock.advance(0.11)
    view.update({POOL: {CRITICAL: 3}}, env.clock.now())
    assert env.director.pump() == 1
    assert s.state is ItemState.DISPATCHED
    assert rule.yielded == rule.released == {(POOL, STANDARD): 1}


def test_local_strict_priority_is_unchanged_under_a_peer_backlog() -> None:
    env, view, _rule = env_with_peers()
    env.saturate()
    for name in ("s1", "s2"):
        env.queued("standard", name)
    env.queued("critical", "c1")
    view.update({POOL: {CRITICAL: 1, STANDARD: 4}}, env.clock.now())
    start = len(env.dispatched)
    free_one(env)
    env.director.pump()
    assert env.names(start) == ["c1"]  # the local critical goes first, as ever
    free_one(env)
    assert env.director.pump() == 0  # then the standard ones hold for the peer's critical


def test_view_is_bounded_and_sorted() -> None:
    view = PeerBacklogView(max_age_s=1.0)
    pools = {f"p{i}": dict.fromkeys(range(MAX_BANDS + 10), 1) for i in range(MAX_POOLS + 10)}
    view.update(pools, 0.0)
    reading = view.reading(0.5)
    assert len(reading) == MAX_POOLS
    assert all(len(bands) == MAX_BANDS for bands in reading.values())
    # The highest bands are kept: what a request above them could hold for.
    assert max(reading["p0"]) == MAX_BANDS + 9
    assert view.above("p0", MAX_BANDS + 8, 0.5) == (1, MAX_BANDS + 9)
    assert view.above("p0", 20, 0.5) == (MAX_BANDS + 9 - 20, MAX_BANDS + 9)
    assert view.above("p0", 20, 1.01) == (0, 20)  # stale
    assert view.reading(1.01) == {}
    view.update({"a": {5: 0, 3: -2}}, 0.0)
    assert view.reading(0.0) == {}
    assert NoPeerBacklog().above("a", 0, 0.0) == (0, 0)
    with pytest.raises(ValueError, match="max_age_s must be positive"):
        PeerBacklogView(max_age_s=0)
    with pytest.raises(ValueError, match="max_yield_s must be positive"):
        PeerYield(view, max_yield_s=0)


def test_summing_snapshots_is_bounded() -> None:
    into: dict[str, dict[int, int]] = {}
    add_backlog(into, [("a", 1, 2), ("a", 1, 3), ("b", 0, 1)])
    assert into == {"a": {1: 5}, "b": {0: 1}}
    add_backlog(into, [(f"x{i}", 0, 1) for i in range(MAX_POOLS * 2)])
    assert len(into) == MAX_POOLS
    add_backlog(into, [("a", p, 1) for p in range(MAX_BANDS * 2)])
    assert len(into["a"]) == MAX_BANDS
    assert into["a"][1] == 6  # a known band still adds up


def test_local_backlog_lists_non_empty_bands() -> None:
    env, _view, _rule = env_with_peers()
    env.saturate()
    env.queued("standard", "s1")
    env.queued("standard", "s2")
    env.queued("critical", "c1")
    controllers: dict[str, FlowController] = dict(env.director.controllers())
    assert local_backlog(controllers) == {POOL: {CRITICAL: 1, STANDARD: 2}}
    env.finish_all()
    env.director.pump()
    env.finish_all()
    assert local_backlog(controllers) == {}
