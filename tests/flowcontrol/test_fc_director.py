"""The Director with flow control: legacy shedding when it is off; queueing, pumping,
expiry and cancellation when it is on. A hand-built datastore (endpoints ``ep-0``… of pool
``pool``, never scraped unless a test says so), the ``default`` scheduling preset and a
:class:`ManualClock`; the director's hooks collect what leaves the queue."""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from typing import Any

import orjson
import pytest

from sluicegate.api.loader import build_config
from sluicegate.builtins import default_registry
from sluicegate.clock import ManualClock
from sluicegate.datalayer.datastore import Datastore, EndpointSpec
from sluicegate.datalayer.endpoint import Endpoint, EngineMetrics, ServedModels
from sluicegate.errors import GatewayError
from sluicegate.flowcontrol.config import POOL_ANNOTATION, build_flow_control
from sluicegate.framework import (
    PREFIX_MATCH,
    CycleState,
    ItemState,
    PluginContext,
    QueueItem,
    StateKey,
)
from sluicegate.requestcontrol.director import Director
from sluicegate.requestcontrol.dispatch import Dispatch
from sluicegate.requestcontrol.models import ModelTable
from sluicegate.requestcontrol.parse import parse_other, parse_request
from sluicegate.scheduling.config import build_scheduler, load_preset

REGISTRY = default_registry()

POOL = "pool"
FAIRNESS = "x-gateway-inference-fairness-id"
MODELS = {"critical": "Critical", "standard": "Standard", "sheddable": "Sheddable"}


def pool_doc(name: str = POOL, annotations: Mapping[str, str] | None = None) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": name}
    if annotations:
        metadata["annotations"] = dict(annotations)
    return {
        "apiVersion": "inference.networking.k8s.io/v1",
        "kind": "InferencePool",
        "metadata": metadata,
        "spec": {"targetPorts": [{"number": 8000}]},
    }


def model_doc(
    public: str, criticality: str, pool: str = POOL, target: str = "base"
) -> dict[str, Any]:
    return {
        "apiVersion": "inference.networking.x-k8s.io/v1alpha2",
        "kind": "InferenceModel",
        "metadata": {"name": public},
        "spec": {
            "modelName": public,
            "criticality": criticality,
            "poolRef": {"name": pool},
            "targetModels": [{"name": target}],
        },
    }


def picker_doc(plugins: Sequence[dict[str, Any]] = (), **fields: Any) -> dict[str, Any]:
    doc = load_preset("default").model_dump(by_alias=True, exclude_none=True)
    doc["plugins"] = [*doc["plugins"], *plugins]
    doc.update(fields)
    return doc


def gated(**fields: Any) -> dict[str, Any]:
    """An EndpointPickerConfig with the flowControl feature gate (and ``fields``)."""
    return picker_doc(featureGates=["flowControl"], **fields)


class _Recorder:
    """A ticket that records how its request left the queue."""

    def __init__(self, env: FlowEnv, name: str) -> None:
        self.env = env
        self.name = name

    def dispatched(self, item: QueueItem, dispatch: Dispatch) -> None:
        self.env.names_of[item] = self.name
        self.env.dispatched.append((item, dispatch))

    def rejected(self, item: QueueItem, error: GatewayError) -> None:
        self.env.names_of[item] = self.name
        self.env.rejected.append((item, error))


