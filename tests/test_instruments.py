"""The per-request metric instruments: the exposition Prometheus scrapes must read exactly
as prometheus_client's own, and a family must not grow without bound."""

from __future__ import annotations

import prometheus_client
import pytest
from prometheus_client import CollectorRegistry, generate_latest

from sluicegate.instruments import OVERFLOW_LABEL, Counter, Gauge, Histogram

BUCKETS = (0.005, 0.1, 1, 2.5, 1048576)


def _without_created(text: bytes) -> list[str]:
    return [line for line in text.decode().splitlines() if "_created" not in line]


def test_exposition_matches_prometheus_client() -> None:
    ours, theirs = CollectorRegistry(), CollectorRegistry()
    oc = Counter("req", "Requests.", ("model",), registry=ours)
    tc = prometheus_client.Counter("req", "Requests.", ("model",), registry=theirs)
    og = Gauge("running", "Running.", ("model",), registry=ours)
    tg = prometheus_client.Gauge("running", "Running.", ("model",), registry=theirs)
    oh = Histogram("lat", "Latency.", ("model",), buckets=BUCKETS, registry=ours)
    th = prometheus_client.Histogram(
        "lat", "Latency.", ("model",), buckets=BUCKETS, registry=theirs
    )
    ou = Histogram("plain", "No labels.", buckets=BUCKETS, registry=ours)
    tu = prometheus_client.Histogram("plain", "No labels.", buckets=BUCKETS, registry=theirs)
    for model, value in [("a", 0.005), ("a", 0.3), ("b", 3.0), ("a", 2e6), ("b", 0.0)]:
        oc.labels(model).inc()
        tc.labels(model).inc()
        og.labels(model).inc(2)
        tg.labels(model).inc(2)
        og.labels(model).dec()
        tg.labels(model).dec()
        oh.labels(model).observe(value)
        th.labels(model).observe(value)
        ou.observe(value)
        tu.observe(value)
    assert _without_created(generate_latest(ours)) == _without_created(generate_latest(theirs))


def test_value_on_a_bound_falls_in_that_bucket() -> None:
    h = Histogram("h", "H.", buckets=(1, 2))
    series = h.labels()
    for v in (1.0, 1.5, 2.0, 2.0001):
        series.observe(v)
    assert series.counts == [1, 2, 1]  # le=1, le=2, +Inf
    assert series.count == 4


def test_unlabelled_counter_is_exported_at_zero() -> None:
    registry = CollectorRegistry()
    Counter("retries", "Retries.", registry=registry)
    assert registry.get_sample_value("retries_total") == 0.0


def test_series_are_bounded_and_the_rest_is_counted_together() -> None:
    registry = CollectorRegistry()
    errors = Counter("errors", "Errors.", ("model", "code"), registry=registry, max_series=3)
    for i in range(10_000):  # client-chosen model names
        errors.labels(f"model-{i}", "404").inc()
    assert len(list(errors.items())) == 4  # three named, one overflow
    assert registry.get_sample_value("errors_total", {"model": "model-0", "code": "404"}) == 1
    overflow = {"model": OVERFLOW_LABEL, "code": OVERFLOW_LABEL}
    assert registry.get_sample_value("errors_total", overflow) == 9_997
    # A label set already known keeps its own series after the limit.
    errors.labels("model-1", "404").inc()
    assert registry.get_sample_value("errors_total", {"model": "model-1", "code": "404"}) == 2


def test_wrong_label_count_is_a_clear_error() -> None:
    family = Counter("c", "C.", ("a", "b"))
    with pytest.raises(ValueError, match=r"takes labels \('a', 'b'\)"):
        family.labels("only-one")


def test_buckets_must_ascend() -> None:
    with pytest.raises(ValueError, match="ascending"):
        Histogram("h", "H.", buckets=(2, 1))


def test_label_values_are_strings_and_nan_is_not_counted() -> None:
    registry = CollectorRegistry()
    codes = Counter("codes", "Codes.", ("code",), registry=registry)
    codes.labels(404).inc()  # type: ignore[arg-type]
    codes.labels("404").inc()
    assert registry.get_sample_value("codes_total", {"code": "404"}) == 2
    h = Histogram("h", "H.", buckets=(1,), registry=registry)
    h.observe(float("nan"))
    assert registry.get_sample_value("h_count") == 0


def test_unlabelled_use_of_a_labelled_family_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="use labels"):
        Counter("c", "C.", ("a",)).inc()


def test_a_name_registered_twice_is_refused() -> None:
    registry = CollectorRegistry()
    Counter("twice", "One.", registry=registry)
    with pytest.raises(ValueError, match="Duplicated"):
        Counter("twice", "Two.", registry=registry)


def test_a_counter_does_not_go_down() -> None:
    with pytest.raises(ValueError, match="only goes up"):
        Counter("c", "C.").inc(-1)
