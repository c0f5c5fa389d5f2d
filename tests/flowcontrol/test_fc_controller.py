"""FlowController on hand-built requests: band order, fairness, ordering, time to live,
capacity, cancellation, and memory that follows the live queue whatever the churn.

Times are plain floats handed to the controller (it reads no clock)."""

from __future__ import annotations

import itertools
import math
import random
from collections.abc import Callable

import pytest

from sluicegate.builtins import default_registry
from sluicegate.clock import ManualClock
from sluicegate.errors import GatewayError
from sluicegate.flowcontrol.controller import BandPolicy, FlowController, FlowControlSettings
from sluicegate.framework import (
    BandLimits,
    FairnessPolicy,
    ItemState,
    LLMRequest,
    OrderingPolicy,
    PluginContext,
    QueueItem,
)

REGISTRY = default_registry()

FCFS, EDF, SLO = "fcfs-ordering-policy", "edf-ordering-policy", "slo-deadline-ordering-policy"
STRICT, RR = "global-strict-fairness-policy", "round-robin-fairness-policy"

_CTX = PluginContext(ManualClock())
_ids = itertools.count()


def ordering(name: str) -> OrderingPolicy:
    plugin = REGISTRY.create(name, name, None, _CTX)
    assert isinstance(plugin, OrderingPolicy)
    return plugin


def fairness(name: str) -> FairnessPolicy:
    plugin = REGISTRY.create(name, name, None, _CTX)
    assert isinstance(plugin, FairnessPolicy)
    return plugin


def band(
    order: str = FCFS,
    fair: str = STRICT,
    max_requests: int | None = None,
    max_bytes: int | None = 1_000_000_000,
) -> BandPolicy:
    return BandPolicy(BandLimits(max_requests, max_bytes), ordering(order), fairness(fair))


def controller(
    order: str = FCFS,
    fair: str = STRICT,
    ttl: float | None = 60.0,
    bands: dict[int, BandPolicy] | None = None,
    max_requests: int | None = None,
    max_bytes: int | None = None,
) -> FlowController:
    return FlowController(
        FlowControlSettings(
            default_band=band(order, fair),
            bands=bands or {},
            max_requests=max_requests,
            max_bytes=max_bytes,
            default_ttl_s=ttl,
        )
    )


def req(
    name: str | None = None,
    *,
    priority: int = 0,
    flow: str = "default-flow",
    arrival: float = 0.0,
    size: int = 100,
    slo_ttft_ms: float | None = None,
) -> LLMRequest:
    return LLMRequest(
        request_id=name or f"r{next(_ids)}",
        model="m",
        target_model="m",
        prompt=b"",
        prompt_tokens=1,
        arrival=arrival,
        priority=priority,
        fairness_id=flow,
        slo_ttft_ms=slo_ttft_ms,
        body_bytes=size,
    )


def always(item: QueueItem) -> bool:
    return True


def drain(c: FlowController, room: Callable[[QueueItem], bool] = always) -> list[str]:
    """Request ids in the order they are dispatched until nothing more can go."""
    out = []
    while (item := c.pop_dispatchable(room)) is not None:
        assert item.state is ItemState.DISPATCHED
        out.append(item.request.request_id)
    return out


def totals(c: FlowController) -> tuple[int, int, list[tuple[int, int, int]]]:
    return c.requests, c.bytes, [(b.priority, b.requests, b.bytes) for b in c.bands()]


def assert_empty(c: FlowController) -> None:
    assert c.requests == 0
    assert c.bytes == 0
    assert c.waiting() == 0
    for b in c.bands():
        assert (b.requests, b.bytes) == (0, 0), b.priority
        assert not b.flows, (b.priority, list(b.flows))
    assert c.next_deadline() is None


# ====================================================================== priority bands


def test_higher_band_first_regardless_of_arrival() -> None:
    c = controller()
    # Interleaved arrivals of three priorities; lower ones arrive first.
    plan = [
        ("s1", -10),
        ("d1", 0),
        ("s2", -10),
        ("d2", 0),
        ("c1", 100),
        ("d3", 0),
        ("c2", 100),
        ("x1", 5),
    ]
    for t, (name, priority) in enumerate(plan):
        c.enqueue(req(name, priority=priority, arrival=float(t)), float(t))
    assert [b.priority for b in c.bands()] == [100, 5, 0, -10]
    assert drain(c) == ["c1", "c2", "x1", "d1", "d2", "d3", "s1", "s2"]
    assert_empty(c)


