"""Predicted latency: models of TTFT and TPOT trained online on the gateway's own traffic.

- :mod:`~sluicegate.latency.features` — the row a model sees (``FeatureRow``), ``Sample``;
- :mod:`~sluicegate.latency.predictor` — ``LatencyPredictor``, the one interface the
  predicted-latency producer calls, and the ``PredictionQuery`` it asks with;
- :mod:`~sluicegate.latency.inprocess` — ``InProcessPredictor``, the default: models
  trained and evaluated in the gateway (``maybe_retrain`` for the simulation,
  ``run_trainer`` for the live gateway);
- :mod:`~sluicegate.latency.client` — ``RemotePredictor``, for prediction/training servers;
- :mod:`~sluicegate.latency.host` — ``PredictorHost``: the predictor a picker provides its
  plugins, built from the ``latencyPredictor`` settings, and its lifecycle;
- :mod:`~sluicegate.latency.calibration` — online calibration of the quantile
  predictions (``LatencyCalibration``);
- :mod:`~sluicegate.latency.store`, :mod:`~sluicegate.latency.model` — the stratified
  sample window and the XGBoost bundle;
- :mod:`~sluicegate.latency.trainserver`, :mod:`~sluicegate.latency.predictserver` — the
  ``sluicegate predictor`` servers; :mod:`~sluicegate.latency.trace` — recorded samples;
- :mod:`~sluicegate.latency.wire`, :mod:`~sluicegate.latency.service`,
  :mod:`~sluicegate.latency.batching`, :mod:`~sluicegate.latency.metrics`,
  :mod:`~sluicegate.latency.xgbfast` — plumbing of the predictor and its servers
  (wire format, batching, metrics, fast XGBoost evaluation), not exported.

The names are imported on first use (lazy): the predicted-latency plugin imports the
features and the predictor interface alone and must not load XGBoost.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sluicegate import lazy

_EXPORTS = {
    "LatencyCalibration": "sluicegate.latency.calibration",
    "QuantileTracker": "sluicegate.latency.calibration",
    "RemotePredictor": "sluicegate.latency.client",
    "RemoteSettings": "sluicegate.latency.client",
    "FEATURE_NAMES": "sluicegate.latency.features",
    "FeatureRow": "sluicegate.latency.features",
    "Sample": "sluicegate.latency.features",
    "feature_matrix": "sluicegate.latency.features",
    "PredictorHost": "sluicegate.latency.host",
    "InProcessPredictor": "sluicegate.latency.inprocess",
    "PredictorSettings": "sluicegate.latency.inprocess",
    "ModelBundle": "sluicegate.latency.model",
    "TrainConfig": "sluicegate.latency.model",
    "TrainingData": "sluicegate.latency.model",
    "train_bundle": "sluicegate.latency.model",
    "LatencyPredictor": "sluicegate.latency.predictor",
    "PredictionQuery": "sluicegate.latency.predictor",
    "Predictions": "sluicegate.latency.predictor",
    "SynchronousPredictor": "sluicegate.latency.predictor",
    "PredictServerOptions": "sluicegate.latency.predictserver",
    "PredictionServer": "sluicegate.latency.predictserver",
    "serve_prediction": "sluicegate.latency.predictserver",
    "SampleStore": "sluicegate.latency.store",
    "StoreConfig": "sluicegate.latency.store",
    "TraceError": "sluicegate.latency.trace",
    "TraceWriter": "sluicegate.latency.trace",
    "load_trace": "sluicegate.latency.trace",
    "read_trace": "sluicegate.latency.trace",
    "TrainServerOptions": "sluicegate.latency.trainserver",
    "TrainingServer": "sluicegate.latency.trainserver",
    "serve_training": "sluicegate.latency.trainserver",
}

if TYPE_CHECKING:
    from sluicegate.latency.calibration import LatencyCalibration, QuantileTracker
    from sluicegate.latency.client import RemotePredictor, RemoteSettings
    from sluicegate.latency.features import FEATURE_NAMES, FeatureRow, Sample, feature_matrix
    from sluicegate.latency.host import PredictorHost
    from sluicegate.latency.inprocess import InProcessPredictor, PredictorSettings
    from sluicegate.latency.model import ModelBundle, TrainConfig, TrainingData, train_bundle
    from sluicegate.latency.predictor import (
        LatencyPredictor,
        PredictionQuery,
        Predictions,
        SynchronousPredictor,
    )
    from sluicegate.latency.predictserver import (
        PredictionServer,
        PredictServerOptions,
        serve_prediction,
    )
    from sluicegate.latency.store import SampleStore, StoreConfig
    from sluicegate.latency.trace import TraceError, TraceWriter, load_trace, read_trace
    from sluicegate.latency.trainserver import TrainingServer, TrainServerOptions, serve_training


__getattr__ = lazy.exports(__name__, _EXPORTS, globals())


__all__ = [
    "FEATURE_NAMES",
    "FeatureRow",
    "InProcessPredictor",
    "LatencyCalibration",
    "LatencyPredictor",
    "ModelBundle",
    "PredictServerOptions",
    "PredictionQuery",
    "PredictionServer",
    "Predictions",
    "PredictorHost",
    "PredictorSettings",
    "QuantileTracker",
    "RemotePredictor",
    "RemoteSettings",
    "Sample",
    "SampleStore",
    "StoreConfig",
    "SynchronousPredictor",
    "TraceError",
    "TraceWriter",
    "TrainConfig",
    "TrainServerOptions",
    "TrainingData",
    "TrainingServer",
    "feature_matrix",
    "load_trace",
    "read_trace",
    "serve_prediction",
    "serve_training",
    "train_bundle",
]
