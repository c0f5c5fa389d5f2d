"""Flow-control plugins (saturation detectors, usage limit, policy registry) and
``build_flow_control`` from configuration text."""

from __future__ import annotations

import textwrap
from typing import Any

import pytest

from sluicegate.api.loader import ConfigError, parse_config
from sluicegate.builtins import default_registry
from sluicegate.clock import ManualClock
from sluicegate.datalayer.endpoint import Endpoint, EngineMetrics
from sluicegate.flowcontrol.config import (
    POOL_ANNOTATION,
    FlowControlSetup,
    build_flow_control,
)
from sluicegate.flowcontrol.policies.fairness import GlobalStrictFairness, RoundRobinFairness
from sluicegate.flowcontrol.policies.ordering import EdfOrdering, FcfsOrdering, SloDeadlineOrdering
from sluicegate.flowcontrol.policies.saturation import ConcurrencyDetector, UtilizationDetector
from sluicegate.flowcontrol.policies.usage_limit import (
    PriorityHoldbackPolicy,
    StaticUsageLimitPolicy,
)
from sluicegate.framework import PluginConfigError, PluginContext, SaturationDetector
from sluicegate.scheduling.config import build_scheduler, load_preset

REGISTRY = default_registry()

NOW = 1000.0
CTX = PluginContext(ManualClock(NOW))


def detector(type_name: str, **params: Any) -> SaturationDetector:
    plugin = REGISTRY.create(type_name, type_name, params, CTX)
    assert isinstance(plugin, SaturationDetector)
    return plugin


def endpoint(
    waiting: int = 0,
    running: int = 0,
    kv: float = 0.0,
    age: float | None = 0.0,
    inflight: int = 0,
    **metrics: Any,
) -> Endpoint:
    """An endpoint scraped ``age`` seconds ago (None: never), with ``inflight`` requests
    dispatched by the gateway before that scrape."""
    e = Endpoint("e", "10.0.0.1", 8000)
    if age is not None:
        e.metrics = EngineMetrics(
            scraped_at=NOW - age, waiting=waiting, running=running, kv_usage=kv, **metrics
        )
    for _ in range(inflight):
        e.inflight.dispatch(0, 0)
    e.inflight.scraped()
    return e


# ================================================================= utilization-detector


@pytest.mark.parametrize(
    ("waiting", "kv", "expected"),
    [
        (0, 0.0, 0.0),
        (2, 0.4, 0.5),  # max(2/5, 0.4/0.8)
        (4, 0.4, 0.8),
        (5, 0.0, 1.0),
        (10, 0.2, 2.0),
        (0, 0.8, 1.0),
        (1, 0.96, 1.2),
    ],
)
def test_utilization_formula(waiting: int, kv: float, expected: float) -> None:
    d = detector("utilization-detector")
    assert d.endpoint_saturation(endpoint(waiting, kv=kv), NOW) == pytest.approx(expected)


def test_utilization_thresholds_are_parameters() -> None:
    d = detector("utilization-detector", queueDepthThreshold=10, kvCacheUtilThreshold=0.5)
    assert d.endpoint_saturation(endpoint(5, kv=0.1), NOW) == pytest.approx(0.5)
    assert d.endpoint_saturation(endpoint(1, kv=0.4), NOW) == pytest.approx(0.8)


def test_utilization_counts_what_the_gateway_sent_since_the_scrape() -> None:
    d = detector("utilization-detector")
    # The scrape saw 3 running, nothing waiting; the gateway has 7 in flight there, so at
    # least 4 must be waiting.
    e = endpoint(waiting=0, running=3, inflight=7)
    assert e.waiting == 4
    assert d.endpoint_saturation(e, NOW) == pytest.approx(0.8)
    # Prompt tokens sent since the scrape raise the KV estimate (capacity 16·100 tokens).
    e = endpoint(kv=0.25, block_size=16, num_gpu_blocks=100)
    e.inflight.dispatch(800, 0)
    assert e.kv_usage() == pytest.approx(0.75)
    assert d.endpoint_saturation(e, NOW) == pytest.approx(0.75 / 0.8)