def test_a_late_higher_priority_request_goes_next() -> None:
    c = controller()
    for i in range(3):
        c.enqueue(req(f"low{i}", arrival=float(i)), float(i))
    assert drain_one(c) == "low0"
    c.enqueue(req("high", priority=1, arrival=10.0), 10.0)
    assert drain(c) == ["high", "low1", "low2"]


def drain_one(c: FlowController, room: Callable[[QueueItem], bool] = always) -> str | None:
    item = c.pop_dispatchable(room)
    return None if item is None else item.request.request_id


# ================================================================ head-of-line blocking


def test_blocked_head_does_not_block_another_flow_of_its_band() -> None:
    c = controller()
    c.enqueue(req("a1", flow="a", arrival=0.0), 0.0)  # best by order, but blocked
    c.enqueue(req("a2", flow="a", arrival=1.0), 1.0)
    c.enqueue(req("b1", flow="b", arrival=2.0), 2.0)
    asked: list[str] = []

    def room(item: QueueItem) -> bool:
        asked.append(item.request.request_id)
        return item.flow_id != "a"

    assert drain(c, room) == ["b1"]
    # Only heads are asked; within a flow, order holds (a2 waits behind a1).
    assert set(asked) == {"a1", "b1"}
    assert c.requests == 2
    assert drain(c) == ["a1", "a2"]


def test_blocked_higher_band_does_not_block_a_lower_band() -> None:
    c = controller()
    c.enqueue(req("c1", priority=100), 0.0)
    c.enqueue(req("c2", priority=100, flow="other"), 0.0)
    c.enqueue(req("s1", priority=0), 1.0)
    c.enqueue(req("d1", priority=-5), 2.0)

    def room(item: QueueItem) -> bool:
        return item.priority != 100  # e.g. its endpoints are full, the others' are not

    assert drain(c, room) == ["s1", "d1"]
    assert drain(c) == ["c1", "c2"]
    assert_empty(c)


def test_nothing_dispatchable_leaves_everything_queued() -> None:
    c = controller()
    for i in range(5):
        c.enqueue(req(priority=i % 2, flow=f"f{i % 3}"), float(i))
    before = totals(c)
    assert c.pop_dispatchable(lambda item: False) is None
    assert totals(c) == before


def test_lower_band_tail_drains_when_higher_bands_are_idle() -> None:
    c = controller()
    rng = random.Random(7)
    low = [f"low{i}" for i in range(60)]
    for i, name in enumerate(low):
        c.enqueue(req(name, flow=f"t{rng.randrange(6)}", arrival=float(i)), float(i))
    # A few high-priority requests come and go; the low band keeps draining in between.
    served: list[str] = []
    for round_ in range(5):
        c.enqueue(req(f"hi{round_}", priority=50, arrival=100.0 + round_), 100.0 + round_)
        served.append(drain_one(c) or "")
        served.extend(drain_one(c) or "" for _ in range(3))
    served.extend(drain(c))
    assert [s for s in served if s.startswith("hi")] == [f"hi{i}" for i in range(5)]
    assert [s for s in served if s.startswith("low")] == low  # every one, in fcfs order
    assert_empty(c)


# ============================================================================ fairness


def test_round_robin_alternates_until_the_small_tenant_is_empty() -> None:
    c = controller(fair=RR)
    for i in range(100):
        c.enqueue(req(f"big{i}", flow="big", arrival=float(i)), float(i))
    for i in range(5):
        c.enqueue(req(f"small{i}", flow="small", arrival=200.0 + i), 200.0 + i)
    order = drain(c)
    assert order[:10] == [name for i in range(5) for name in (f"big{i}", f"small{i}")]
    assert order[10:] == [f"big{i}" for i in range(5, 100)]
    assert_empty(c)


def test_round_robin_takes_in_a_new_flow_and_skips_a_blocked_one() -> None:
    c = controller(fair=RR)
    for i in range(4):
        c.enqueue(req(f"a{i}", flow="a", arrival=float(i)), float(i))
        c.enqueue(req(f"b{i}", flow="b", arrival=float(i)), float(i))
    assert [drain_one(c), drain_one(c)] == ["a0", "b0"]
    c.enqueue(req("c0", flow="c", arrival=9.0), 9.0)
    assert [drain_one(c), drain_one(c), drain_one(c)] == ["a1", "b1", "c0"]

    def not_b(item: QueueItem) -> bool:
        return item.flow_id != "b"

    assert [drain_one(c, not_b), drain_one(c, not_b)] == ["a2", "a3"]
    assert drain(c) == ["b2", "b3"]
    assert_empty(c)


