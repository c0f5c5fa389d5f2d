"""Datastore diffing and listeners; Endpoint addresses, staleness, load estimates, InFlight."""

from __future__ import annotations

import random

import pytest

from sluicegate.datalayer.datastore import Datastore, EndpointSpec
from sluicegate.datalayer.endpoint import SAME_ITERATION_S, Endpoint, EngineMetrics, InFlight


class Recorder:
    """Collects listener calls as ("added"|"removed", endpoint name) pairs."""

    def __init__(self, datastore: Datastore) -> None:
        self.calls: list[tuple[str, str]] = []
        datastore.on_added(lambda e: self.calls.append(("added", e.name)))
        datastore.on_removed(lambda e: self.calls.append(("removed", e.name)))

    def take(self) -> list[tuple[str, str]]:
        calls, self.calls = self.calls, []
        return calls


def spec(name: str, port: int = 8000, host: str = "10.0.0.1", **labels: str) -> EndpointSpec:
    return EndpointSpec(name, host, port, labels=dict(labels))


# --------------------------------------------------------------------------- datastore


def test_set_endpoints_adds_and_notifies() -> None:
    ds = Datastore()
    rec = Recorder(ds)
    ds.set_endpoints("p", [spec("a", 1), spec("b", 2)])
    assert [e.name for e in ds.pools["p"].endpoints] == ["a", "b"]
    assert rec.take() == [("added", "a"), ("added", "b")]
    a = ds.pools["p"].get("a")
    assert a is not None
    assert (a.host, a.port, a.pool, a.engine_type) == ("10.0.0.1", 1, "p", "vllm")


def test_set_endpoints_keeps_state_of_endpoints_that_stay() -> None:
    ds = Datastore()
    rec = Recorder(ds)
    ds.set_endpoints("p", [spec("a", 1), spec("b", 2)])
    rec.take()
    a = ds.pools["p"].endpoints[0]
    a.metrics = EngineMetrics(scraped_at=3.0, waiting=4)
    a.inflight.dispatch(100, 20)
    a.health.consecutive_failures = 2
    index = a.index

    ds.set_endpoints("p", [spec("c", 3), spec("a", 1, zone="z")])
    endpoints = ds.pools["p"].endpoints
    assert [e.name for e in endpoints] == ["a", "c"]  # kept first, then new
    assert endpoints[0] is a
    assert a.metrics is not None
    assert a.metrics.waiting == 4
    assert a.inflight.requests == 1
    assert a.health.consecutive_failures == 2
    assert a.index == index
    assert a.labels == {"zone": "z"}  # labels follow discovery
    assert rec.take() == [("removed", "b"), ("added", "c")]


def test_same_name_new_address_is_a_new_endpoint() -> None:
    ds = Datastore()
    rec = Recorder(ds)
    ds.set_endpoints("p", [spec("a", 1)])
    old = ds.pools["p"].endpoints[0]
    old.inflight.dispatch(1, 1)
    rec.take()
    ds.set_endpoints("p", [spec("a", 2)])
    new = ds.pools["p"].endpoints[0]
    assert new is not old
    assert new.port == 2
    assert new.inflight.requests == 0
    assert rec.take() == [("removed", "a"), ("added", "a")]


def test_unchanged_set_notifies_nobody() -> None:
    ds = Datastore()
    ds.set_endpoints("p", [spec("a", 1)])
    rec = Recorder(ds)
    ds.set_endpoints("p", [spec("a", 1)])
    assert rec.take() == []


def test_engine_type_follows_discovery() -> None:
    ds = Datastore()
    ds.set_endpoints("p", [EndpointSpec("a", "h", 1)])
    ds.set_endpoints("p", [EndpointSpec("a", "h", 1, engine_type="sglang")])
    assert ds.pools["p"].endpoints[0].engine_type == "sglang"