def test_utilization_staleness_threshold() -> None:
    d = detector("utilization-detector", metricsStalenessThreshold="200ms")
    assert isinstance(d, UtilizationDetector)
    assert d.params.metrics_staleness_threshold == pytest.approx(0.2)
    fresh, old, never = endpoint(age=0.15), endpoint(age=0.25), endpoint(age=None)
    assert d.usable(fresh, NOW)
    assert d.endpoint_saturation(fresh, NOW) == 0.0
    assert d.has_room(fresh, NOW)
    for stale in (old, never):
        assert not d.usable(stale, NOW)
        assert d.endpoint_saturation(stale, NOW) == 1.0
        assert not d.has_room(stale, NOW)
    relaxed = detector("utilization-detector", metricsStalenessThreshold="1s")
    assert relaxed.has_room(old, NOW)
    assert detector("utilization-detector").has_room(endpoint(age=0.19), NOW)  # default 200 ms
    assert not detector("utilization-detector").has_room(endpoint(age=0.21), NOW)


def test_utilization_has_room_limits() -> None:
    d = detector("utilization-detector")
    assert d.has_room(endpoint(4), NOW)
    assert not d.has_room(endpoint(5), NOW)
    assert d.has_room(endpoint(kv=0.79), NOW)
    assert not d.has_room(endpoint(kv=0.8), NOW)


def test_utilization_has_room_with_headroom() -> None:
    d = detector("utilization-detector", headroom=0.5)
    assert d.headroom == 0.5
    assert d.has_room(endpoint(7), NOW)  # queue limit 5·1.5 = 7.5
    assert not d.has_room(endpoint(8), NOW)
    assert d.has_room(endpoint(kv=0.99), NOW)  # KV limit min(1, 0.8·1.5) = 1.0
    # Regression: a full KV cache never has room, however large the headroom.
    assert not d.has_room(endpoint(kv=1.0), NOW)
    assert not detector("utilization-detector", headroom=3.0).has_room(endpoint(kv=1.0), NOW)


def test_utilization_has_room_under_a_usage_ceiling() -> None:
    d = detector("utilization-detector")
    assert d.has_room(endpoint(2), NOW, ceiling=0.5)  # queue limit 2.5
    assert not d.has_room(endpoint(3), NOW, ceiling=0.5)
    assert d.has_room(endpoint(kv=0.39), NOW, ceiling=0.5)  # KV limit 0.4
    assert not d.has_room(endpoint(kv=0.4), NOW, ceiling=0.5)
    roomy = detector("utilization-detector", headroom=1.0)
    assert roomy.has_room(endpoint(4), NOW, ceiling=0.5)  # 5·0.5·2 = 5
    assert not roomy.has_room(endpoint(5), NOW, ceiling=0.5)


def test_utilization_pool_saturation_is_the_mean() -> None:
    d = detector("utilization-detector")
    assert d.saturation([], NOW) == 1.0
    assert d.saturation([endpoint(0), endpoint(5)], NOW) == pytest.approx(0.5)
    assert d.saturation([endpoint(0), endpoint(age=10.0)], NOW) == pytest.approx(0.5)
    assert d.saturation([endpoint(10), endpoint(0), endpoint(kv=0.4)], NOW) == pytest.approx(
        (2.0 + 0.0 + 0.5) / 3
    )


def test_utilization_parameters_are_validated() -> None:
    for params in (
        {"queueDepthThreshold": 0},
        {"kvCacheUtilThreshold": 1.5},
        {"headroom": -0.1},
        {"metricsStalenessThreshold": "soon"},
        {"noSuchThing": 1},
    ):
        with pytest.raises(PluginConfigError):
            REGISTRY.create("utilization-detector", "d", params, CTX)


# ================================================================= concurrency-detector


def test_concurrency_detector_requests_mode() -> None:
    d = detector("concurrency-detector", maxConcurrency=4)
    assert isinstance(d, ConcurrencyDetector)
    assert d.params.concurrency_mode == "requests"
    assert d.endpoint_saturation(endpoint(inflight=2), NOW) == pytest.approx(0.5)
    assert d.has_room(endpoint(inflight=3), NOW)
    assert not d.has_room(endpoint(inflight=4), NOW)
    # It counts only the gateway's own requests: what the server reports does not matter,
    # nor does the age of the scrape.
    assert d.has_room(endpoint(waiting=50, kv=1.0, age=None, inflight=0), NOW)
    spare = detector("concurrency-detector", maxConcurrency=4, headroom=0.5)
    assert spare.has_room(endpoint(inflight=5), NOW)  # 4·1.5 = 6
    assert not spare.has_room(endpoint(inflight=6), NOW)
    assert d.has_room(endpoint(inflight=1), NOW, ceiling=0.5)
    assert not d.has_room(endpoint(inflight=2), NOW, ceiling=0.5)


