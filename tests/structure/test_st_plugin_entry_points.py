"""Plugins from other distributions: declared under the ``sluicegate.plugins`` entry-point
group, registered by type name, wired from YAML like any built-in.

The test writes a tiny installed distribution (a module and its ``.dist-info`` with an
``entry_points.txt``) into a temporary folder on ``sys.path``, which is how
``importlib.metadata`` finds installed distributions.
"""

from __future__ import annotations

import logging
import textwrap
from pathlib import Path

import pytest

from sluicegate.api.loader import parse_config
from sluicegate.builtins import BUILTIN_PLUGINS, default_registry
from sluicegate.framework import ENTRY_POINT_GROUP
from sluicegate.requestcontrol.parse import parse_request
from sluicegate.runtime import Runtime

PLUGIN_MODULE = '''
from sluicegate.framework import Scorer


class FavouriteScorer(Scorer):
    """Scores one endpoint, named by its ``favourite`` parameter, 1 and the others 0."""

    type_name = "favourite-scorer"

    class Parameters(Scorer.Parameters):
        favourite: str = ""

    def score(self, request, state, endpoints):
        return [1.0 if e.name == self.params.favourite else 0.0 for e in endpoints]
'''

CONFIG = """
apiVersion: inference.networking.k8s.io/v1
kind: InferencePool
metadata: {name: pool}
spec:
  targetPorts: [{number: 8000}]
  endpoints:
  - {address: "10.0.0.1:8000", name: a}
  - {address: "10.0.0.2:8000", name: b}
  - {address: "10.0.0.3:8000", name: c}
---
apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
- {type: queue-scorer}
- type: favourite-scorer
  parameters: {favourite: c}
schedulingProfiles:
- name: default
  plugins:
  - {pluginRef: queue-scorer, weight: 1}
  - {pluginRef: favourite-scorer, weight: 10}
"""


def _install(folder: Path, name: str, entry_points: str, module: str | None = None) -> None:
    dist = folder / f"{name}-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text(
        f"[{ENTRY_POINT_GROUP}]\n" + textwrap.dedent(entry_points)
    )
    if module is not None:
        (folder / f"{name}.py").write_text(module)


def test_an_entry_point_plugin_is_wired_from_yaml(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _install(
        tmp_path,
        "favourite_plugin",
        "favourite = favourite_plugin:FavouriteScorer\n",
        PLUGIN_MODULE,
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    registry = default_registry()
    assert "favourite-scorer" in registry.types()
    runtime = Runtime(parse_config(CONFIG))
    assert "favourite-scorer" in runtime.registry.types()
    parsed = parse_request("completions", b'{"model": "m", "prompt": "hello"}', {})
    for i in range(5):
        dispatch = runtime.director.route(parsed, f"r{i}")
        assert dispatch.endpoint.name == "c"
        dispatch.finish(runtime.clock.now())


def test_without_the_distribution_the_type_is_unknown() -> None:
    registry = default_registry()
    assert "favourite-scorer" not in registry.types()
    assert set(registry.types()) == {cls.type_name for cls in BUILTIN_PLUGINS}


def test_a_broken_entry_point_is_logged_and_skipped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    _install(
        tmp_path,
        "broken_plugins",
        """
        missing = no_such_module:Thing
        clash = broken_plugins:QueueScorerTwin
        not-a-plugin = broken_plugins:NOT_A_PLUGIN
        """,
        "from sluicegate.framework import Scorer\n"
        "class QueueScorerTwin(Scorer):\n"
        "    type_name = 'queue-scorer'\n"
        "    def score(self, request, state, endpoints):\n"
        "        return [0.0] * len(endpoints)\n"
        "NOT_A_PLUGIN = 42\n",
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    with caplog.at_level(logging.ERROR, logger="sluicegate.plugins"):
        registry = default_registry()
    assert set(registry.types()) == {cls.type_name for cls in BUILTIN_PLUGINS}
    messages = " ".join(r.getMessage() for r in caplog.records)
    for name in ("missing", "clash", "not-a-plugin"):
        assert f"plugin entry point {name} " in messages
    assert "already registered" in messages
