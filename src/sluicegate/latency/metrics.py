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
from sluicegate.latency.hardware import MODEL_SOURCES, UNNAMED, HardwareAwarePredictor
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


class HardwarePredictorCollector(Collector):
    """The in-process predictor of a picker (:class:`HardwareAwarePredictor`): the
    :class:`PredictorCollector` families summed over its classes (``model_score`` and
    ``model_version`` of the class with most samples: on a pool of one class, exactly that
    class's), and per class ``sluicegate_predictor_class_samples{class,target}``,
    ``sluicegate_predictor_class_model_score{class,target,score}`` and
    ``sluicegate_predictor_latency_model_source{class,source}`` (1 for what predicts the
    class now: ``model``, ``measured-ratio``, ``configured-ratio`` or ``heuristic``; 0 for
    the others). Classes are bounded by ``max_classes``; the unnamed one is ``none``."""

    def __init__(self, predictor: HardwareAwarePredictor) -> None:
        self._predictor = predictor

    def describe(self) -> Iterator[Metric]:
        return iter(())

    def collect(self) -> Iterator[Metric]:
        predictor = self._predictor
        lanes = predictor.lanes
        yield GaugeMetricFamily(_P + "ready", "1 when a model exists.", int(predictor.ready))
        yield from calibration_metrics(predictor.calibration)
        main = max(lanes.values(), key=lambda lane: lane.ttft_samples, default=None)
        bundle = main.bundle if main is not None else None
        yield GaugeMetricFamily(
            _P + "model_version",
            "Trainings behind the models in use (0: none).",
            bundle.version if bundle else 0,
        )
        samples = GaugeMetricFamily(
            _P + "samples", "Samples in the window.", labels=["target", "split"]
        )
        per_class = GaugeMetricFamily(
            _P + "class_samples",
            "Training samples in a hardware class's window.",
            labels=["class", "target"],
        )
        class_scores = GaugeMetricFamily(
            _P + "class_model_score",
            "Held-out MAPE and quantile coverage of a hardware class's models (fractions).",
            labels=["class", "target", "score"],
        )
        for target in ("ttft", "tpot"):
            sets = [
                lane.store.ttft if target == "ttft" else lane.store.tpot for lane in lanes.values()
            ]
            samples.add_metric([target, "train"], sum(s.train_count for s in sets))
            samples.add_metric([target, "test"], sum(s.test_count for s in sets))
        for cls, lane in lanes.items():
            label = UNNAMED if cls is None else cls
            per_class.add_metric([label, "ttft"], lane.store.ttft.train_count)
            per_class.add_metric([label, "tpot"], lane.store.tpot.train_count)
            if lane.bundle is not None:
                for target, model in (("ttft", lane.bundle.ttft), ("tpot", lane.bundle.tpot)):
                    if model is not None and model.mape is not None:
                        class_scores.add_metric([label, target, "mape"], model.mape)
                    if model is not None and model.coverage is not None:
                        class_scores.add_metric([label, target, "coverage"], model.coverage)
        yield samples
        yield per_class
        yield class_scores
        yield CounterMetricFamily(
            _P + "rejected_samples",
            "Samples refused (bad values, or of a class beyond maxClasses).",
            sum(lane.store.rejected for lane in lanes.values()) + predictor.refused_class_samples,
        )
        yield CounterMetricFamily(
            _P + "evicted_classes",
            "Hardware-class lanes given up for a new class (no sample for class_idle_s, 600 s).",
            predictor.evicted_classes,
        )
        scores = GaugeMetricFamily(
            _P + "model_score",
            "Held-out MAPE and quantile coverage of the models in use (fractions).",
            labels=["target", "score"],
        )
        for target, model in (
            (("ttft", bundle.ttft), ("tpot", bundle.tpot)) if bundle is not None else ()
        ):
            if model is not None and model.mape is not None:
                scores.add_metric([target, "mape"], model.mape)
            if model is not None and model.coverage is not None:
                scores.add_metric([target, "coverage"], model.coverage)
        yield scores
        source = GaugeMetricFamily(
            _P + "latency_model_source",
            "What predicts a hardware class: its own model, a donor class's model scaled "
            "by a measured or configured ratio, or the heuristic fallback (1: current).",
            labels=["class", "source"],
        )
        for label, current in predictor.sources().items():
            for kind in MODEL_SOURCES:
                source.add_metric([label, kind], int(kind == current))
        yield source
        values = lanes.values()
        for name, doc, value in (
            ("trainings", "Successful trainings.", sum(lane.trainings for lane in values)),
            (
                "training_failures",
                "Failed trainings.",
                sum(lane.training_failures for lane in values),
            ),
        ):
            yield CounterMetricFamily(_P + name, doc, value)
        yield GaugeMetricFamily(
            _P + "last_train_duration_seconds",
            "Wall time of the last training.",
            max((lane.last_train_duration_s for lane in values), default=0.0),
        )
        yield CounterMetricFamily(
            _P + "predicted_rows",
            "Rows predicted.",
            sum(lane.predicted_rows for lane in values) + predictor.merged_rows,
        )
        yield CounterMetricFamily(
            _P + "prediction_seconds",
            "Time spent predicting.",
            sum(lane.prediction_seconds_total for lane in values),
        )


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
        "them at the configured quantile (a hardware-aware predictor: the factor of rows "
        "without a class; each class's is class_calibration_scale).",
        labels=["target"],
    )
    observed = CounterMetricFamily(
        _P + "calibration_observations",
        "Routed requests compared with the prediction they were routed on (every class).",
        labels=["target"],
    )
    misses = CounterMetricFamily(
        _P + "calibration_misses",
        "Routed requests slower than their scaled prediction (every class).",
        labels=["target"],
    )
    for target, tracker in (("ttft", calibration.ttft), ("tpot", calibration.tpot)):
        seen, missed = calibration.totals(target)
        scale.add_metric([target], tracker.scale)
        observed.add_metric([target], seen)
        misses.add_metric([target], missed)
    yield scale
    yield observed
    yield misses
    if not calibration.classes:
        return
    class_scale = GaugeMetricFamily(
        _P + "class_calibration_scale",
        "Per hardware class: the factor applied to that class's predictions (a hardware-aware "
        "predictor calibrates each class on its own routed requests).",
        labels=["class", "target"],
    )
    class_observed = CounterMetricFamily(
        _P + "class_calibration_observations",
        "Per hardware class: routed requests compared with their prediction.",
        labels=["class", "target"],
    )
    for cls, pair in calibration.classes.items():
        for target, tracker in (("ttft", pair.ttft), ("tpot", pair.tpot)):
            class_scale.add_metric([cls, target], tracker.scale)
            class_observed.add_metric([cls, target], tracker.observations)
    yield class_scale
    yield class_observed