def test_concurrency_detector_tokens_mode() -> None:
    d = detector("concurrency-detector", concurrencyMode="tokens", maxTokenConcurrency=1000)
    e = endpoint()
    e.inflight.dispatch(300, 200)
    assert d.endpoint_saturation(e, NOW) == pytest.approx(0.5)
    assert d.has_room(e, NOW)
    e.inflight.dispatch(0, 500)
    assert d.endpoint_saturation(e, NOW) == pytest.approx(1.0)
    assert not d.has_room(e, NOW)
    e.inflight.first_token(300)  # prefill done: its prompt tokens no longer count
    assert d.has_room(e, NOW)


def test_concurrency_pool_saturation_is_total_over_capacity() -> None:
    d = detector("concurrency-detector", maxConcurrency=10)
    assert d.saturation([], NOW) == 1.0
    assert d.saturation(
        [endpoint(inflight=10), endpoint(inflight=2), endpoint()], NOW
    ) == pytest.approx(12 / 30)
    defaults = detector("concurrency-detector")
    assert isinstance(defaults, ConcurrencyDetector)
    assert (defaults.params.max_concurrency, defaults.params.max_token_concurrency) == (
        100,
        1_000_000,
    )
    with pytest.raises(PluginConfigError):
        detector("concurrency-detector", concurrencyMode="bytes")


# ============================================================ usage limit and registry


def test_static_usage_limit() -> None:
    default = REGISTRY.create("static-usage-limit-policy", "u", None, CTX)
    assert isinstance(default, StaticUsageLimitPolicy)
    assert [default.ceiling(p) for p in (-10, 0, 100)] == [1.0, 1.0, 1.0]
    strict = REGISTRY.create("static-usage-limit-policy", "u", {"threshold": 0.8}, CTX)
    assert isinstance(strict, StaticUsageLimitPolicy)
    assert strict.ceiling(100) == 0.8
    with pytest.raises(PluginConfigError):
        REGISTRY.create("static-usage-limit-policy", "u", {"threshold": 0}, CTX)


def test_priority_holdback_policy() -> None:
    default = REGISTRY.create("priority-holdback-policy", "h", None, CTX)
    assert isinstance(default, PriorityHoldbackPolicy)
    assert [default.ceiling(p) for p in (100, 1, 0, -10)] == pytest.approx([1.0, 1.0, 0.8, 0.8])
    custom = REGISTRY.create(
        "priority-holdback-policy",
        "h",
        {"threshold": 0.9, "holdback": 0.5, "protectedPriority": 100},
        CTX,
    )
    assert isinstance(custom, PriorityHoldbackPolicy)
    assert custom.ceiling(100) == pytest.approx(0.9)
    assert custom.ceiling(99) == pytest.approx(0.45)
    for bad in ({"holdback": 1.0}, {"holdback": -0.1}, {"threshold": 0}):
        with pytest.raises(PluginConfigError):
            REGISTRY.create("priority-holdback-policy", "h", bad, CTX)


def test_priority_isolation_preset_builds() -> None:
    picker = load_preset("priority-isolation")
    built = build_scheduler(picker, CTX, REGISTRY)
    setup = build_flow_control(picker, built.plugins, CTX, REGISTRY)
    assert isinstance(setup.detector, UtilizationDetector)
    assert setup.detector.params.queue_depth_threshold == 1
    assert isinstance(setup.usage_limit, PriorityHoldbackPolicy)
    assert setup.usage_limit.ceiling(100) == 1.0
    assert setup.usage_limit.ceiling(0) == pytest.approx(0.95)
    assert not setup.enabled  # the preset does not turn flow control on by itself


def test_policies_are_registered_under_their_reference_names() -> None:
    types = REGISTRY.types()
    expected = {
        "utilization-detector": UtilizationDetector,
        "concurrency-detector": ConcurrencyDetector,
        "static-usage-limit-policy": StaticUsageLimitPolicy,
        "priority-holdback-policy": PriorityHoldbackPolicy,
        "fcfs-ordering-policy": FcfsOrdering,
        "edf-ordering-policy": EdfOrdering,
        "slo-deadline-ordering-policy": SloDeadlineOrdering,
        "global-strict-fairness-policy": GlobalStrictFairness,
        "round-robin-fairness-policy": RoundRobinFairness,
    }
    for name, cls in expected.items():
        assert types[name] is cls


# ================================================================ build_flow_control

HEADER = """\
apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
"""
PROFILE = """\
schedulingProfiles:
- name: default
  plugins:
  - {pluginRef: queue-scorer}
  - {pluginRef: max-score-picker}
"""
SCHEDULING_PLUGINS = """\
- type: queue-scorer
- type: max-score-picker
"""