class FlowEnv:
    def __init__(
        self,
        picker: dict[str, Any] | None = None,
        endpoints: int = 2,
        pools: Mapping[str, Mapping[str, str]] | None = None,
    ) -> None:
        pools = pools if pools is not None else {POOL: {}}
        docs = [pool_doc(name, annotations) for name, annotations in pools.items()]
        first = next(iter(pools))
        docs += [model_doc(m, c, first) for m, c in MODELS.items()]
        docs += [model_doc(f"{m}@{p}", c, p) for p in pools for m, c in MODELS.items()]
        if picker is not None:
            docs.append(picker)
        self.config = build_config(docs)
        self.clock = ManualClock(1000.0)
        self.datastore = Datastore()
        for name in pools:
            prefix = "ep" if name == first else f"{name}-ep"
            self.datastore.set_endpoints(
                name,
                [EndpointSpec(f"{prefix}-{i}", "10.0.0.1", 8000 + i) for i in range(endpoints)],
            )
            self.datastore.pools[name].annotations = dict(
                self.config.pools[name].metadata.annotations
            )
        context = PluginContext(self.clock, 0)
        self.built = build_scheduler(self.config.picker, context, REGISTRY)
        flow = build_flow_control(self.config.picker, self.built.plugins, context, REGISTRY)
        self.director = Director(
            self.datastore, self.built, ModelTable(self.config), self.clock, 1.0, flow=flow
        )
        self.dispatched: list[tuple[QueueItem, Dispatch]] = []
        self.rejected: list[tuple[QueueItem, GatewayError]] = []
        self.names_of: dict[QueueItem, str] = {}
        self.direct: list[Dispatch] = []
        self._ids = itertools.count()
        for e in self.datastore.all_endpoints():
            e.models = ServedModels(frozenset({"base"}), frozenset(), self.clock.now())

    def endpoints(self, pool: str = POOL) -> list[Endpoint]:
        return self.datastore.pools[pool].endpoints

    def scrape_all(self, pool: str = POOL, age: float = 0.0, **fields: Any) -> None:
        for e in self.endpoints(pool):
            e.metrics = EngineMetrics(scraped_at=self.clock.now() - age, **fields)
            e.inflight.scraped()

    def scrape_as_running(self, pool: str = POOL) -> None:
        """A fresh scrape in which everything in flight is running (nothing waits)."""
        for e in self.endpoints(pool):
            e.metrics = EngineMetrics(scraped_at=self.clock.now(), running=e.inflight.requests)
            e.inflight.scraped()

    def submit(
        self,
        model: str,
        name: str | None = None,
        headers: Mapping[str, str] | None = None,
        state: CycleState | None = None,
    ) -> Dispatch | QueueItem:
        name = name or f"req-{next(self._ids)}"
        headers = dict(headers or {})
        body = {"model": model, "prompt": f"prompt of {name}", "max_tokens": 8}
        parsed = parse_request("completions", orjson.dumps(body), headers)
        admitted = self.director.admit(parsed, name, headers)
        result = self.director.submit(admitted, _Recorder(self, name), state)
        if isinstance(result, Dispatch):
            self.direct.append(result)
        return result

    def queued(self, model: str, name: str | None = None, **kw: Any) -> QueueItem:
        result = self.submit(model, name, **kw)
        assert isinstance(result, QueueItem)
        assert result.state is ItemState.QUEUED, name
        return result

    def at_once(self, model: str, name: str | None = None) -> QueueItem:
        """Submit a request that must leave the queue inside submit()."""
        result = self.submit(model, name)
        assert isinstance(result, QueueItem)
        assert result.state is ItemState.DISPATCHED, name
        return result

    def shed(self, model: str, reason: str = "rejected-saturated") -> GatewayError:
        with pytest.raises(GatewayError) as info:
            self.submit(model)
        assert info.value.status == 429
        assert info.value.reason == reason
        assert info.value.headers()["Retry-After"] == "1"
        return info.value

    def saturate(self, per_endpoint: int = 5) -> None:
        """Fresh idle metrics, then standard requests until no endpoint has room."""
        self.scrape_all()
        for _ in range(per_endpoint * len(self.endpoints())):
            self.at_once("standard", f"fill-{next(self._ids)}")
        assert self.waiting() == 0

    def names(self, start: int = 0) -> list[str]:
        return [self.names_of[item] for item, _ in self.dispatched[start:]]

    def finish(self, dispatch: Dispatch) -> None:
        dispatch.finish(self.clock.now())

    def finish_all(self) -> None:
        for _, dispatch in self.dispatched:
            self.finish(dispatch)
        for dispatch in self.direct:
            self.finish(dispatch)

    def waiting(self, pool: str = POOL) -> int:
        controller = self.director.controllers().get(pool)
        return controller.requests if controller is not None else 0

    def assert_balanced(self) -> None:
        for e in self.datastore.all_endpoints():
            assert (e.inflight.requests, e.inflight.prompt_tokens, e.inflight.decode_tokens) == (
                0,
                0,
                0,
            ), e.name


