"""The declared public API of the top-level package and the framework layer, pinned: a
name added or removed here is a decision, made in this file."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest
from import_graph import PACKAGE, SRC

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
    "PREFETCH_PASS",
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


# Every package declares what it exports; only the two above are pinned name by name.
PLUGIN_NAMESPACES = ("sluicegate.scheduling.plugins", "sluicegate.flowcontrol.policies")


def _packages() -> list[str]:
    root = SRC / PACKAGE
    return sorted(
        ".".join(init.parent.relative_to(SRC).parts) for init in root.rglob("__init__.py")
    )


def _lazy_packages() -> list[str]:
    """The packages whose ``__init__`` maps names to modules (``_EXPORTS``), read from the
    source so that finding them imports nothing."""
    return [
        name
        for name in _packages()
        if "_EXPORTS = {" in (SRC / name.replace(".", "/") / "__init__.py").read_text()
    ]


def test_the_package_list_is_found() -> None:
    packages = _packages()
    assert {PACKAGE, "sluicegate.framework", "sluicegate.gateway.http"} <= set(packages)
    assert len(_lazy_packages()) >= 2


@pytest.mark.parametrize("name", _packages())
def test_every_package_declares_its_exports(name: str) -> None:
    package = importlib.import_module(name)
    exported = getattr(package, "__all__", None)
    assert isinstance(exported, list), f"{name} declares no __all__"
    assert all(isinstance(n, str) for n in exported), name
    assert len(exported) == len(set(exported)), f"{name}: duplicate names in __all__"
    missing = [n for n in exported if not hasattr(package, n)]
    assert missing == [], f"{name}: __all__ names that do not resolve"
    if name in PLUGIN_NAMESPACES:
        assert exported == [], f"{name} is a plugin namespace and exports nothing"
    mapping = getattr(package, "_EXPORTS", None)
    if mapping is not None:  # lazy: nothing importable that is not declared, and vice versa
        assert set(mapping) == set(exported) - {"__version__"}, name


@pytest.mark.parametrize("name", _lazy_packages())
def test_lazy_packages_refuse_unknown_names(name: str) -> None:
    with pytest.raises(AttributeError, match="no attribute 'Nope'"):
        importlib.import_module(name).Nope  # noqa: B018


def test_importing_a_lazy_package_loads_none_of_its_modules() -> None:
    """``import sluicegate.<package>`` runs for every import of one of its modules, so a
    lazy ``__init__`` must import nothing of its own until a name is asked for."""
    lazy = _lazy_packages()
    code = (
        "import importlib, sys\n"
        f"for name in {lazy!r}: importlib.import_module(name)\n"
        "print('\\n'.join(sorted(m for m in sys.modules if m.startswith('sluicegate'))))"
    )
    loaded = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        env={"PYTHONPATH": str(SRC), "PATH": "/usr/bin:/bin"},
    ).stdout.split()
    assert sorted(loaded) == sorted([*lazy, "sluicegate.lazy"])  # and the helper they share