def picker_text(plugins: str = "", rest: str = "", gates: str = "") -> str:
    return (
        HEADER
        + gates
        + "plugins:\n"
        + SCHEDULING_PLUGINS
        + textwrap.dedent(plugins)
        + PROFILE
        + textwrap.dedent(rest)
    )


def setup_from(text: str) -> tuple[FlowControlSetup, dict[str, Any]]:
    config = parse_config(text)
    built = build_scheduler(config.picker, CTX, REGISTRY)
    return build_flow_control(config.picker, built.plugins, CTX, REGISTRY), dict(built.plugins)


FULL = picker_text(
    gates="featureGates: [flowControl]\n",
    plugins="""\
    - name: sat
      type: utilization-detector
      parameters:
        queueDepthThreshold: 8
        kvCacheUtilThreshold: 0.9
        metricsStalenessThreshold: 500ms
        headroom: 0.2
    - name: rr
      type: round-robin-fairness-policy
    - name: limit
      type: static-usage-limit-policy
      parameters: {threshold: 0.9}
    """,
    rest="""\
    saturationDetector:
      pluginRef: sat
    flowControl:
      maxBytes: 10Gi
      maxRequests: 1000
      defaultRequestTTL: 1m30s
      usageLimitPolicyPluginRef: limit
      defaultPriorityBand: {maxBytes: 512Mi, maxRequests: 200}
      priorityBands:
      - {priority: 100, maxRequests: 50, orderingPolicyRef: edf-ordering-policy,
         fairnessPolicyRef: rr}
      - {priority: 0, maxBytes: 1G}
      - {priority: -10, orderingPolicyRef: slo-deadline-ordering-policy}
    """,
)


def test_build_flow_control_from_yaml() -> None:
    setup, plugins = setup_from(FULL)
    assert setup.enabled
    assert setup.detector is plugins["sat"]  # the configured instance, not a copy
    assert isinstance(setup.detector, UtilizationDetector)
    p = setup.detector.params
    assert (p.queue_depth_threshold, p.kv_cache_util_threshold) == (8, 0.9)
    assert p.metrics_staleness_threshold == pytest.approx(0.5)
    assert p.headroom == pytest.approx(0.2)
    assert setup.usage_limit is plugins["limit"]
    assert setup.usage_limit.ceiling(0) == pytest.approx(0.9)

    s = setup.settings
    assert s.max_bytes == 10 * 1024**3
    assert s.max_requests == 1000
    assert s.default_ttl_s == pytest.approx(90.0)
    assert (s.default_band.limits.max_bytes, s.default_band.limits.max_requests) == (
        512 * 1024**2,
        200,
    )
    assert isinstance(s.default_band.ordering, FcfsOrdering)
    assert isinstance(s.default_band.fairness, GlobalStrictFairness)
    assert sorted(s.bands) == [-10, 0, 100]

    critical = s.policy(100)
    assert critical.limits.max_requests == 50
    assert critical.limits.max_bytes == 512 * 1024**2  # from the default band
    assert isinstance(critical.ordering, EdfOrdering)  # created from its type name
    assert critical.fairness is plugins["rr"]

    standard = s.policy(0)
    assert (standard.limits.max_bytes, standard.limits.max_requests) == (1_000_000_000, 200)
    assert standard.ordering is s.default_band.ordering
    assert isinstance(s.policy(-10).ordering, SloDeadlineOrdering)
    assert s.policy(7) is s.default_band  # an unconfigured priority


def test_defaults_without_configuration() -> None:
    for setup in (
        build_flow_control(None, {}, CTX, REGISTRY),
        setup_from(picker_text())[0],
    ):
        assert not setup.enabled
        assert isinstance(setup.detector, UtilizationDetector)
        assert setup.detector.params.queue_depth_threshold == 5
        assert setup.detector.params.kv_cache_util_threshold == 0.8
        assert setup.detector.params.metrics_staleness_threshold == pytest.approx(0.2)
        assert setup.usage_limit.ceiling(0) == 1.0
        s = setup.settings
        assert (s.max_requests, s.max_bytes) == (None, None)
        assert s.default_ttl_s == 60.0
        assert s.default_band.limits.max_bytes == 1_000_000_000
        assert s.default_band.limits.max_requests is None
        assert isinstance(s.default_band.ordering, FcfsOrdering)
        assert isinstance(s.default_band.fairness, GlobalStrictFairness)
        assert not s.bands


