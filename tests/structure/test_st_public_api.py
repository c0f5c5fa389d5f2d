"""The declared public API of the top-level package and the framework layer, pinned: a
name added or removed here is a decision, made in this file."""

from __future__ import annotations

import importlib

import pytest

import sluicegate
import sluicegate.framework

TOP_LEVEL = [
    "Config",
    "ConfigError",
    "Gateway",
    "GatewayError",
    "GatewayOptions",
    "Runtime",
    "RuntimeOptions",
    "__version__",
    "default_registry",
    "load_config",
    "parse_config",
]

FRAMEWORK = [
    "ENTRY_POINT_GROUP",
    "PREDICTIONS",
    "PREDICTION_OUTCOME",
    "PREDICTOR_SERVICE",
    "PREFIX_MATCH",
    "PREFIX_PRODUCER_TYPE",
    "RESPONSE_HEADERS",
    "Admitter",
    "AsyncDataProducer",
    "Band",
    "BandLimits",
    "CycleState",
    "DataProducer",
    "EndpointObserver",
    "EndpointPrediction",
    "FairnessPolicy",
    "Filter",
    "FlowQueue",
    "ItemState",
    "LLMRequest",
    "OrderingPolicy",
    "Picker",
    "PickerParameters",
    "Plugin",
    "PluginConfigError",
    "PluginContext",
    "PluginParameters",
    "PluginRegistry",
    "PreRequest",
    "PredictionOutcome",
    "PredictionStatus",
    "PrefixIndexer",
    "PrefixMatch",
    "ProfileHandler",
    "ProfileResult",
    "QueueItem",
    "ResponseObserver",
    "ResponseOutcome",
    "ReuseDistances",
    "SaturationDetector",
    "SchedulerProfileLike",
    "SchedulingError",
    "SchedulingResult",
    "ScoredEndpoint",
    "Scorer",
    "StateKey",
    "UsageLimitPolicy",
]


@pytest.mark.parametrize(
    ("module", "expected"), [(sluicegate, TOP_LEVEL), (sluicegate.framework, FRAMEWORK)]
)
def test_exported_names_are_pinned(module: object, expected: list[str]) -> None:
    assert sorted(module.__all__) == sorted(expected)  # type: ignore[attr-defined]


@pytest.mark.parametrize("name", TOP_LEVEL)
def test_every_top_level_name_resolves(name: str) -> None:
    assert getattr(sluicegate, name) is not None


def test_framework_names_come_from_its_own_modules() -> None:
    for name in FRAMEWORK:
        value = getattr(sluicegate.framework, name)
        origin = getattr(value, "__module__", "sluicegate.framework")
        if isinstance(value, type):
            assert origin.startswith("sluicegate.framework"), name


def test_unknown_top_level_name_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no attribute 'Nope'"):
        importlib.import_module("sluicegate").Nope  # noqa: B018