@pytest.mark.parametrize("fair", [STRICT, RR])
def test_last_request_of_a_flow_can_be_dispatched(fair: str) -> None:
    # Regression: round-robin looked the emptied flow up after it had been forgotten.
    c = controller(fair=fair)
    c.enqueue(req("only", flow="one-off"), 0.0)
    assert drain(c) == ["only"]
    c.enqueue(req("x", flow="a"), 1.0)
    c.enqueue(req("y", flow="b"), 2.0)
    assert drain(c) == ["x", "y"]
    assert_empty(c)


def test_global_strict_follows_the_ordering_across_flows() -> None:
    c = controller(fair=STRICT)
    arrivals = {"a": [0.0, 3.0, 4.0], "b": [1.0, 2.0, 6.0], "c": [5.0]}
    for flow, times in arrivals.items():
        for t in times:
            c.enqueue(req(f"{flow}@{t:g}", flow=flow, arrival=t), 10.0)
    assert drain(c) == ["a@0", "b@1", "b@2", "a@3", "a@4", "c@5", "b@6"]


def test_global_strict_with_edf_serves_the_earliest_deadline_of_any_flow() -> None:
    c = controller(order=EDF, fair=STRICT, ttl=10.0)
    c.enqueue(req("a-late", flow="a", arrival=5.0), 5.0)  # deadline 15
    c.enqueue(req("b-early", flow="b", arrival=1.0), 1.0)  # deadline 11
    c.enqueue(req("a-later", flow="a", arrival=6.0), 6.0)  # deadline 16
    assert drain(c) == ["b-early", "a-late", "a-later"]


# ============================================================================ ordering


def test_fcfs_orders_by_arrival_not_by_enqueue_call() -> None:
    c = controller(order=FCFS)
    for name, arrival in [("third", 3.0), ("first", 1.0), ("second", 2.0), ("fourth", 3.0)]:
        c.enqueue(req(name, arrival=arrival), 5.0)
    assert drain(c) == ["first", "second", "third", "fourth"]  # ties: enqueue order


def test_edf_orders_by_enqueue_plus_ttl_and_puts_no_deadline_last() -> None:
    c = controller(order=EDF, ttl=None)
    c.enqueue(req("forever-1", arrival=0.0), 0.0)
    c.settings.default_ttl_s = 10.0
    c.enqueue(req("d15", arrival=5.0), 5.0)
    c.settings.default_ttl_s = 2.0
    c.enqueue(req("d8", arrival=6.0), 6.0)
    c.enqueue(req("d9", arrival=7.0), 7.0)
    c.settings.default_ttl_s = None
    c.enqueue(req("forever-2", arrival=8.0), 8.0)
    assert drain(c) == ["d8", "d9", "d15", "forever-1", "forever-2"]


def test_slo_deadline_orders_by_arrival_plus_ttft_slo() -> None:
    c = controller(order=SLO)
    plan = [
        ("a", 0.0, 5000.0),  # due 5.0
        ("b", 1.0, 1000.0),  # due 2.0
        ("none-1", 0.5, None),
        ("d", 2.0, 500.0),  # due 2.5
        ("none-0", 0.2, None),
        ("e", 0.0, 2000.0),  # due 2.0, arrived before b
    ]
    for name, arrival, slo in plan:
        c.enqueue(req(name, arrival=arrival, slo_ttft_ms=slo), 3.0)
    assert drain(c) == ["e", "b", "d", "a", "none-0", "none-1"]


def test_each_band_uses_its_own_ordering() -> None:
    c = controller(order=FCFS, bands={10: band(order=SLO)})
    c.enqueue(req("hi-noslo", priority=10, arrival=0.0), 0.0)
    c.enqueue(req("hi-slo", priority=10, arrival=1.0, slo_ttft_ms=100.0), 1.0)
    c.enqueue(req("lo-2", arrival=2.0, slo_ttft_ms=1.0), 2.0)
    c.enqueue(req("lo-1", arrival=1.5), 2.0)
    assert drain(c) == ["hi-slo", "hi-noslo", "lo-1", "lo-2"]


