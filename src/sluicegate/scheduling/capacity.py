"""Per-class serving capacity, for heuristic scorers that normalise load by it.

On a mixed pool a queue of 4 on an H100 drains about three times faster than the same
queue on an A100 (Llama-3-8B prefill: 21 against 67 µs per token of linear ops, this
repository's ``sim/profiles`` calibration), so the ``queue-scorer``,
``kv-cache-utilization-scorer``, ``active-request-scorer`` and the ``latency-scorer``'s
heuristic fallback can weigh load by each endpoint's hardware class capacity ``c`` (output
tokens/s, or any unit common to all classes), and the ``cost-aware-scorer`` prices a token
by it — an opt-in parameter, ``capacityNormalization``:

- ``off`` (default): no normalisation, the scorers' formulas as the reference's;
- ``configured``: ``c`` is ``classCapacity[class]`` (e.g. ``{h100-80gb: 3, a100-80gb: 1}``);
- ``measured``: ``c`` is learnt online per class — the output token rate an endpoint of the
  class sustains while saturated (requests waiting at the previous scrape): from the
  server's generation counter (``vllm:generation_tokens_total``) between two scrapes, or,
  when the server reports none, from the gateway's own relay timing
  (``running / token_interval_s``); an exponential average (weight
  :data:`MEASURE_WEIGHT`) per class. A class not measured yet uses its configured value.

A candidate whose capacity is unknown (no class, not configured, not measured) makes the
normalisation neutral for the whole decision: comparing a measured rate with a guess would
do more harm than none. Every scorer then multiplies its load count by the *load factor*
``f = c_max / c`` (``c_max`` the largest capacity among the candidates; 1 for the fastest,
3 for an endpoint a third as fast), so a homogeneous pool gets exactly ``f = 1`` and the
scores it always got.

Memory: one previous scrape per endpoint, released when the endpoint leaves the pool (the
scorers are :class:`~sluicegate.framework.EndpointObserver` plugins, told by the director
when the datastore removes one) and at most :data:`MAX_ENDPOINTS` whatever the host (the
least recently scraped dropped first), and one average per class (at most
:data:`MAX_CLASSES`). An endpoint is kept by its pool, name and address (the datastore's
identity of it), so two pools listing the same pod keep one previous scrape each.

Limit: a scorer that sees more than :data:`MAX_ENDPOINTS` endpoints between two scrapes of
each evicts every endpoint's previous scrape before its next one arrives, so ``measured``
never learns there (the configured value, if any, stays in use).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Annotated, Literal

from pydantic import Field

from sluicegate.api.hardware import AcceleratorClass, ClassKeyed
from sluicegate.datalayer.endpoint import Endpoint, EngineMetrics
from sluicegate.framework import EndpointObserver, PluginContext, PluginParameters, Scorer

EndpointKey = tuple[str, str, str]
"""An endpoint's pool, name and address: unique in the datastore (a name is unique only
within its pool)."""

CapacityMode = Literal["off", "configured", "measured"]
MEASURE_WEIGHT = 0.1
"""Weight of each new saturated-rate observation in a class's average."""
MAX_ENDPOINTS = 4096
"""Endpoints whose previous scrape is kept (beyond: the least recently scraped's dropped).
A pool larger than this never learns ``measured`` (module docstring)."""
MAX_CLASSES = 64


class CapacityParameters(PluginParameters):
    """The parameters of a capacity-aware scorer: ``capacityNormalization`` (``off``) and
    ``classCapacity`` (empty; relative capacity per hardware class, any positive unit;
    keys normalized like an endpoint's ``accelerator``, ``H100-80GB`` → ``h100-80gb``)."""

    capacity_normalization: CapacityMode = "off"
    class_capacity: Annotated[dict[AcceleratorClass, float], ClassKeyed] = Field(
        default_factory=dict, max_length=MAX_CLASSES
    )

    def model_post_init(self, context: object, /) -> None:
        bad = [k for k, v in self.class_capacity.items() if not (math.isfinite(v) and v > 0)]
        if bad:
            raise ValueError(f"classCapacity must be positive, not for {bad}")
        if self.capacity_normalization == "configured" and not self.class_capacity:
            raise ValueError("capacityNormalization: configured needs classCapacity")

    @property
    def normalised(self) -> bool:
        """Whether the scorer weighs load by class capacity (its ``hardware_aware``)."""
        return self.capacity_normalization != "off"

    def capacity(self) -> ClassCapacity:
        """The scorer's capacity state."""
        return ClassCapacity(self.capacity_normalization, self.class_capacity)


