"""The plugin registry and the scheduler builder (configuration → wired plugins)."""

from __future__ import annotations

from typing import Any

import pytest

from sluicegate.api.resources import EndpointPickerConfig
from sluicegate.builtins import default_registry
from sluicegate.framework import (
    CycleState,
    PluginConfigError,
    PluginContext,
    PluginRegistry,
    Scorer,
)
from sluicegate.scheduling.config import (
    BuiltScheduler,
    build_scheduler,
    load_preset,
    preset_names,
)
from sluicegate.scheduling.plugins.max_score_picker import MaxScorePicker
from sluicegate.scheduling.plugins.prefix_cache import ApproxPrefixCacheProducer
from sluicegate.scheduling.plugins.single_profile_handler import SingleProfileHandler

REGISTRY = default_registry()

BUILTIN_TYPES = {
    "active-request-scorer",
    "approx-prefix-cache-producer",
    "kv-cache-utilization-scorer",
    "least-request",
    "load-aware-scorer",
    "lora-affinity-scorer",
    "max-score-picker",
    "prefix-cache-scorer",
    "queue-scorer",
    "random-picker",
    "round-robin",
    "running-requests-size-scorer",
    "session-affinity-scorer",
    "single-profile-handler",
    "token-load-scorer",
    "weighted-random-picker",
}


def _config(plugins: list[dict[str, Any]], profiles: list[dict[str, Any]]) -> EndpointPickerConfig:
    return EndpointPickerConfig.model_validate(
        {
            "apiVersion": "inference.networking.x-k8s.io/v1alpha1",
            "kind": "EndpointPickerConfig",
            "plugins": plugins,
            "schedulingProfiles": profiles,
        }
    )


# --------------------------------------------------------------------------- registry


def test_builtin_types_registered() -> None:
    types = REGISTRY.types()
    assert set(types) >= BUILTIN_TYPES
    for name, cls in types.items():
        assert cls.type_name == name
        doc = __import__(cls.__module__, fromlist=["_"]).__doc__
        assert doc, f"{name}: module docstring missing"
        assert name in doc, f"{name}: module docstring does not name the type"


def test_unknown_type_lists_known_ones(ctx: PluginContext) -> None:
    with pytest.raises(PluginConfigError, match="unknown plugin type 'nope'") as info:
        REGISTRY.create("nope", "x", None, ctx)
    for name in ("queue-scorer", "round-robin", "weighted-random-picker"):
        assert name in str(info.value)


def test_bad_parameter_value_names_plugin_and_field(ctx: PluginContext) -> None:
    with pytest.raises(PluginConfigError) as info:
        REGISTRY.create("load-aware-scorer", "my-load", {"threshold": "many"}, ctx)
    message = str(info.value)
    assert "'my-load'" in message
    assert "load-aware-scorer" in message
    assert "threshold" in message


@pytest.mark.parametrize(
    ("type_name", "parameters", "field"),
    [
        ("token-load-scorer", {"queueThresholdTokens": 0}, "queueThresholdTokens"),
        ("prefix-cache-scorer", {"matchLengthWeight": 2}, "matchLengthWeight"),
        ("max-score-picker", {"maxNumOfEndpoints": -1}, "maxNumOfEndpoints"),
        ("active-request-scorer", {"idleThreshold": -1}, "idleThreshold"),
    ],
)
def test_out_of_range_parameters_rejected(
    type_name: str, parameters: dict[str, Any], field: str, ctx: PluginContext
) -> None:
    with pytest.raises(PluginConfigError, match=field):
        REGISTRY.create(type_name, "p", parameters, ctx)


def test_unknown_parameter_key_rejected(ctx: PluginContext) -> None:
    with pytest.raises(PluginConfigError, match="thresold"):
        REGISTRY.create("load-aware-scorer", "p", {"thresold": 3}, ctx)
    with pytest.raises(PluginConfigError, match="anything"):
        REGISTRY.create("queue-scorer", "p", {"anything": 1}, ctx)