# ======================================================================== time to live


def test_expire_returns_exactly_the_expired_requests() -> None:
    c = controller(ttl=10.0)
    items = [c.enqueue(req(f"r{i}", arrival=float(i)), float(i)) for i in range(5)]
    assert [i.deadline for i in items] == [10.0, 11.0, 12.0, 13.0, 14.0]
    assert c.next_deadline() == 10.0
    assert c.expire(9.999) == []
    expired = c.expire(11.0)  # a deadline equal to now has expired
    assert expired == items[:2]
    assert all(i.state is ItemState.EXPIRED for i in expired)
    assert c.requests == 3
    assert c.bytes == 300
    assert c.next_deadline() == 12.0
    assert drain(c) == ["r2", "r3", "r4"]
    assert c.expire(math.inf) == []
    assert_empty(c)


def test_dispatched_and_cancelled_requests_never_expire() -> None:
    c = controller(ttl=5.0)
    a = c.enqueue(req("a"), 0.0)
    b = c.enqueue(req("b"), 1.0)
    d = c.enqueue(req("d"), 2.0)
    assert drain_one(c) == "a"
    assert c.cancel(b)
    assert c.next_deadline() == 7.0
    assert c.expire(100.0) == [d]
    assert (a.state, b.state, d.state) == (
        ItemState.DISPATCHED,
        ItemState.CANCELLED,
        ItemState.EXPIRED,
    )
    assert c.next_deadline() is None
    assert_empty(c)


def test_no_ttl_means_no_deadline() -> None:
    c = controller(ttl=None)
    item = c.enqueue(req(), 0.0)
    assert item.deadline is None
    assert c.next_deadline() is None
    assert c.expire(1e18) == []
    assert c.expiry_entries == 0
    assert c.requests == 1


def test_expired_requests_across_bands_and_flows_in_deadline_order() -> None:
    c = controller(ttl=1.0)
    items = [
        c.enqueue(req(priority=p, flow=f), t)
        for t, (p, f) in enumerate([(5, "x"), (0, "y"), (5, "y"), (-1, "z")])
    ]
    assert c.expire(10.0) == items
    assert_empty(c)


# ============================================================================ capacity


def expect_capacity(c: FlowController, request: LLMRequest) -> GatewayError:
    before = totals(c)
    with pytest.raises(GatewayError) as info:
        c.enqueue(request, 0.0)
    err = info.value
    assert err.status == 429
    assert err.reason == "rejected-capacity"
    assert err.retry_after_s is not None
    assert "full" in err.message
    assert totals(c) == before  # a refusal changes nothing
    return err


def test_global_max_requests() -> None:
    c = controller(max_requests=3)
    items = [c.enqueue(req(priority=p), 0.0) for p in (0, 1, 2)]
    expect_capacity(c, req(priority=7))
    assert drain_one(c) is not None  # a dispatch frees a place
    c.enqueue(req(), 0.0)
    expect_capacity(c, req())
    assert c.cancel(items[0])  # so does a cancellation
    last = c.enqueue(req(), 0.0)
    expect_capacity(c, req())
    assert len(c.expire(1e9)) == 3  # and expiry
    c.enqueue(req(), 0.0)
    assert last.state is ItemState.EXPIRED


def test_global_max_bytes() -> None:
    c = controller(max_bytes=1000)
    a = c.enqueue(req(size=600), 0.0)
    c.enqueue(req(size=400), 0.0)
    expect_capacity(c, req(size=1))
    assert c.cancel(a)
    expect_capacity(c, req(size=601))
    c.enqueue(req(size=600), 0.0)
    assert c.bytes == 1000
    c2 = controller(max_bytes=1000)
    expect_capacity(c2, req(size=1001))  # too big even for an empty queue
    c2.enqueue(req(size=0), 0.0)