def test_indexes_are_unique_and_never_reused() -> None:
    ds = Datastore()
    ds.set_endpoints("p", [spec("a", 1), spec("b", 2)])
    ds.set_endpoints("q", [spec("c", 3)])
    ds.set_endpoints("p", [spec("b", 2), spec("d", 4)])
    indexes = [e.index for e in ds.all_endpoints()]
    assert len(set(indexes)) == len(indexes)
    assert ds.pools["p"].get("d") is not None
    d = ds.pools["p"].get("d")
    assert d is not None
    assert d.index == 3


def test_pools_are_independent() -> None:
    ds = Datastore()
    rec = Recorder(ds)
    ds.set_endpoints("p", [spec("a", 1)])
    ds.set_endpoints("q", [spec("a", 1)])  # same identity, other pool
    assert rec.take() == [("added", "a"), ("added", "a")]
    assert ds.pools["p"].endpoints[0] is not ds.pools["q"].endpoints[0]
    ds.set_endpoints("q", [])
    assert rec.take() == [("removed", "a")]
    assert len(ds.pools["p"].endpoints) == 1
    assert [e.pool for e in ds.all_endpoints()] == ["p"]


def test_remove_pool() -> None:
    ds = Datastore()
    rec = Recorder(ds)
    ds.set_endpoints("p", [spec("a", 1), spec("b", 2)])
    ds.set_endpoints("q", [spec("c", 3)])
    rec.take()
    ds.remove_pool("p")
    assert "p" not in ds.pools
    assert rec.take() == [("removed", "a"), ("removed", "b")]
    assert [e.name for e in ds.all_endpoints()] == ["c"]
    ds.remove_pool("never-existed")
    assert "never-existed" not in ds.pools
    assert rec.take() == []


def test_listeners_see_the_updated_pool() -> None:
    ds = Datastore()
    ds.set_endpoints("p", [spec("a", 1)])
    seen: list[list[str]] = []
    ds.on_added(lambda e: seen.append([x.name for x in ds.pools[e.pool].endpoints]))
    ds.on_removed(lambda e: seen.append([x.name for x in ds.pools[e.pool].endpoints]))
    ds.set_endpoints("p", [spec("b", 2)])
    assert seen == [["b"], ["b"]]


def test_pool_lookup_by_name_and_address() -> None:
    ds = Datastore()
    ds.set_endpoints("p", [spec("a", 8000), spec("v6", 8001, host="fd00::1")])
    pool = ds.pools["p"]
    assert pool.get("a") is pool.endpoints[0]
    assert pool.get("zz") is None
    assert pool.by_address("10.0.0.1:8000") is pool.endpoints[0]
    assert pool.by_address("[fd00::1]:8001") is pool.endpoints[1]
    assert pool.by_address("10.0.0.1:9999") is None
    assert ds.pool("new").endpoints == []  # pool() creates
    assert "new" in ds.pools


def test_duplicate_specs_collapse() -> None:
    ds = Datastore()
    ds.set_endpoints("p", [spec("a", 1), spec("a", 1)])
    assert len(ds.pools["p"].endpoints) == 1


# --------------------------------------------------------------------------- endpoint


@pytest.mark.parametrize(
    ("host", "port", "address"),
    [
        ("10.0.0.1", 8000, "10.0.0.1:8000"),
        ("vllm-0.svc.cluster.local", 80, "vllm-0.svc.cluster.local:80"),
        ("::1", 8000, "[::1]:8000"),
        ("fd00:10::2a", 9000, "[fd00:10::2a]:9000"),
    ],
)
def test_address_and_url(host: str, port: int, address: str) -> None:
    ep = Endpoint("e", host, port)
    assert ep.address == address
    assert ep.url == f"http://{address}"
    assert Endpoint("e", host, port, scheme="https").url == f"https://{address}"


def test_is_stale() -> None:
    ep = Endpoint("e", "h", 1)
    assert ep.is_stale(0.0, 1.0)  # never scraped
    ep.metrics = EngineMetrics(scraped_at=10.0)
    assert not ep.is_stale(10.0, 1.0)
    assert not ep.is_stale(11.0, 1.0)  # exactly the threshold is still fresh
    assert ep.is_stale(11.001, 1.0)
    assert ep.is_stale(1e9, 1.0)


