"""Endpoint hardware from configuration and pod labels, and the mixed-pool notice."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from sluicegate.api.hardware import PoolHardware, normalize_accelerator
from sluicegate.api.loader import ConfigError, build_config
from sluicegate.datalayer.datastore import Datastore, EndpointSpec
from sluicegate.datalayer.endpoint import Hardware
from sluicegate.datalayer.hardware import hardware_from_labels
from sluicegate.datalayer.pools import static_endpoints
from sluicegate.runtime.notices import Notices, mixed_hardware_pools


@pytest.mark.parametrize(
    ("label", "cls"),
    [
        ("NVIDIA-H100-80GB-HBM3", "h100-80gb"),
        ("NVIDIA-A100-SXM4-80GB", "a100-80gb"),
        ("NVIDIA-A100-80GB-PCIe", "a100-80gb"),
        ("NVIDIA-A100-SXM4-40GB", "a100-40gb"),
        ("NVIDIA-L40S", "l40s-48gb"),
        ("NVIDIA-H200", "h200-141gb"),
        ("NVIDIA-H100-NVL", "h100-nvl"),
        ("Tesla-T4", "t4-16gb"),
        ("NVIDIA-A100-SXM4-40GB-MIG-1g.5gb", "a100-40gb-mig-1g.5gb"),
        ("h100-80gb", "h100-80gb"),
        ("  A100 80GB ", "a100-80gb"),
        ("NVIDIA-GeForce-RTX-4090", "rtx-4090"),
    ],
)
def test_gpu_product_names_normalize_to_one_class_per_card(label: str, cls: str) -> None:
    assert normalize_accelerator(label) == cls
    assert normalize_accelerator(cls) == cls  # a class name is a fixed point


@pytest.mark.parametrize("bad", ["", "NVIDIA-", "sxm4-pcie", "h100/80gb", "x" * 70])
def test_names_that_give_no_class_are_refused(bad: str) -> None:
    with pytest.raises(ValueError, match="class"):
        normalize_accelerator(bad)


def _pool(hardware: dict[str, Any] | None, *endpoints: dict[str, Any]) -> dict[str, Any]:
    spec: dict[str, Any] = {"targetPorts": [{"number": 8000}], "endpoints": list(endpoints)}
    if hardware is not None:
        spec["hardware"] = hardware
    return {
        "apiVersion": "inference.networking.k8s.io/v1",
        "kind": "InferencePool",
        "metadata": {"name": "p"},
        "spec": spec,
    }


def test_configuration_gives_each_endpoint_its_class_and_cost() -> None:
    doc = _pool(
        {
            "accelerator": "a100-80gb",
            "costPerHour": 1.0,
            "costPerHourByAccelerator": {"NVIDIA-H100-80GB-HBM3": 2.99, "a100-80gb": 1.79},
        },
        {"address": "10.0.0.1:8000", "name": "h", "accelerator": "NVIDIA-H100-80GB-HBM3"},
        {"address": "10.0.0.2:8000", "name": "a"},
        {"address": "10.0.0.3:8000", "name": "spot", "costPerHour": 0.5},
        {"address": "10.0.0.4:8000", "name": "l", "accelerator": "l40s"},
    )
    specs = {s.name: s.hardware for s in static_endpoints(build_config([doc]))["p"]}
    assert specs == {
        "h": Hardware("h100-80gb", 2.99),
        "a": Hardware("a100-80gb", 1.79),
        "spot": Hardware("a100-80gb", 0.5),
        "l": Hardware("l40s-48gb", 1.0),  # no entry for its class: the pool's costPerHour
    }


def test_without_hardware_settings_endpoints_have_none() -> None:
    doc = _pool(None, {"address": "10.0.0.1:8000", "name": "a"})
    assert static_endpoints(build_config([doc]))["p"][0].hardware == Hardware()


@pytest.mark.parametrize(
    ("hardware", "endpoint", "words"),
    [
        (None, {"costPerHour": -1}, ["costPerHour", "greater than or equal"]),
        (None, {"accelerator": "h100/80gb"}, ["accelerator", "must be lower-case"]),
        ({"costPerHour": "cheap"}, {}, ["hardware", "costPerHour"]),
        ({"gpu": "h100"}, {}, ["hardware", "gpu"]),
    ],
)
def test_bad_hardware_settings_name_the_field(
    hardware: dict[str, Any] | None, endpoint: dict[str, Any], words: list[str]
) -> None:
    doc = _pool(hardware, {"address": "10.0.0.1:8000", "name": "a", **endpoint})
    with pytest.raises(ConfigError) as info:
        build_config([doc])
    text = "\n".join(info.value.problems)
    for word in words:
        assert word in text, text


DEFAULTS = PoolHardware(accelerator="a100-80gb", cost_per_hour_by_accelerator={"h100-80gb": 3.0})


def test_labels_give_class_and_cost_with_sluicegate_labels_first() -> None:
    problems: list[str] = []
    gpu = {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
    assert hardware_from_labels(gpu, DEFAULTS, problems, "pod") == Hardware("h100-80gb", 3.0)
    both = {**gpu, "sluicegate.dev/accelerator": "l40s", "sluicegate.dev/cost-per-hour": "0.8"}
    assert hardware_from_labels(both, DEFAULTS, problems, "pod") == Hardware("l40s-48gb", 0.8)
    assert hardware_from_labels({}, DEFAULTS, problems, "pod") == Hardware("a100-80gb", None)
    assert problems == []


def test_unreadable_labels_are_reported_and_the_defaults_apply() -> None:
    problems: list[str] = []
    labels = {
        "sluicegate.dev/accelerator": "bad/class",
        "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
        "sluicegate.dev/cost-per-hour": "nan",
    }
    got = hardware_from_labels(labels, DEFAULTS, problems, "Pod ns/x")
    assert got == Hardware("h100-80gb", 3.0)  # the GPU label, the class's default cost
    assert len(problems) == 2
    assert problems[0].startswith("Pod ns/x: label sluicegate.dev/accelerator:")
    assert "sluicegate.dev/cost-per-hour: 'nan' is not a cost" in problems[1]


def _store(*hardware: Hardware) -> Datastore:
    store = Datastore()
    specs = [
        EndpointSpec(f"e{i}", "127.0.0.1", 8000 + i, hardware=h) for i, h in enumerate(hardware)
    ]
    store.set_endpoints("p", specs)
    return store


def test_a_pool_is_mixed_when_its_endpoints_differ_in_class() -> None:
    h100, a100 = Hardware("h100-80gb"), Hardware("a100-80gb")
    assert mixed_hardware_pools(_store(h100, h100)) == []
    assert mixed_hardware_pools(_store(Hardware(), Hardware())) == []
    assert mixed_hardware_pools(_store(h100, a100, a100)) == [("p", ["a100-80gb", "h100-80gb"])]
    assert mixed_hardware_pools(_store(h100, Hardware())) == [("p", ["h100-80gb", "unknown"])]
    # Cost alone does not make classes.
    assert (
        mixed_hardware_pools(_store(Hardware("a100-80gb", 1.0), Hardware("a100-80gb", 2.0))) == []
    )


def test_mixed_pool_notice_is_logged_once_and_again_after_it_was_not_mixed(
    caplog: pytest.LogCaptureFixture,
) -> None:
    h100, a100 = Hardware("h100-80gb"), Hardware("a100-80gb")
    store = _store(h100, a100)
    notices = Notices()
    caplog.set_level(logging.WARNING, "sluicegate.runtime")
    notices.mixed_hardware(store, hardware_aware=True)
    assert not caplog.records
    for _ in range(3):
        notices.mixed_hardware(store, hardware_aware=False)
    assert len(caplog.records) == 1
    assert "'p' mixes hardware classes (a100-80gb, h100-80gb)" in caplog.records[0].message
    assert "hardware-blind" in caplog.records[0].message
    # Every A100 leaves: the pool is homogeneous, and nothing is said.
    store.set_endpoints("p", [EndpointSpec("e0", "127.0.0.1", 8000, hardware=h100)])
    notices.mixed_hardware(store, hardware_aware=False)
    assert len(caplog.records) == 1
    store.set_endpoints(
        "p",
        [
            EndpointSpec("e0", "127.0.0.1", 8000, hardware=h100),
            EndpointSpec("e9", "127.0.0.1", 8009, hardware=a100),
        ],
    )
    notices.mixed_hardware(store, hardware_aware=False)
    assert len(caplog.records) == 2
