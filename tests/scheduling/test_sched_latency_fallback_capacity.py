"""The latency scorer's heuristic fallback with capacity normalisation: on a mixed pool
queues and free KV are weighed by each class's capacity; on a pool of one class, or with
the normalisation off, the fallback scores exactly as the reference's composite."""

from __future__ import annotations

from typing import Any

import pytest

from sluicegate.builtins import default_registry
from sluicegate.clock import ManualClock
from sluicegate.datalayer.endpoint import Endpoint, EngineMetrics, Hardware
from sluicegate.framework import CycleState, LLMRequest, PluginContext
from sluicegate.scheduling.config import load_preset

REGISTRY = default_registry()
H100, A100 = "h100-80gb", "a100-80gb"
CONFIGURED = {"capacityNormalization": "configured", "classCapacity": {H100: 3.0, A100: 1.0}}


def endpoint(i: int, cls: str | None, waiting: int, kv: float) -> Endpoint:
    metrics = EngineMetrics(scraped_at=0.0, waiting=waiting, kv_usage=kv)
    e = Endpoint(name=f"ep-{i}", host="10.0.0.1", port=8000 + i, metrics=metrics, index=i)
    e.hardware = Hardware(cls, None)
    return e


def scorer(**params: Any) -> Any:
    return REGISTRY.create("latency-scorer", "s", params, PluginContext(ManualClock(), 0))


def request() -> LLMRequest:
    return LLMRequest(
        request_id="r",
        model="base",
        target_model="base",
        prompt=b"hi",
        prompt_tokens=1,
        arrival=0.0,
        headers={},
    )


def test_fallback_weighs_queue_and_free_kv_by_class_capacity() -> None:
    # Same queue and KV use; the H100 is three times the A100: queue 2 counts as 2 on the
    # H100 and 6 on the A100, free KV 0.5 as 0.5 and 0.5 / 3.
    pool = [endpoint(0, H100, 2, 0.5), endpoint(1, A100, 2, 0.5)]
    blind = scorer().score(request(), CycleState(), pool)
    assert blind[0] == blind[1]
    h100, a100 = scorer(**CONFIGURED).score(request(), CycleState(), pool)
    # weights 1/3 each: H100 (0.5 + (6 − 2) / 6) / 3, A100 (0.5 / 3 + 0) / 3
    assert h100 == pytest.approx(round(100 * (0.5 + 4 / 6) / 3) / 100)
    assert a100 == pytest.approx(round(100 * (0.5 / 3) / 3) / 100)
    assert h100 > a100


@pytest.mark.parametrize("cls", [None, H100])
def test_fallback_is_unchanged_on_a_pool_of_one_class(cls: str | None) -> None:
    pool = [endpoint(0, cls, 3, 0.2), endpoint(1, cls, 1, 0.7), endpoint(2, cls, 0, 0.4)]
    for mode in ("configured", "measured"):
        params = {**CONFIGURED, "capacityNormalization": mode}
        if cls is None and mode == "configured":
            params["classCapacity"] = {A100: 1.0}  # no class: neutral
        got = scorer(**params).score(request(), CycleState(), pool)
        assert got == scorer().score(request(), CycleState(), pool)


def test_hardware_aware_presets_normalise_the_fallback() -> None:
    for preset in ("predicted-latency", "cost-aware"):
        spec = next(p for p in load_preset(preset).plugins if p.type == "latency-scorer")
        assert (spec.parameters or {}).get("capacityNormalization") == "measured"
    pool = next(
        p for p in load_preset("predicted-latency-pool").plugins if p.type == "latency-scorer"
    )
    assert "capacityNormalization" not in (pool.parameters or {})
