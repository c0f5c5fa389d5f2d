"""Counters, gauges and histograms for metrics updated on every request.

prometheus_client's instruments take a lock and check their state on each update (about
1 µs per histogram observation, a dozen per request); the gateway updates its metrics from
one event-loop thread, so these keep plain numbers and hand them to prometheus_client only
when ``/metrics`` is scraped, as a :class:`~prometheus_client.registry.Collector`. Their
exposition is the same as prometheus_client's (``_total`` counters, cumulative ``le``
buckets, ``_sum`` and ``_count``), minus the ``_created`` series.

Not thread-safe: update them from the event loop only.

Each family keeps at most ``max_series`` label sets (default 1,000): label values can come
from clients (a model name nothing serves), and a metric must not grow without bound.
Label sets past the limit are counted together under the value ``"_other"`` in every
label.
"""

from __future__ import annotations

import abc
from bisect import bisect_left
from collections.abc import Iterator, Sequence
from typing import Generic, TypeVar

from prometheus_client import CollectorRegistry
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

OVERFLOW_LABEL = "_other"
"""The label value of the series that collects label sets past a family's limit."""

DEFAULT_MAX_SERIES = 1_000


class CounterSeries:
    """One labelled counter: a total that only goes up."""

    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value = 0.0

    def inc(self, amount: float = 1.0) -> None:
        if amount < 0:
            raise ValueError(f"a counter only goes up, not by {amount}")
        self.value += amount


class GaugeSeries:
    """One labelled gauge: a level that goes up and down."""

    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value = 0.0

    def inc(self, amount: float = 1.0) -> None:
        self.value += amount

    def dec(self, amount: float = 1.0) -> None:
        self.value -= amount

    def set(self, value: float) -> None:
        self.value = value


class HistogramSeries:
    """One labelled histogram: observation counts per bucket (not cumulative; the last
    one is ``+Inf``) and their sum."""

    __slots__ = ("_bounds", "counts", "sum")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self._bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.sum = 0.0

    def observe(self, value: float) -> None:
        if value != value:  # NaN: in no bucket, as prometheus_client does
            return
        # Bucket ``le=b`` holds values ≤ b: the first bound not below the value.
        self.counts[bisect_left(self._bounds, value)] += 1
        self.sum += value

    @property
    def count(self) -> int:
        return sum(self.counts)


S = TypeVar("S", CounterSeries, GaugeSeries, HistogramSeries)


class _Family(Collector, Generic[S]):
    """A metric's series by label values, exported when the registry is collected."""

    def __init__(
        self,
        name: str,
        documentation: str,
        labelnames: Sequence[str] = (),
        registry: CollectorRegistry | None = None,
        max_series: int = DEFAULT_MAX_SERIES,
    ) -> None:
        self.name = name
        self.documentation = documentation
        self.labelnames = tuple(labelnames)
        self._series: dict[tuple[str, ...], S] = {}
        self._max_series = max_series
        if not self.labelnames:  # an unlabelled metric exists (at zero) from the start
            self._series[()] = self._new()
        if registry is not None:
            registry.register(self)

    @abc.abstractmethod
    def _new(self) -> S:
        """A new series at zero."""

    def labels(self, *values: str) -> S:
        """The series for these label values (one per label name, in order)."""
        series = self._series.get(values)
        if series is not None:
            return series
        if len(values) != len(self.labelnames):
            raise ValueError(
                f"metric {self.name} takes labels {self.labelnames}, got {len(values)} values"
            )
        values = tuple(str(v) for v in values)
        series = self._series.get(values)
        if series is not None:
            return series
        if len(self._series) >= self._max_series:
            values = (OVERFLOW_LABEL,) * len(values)
            series = self._series.get(values)
            if series is not None:
                return series
        series = self._series[values] = self._new()
        return series

    def items(self) -> Iterator[tuple[tuple[str, ...], S]]:
        return iter(list(self._series.items()))

    def _unlabelled(self) -> S:
        try:
            return self._series[()]
        except KeyError:
            raise ValueError(
                f"metric {self.name} has labels {self.labelnames}: use labels(...) first"
            ) from None

    @abc.abstractmethod
    def _family(self) -> Metric:
        """The prometheus_client family this metric is exported as, without samples."""

    def describe(self) -> Iterator[Metric]:
        # The names, without samples: the registry refuses a second metric of a name.
        yield self._family()


V = TypeVar("V", CounterSeries, GaugeSeries)


class _ValueFamily(_Family[V]):
    """A family whose series each hold one number (counters, gauges)."""

    @property
    def value(self) -> float:
        """The unlabelled series' value."""
        return self._unlabelled().value

    def collect(self) -> Iterator[Metric]:
        family = self._family()
        for values, series in self.items():
            family.add_metric(values, series.value)  # type: ignore[attr-defined]
        yield family


class Counter(_ValueFamily[CounterSeries]):
    """A counter family (exported as ``<name>_total``)."""

    def _new(self) -> CounterSeries:
        return CounterSeries()

    def inc(self, amount: float = 1.0) -> None:
        """Add to the unlabelled counter."""
        self._unlabelled().inc(amount)

    def _family(self) -> CounterMetricFamily:
        return CounterMetricFamily(self.name, self.documentation, labels=self.labelnames)


class Gauge(_ValueFamily[GaugeSeries]):
    """A gauge family."""

    def _new(self) -> GaugeSeries:
        return GaugeSeries()

    def inc(self, amount: float = 1.0) -> None:
        self._unlabelled().inc(amount)

    def dec(self, amount: float = 1.0) -> None:
        self._unlabelled().dec(amount)

    def set(self, value: float) -> None:
        self._unlabelled().set(value)

    def _family(self) -> GaugeMetricFamily:
        return GaugeMetricFamily(self.name, self.documentation, labels=self.labelnames)


class Histogram(_Family[HistogramSeries]):
    """A histogram family over ``buckets`` (upper bounds, ascending; ``+Inf`` is added)."""

    def __init__(
        self,
        name: str,
        documentation: str,
        labelnames: Sequence[str] = (),
        *,
        buckets: Sequence[float],
        registry: CollectorRegistry | None = None,
        max_series: int = DEFAULT_MAX_SERIES,
    ) -> None:
        bounds = tuple(float(b) for b in buckets)
        if list(bounds) != sorted(set(bounds)) or not bounds:
            raise ValueError(f"histogram {name}: buckets must be distinct and ascending")
        if bounds[-1] == float("inf"):
            bounds = bounds[:-1]
        self._bounds = bounds
        # prometheus_client's own formatting of ``le``, so the series read the same.
        self._le = [floatToGoString(b) for b in bounds] + ["+Inf"]  # type: ignore[no-untyped-call]
        super().__init__(name, documentation, labelnames, registry, max_series)

    def _new(self) -> HistogramSeries:
        return HistogramSeries(self._bounds)

    def observe(self, value: float) -> None:
        """Record ``value`` in the unlabelled histogram."""
        self._unlabelled().observe(value)

    def _family(self) -> HistogramMetricFamily:
        return HistogramMetricFamily(self.name, self.documentation, labels=self.labelnames)

    def collect(self) -> Iterator[Metric]:
        family = self._family()
        for values, series in self.items():
            running = 0
            cumulative = []
            for le, n in zip(self._le, series.counts, strict=True):
                running += n
                cumulative.append((le, running))
            family.add_metric(values, cumulative, series.sum)
        yield family


__all__ = [
    "OVERFLOW_LABEL",
    "Counter",
    "CounterSeries",
    "Gauge",
    "GaugeSeries",
    "Histogram",
    "HistogramSeries",
]