class ClassCapacity:
    """Load factors of candidates by their hardware class (module docstring)."""

    __slots__ = ("_last", "configured", "measured", "mode")

    def __init__(self, mode: CapacityMode, configured: Mapping[str, float]) -> None:
        self.mode: CapacityMode = mode
        self.configured = dict(configured)
        self.measured: dict[str, float] = {}
        """Output tokens/s per class, learnt while saturated."""
        self._last: dict[EndpointKey, EngineMetrics] = {}
        """Each endpoint's previous scrape, least recently scraped first."""

    def factors(self, endpoints: Sequence[Endpoint]) -> list[float] | None:
        """``c_max / c`` per candidate, or None when the normalisation is neutral (off,
        all capacities equal, or one unknown). Learns from new scrapes first (measured)."""
        caps = self.capacities(endpoints)
        if caps is None:
            return None
        top = max(caps)
        if min(caps) == top:
            return None
        return [top / c for c in caps]

    def capacities(self, endpoints: Sequence[Endpoint]) -> list[float] | None:
        """The class capacity ``c`` of each candidate (the configured unit, or output
        tokens/s measured), or None when off, empty or one is unknown. Learns from new
        scrapes first (measured)."""
        if self.mode == "off" or not endpoints:
            return None
        if self.mode == "measured":
            for e in endpoints:
                self._observe(e)
        caps: list[float] = []
        for e in endpoints:
            cls = e.hardware.accelerator
            if cls is None:
                return None
            cap = self.measured.get(cls) if self.mode == "measured" else None
            if cap is None:
                cap = self.configured.get(cls)
                if cap is None:
                    return None
            caps.append(cap)
        return caps

    def _observe(self, e: Endpoint) -> None:
        m = e.metrics
        cls = e.hardware.accelerator
        if m is None or cls is None:
            return
        key = endpoint_key(e)
        last = self._last.get(key)
        if last is m:
            return
        if last is not None:
            del self._last[key]  # re-inserted last: the dict's order is recency
        elif len(self._last) >= MAX_ENDPOINTS:
            del self._last[next(iter(self._last))]
        self._last[key] = m
        if last is None or last.waiting <= 0 or m.scraped_at <= last.scraped_at:
            return
        if m.generation_tokens is not None and last.generation_tokens is not None:
            rate = (m.generation_tokens - last.generation_tokens) / (m.scraped_at - last.scraped_at)
        else:
            interval = e.inflight.token_interval_s
            rate = m.running / interval if interval > 0 else 0.0
        if not (math.isfinite(rate) and rate > 0):
            return
        old = self.measured.get(cls)
        if old is None:
            if len(self.measured) >= MAX_CLASSES:
                return
            self.measured[cls] = rate
        else:
            self.measured[cls] = old + MEASURE_WEIGHT * (rate - old)

    def forget(self, endpoint: Endpoint) -> None:
        """Drop what is kept for ``endpoint`` (it left the pool)."""
        self._last.pop(endpoint_key(endpoint), None)

    @property
    def endpoints_kept(self) -> list[EndpointKey]:
        """Endpoints whose previous scrape is kept, least recently scraped first (a copy)."""
        return list(self._last)


def endpoint_key(e: Endpoint) -> EndpointKey:
    """How :class:`ClassCapacity` keys ``e``: as the datastore matches it in its pool."""
    return (e.pool, e.name, e.address)


class CapacityScorer(Scorer, EndpointObserver):
    """A scorer that uses class capacity (the module docstring): its ``Parameters`` extend
    :class:`CapacityParameters`, and ``self.capacity`` gives the capacities and load factors
    (None: not normalised, or neutral for this decision). It releases an endpoint's kept
    scrape in :meth:`forget_endpoint`; a subclass that overrides it must call
    ``super().forget_endpoint(endpoint)``, or the scrape stays until the LRU drops it."""

    class Parameters(CapacityParameters):
        """Capacity normalisation (module docstring)."""

    params: CapacityParameters

    def __init__(
        self, name: str, context: PluginContext, params: PluginParameters | None = None
    ) -> None:
        super().__init__(name, context, params)
        self.capacity = self.params.capacity()

    @property
    def hardware_aware(self) -> bool:
        """True with capacity normalisation on."""
        return self.params.normalised

    def forget_endpoint(self, endpoint: Endpoint) -> None:
        """Release ``endpoint``'s kept scrape (overrides must call this)."""
        self.capacity.forget(endpoint)
