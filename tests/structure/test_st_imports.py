"""The house rules of the import graph: no circles, arrows that point down the layers,
plugins that lean only on the framework, hosts that do not know particular plugins.

Layers, lowest first (a module may import its own package and lower layers only):

| rank | packages |
|---|---|
| 0 | ``api``, ``clock``, ``lax``, ``lazy``, ``tokens``, ``kv_wire``, ``errors``, ``instruments``, |
|   | ``upstream``, ``metric_buckets``, ``metric_names``, ``model_tokenizer`` |
| 1 | ``datalayer`` |
| 2 | ``framework``, ``k8s``, ``live_metrics`` |
| 3 | ``latency``, ``metrics``, ``tokenization`` |
| 4 | ``scheduling``, ``flowcontrol``, ``config_watch`` |
| 5 | ``builtins`` (the one composition point of the built-in plugins) |
| 6 | ``requestcontrol`` |
| 7 | ``runtime`` |
| 8 | ``gateway``, ``extproc`` |
| 9 | ``bench`` |
| 10 | ``cli`` |
| 11 | ``__main__`` |

``sim`` is a model server: it imports only rank-0 modules and itself.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
from import_graph import PACKAGE, SRC, cycles, import_graph

RANKS = {
    **dict.fromkeys(
        (
            "api",
            "clock",
            "lax",
            "lazy",
            "tokens",
            "kv_wire",
            "errors",
            "instruments",
            "upstream",
            "metric_buckets",
            "metric_names",
            "model_tokenizer",
        ),
        0,
    ),
    "datalayer": 1,
    **dict.fromkeys(("framework", "k8s", "live_metrics"), 2),
    **dict.fromkeys(("latency", "metrics", "tokenization"), 3),
    **dict.fromkeys(("scheduling", "flowcontrol", "config_watch"), 4),
    "builtins": 5,
    "requestcontrol": 6,
    "runtime": 7,
    **dict.fromkeys(("gateway", "extproc"), 8),
    "bench": 9,
    "cli": 10,
    "__main__": 11,
}
SIM = "sim"
PLUGIN_PACKAGES = (f"{PACKAGE}.scheduling.plugins", f"{PACKAGE}.flowcontrol.policies")
# Circles that are known and scheduled to go (each names its fix); a new one fails.
KNOWN_CIRCLES: list[list[str]] = []
# Arrows out of the simulator that are known and scheduled to go; a new one fails.
KNOWN_SIM_ARROWS: set[tuple[str, str]] = set()


def _package(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def _is_plugin(module: str) -> bool:
    return any(module.startswith(p + ".") for p in PLUGIN_PACKAGES)


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    return import_graph()


def test_every_package_has_a_layer(graph: dict[str, set[str]]) -> None:
    packages = {_package(m) for m in graph if m != PACKAGE}
    assert packages - set(RANKS) - {SIM} == set()


def test_no_new_import_circle(graph: dict[str, set[str]]) -> None:
    assert cycles(graph) == KNOWN_CIRCLES


def test_arrows_point_down_the_layers(graph: dict[str, set[str]]) -> None:
    known = {(a, b) for circle in KNOWN_CIRCLES for a in circle for b in circle if a != b}
    wrong = []
    for module, targets in sorted(graph.items()):
        source = _package(module)
        for target in sorted(targets):
            dest = _package(target)
            if not source or not dest or dest == source or (module, target) in known:
                continue
            if source == SIM:
                allowed = RANKS.get(dest) == 0 or (module, target) in KNOWN_SIM_ARROWS
            elif dest == SIM:
                allowed = RANKS[source] >= RANKS["gateway"]  # the embedded pool, the lab
            else:
                allowed = RANKS[dest] < RANKS[source]
            if not allowed:
                wrong.append(f"{module} → {target}")
    assert wrong == []


def test_rank_zero_and_the_simulator_need_nothing_above_even_for_types() -> None:
    """A rank-0 package (and ``sim``, which may use them) stands alone: not even an
    annotation names a higher layer, so it can be read, typed and moved without them."""
    wrong = [
        f"{module} → {target}"
        for module, targets in sorted(import_graph(type_checking=True).items())
        if RANKS.get(_package(module)) == 0 or _package(module) == SIM
        for target in sorted(targets)
        if _package(target) != _package(module) and RANKS.get(_package(target)) != 0
    ]
    assert wrong == []


def test_plugins_do_not_import_plugins(graph: dict[str, set[str]]) -> None:
    wrong = [
        f"{module} → {target}"
        for module, targets in sorted(graph.items())
        if _is_plugin(module)
        for target in sorted(targets)
        if _is_plugin(target)
    ]
    assert wrong == []


def test_only_the_composition_point_imports_plugins(graph: dict[str, set[str]]) -> None:
    """Hosts and the lab reach plugins through the registry, never by module."""
    wrong = [
        f"{module} → {target}"
        for module, targets in sorted(graph.items())
        if not _is_plugin(module) and module != f"{PACKAGE}.builtins"
        for target in sorted(targets)
        if _is_plugin(target)
    ]
    assert wrong == []


def test_importing_the_framework_loads_no_plugin() -> None:
    code = (
        "import sys, sluicegate.framework\n"
        "print('\\n'.join(sorted(m for m in sys.modules if m.startswith('sluicegate'))))"
    )
    loaded = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        env={"PYTHONPATH": str(SRC), "PATH": "/usr/bin:/bin"},
    ).stdout.split()
    allowed = (
        "sluicegate.framework",
        "sluicegate.clock",
        "sluicegate.datalayer",
        "sluicegate.lazy",
    )
    assert [m for m in loaded if m != PACKAGE and not m.startswith(allowed)] == []
    assert "sluicegate.datalayer.endpoint" in loaded
    assert not [m for m in loaded if m.startswith("sluicegate.datalayer.") and "endpoint" not in m]