# ================================================================= flow control off


def test_off_sheds_only_sheddable_and_only_when_saturated() -> None:
    env = FlowEnv()
    env.scrape_all()
    assert isinstance(env.submit("sheddable"), Dispatch)  # idle pool: served
    env.scrape_all(waiting=5)  # every endpoint at 1.0
    err = env.shed("sheddable")
    assert err.message == "system saturated, sheddable request dropped"
    for model in ("standard", "critical"):  # the rest go on to the servers' queues
        for _ in range(3):
            assert isinstance(env.submit(model), Dispatch)
    # One endpoint idle again (what it holds is running): mean saturation 0.5, wherever
    # the random tie-breaks sent the requests above.
    idle = env.endpoints()[1]
    idle.metrics = EngineMetrics(scraped_at=env.clock.now(), running=idle.inflight.requests)
    assert isinstance(env.submit("sheddable"), Dispatch)
    env.scrape_all(age=5.0)  # stale metrics: saturated as far as the detector knows
    env.shed("sheddable")
    assert isinstance(env.submit("standard"), Dispatch)
    assert not env.director.controllers()
    assert env.dispatched == []
    assert env.rejected == []
    env.finish_all()
    env.assert_balanced()


def test_off_without_endpoints() -> None:
    env = FlowEnv()
    for e in env.endpoints():
        e.health.ejected = True
    with pytest.raises(GatewayError) as info:
        env.submit("standard")
    assert (info.value.status, info.value.reason) == (503, "no-endpoint")
    env.shed("sheddable")  # an empty pool counts as saturated


# ================================================================== flow control on


def test_on_dispatches_at_once_while_there_is_room_then_queues() -> None:
    env = FlowEnv(gated())
    env.scrape_all()
    for i in range(10):
        item = env.submit("standard", f"s{i}")
        assert isinstance(item, QueueItem)
        assert item.state is ItemState.DISPATCHED  # left the queue inside submit()
    assert env.names() == [f"s{i}" for i in range(10)]
    assert sorted(e.inflight.requests for e in env.endpoints()) == [5, 5]
    late = env.queued("standard", "late")  # 5 waiting (estimated) on each: no room
    assert env.waiting() == 1
    assert env.director.pump() == 0
    assert late.state is ItemState.QUEUED
    env.finish(env.dispatched[0][1])
    assert env.director.pump() == 1
    assert env.names(10) == ["late"]
    env.finish_all()
    env.assert_balanced()


def test_pump_after_capacity_frees_serves_critical_before_standard() -> None:
    env = FlowEnv(gated())
    env.saturate()
    for name in ("s1", "s2", "s3"):
        env.queued("standard", name)
    env.clock.advance(1.0)
    env.scrape_all()  # still nothing seen running: in-flight requests count as waiting
    for name in ("c1", "c2"):
        env.queued("critical", name)
    assert env.waiting() == 5
    start = len(env.dispatched)

    env.finish(env.dispatched[0][1])  # one place frees up
    assert env.director.pump() == 1
    assert env.names(start) == ["c1"]
    env.finish(env.dispatched[1][1])
    env.director.pump()
    assert env.names(start) == ["c1", "c2"]
    # A fresh scrape shows nothing waiting on the servers: room for everyone.
    env.scrape_as_running()
    assert env.director.pump() == 3
    assert env.names(start) == ["c1", "c2", "s1", "s2", "s3"]
    assert env.waiting() == 0
    assert env.rejected == []
    env.finish_all()
    env.assert_balanced()


