"""Saturation detectors: how full each endpoint, and the pool, is.

A detector gives each endpoint a saturation (0 = idle, 1.0 = full) and says whether it has
room for another request. Pool saturation is the mean over the candidate endpoints; an
empty pool is saturated (1.0). Flow control dispatches a waiting request when some
candidate has room, and sheds a sheddable request when the pool's saturation reaches the
usage limit.

``utilization-detector`` (default) — inputs: each endpoint's waiting requests and KV-cache
use (the gateway's estimates: the last scrape raised by what it dispatched since), and the
scrape's age. Parameters (defaults of llm-d-router,
https://github.com/llm-d/llm-d-router/blob/ebab6879/pkg/epp/framework/plugins/flowcontrol/saturationdetector/utilization/config.go):
``queueDepthThreshold`` (5), ``kvCacheUtilThreshold`` (0.8), ``metricsStalenessThreshold``
("200ms"), ``headroom`` (0).
Formula: ``max(waiting / queueDepthThreshold, kv / kvCacheUtilThreshold)``; an endpoint
with stale or no metrics is saturated (1.0). It has room while ``waiting <
queueDepthThreshold·(1+headroom)``, ``kv < min(1, kvCacheUtilThreshold·(1+headroom))``
and its metrics are fresh (a usage ceiling below 1.0 scales both limits).

``concurrency-detector`` — inputs: the gateway's own in-flight requests (or tokens) per
endpoint. Parameters: ``concurrencyMode`` (``requests`` | ``tokens``), ``maxConcurrency``
(100 requests), ``maxTokenConcurrency`` (1,000,000 tokens), ``headroom`` (0). Formula:
in-flight / limit; room while in-flight < limit·(1+headroom).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from pydantic import Field

from sluicegate.api.units import Seconds
from sluicegate.datalayer.endpoint import Endpoint
from sluicegate.framework import PluginParameters, SaturationDetector


class UtilizationDetector(SaturationDetector):
    type_name = "utilization-detector"

    class Parameters(PluginParameters):
        queue_depth_threshold: int = Field(5, ge=1)
        kv_cache_util_threshold: float = Field(0.8, gt=0.0, le=1.0)
        metrics_staleness_threshold: Seconds = 0.2
        headroom: float = Field(0.0, ge=0.0)

    params: Parameters

    @property
    def headroom(self) -> float:
        return self.params.headroom

    def usable(self, endpoint: Endpoint, now: float) -> bool:
        return not endpoint.is_stale(now, self.params.metrics_staleness_threshold)

    def has_room(self, endpoint: Endpoint, now: float, ceiling: float = 1.0) -> bool:
        # The two limits separately: the KV limit never exceeds a full cache, whatever the
        # headroom (the generic saturation < ceiling·(1+headroom) would let kv = 1.0 in).
        if not self.usable(endpoint, now):
            return False
        p, scale = self.params, ceiling * (1.0 + self.params.headroom)
        return endpoint.waiting < p.queue_depth_threshold * scale and endpoint.kv_usage() < min(
            1.0, p.kv_cache_util_threshold * scale
        )

    def endpoint_saturation(self, endpoint: Endpoint, now: float) -> float:
        p = self.params
        if not self.usable(endpoint, now):
            return 1.0
        return max(
            endpoint.waiting / p.queue_depth_threshold,
            endpoint.kv_usage() / p.kv_cache_util_threshold,
        )


class ConcurrencyDetector(SaturationDetector):
    type_name = "concurrency-detector"

    class Parameters(PluginParameters):
        concurrency_mode: Literal["requests", "tokens"] = "requests"
        max_concurrency: int = Field(100, ge=1)
        max_token_concurrency: int = Field(1_000_000, ge=1)
        headroom: float = Field(0.0, ge=0.0)

    params: Parameters

    @property
    def headroom(self) -> float:
        return self.params.headroom

    def _load_and_limit(self, endpoint: Endpoint) -> tuple[float, float]:
        # This replica's in-flight work plus its peers' (shared state): the limit is the
        # endpoint's, not one gateway's share of it.
        p = self.params
        if p.concurrency_mode == "requests":
            return endpoint.dispatched_requests, p.max_concurrency
        return endpoint.dispatched_tokens, p.max_token_concurrency

    def endpoint_saturation(self, endpoint: Endpoint, now: float) -> float:
        load, limit = self._load_and_limit(endpoint)
        return load / limit

    def saturation(self, endpoints: Sequence[Endpoint], now: float) -> float:
        """Total in-flight over total capacity; 1.0 for an empty pool."""
        if not endpoints:
            return 1.0
        loads = [self._load_and_limit(e) for e in endpoints]
        return sum(load for load, _ in loads) / sum(limit for _, limit in loads)