def test_per_band_max_requests_and_bytes() -> None:
    c = controller(
        bands={100: band(max_requests=2), -10: band(max_bytes=500)},
    )
    c.enqueue(req("c1", priority=100), 0.0)
    c.enqueue(req("c2", priority=100), 0.0)
    err = expect_capacity(c, req(priority=100))
    assert "priority 100" in err.message
    c.enqueue(req(priority=0), 0.0)  # other bands are not affected
    c.enqueue(req("s1", priority=-10, size=500), 0.0)
    err = expect_capacity(c, req(priority=-10, size=1))
    assert "priority -10" in err.message
    assert "bytes" in err.message
    assert drain_one(c, lambda i: i.priority == -10) == "s1"
    c.enqueue(req(priority=-10, size=500), 0.0)  # its bytes came back on dispatch
    assert drain_one(c) == "c1"
    c.enqueue(req(priority=100), 0.0)  # and the band's place


def test_default_band_limit_of_one_gigabyte() -> None:
    c = controller()
    c.enqueue(req(size=600_000_000), 0.0)
    expect_capacity(c, req(size=400_000_001))
    c.enqueue(req(size=400_000_000), 0.0)
    c.enqueue(req(priority=1, size=999_999_999), 0.0)  # a band of its own


def test_capacity_counts_are_restored_after_everything_leaves() -> None:
    c = controller(ttl=10.0, max_requests=50, max_bytes=50 * 100, bands={1: band(max_requests=10)})
    rng = random.Random(3)
    items = [c.enqueue(req(priority=i % 2, flow=f"f{i % 4}"), float(i)) for i in range(20)]
    for item in rng.sample(items, 5):
        assert c.cancel(item)
    assert None not in [drain_one(c) for _ in range(5)]
    assert len(c.expire(100.0)) == 10
    assert_empty(c)
    for _ in range(50):
        c.enqueue(req(priority=0), 200.0)
    expect_capacity(c, req(priority=1))


# ============================================================================== cancel


def test_cancel_semantics() -> None:
    c = controller()
    a = c.enqueue(req("a", flow="f", arrival=0.0), 0.0)
    b = c.enqueue(req("b", flow="f", arrival=1.0), 1.0)
    d = c.enqueue(req("d", flow="f", arrival=2.0), 2.0)
    assert c.cancel(b)  # from the middle of its flow
    assert b.state is ItemState.CANCELLED
    assert not c.cancel(b)  # only once
    assert (c.requests, c.bytes) == (2, 200)
    assert drain(c) == ["a", "d"]  # the others keep their order; b never leaves
    assert not c.cancel(a)  # already dispatched
    assert a.state is ItemState.DISPATCHED
    assert not c.cancel(d)
    assert_empty(c)


def test_cancel_the_head_lets_the_next_go() -> None:
    c = controller()
    a = c.enqueue(req("a", arrival=0.0), 0.0)
    c.enqueue(req("b", arrival=1.0), 1.0)
    assert c.cancel(a)
    assert drain(c) == ["b"]
    assert_empty(c)


def test_cancel_after_expiry_is_a_no_op() -> None:
    c = controller(ttl=1.0)
    a = c.enqueue(req("a"), 0.0)
    assert c.expire(1.0) == [a]
    assert not c.cancel(a)
    assert a.state is ItemState.EXPIRED
    assert_empty(c)


# ============================================================================== memory

BOUND = 300
"""Heap entries tolerated with at most ~100 live requests: live + amortised dead ones."""


def heap_entries(c: FlowController) -> int:
    return sum(q.entries for b in c.bands() for q in b.flows.values())


def flows(c: FlowController) -> int:
    return sum(len(b.flows) for b in c.bands())


def assert_bounded(c: FlowController, live_max: int) -> None:
    assert c.requests <= live_max
    assert heap_entries(c) <= BOUND, heap_entries(c)
    assert c.expiry_entries <= BOUND, c.expiry_entries
    for b in c.bands():
        for q in b.flows.values():
            assert q.live >= 0
            assert q.entries <= BOUND


CYCLES = 1_000_000


def test_memory_enqueue_expire_cycles() -> None:
    c = controller(ttl=1.0)
    shared = req(flow="tenant")  # one request object: the loop measures the controller
    enqueue, expire = c.enqueue, c.expire
    for i in range(CYCLES):
        enqueue(shared, float(i))
        # The previous request expires; the new one keeps the flow alive, so the dead
        # entries pile up in its heap until compaction.
        if len(expire(i + 0.5)) != (1 if i else 0):
            raise AssertionError(f"cycle {i}: expected one expiry")
        if i % 100_000 == 0:
            assert_bounded(c, 2)
    assert c.expire(math.inf)
    assert_empty(c)