def test_sheddable_is_shed_when_saturated_even_with_flow_control() -> None:
    env = FlowEnv(gated())
    env.saturate()
    env.queued("standard", "s1")
    env.queued("critical", "c1")
    env.shed("sheddable")
    assert env.waiting() == 2  # nothing queued for it
    # One place frees: the pool dips below 1.0, so a sheddable request is admitted — and
    # queued behind the higher bands, which take the place first.
    env.finish(env.dispatched[0][1])
    late = env.submit("sheddable", "d1")
    assert isinstance(late, QueueItem)
    assert late.state is ItemState.QUEUED
    assert env.names(10) == ["c1"]
    env.scrape_as_running()
    env.director.pump()
    assert env.names(10) == ["c1", "s1", "d1"]
    env.finish_all()
    env.assert_balanced()


def test_ttl_expiry_rejects_with_503() -> None:
    env = FlowEnv(gated(flowControl={"defaultRequestTTL": "10s"}))
    env.saturate()
    t0 = env.clock.now()
    critical = env.queued("critical", "c1")
    env.clock.advance(1.0)
    standard = env.queued("standard", "s1")
    assert critical.deadline == t0 + 10.0
    assert env.director.next_deadline() == t0 + 10.0
    env.clock.set(t0 + 9.999)
    assert env.director.expire() == 0
    env.clock.set(t0 + 10.0)
    assert env.director.expire() == 1
    item, err = env.rejected[0]
    assert item is critical
    assert item.state is ItemState.EXPIRED
    assert err.status == 503
    assert err.reason == "rejected-ttl-expired"
    assert err.code == "queue_timeout"
    assert err.message == "request timed out in queue"
    assert err.retry_after_s == 1
    body = orjson.loads(err.body())["error"]
    assert body["type"] == "service_unavailable"
    assert env.director.next_deadline() == t0 + 11.0
    env.clock.set(t0 + 20.0)
    assert env.director.expire() == 1
    assert env.rejected[1][0] is standard
    assert env.director.next_deadline() is None
    env.scrape_as_running()
    assert env.director.pump() == 0  # expired requests never leave later
    assert env.waiting() == 0
    env.finish_all()
    env.assert_balanced()


def test_cancel_removes_a_waiting_request() -> None:
    env = FlowEnv(gated())
    env.saturate()
    a = env.queued("critical", "a")
    b = env.queued("critical", "b")
    assert env.director.cancel(a)
    assert a.state is ItemState.CANCELLED
    assert not env.director.cancel(a)
    assert env.waiting() == 1
    env.scrape_as_running()
    env.director.pump()
    assert env.names(10) == ["b"]
    assert not env.director.cancel(b)  # already dispatched
    assert env.rejected == []
    env.clock.advance(3600.0)
    assert env.director.expire() == 0  # the cancelled one does not expire later
    env.finish_all()
    env.assert_balanced()


def test_capacity_rejection_is_429() -> None:
    env = FlowEnv(gated(flowControl={"maxRequests": 2}))
    env.saturate()
    env.queued("standard")
    env.queued("critical")
    err = env.shed("critical", reason="rejected-capacity")
    assert "full" in err.message
    assert env.waiting() == 2


def test_no_endpoints_is_a_503_at_once_and_queued_requests_are_answered() -> None:
    # A pool without endpoints can serve nothing until its endpoint set changes: new
    # requests are refused at once, queued ones as soon as the director is told.
    env = FlowEnv(gated(flowControl={"defaultRequestTTL": "30s"}))
    specs = [EndpointSpec(e.name, e.host, e.port) for e in env.endpoints()]
    first = env.queued("standard", "first")  # never scraped: no room yet
    assert env.director.reject_unservable() == 0
    env.datastore.set_endpoints(POOL, [])  # scaled to zero
    assert env.director.reject_unservable() == 1
    assert env.rejected[0][0] is first
    error = env.rejected[0][1]
    assert (error.status, error.code) == (503, "no_endpoint")
    assert "pool 'pool' has no endpoints" in error.message
    assert env.waiting() == 0
    assert env.director.expire(env.clock.now() + 60.0) == 0  # nothing left to time out
    with pytest.raises(GatewayError) as info:
        env.submit("critical", "refused")
    assert info.value.status == 503
    assert "pool 'pool' has no endpoints" in info.value.message
    env.datastore.set_endpoints(POOL, specs)  # scaled back up
    env.scrape_all()
    second = env.submit("critical", "second")
    assert isinstance(second, QueueItem)
    assert second.state is ItemState.DISPATCHED
    assert env.names() == ["second"]
    env.finish_all()
    env.assert_balanced()