def test_load_from_scrape_alone() -> None:
    ep = Endpoint(
        "e", "h", 1, metrics=EngineMetrics(scraped_at=0.0, waiting=3, running=5, kv_usage=0.4)
    )
    assert (ep.waiting, ep.running) == (3, 5)
    assert ep.kv_usage() == 0.4


def test_in_flight_raises_stale_counts() -> None:
    ep = Endpoint("e", "h", 1, metrics=EngineMetrics(scraped_at=0.0, waiting=1, running=2))
    for _ in range(3):
        ep.inflight.dispatch(10, 10)
    assert (ep.waiting, ep.running) == (1, 2)  # 3 in flight fit in what the scrape shows
    for _ in range(4):
        ep.inflight.dispatch(10, 10)
    # 7 in flight: at least 7 - running(2) = 5 wait, at least 7 - waiting(1) = 6 run.
    assert (ep.waiting, ep.running) == (5, 6)


def test_never_scraped_endpoint_does_not_look_idle() -> None:
    ep = Endpoint("e", "h", 1)
    assert ep.metrics is None
    assert ep.kv_usage() == 1.0  # counts as full
    assert ep.kv_usage(capacity_tokens=10**6) == 1.0
    assert ep.kv_capacity_tokens is None
    assert ep.is_stale(0.0, 1e9)
    ep.inflight.dispatch(50, 10)
    ep.inflight.dispatch(50, 10)
    # Everything the gateway sent is assumed to wait (and to run): never less than ours.
    assert ep.waiting == 2
    assert ep.running == 2


def test_kv_usage_adds_prompt_tokens_since_scrape() -> None:
    m = EngineMetrics(scraped_at=0.0, kv_usage=0.25, block_size=16, num_gpu_blocks=1000)
    ep = Endpoint("e", "h", 1, metrics=m)
    assert ep.kv_capacity_tokens == 16_000
    ep.inflight.dispatch(4000, 100)
    assert ep.kv_usage() == pytest.approx(0.5)
    assert ep.kv_usage(capacity_tokens=8000) == pytest.approx(0.75)  # explicit capacity wins
    ep.inflight.dispatch(20_000, 100)
    assert ep.kv_usage() == 1.0  # capped
    ep.inflight.scraped()
    assert ep.kv_usage() == 0.25  # the new scrape accounts for it


def test_kv_usage_without_capacity_uses_scrape_only() -> None:
    ep = Endpoint("e", "h", 1, metrics=EngineMetrics(scraped_at=0.0, kv_usage=0.3, block_size=16))
    ep.inflight.dispatch(10_000, 0)
    assert ep.kv_capacity_tokens is None
    assert ep.kv_usage() == 0.3
    assert ep.kv_usage(capacity_tokens=100_000) == pytest.approx(0.4)


def test_first_token_does_not_shrink_since_scrape_estimate() -> None:
    # Prefilled prompt tokens stay in the KV cache: released from the queue, not from KV.
    m = EngineMetrics(scraped_at=0.0, kv_usage=0.0, block_size=10, num_gpu_blocks=100)
    ep = Endpoint("e", "h", 1, metrics=m)
    ep.inflight.dispatch(500, 10)
    ep.inflight.first_token(500)
    assert ep.inflight.prompt_tokens == 0
    assert ep.kv_usage() == pytest.approx(0.5)


# --------------------------------------------------------------------------- InFlight


def test_inflight_lifecycle() -> None:
    f = InFlight()
    f.dispatch(100, 30)
    f.dispatch(50, 10)
    assert (f.requests, f.prompt_tokens, f.decode_tokens) == (2, 150, 40)
    assert (f.requests_since_scrape, f.prompt_tokens_since_scrape) == (2, 150)
    f.first_token(100)
    assert f.prompt_tokens == 50
    f.complete(0, 30)
    f.complete(50, 10)
    assert f == InFlight(requests_since_scrape=2, prompt_tokens_since_scrape=150)
    f.scraped()
    assert f == InFlight()