def test_memory_enqueue_cancel_cycles_behind_a_standing_backlog() -> None:
    # Cancelled requests sit behind 100 live ones: their dead entries are mid-heap and
    # only compaction (not the head sweep) can free them.
    c = controller(ttl=3600.0)
    backlog = [c.enqueue(req(flow="tenant", arrival=-1.0), 0.0) for _ in range(100)]
    shared = req(flow="tenant", arrival=1.0)
    enqueue, cancel = c.enqueue, c.cancel
    for i in range(CYCLES):
        if not cancel(enqueue(shared, float(i))):
            raise AssertionError(f"cycle {i}: cancel failed")
        if i % 100_000 == 0:
            assert_bounded(c, 101)
    assert_bounded(c, 100)
    assert c.requests == 100
    assert all(item.state is ItemState.QUEUED for item in backlog)
    assert len(drain(c)) == 100
    assert_empty(c)


def test_memory_enqueue_dispatch_cycles_with_dead_entries_interleaved() -> None:
    # Two flows, about twenty waiting; every fifth request is cancelled one cycle after
    # it was queued (its dead entry sits at the tail of its flow's heap).
    c = controller(ttl=3600.0)
    shared = [req(flow=f"t{k}") for k in range(2)]
    enqueue, pop, cancel = c.enqueue, c.pop_dispatchable, c.cancel
    previous: QueueItem | None = None
    dispatched = 0
    for i in range(CYCLES):
        item = enqueue(shared[i & 1], float(i))
        if i % 5 == 0 and previous is not None:
            cancel(previous)
        previous = item
        while c.requests > 20:
            if pop(always) is None:
                raise AssertionError(f"cycle {i}: nothing to dispatch")
            dispatched += 1
        if i % 100_000 == 0:
            assert_bounded(c, 21)
    assert dispatched > CYCLES * 3 // 4
    assert_bounded(c, 21)
    drain(c)
    assert c.expire(math.inf) == []
    assert_empty(c)
    assert c.expiry_entries <= BOUND


@pytest.mark.parametrize("fair", [STRICT, RR])
def test_memory_interleaved_churn_over_bands_and_flows(fair: str) -> None:
    rng = random.Random(11)
    c = controller(fair=fair, ttl=5.0, bands={100: band(fair=fair, order=EDF)})
    live: list[QueueItem] = []
    t = 0.0
    for step in range(150_000):
        t += 0.01
        if c.requests < 100:
            request = req(
                priority=rng.choice((100, 0, -10)),
                flow=f"tenant-{rng.randrange(20)}" if rng.random() < 0.8 else f"once-{step}",
                arrival=t,
            )
            live.append(c.enqueue(request, t))
        op = rng.random()
        if op < 0.3:
            c.pop_dispatchable(lambda item: rng.random() < 0.7)
        elif op < 0.55 and live:
            c.cancel(live[rng.randrange(len(live))])
        elif op < 0.6:
            c.expire(t)
        if step % 1000 == 0:
            live = [item for item in live if item.state is ItemState.QUEUED]
            assert c.requests == len(live)
            assert flows(c) <= c.requests  # a flow is forgotten when it empties
            assert_bounded(c, 100)
    c.expire(math.inf)
    assert_empty(c)


@pytest.mark.parametrize("fair", [STRICT, RR])
@pytest.mark.parametrize("exit_by", ["dispatch", "cancel", "expire"])
def test_one_off_fairness_ids_do_not_accumulate(fair: str, exit_by: str) -> None:
    # Regression: a flow whose only request was cancelled or expired kept its dead heap
    # entry, and so its place in the band, forever.
    c = controller(fair=fair, ttl=None)
    c.enqueue(req(flow="regular", arrival=-1.0), 0.0)  # waits throughout (no TTL)
    c.settings.default_ttl_s = 1.0

    def not_regular(item: QueueItem) -> bool:
        return item.flow_id != "regular"

    for i in range(2000):
        item = c.enqueue(req(flow=f"session-{i}", arrival=float(i)), float(i))
        if exit_by == "dispatch":
            assert c.pop_dispatchable(not_regular) is item
        elif exit_by == "cancel":
            assert c.cancel(item)
        else:
            assert c.expire(i + 1.0) == [item]
        assert flows(c) == 1, (i, [list(b.flows) for b in c.bands()])
    assert heap_entries(c) == 1
    assert c.requests == 1