def test_queued_request_answered_when_its_target_is_no_longer_listed() -> None:
    env = FlowEnv(gated())
    item = env.queued("standard", "waits")  # target "base", never scraped: no room
    for e in env.endpoints():
        e.models = ServedModels(frozenset({"other"}), frozenset(), env.clock.now())
    env.endpoints()[0].health.ejected = True  # ejected endpoints count: they come back
    assert env.director.reject_unservable() == 1
    assert env.rejected == [(item, env.rejected[0][1])]
    error = env.rejected[0][1]
    assert (error.status, error.reason) == (503, "model-not-served")
    assert "'standard'" in error.message  # the client's name, not the target
    assert "'base'" in error.detail
    assert "other" in error.detail


def test_queued_request_waits_while_some_endpoint_has_not_listed_its_models() -> None:
    env = FlowEnv(gated())
    item = env.queued("standard", "waits")
    env.endpoints()[0].models = ServedModels(frozenset({"other"}), frozenset(), 1.0)
    env.endpoints()[1].models = ServedModels()  # not listed yet
    assert env.director.reject_unservable() == 0
    assert item.state is ItemState.QUEUED


def test_stale_metrics_hold_requests_until_a_fresh_scrape() -> None:
    env = FlowEnv(gated())
    env.scrape_all(age=0.5)  # older than the detector's 200 ms
    item = env.queued("standard")
    env.scrape_all()
    assert env.director.pump() == 1
    assert item.state is ItemState.DISPATCHED
    env.finish_all()
    env.assert_balanced()


def test_round_robin_between_tenants_through_the_fairness_header() -> None:
    env = FlowEnv(
        gated(
            flowControl={
                "defaultPriorityBand": {"fairnessPolicyRef": "round-robin-fairness-policy"}
            }
        )
    )
    env.saturate()
    for i in range(6):
        env.queued("standard", f"a{i}", headers={FAIRNESS: "tenant-a"})
    for i in range(2):
        env.queued("standard", f"b{i}", headers={FAIRNESS: "tenant-b"})
    for k in range(8):  # one place at a time
        env.finish(env.dispatched[k][1])
        assert env.director.pump() == 1
    assert env.names(10) == ["a0", "b0", "a1", "b1", "a2", "a3", "a4", "a5"]
    env.finish_all()
    env.assert_balanced()


def test_concurrency_detector_limits_in_flight_requests() -> None:
    env = FlowEnv(
        gated(
            plugins=[
                {"name": "cap", "type": "concurrency-detector", "parameters": {"maxConcurrency": 2}}
            ],
            saturationDetector={"pluginRef": "cap"},
        )
    )
    # Never scraped: the concurrency detector does not need metrics.
    for i in range(6):
        env.submit("standard", f"r{i}")
    assert env.names() == ["r0", "r1", "r2", "r3"]
    assert env.waiting() == 2
    env.shed("sheddable")  # 4 of 4 in flight: saturated
    env.finish(env.dispatched[0][1])
    assert env.director.pump() == 1
    assert env.names()[-1] == "r4"
    env.finish_all()
    env.director.pump()
    env.finish_all()
    assert env.waiting() == 0
    env.assert_balanced()


def test_priority_holdback_keeps_the_last_places_for_critical() -> None:
    env = FlowEnv(gated(flowControl={"usageLimitPolicyPluginRef": "priority-holdback-policy"}))
    env.scrape_all()
    env.at_once("sheddable")  # an idle pool takes anything
    env.finish_all()
    # Below the protected priority the ceiling is 0.8: 4 waiting (of 5) fill an endpoint.
    for i in range(8):
        env.at_once("standard", f"s{i}")
    standard = env.queued("standard", "s-late")
    env.shed("sheddable")  # pool saturation 0.8 reaches the sheddable ceiling
    # Critical may go up to 1.0: the fifth place of each endpoint is its own.
    for name in ("c0", "c1"):
        env.at_once("critical", name)
    critical = env.queued("critical", "c-late")
    env.finish(env.dispatched[1][1])  # a standard request ends: the place goes to Critical
    assert env.director.pump() == 1
    assert critical.state is ItemState.DISPATCHED
    assert standard.state is ItemState.QUEUED
    env.scrape_as_running()
    env.director.pump()
    assert standard.state is ItemState.DISPATCHED
    env.finish_all()
    env.assert_balanced()