def test_inflight_splits_prefills_at_the_last_token() -> None:
    f = InFlight()
    first = f.prefill_queued(100)
    assert (f.prompt_tokens_before_last_token, f.prompt_tokens_after_last_token) == (0, 100)
    f.token(1.0)  # an iteration begins: the 100 tokens were there for it
    assert (f.prompt_tokens_before_last_token, f.prompt_tokens_after_last_token) == (100, 0)
    second = f.prefill_queued(40)
    third = f.prefill_queued(25)
    assert (f.prompt_tokens_before_last_token, f.prompt_tokens_after_last_token) == (100, 65)
    f.prefill_done(25, third)  # left before any token: it leaves the next iteration
    f.prefill_done(100, first)  # answered
    assert (f.prompt_tokens_before_last_token, f.prompt_tokens_after_last_token) == (0, 40)
    f.token(1.01)
    f.prefill_done(40, second)
    assert f == InFlight()


def test_inflight_chunks_of_one_burst_begin_one_iteration() -> None:
    f = InFlight()
    f.token(1.0)  # an iteration ends and the next begins
    queued = f.prefill_queued(100)  # arrives while the burst's chunks come in
    f.token(1.0 + SAME_ITERATION_S / 2)  # another chunk of the same burst
    assert (f.prompt_tokens_before_last_token, f.prompt_tokens_after_last_token) == (0, 100)
    f.token(1.01)  # the next iteration: the request was there for it
    assert (f.prompt_tokens_before_last_token, f.prompt_tokens_after_last_token) == (100, 0)
    f.prefill_done(100, queued)
    assert f == InFlight()


def test_inflight_token_times_iterations() -> None:
    f = InFlight()
    f.token(1.0)
    assert (f.last_token_at, f.token_interval_s) == (1.0, 0.0)
    f.token(1.0002)  # another chunk of the same iteration
    assert (f.last_token_at, f.token_interval_s) == (1.0002, 0.0)
    f.token(1.015)
    assert f.last_token_at == 1.015
    assert f.token_interval_s == pytest.approx(0.0148)
    assert f == InFlight()  # timing is not part of the accounting's equality


def test_inflight_token_bursts_of_many_streams_time_the_iteration() -> None:
    """32 streams' chunks of one iteration reach the gateway 40 µs apart (1.3 ms in all):
    the interval is the gap between bursts, not a gap inside one."""
    f = InFlight()
    for iteration in range(3):
        start = 1.0 + iteration * 0.020
        for k in range(32):
            f.token(start + k * 0.00004)
    burst = 31 * 0.00004
    assert f.token_interval_s == pytest.approx(0.020 - burst)
    assert f.last_token_at == pytest.approx(1.040 + burst)


def test_inflight_never_negative() -> None:
    f = InFlight()
    f.complete(10, 10)
    f.first_token(5)
    assert (f.requests, f.prompt_tokens, f.decode_tokens) == (0, 0, 0)
    f.dispatch(10, 10)
    f.complete(10, 10)
    f.complete(10, 10)  # released twice
    f.first_token(10)
    assert (f.requests, f.prompt_tokens, f.decode_tokens) == (0, 0, 0)


def test_inflight_random_sequences_stay_non_negative() -> None:
    rng = random.Random(7)
    f = InFlight()
    for _ in range(5000):
        op = rng.randrange(4)
        n = rng.randrange(0, 200)
        if op == 0:
            f.dispatch(n, rng.randrange(0, 200))
        elif op == 1:
            f.first_token(n)
        elif op == 2:
            f.complete(n, rng.randrange(0, 200))
        else:
            f.scraped()
        assert min(f.requests, f.prompt_tokens, f.decode_tokens) >= 0
        assert min(f.requests_since_scrape, f.prompt_tokens_since_scrape) >= 0