def test_parameters_by_camel_or_snake_name(ctx: PluginContext) -> None:
    camel = REGISTRY.create("token-load-scorer", "a", {"queueThresholdTokens": 7}, ctx)
    snake = REGISTRY.create("token-load-scorer", "b", {"queue_threshold_tokens": 7}, ctx)
    default = REGISTRY.create("token-load-scorer", "c", None, ctx)
    assert camel.params == snake.params
    assert default.params.queue_threshold_tokens == 4_194_304  # type: ignore[attr-defined]


def test_register_aliases_and_conflicts(ctx: PluginContext) -> None:
    registry = PluginRegistry()

    class Probe(Scorer):
        type_name = "probe-scorer"
        aliases = ("old-name",)

        def score(self, request: Any, state: CycleState, endpoints: Any) -> list[float]:
            return [0.5] * len(endpoints)

    registry.register(Probe)
    registry.register(Probe)  # the same class again: nothing changes
    assert type(registry.create("old-name", "p", None, ctx)) is Probe
    assert list(registry.types()) == ["probe-scorer"]

    class Clash(Probe):
        pass

    with pytest.raises(TypeError, match="already registered by Probe"):
        registry.register(Clash)

    class Nameless(Probe):
        type_name = ""

    with pytest.raises(TypeError, match="no type_name"):
        registry.register(Nameless)

    class Squatter(Probe):
        type_name = "squatter"
        aliases = ("old-name",)

    with pytest.raises(TypeError, match="alias 'old-name' is already taken"):
        registry.register(Squatter)
    with pytest.raises(TypeError, match="not a Plugin subclass"):
        registry.register(int)  # type: ignore[arg-type]


def test_registries_are_independent(ctx: PluginContext) -> None:
    """A registry is an object, not a process-wide table: what one holds, another need not."""
    assert "queue-scorer" not in PluginRegistry().types()
    assert "queue-scorer" in REGISTRY.types()


# --------------------------------------------------------------------------- builder


def _weights(built: BuiltScheduler, profile: str = "default") -> list[tuple[str, float]]:
    return [(ws.scorer.type_name, ws.weight) for ws in built.scheduler.profiles[profile].scorers]


def test_default_preset_wiring(ctx: PluginContext) -> None:
    built = build_scheduler(None, ctx, REGISTRY)
    scheduler = built.scheduler
    assert list(scheduler.profiles) == ["default"]
    assert _weights(built) == [
        ("queue-scorer", 2.0),
        ("kv-cache-utilization-scorer", 2.0),
        ("prefix-cache-scorer", 3.0),
    ]
    profile = scheduler.profiles["default"]
    assert isinstance(profile.picker, MaxScorePicker)
    assert profile.filters == []
    assert isinstance(scheduler.profile_handler, SingleProfileHandler)
    (producer,) = scheduler.producers
    assert isinstance(producer, ApproxPrefixCacheProducer)
    assert scheduler.pre_request == [producer]
    # told when an endpoint leaves: the prefix index, and the scorers' capacity state
    assert sorted(p.type_name for p in built.observers) == [
        "approx-prefix-cache-producer",
        "kv-cache-utilization-scorer",
        "queue-scorer",
    ]
    assert producer in built.observers
    assert built.plugins["approx-prefix-cache-producer"] is producer
    assert producer.context.lookup is built.plugins
    assert ctx.lookup == {}  # the caller's context is left alone


def test_producer_auto_created_for_prefix_scorer(ctx: PluginContext) -> None:
    config = _config(
        [{"type": "prefix-cache-scorer", "name": "prefix"}],
        [{"name": "p", "plugins": [{"pluginRef": "prefix"}]}],
    )
    built = build_scheduler(config, ctx, REGISTRY)
    assert [type(p) for p in built.scheduler.producers] == [ApproxPrefixCacheProducer]
    assert _weights(built, "p") == [("prefix-cache-scorer", 1.0)]  # unweighted → 1.0