def test_pool_annotation_enables_flow_control_for_that_pool_only() -> None:
    env = FlowEnv(pools={"queued": {POOL_ANNOTATION: "true"}, "plain": {}})
    env.scrape_all("queued")
    env.scrape_all("plain")
    assert isinstance(env.submit("standard@plain"), Dispatch)
    item = env.submit("standard@queued")
    assert isinstance(item, QueueItem)
    assert item.state is ItemState.DISPATCHED
    assert set(env.director.controllers()) == {"queued"}
    env.finish_all()
    env.assert_balanced()


def test_settings_change_keeps_waiting_requests() -> None:
    env = FlowEnv(gated())
    env.saturate()
    waiting = env.queued("standard", "w")
    context = PluginContext(env.clock)
    env.director.set_flow(
        build_flow_control(
            build_config([gated(flowControl={"defaultRequestTTL": "1s"})]).picker,
            env.built.plugins,
            context,
            REGISTRY,
        )
    )
    assert env.waiting() == 1
    later = env.queued("standard", "later")
    assert later.deadline == env.clock.now() + 1.0
    env.scrape_as_running()
    env.director.pump()
    assert env.names(10) == ["w", "later"]
    assert waiting.state is ItemState.DISPATCHED


def test_turning_flow_control_off_bypasses_the_queue_and_drains_it() -> None:
    env = FlowEnv(gated())
    env.saturate()
    waiting = env.queued("standard", "w")
    context = PluginContext(env.clock)
    env.director.set_flow(
        build_flow_control(build_config([picker_doc()]).picker, {}, context, REGISTRY)
    )
    # New requests are scheduled at once (the servers queue them), not queued behind "w".
    assert isinstance(env.submit("standard", "new"), Dispatch)
    assert env.waiting() == 1
    env.scrape_as_running()
    env.director.pump()
    assert waiting.state is ItemState.DISPATCHED
    assert env.names(10) == ["w"]
    env.submit("standard", "after-drain")
    assert not env.director.controllers()  # the drained queue is gone
    env.finish_all()
    env.assert_balanced()


def test_a_queued_request_keeps_its_admission_state() -> None:
    """What was fetched for a request at admission (e.g. remote latency predictions) is in
    the state it is scheduled with when it leaves the queue."""
    env = FlowEnv(gated())
    env.saturate()
    marker: StateKey[str] = StateKey("test-marker")
    fetched = CycleState()
    fetched.put(marker, "fetched at admission")
    item = env.submit("standard", "w", state=fetched)
    assert isinstance(item, QueueItem)
    assert item.state is ItemState.QUEUED
    env.scrape_as_running()
    env.director.pump()
    (_, dispatch), *_ = [(i, d) for i, d in env.dispatched if i is item]
    assert dispatch.state.get(marker) == "fetched at admission"
    assert dispatch.state.get(PREFIX_MATCH) is not None  # producers ran again
    env.finish_all()
    env.assert_balanced()


def test_a_queued_model_less_request_is_not_unservable() -> None:
    # Every endpoint has listed its models; a request without a model (POST /tokenize
    # without one) serves on any of them, so a model-list change must not refuse it.
    env = FlowEnv(gated())
    parsed = parse_other(b'{"text": "hello"}', {"content-type": "application/json"}, False)
    admitted = env.director.admit(parsed, "model-less", {})
    item = env.director.submit(admitted, _Recorder(env, "model-less"), None)
    assert isinstance(item, QueueItem)
    assert item.state is ItemState.QUEUED
    assert env.director.reject_unservable() == 0
    assert env.rejected == []
