"""Prometheus metrics of an :class:`~sluicegate.latency.inprocess.InProcessPredictor`.

:class:`PredictorCollector` reads the predictor's plain attributes when scraped; the
gateway, the Envoy endpoint picker and the predictor servers register it in their
registries. Names are prefixed ``sluicegate_predictor_``; scores are fractions, durations
seconds.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from sluicegate.latency.calibration import LatencyCalibration
from sluicegate.latency.client import RemotePredictor
from sluicegate.latency.inprocess import InProcessPredictor
from sluicegate.latency.store import KV_BUCKETS, PREFIX_BUCKETS, QUEUE_BUCKETS

_P = "sluicegate_predictor_"


class PredictorCollector(Collector):
    """Samples (per bucket when ``buckets``), model scores and version, trainings and
    predictions of ``predictor``."""

    def __init__(self, predictor: InProcessPredictor, buckets: bool = False) -> None:
        self._predictor = predictor
        self._buckets = buckets

    def describe(self) -> Iterator[Metric]:
        return iter(())

    def collect(self) -> Iterator[Metric]:
        predictor = self._predictor
        store, bundle = predictor.store, predictor.bundle
        yield GaugeMetricFamily(_P + "ready", "1 when a model exists.", int(bundle is not None))
        yield from calibration_metrics(predictor.calibration)
        yield GaugeMetricFamily(
            _P + "model_version",
            "Trainings behind the models in use (0: none).",
            bundle.version if bundle else 0,
        )
        sets = (("ttft", store.ttft), ("tpot", store.tpot))
        samples = GaugeMetricFamily(
            _P + "samples", "Samples in the window.", labels=["target", "split"]
        )
        for target, sample_set in sets:
            samples.add_metric([target, "train"], sample_set.train_count)
            samples.add_metric([target, "test"], sample_set.test_count)
        yield samples
        yield CounterMetricFamily(_P + "rejected_samples", "Samples refused.", store.rejected)
        scores = GaugeMetricFamily(
            _P + "model_score",
            "Held-out MAPE and quantile coverage of the models in use (fractions).",
            labels=["target", "score"],
        )
        models = (("ttft", bundle.ttft), ("tpot", bundle.tpot)) if bundle is not None else ()
        for target, model in models:
            if model is None:
                continue
            if model.mape is not None:
                scores.add_metric([target, "mape"], model.mape)
            if model.coverage is not None:
                scores.add_metric([target, "coverage"], model.coverage)
        yield scores
        yield CounterMetricFamily(_P + "trainings", "Successful trainings.", predictor.trainings)
        yield CounterMetricFamily(
            _P + "training_failures", "Failed trainings.", predictor.training_failures
        )
        yield GaugeMetricFamily(
            _P + "last_train_duration_seconds",
            "Wall time of the last training.",
            predictor.last_train_duration_s,
        )
        yield CounterMetricFamily(
            _P + "predicted_rows", "Rows predicted.", predictor.predicted_rows
        )
        yield CounterMetricFamily(
            _P + "prediction_seconds", "Time spent predicting.", predictor.prediction_seconds_total
        )
        if self._buckets:
            yield self._bucket_samples(sets)

    def _bucket_samples(self, sets: tuple[tuple[str, object], ...]) -> Metric:
        family = GaugeMetricFamily(
            _P + "bucket_samples",
            "Training samples per (queue, KV, prefix) bucket (empty buckets left out).",
            labels=["target", "queue_bucket", "kv_bucket", "prefix_bucket"],
        )
        for target, sample_set in sets:
            counts = sample_set.bucket_counts()  # type: ignore[attr-defined]
            for q in range(QUEUE_BUCKETS):
                for kv in range(KV_BUCKETS):
                    for p in range(PREFIX_BUCKETS):
                        if counts[q, kv, p]:
                            family.add_metric(
                                [target, str(q), str(kv), str(p)], int(counts[q, kv, p])
                            )
        return family


class RemotePredictorCollector(Collector):
    """The prediction-service client's counters (``sluicegate_predictor_remote_*``): calls,
    the HTTP requests they were coalesced into, and every way a call or a sample can fail —
    what to alert on when predictions come from prediction servers."""

    def __init__(self, remote: RemotePredictor) -> None:
        self._remote = remote

    def describe(self) -> Iterator[Metric]:
        return iter(())

    def collect(self) -> Iterator[Metric]:
        r = self._remote
        counters = (
            ("calls", "Prediction calls made by the scheduler.", r.calls),
            ("http_requests", "HTTP requests the calls were coalesced into.", r.http_requests),
            ("failures", "Calls answered without predictions: HTTP or server error.", r.failures),
            ("timeouts", "Calls answered without predictions: timed out.", r.timeouts),
            (
                "no_server",
                "Calls answered without predictions: every prediction server backing off.",
                r.no_server,
            ),
            ("samples_sent", "Training samples delivered to the training server.", r.samples_sent),
            (
                "samples_dropped",
                "Training samples dropped because the send buffer was full.",
                r.samples_dropped,
            ),
            ("flush_failures", "Failed deliveries of sample batches.", r.flush_failures),
        )
        for name, doc, value in counters:
            yield CounterMetricFamily(_P + "remote_" + name, doc, value)
        yield from calibration_metrics(r.calibration)


def calibration_metrics(calibration: LatencyCalibration | None) -> Iterator[Metric]:
    """The online calibration's scale and record per target (nothing without one)."""
    if calibration is None:
        return
    scale = GaugeMetricFamily(
        _P + "calibration_scale",
        "Factor applied to the quantile models' predictions so that routed requests meet "
        "them at the configured quantile.",
        labels=["target"],
    )
    observed = CounterMetricFamily(
        _P + "calibration_observations",
        "Routed requests compared with the prediction they were routed on.",
        labels=["target"],
    )
    misses = CounterMetricFamily(
        _P + "calibration_misses",
        "Routed requests slower than their scaled prediction.",
        labels=["target"],
    )
    for target, tracker in (("ttft", calibration.ttft), ("tpot", calibration.tpot)):
        scale.add_metric([target], tracker.scale)
        observed.add_metric([target], tracker.observations)
        misses.add_metric([target], tracker.misses)
    yield scale
    yield observed
    yield misses
