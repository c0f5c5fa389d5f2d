"""Predicted latency: models of TTFT and TPOT trained online on the gateway's own traffic.

- :mod:`~sluicegate.latency.features` — the row a model sees (``FeatureRow``), ``Sample``;
- :mod:`~sluicegate.latency.predictor` — ``LatencyPredictor``, the one interface the
  predicted-latency producer calls, and the ``PredictionQuery`` it asks with;
- :mod:`~sluicegate.latency.inprocess` — ``InProcessPredictor``, the default: models
  trained and evaluated in the gateway (``maybe_retrain`` for the simulation,
  ``run_trainer`` for the live gateway);
- :mod:`~sluicegate.latency.client` — ``RemotePredictor``, for prediction/training servers;
- :mod:`~sluicegate.latency.store`, :mod:`~sluicegate.latency.model` — the stratified
  sample window and the XGBoost bundle;
- :mod:`~sluicegate.latency.trainserver`, :mod:`~sluicegate.latency.predictserver` — the
  ``sluicegate predictor`` servers; :mod:`~sluicegate.latency.trace` — recorded samples.
"""