def test_detector_named_by_type_and_concurrency_parameters() -> None:
    setup, _ = setup_from(
        picker_text(
            plugins="""\
            - type: concurrency-detector
              parameters: {concurrencyMode: tokens, maxTokenConcurrency: 4096}
            """,
            rest="saturationDetector: {pluginRef: concurrency-detector}\n",
        )
    )
    assert isinstance(setup.detector, ConcurrencyDetector)
    assert setup.detector.params.concurrency_mode == "tokens"
    assert setup.detector.params.max_token_concurrency == 4096
    # A reference to a type that is not configured creates one with its defaults.
    setup, _ = setup_from(
        picker_text(rest="saturationDetector: {pluginRef: concurrency-detector}\n")
    )
    assert isinstance(setup.detector, ConcurrencyDetector)
    assert setup.detector.params.max_concurrency == 100


@pytest.mark.parametrize("ttl", ['"0s"', "0", "null"])
def test_zero_or_null_ttl_waits_forever(ttl: str) -> None:
    setup, _ = setup_from(picker_text(rest=f"flowControl: {{defaultRequestTTL: {ttl}}}\n"))
    assert setup.settings.default_ttl_s is None


@pytest.mark.parametrize(
    ("rest", "plugins", "needle"),
    [
        # A configured plugin of the wrong kind.
        ("saturationDetector: {pluginRef: queue-scorer}\n", "", "not a SaturationDetector"),
        (
            "flowControl: {priorityBands: [{priority: 1, orderingPolicyRef: rr}]}\n",
            "- {name: rr, type: round-robin-fairness-policy}\n",
            "not a OrderingPolicy",
        ),
        (
            "flowControl: {defaultPriorityBand: {fairnessPolicyRef: fcfs-ordering-policy}}\n",
            "",
            "not a FairnessPolicy",
        ),
        (
            "flowControl: {usageLimitPolicyPluginRef: utilization-detector}\n",
            "",
            "not a UsageLimitPolicy",
        ),
        # Unknown names.
        ("saturationDetector: {pluginRef: no-such-detector}\n", "", "unknown plugin type"),
        (
            "flowControl: {priorityBands: [{priority: 1, fairnessPolicyRef: fair-share}]}\n",
            "",
            "unknown plugin type",
        ),
    ],
)
def test_wrong_references_are_plugin_config_errors(rest: str, plugins: str, needle: str) -> None:
    with pytest.raises(PluginConfigError, match=needle):
        setup_from(picker_text(plugins=plugins, rest=rest))


@pytest.mark.parametrize(
    ("rest", "needle"),
    [
        ("flowControl: {defaultRequestTTL: 5 parsecs}\n", "invalid duration"),
        ("flowControl: {maxBytes: 10 gigs}\n", "invalid size"),
        ("flowControl: {maxRequests: 0}\n", "maxRequests"),
        ("flowControl: {priorityBands: [{maxRequests: 5}]}\n", "needs a priority"),
        (
            "flowControl: {priorityBands: [{priority: 1}, {priority: 1}]}\n",
            "must be unique",
        ),
        ("flowControl: {maxQueue: 5}\n", "maxQueue"),
    ],
)
def test_invalid_flow_control_sections_are_config_errors(rest: str, needle: str) -> None:
    with pytest.raises(ConfigError, match=needle):
        parse_config(picker_text(rest=rest))


def test_pool_annotation_turns_flow_control_on_for_that_pool() -> None:
    config = parse_config(
        textwrap.dedent(
            f"""\
            apiVersion: inference.networking.k8s.io/v1
            kind: InferencePool
            metadata:
              name: queued
              annotations:
                {POOL_ANNOTATION}: "true"
            spec:
              targetPorts: [{{number: 8000}}]
            ---
            apiVersion: inference.networking.k8s.io/v1
            kind: InferencePool
            metadata: {{name: plain}}
            spec:
              targetPorts: [{{number: 8000}}]
            """
        )
    )
    setup = build_flow_control(config.picker, {}, CTX, REGISTRY)
    assert not setup.enabled
    assert setup.enabled_for(config.pools["queued"].metadata.annotations)
    assert not setup.enabled_for(config.pools["plain"].metadata.annotations)
    assert setup.enabled_for({POOL_ANNOTATION: "True"})
    assert not setup.enabled_for({POOL_ANNOTATION: "false"})
    assert not setup.enabled_for({POOL_ANNOTATION: ""})
    gated, _ = setup_from(picker_text(gates="featureGates: [flowControl]\n"))
    assert gated.enabled_for({})
    assert gated.enabled_for({POOL_ANNOTATION: "false"})  # the gate covers every pool
    other_gate, _ = setup_from(picker_text(gates="featureGates: [somethingElse]\n"))
    assert not other_gate.enabled_for({})
