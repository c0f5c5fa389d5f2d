"""The pools' ``kvEvents`` block: validation names the field, addresses per endpoint."""

from __future__ import annotations

from typing import Any

import pytest

from sluicegate.api.loader import ConfigError, build_config
from sluicegate.datalayer.datastore import Datastore
from sluicegate.datalayer.pools import static_endpoints, sync_pools
from sluicegate.runtime.kvevents import wanted_sources


def _pool(kv: dict[str, Any] | None, *endpoints: dict[str, Any]) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "targetPorts": [{"number": 8000}],
        "endpoints": list(endpoints) or [{"address": "10.0.0.5:8000", "name": "a"}],
    }
    if kv is not None:
        spec["kvEvents"] = kv
    return {
        "apiVersion": "inference.networking.k8s.io/v1",
        "kind": "InferencePool",
        "metadata": {"name": "p"},
        "spec": spec,
    }


def _problem(doc: dict[str, Any]) -> str:
    with pytest.raises(ConfigError) as info:
        build_config([doc])
    return str(info.value)


@pytest.mark.parametrize(
    ("kv", "words"),
    [
        ({"port": 0}, ["kvEvents", "port"]),
        ({"replayPort": 70000}, ["kvEvents", "replayPort"]),
        ({"capacityBlocks": 0}, ["kvEvents", "capacityBlocks"]),
        ({"endpoint": "http://{host}:5557"}, ["endpoint", "tcp://"]),
        ({"endpoint": "tcp://{pod}:5557"}, ["endpoint", "{host}"]),
        ({"endpoint": "tcp://{host}:1", "port": 5557}, ["port or endpoint"]),
        ({"replayEndpoint": "tcp://{host}:1", "replayPort": 2}, ["replayPort or replayEndpoint"]),
        ({"topics": "x"}, ["kvEvents", "topics"]),
    ],
)
def test_bad_settings_name_the_field(kv: dict[str, Any], words: list[str]) -> None:
    problem = _problem(_pool(kv))
    for word in words:
        assert word in problem


def test_bad_endpoint_override_names_the_field() -> None:
    endpoint = {"address": "10.0.0.5:8000", "name": "a", "kvEvents": {"capacityBlocks": -1}}
    problem = _problem(_pool({}, endpoint))
    assert "endpoints" in problem
    assert "capacityBlocks" in problem


def _wanted(doc: dict[str, Any]) -> dict[str, tuple[str, str | None, str, int | None]]:
    config = build_config([doc])
    datastore = Datastore()
    sync_pools(datastore, config, static_endpoints(config))
    return {
        name: (s.pub_address, s.replay_address, s.topic, s.capacity_blocks)
        for name, (s, _) in wanted_sources(config, datastore).get("p", {}).items()
    }


def test_addresses_per_endpoint() -> None:
    doc = _pool(
        {"replayPort": 5558, "topic": "kv"},
        {"address": "10.0.0.5:8000", "name": "a"},
        {"address": "[fd00::7]:8000", "name": "b", "kvEvents": {"port": 6000}},
        {"address": "10.0.0.6:8001", "name": "c", "kvEvents": {"endpoint": "tcp://{host}:{port}"}},
        {"address": "10.0.0.7:8000", "name": "d", "kvEvents": {"enabled": False}},
    )
    assert _wanted(doc) == {
        "a": ("tcp://10.0.0.5:5557", "tcp://10.0.0.5:5558", "kv", None),
        "b": ("tcp://[fd00::7]:6000", "tcp://[fd00::7]:5558", "kv", None),
        "c": ("tcp://10.0.0.6:8001", "tcp://10.0.0.6:5558", "kv", None),
    }


def test_off_without_a_block_and_per_endpoint_only() -> None:
    assert _wanted(_pool(None)) == {}
    doc = _pool(
        None,
        {"address": "10.0.0.5:8000", "name": "a"},
        {"address": "10.0.0.6:8000", "name": "b", "kvEvents": {"capacityBlocks": 900}},
    )
    assert _wanted(doc) == {"b": ("tcp://10.0.0.6:5557", None, "", 900)}
