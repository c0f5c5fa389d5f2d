"""Shared helpers for gateway tests (imported by conftest and the tests of this folder)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from sluicegate.gateway.app import Gateway
from sluicegate.runtime import RuntimeOptions
from sluicegate.scheduling.config import load_preset
from sluicegate.sim.server import SimCluster

POOL = "pool"


class GatewayFactory(Protocol):
    async def __call__(
        self,
        cluster: SimCluster,
        *,
        docs: Sequence[dict[str, Any]] = (),
        preset: str | None = None,
        settings: dict[str, Any] | None = None,
        api_keys: Sequence[str] = (),
        wait_ready: bool = True,
        runtime: RuntimeOptions | None = None,
    ) -> Gateway: ...


def pool_doc(
    urls: Sequence[str], name: str = POOL, annotations: dict[str, str] | None = None
) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": name}
    if annotations:
        metadata["annotations"] = dict(annotations)
    return {
        "apiVersion": "inference.networking.k8s.io/v1",
        "kind": "InferencePool",
        "metadata": metadata,
        "spec": {
            "targetPorts": [{"number": 8000}],
            "endpoints": [{"address": u, "name": f"sim-{i}"} for i, u in enumerate(urls)],
        },
    }


def model_doc(
    public: str, targets: dict[str, int], criticality: str = "Standard", pool: str = POOL
) -> dict[str, Any]:
    return {
        "apiVersion": "inference.networking.x-k8s.io/v1alpha2",
        "kind": "InferenceModel",
        "metadata": {"name": public},
        "spec": {
            "modelName": public,
            "criticality": criticality,
            "poolRef": {"name": pool},
            "targetModels": [{"name": n, "weight": w} for n, w in targets.items()],
        },
    }


def gateway_doc(**spec: Any) -> dict[str, Any]:
    return {"apiVersion": "sluicegate.dev/v1alpha1", "kind": "GatewayConfig", "spec": spec}


QUEUEING_ANNOTATION = "inference-epp-env.networking.x-k8s.io/experimental-use-queueing"
"""The InferencePool annotation that turns flow control on for that pool."""


def picker_doc(
    preset: str = "default", plugins: Sequence[dict[str, Any]] = (), **fields: Any
) -> dict[str, Any]:
    """An EndpointPickerConfig document: the shipped ``preset`` plus extra ``plugins`` and
    top-level ``fields`` (camelCase: ``featureGates``, ``saturationDetector``,
    ``flowControl``)."""
    doc = load_preset(preset).model_dump(by_alias=True, exclude_none=True)
    doc["plugins"] = [*doc["plugins"], *plugins]
    doc.update(fields)
    return doc


async def wait_until_scraped(gateway: Gateway, models: bool = True) -> None:
    """Refresh every endpoint's metrics and model list once, now."""
    assert gateway.collector is not None
    for endpoint in gateway.datastore.all_endpoints():
        await gateway.collector.refresh(endpoint)
        assert endpoint.metrics is not None, f"{endpoint.name} was not scraped"
        if models:
            assert endpoint.models.known, f"{endpoint.name} did not list its models"