def test_configured_producer_is_not_duplicated(ctx: PluginContext) -> None:
    config = _config(
        [
            {"type": "prefix-cache-scorer"},
            {
                "type": "approx-prefix-cache-producer",
                "name": "my-producer",
                "parameters": {"blockSizeTokens": 128},
            },
        ],
        [{"name": "p", "plugins": [{"pluginRef": "prefix-cache-scorer", "weight": 3}]}],
    )
    built = build_scheduler(config, ctx, REGISTRY)
    (producer,) = built.scheduler.producers
    assert producer is built.plugins["my-producer"]
    assert producer.params.block_size_tokens == 128  # type: ignore[attr-defined]


def test_picker_auto_created(ctx: PluginContext) -> None:
    config = _config(
        [{"type": "queue-scorer"}], [{"name": "p", "plugins": [{"pluginRef": "queue-scorer"}]}]
    )
    built = build_scheduler(config, ctx, REGISTRY)
    picker = built.scheduler.profiles["p"].picker
    assert isinstance(picker, MaxScorePicker)
    assert built.plugins["p-max-score-picker"] is picker


def test_weight_on_non_scorer_rejected(ctx: PluginContext) -> None:
    config = _config(
        [{"type": "random-picker"}],
        [{"name": "p", "plugins": [{"pluginRef": "random-picker", "weight": 2}]}],
    )
    with pytest.raises(PluginConfigError, match="not a scorer"):
        build_scheduler(config, ctx, REGISTRY)


def test_two_pickers_in_a_profile_rejected(ctx: PluginContext) -> None:
    config = _config(
        [{"type": "random-picker"}, {"type": "round-robin"}],
        [{"name": "p", "plugins": [{"pluginRef": "random-picker"}, {"pluginRef": "round-robin"}]}],
    )
    with pytest.raises(PluginConfigError, match="more than one picker"):
        build_scheduler(config, ctx, REGISTRY)


def test_multiple_profiles_need_a_handler(ctx: PluginContext) -> None:
    config = _config(
        [{"type": "queue-scorer"}],
        [
            {"name": "a", "plugins": [{"pluginRef": "queue-scorer"}]},
            {"name": "b", "plugins": [{"pluginRef": "queue-scorer"}]},
        ],
    )
    with pytest.raises(PluginConfigError, match="profile handler"):
        build_scheduler(config, ctx, REGISTRY)


def test_no_profiles_rejected(ctx: PluginContext) -> None:
    with pytest.raises(PluginConfigError, match="no schedulingProfiles"):
        build_scheduler(_config([{"type": "queue-scorer"}], []), ctx, REGISTRY)


def test_bad_plugin_in_config_names_it(ctx: PluginContext) -> None:
    config = _config(
        [{"type": "load-aware-scorer", "name": "la", "parameters": {"threshold": 0}}],
        [{"name": "p", "plugins": [{"pluginRef": "la"}]}],
    )
    with pytest.raises(PluginConfigError, match=r"'la'.*threshold"):
        build_scheduler(config, ctx, REGISTRY)


def test_unknown_preset_lists_known_ones() -> None:
    with pytest.raises(PluginConfigError, match=r"known presets: .*default"):
        load_preset("fastest")


def test_shipped_presets() -> None:
    assert {"default", "least-request", "random", "round-robin"} <= set(preset_names())


@pytest.mark.parametrize("name", preset_names())
def test_every_preset_builds_and_schedules(
    name: str, ctx: PluginContext, make_endpoint: Any, make_request: Any
) -> None:
    built = build_scheduler(load_preset(name), ctx, REGISTRY)
    endpoints = [make_endpoint(i, waiting=i) for i in range(3)]
    request, state = make_request("hello " * 100), CycleState()
    built.scheduler.prepare(request, state, endpoints)
    result = built.scheduler.schedule(request, state, endpoints)
    assert result.targets
    assert result.targets[0] in endpoints
    built.scheduler.notify_pre_request(request, state, result)
