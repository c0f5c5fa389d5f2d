"""The latency predictor a picker provides its plugins, and its lifecycle.

:class:`PredictorHost` turns the ``latencyPredictor`` settings into the service the
``predicted-latency-producer`` looks up: a :class:`HardwareAwarePredictor` (the default:
in-process models, one per hardware class, trained on the picker's own traffic in a
worker thread) or a :class:`RemotePredictor`
(prediction and training servers), starts and stops it with the
picker and exports its metrics.

At start the in-process predictor loads the models saved in its model directory
(``--latency-model-dir``, else ``modelDir``), then — given a recorded trace
(``--latency-trace``) — files the trace's samples in their classes' windows and trains
on them at once, through the same training (and saving) as live retraining. Live samples
then join the windows and gradually take them over.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Mapping

from prometheus_client import CollectorRegistry

from sluicegate.api.settings import LatencyPredictorSettings
from sluicegate.clock import Clock
from sluicegate.latency.client import RemotePredictor, RemoteSettings
from sluicegate.latency.hardware import HardwareAwarePredictor, configured_speeds
from sluicegate.latency.inprocess import PredictorSettings
from sluicegate.latency.metrics import HardwarePredictorCollector, RemotePredictorCollector
from sluicegate.latency.model import TrainConfig
from sluicegate.latency.predictor import LatencyPredictor
from sluicegate.latency.trace import load_trace

log = logging.getLogger("sluicegate.latency")

PREDICTION_URL_ENV = "PREDICTION_SERVER_URL"
TRAINING_URL_ENV = "TRAINING_SERVER_URL"


def remote_urls(
    settings: LatencyPredictorSettings, environ: Mapping[str, str] | None = None
) -> tuple[tuple[str, ...], str | None]:
    """Prediction server URLs and the training server URL: the settings', else the
    environment's (``PREDICTION_SERVER_URL`` comma-separated, ``TRAINING_SERVER_URL``)."""
    env = os.environ if environ is None else environ
    predict = tuple(settings.prediction_urls) or tuple(
        u.strip() for u in env.get(PREDICTION_URL_ENV, "").split(",") if u.strip()
    )
    train = settings.training_url or env.get(TRAINING_URL_ENV) or None
    return predict, train


class PredictorHost:
    """Owns one latency predictor: starts it, stops it, exports its metrics."""

    def __init__(
        self,
        settings: LatencyPredictorSettings,
        clock: Clock,
        environ: Mapping[str, str] | None = None,
        *,
        model_dir: str | None = None,
        trace: str | None = None,
    ) -> None:
        """``model_dir`` overrides the settings' ``modelDir``; ``trace`` is a JSON Lines
        sample file to train on at start. Both apply to in-process models only."""
        self.settings = settings
        self.model_dir = model_dir or settings.model_dir
        self.trace = trace
        predict_urls, train_url = remote_urls(settings, environ)
        self.local: HardwareAwarePredictor | None = None
        self.remote: RemotePredictor | None = None
        if predict_urls:
            self.remote = RemotePredictor(
                RemoteSettings(
                    prediction_urls=predict_urls,
                    training_url=train_url,
                    timeout_s=settings.timeout_ms / 1000.0,
                    quantile=(
                        settings.quantile
                        if settings.online_calibration and settings.objective == "quantile"
                        else None
                    ),
                )
            )
        else:
            self.local = HardwareAwarePredictor(
                clock,
                PredictorSettings(
                    retrain_interval_s=settings.retrain_interval_ms / 1000.0,
                    min_samples=settings.min_samples,
                    train=TrainConfig(objective=settings.objective, alpha=settings.quantile),
                    model_dir=self.model_dir,
                    online_calibration=settings.online_calibration,
                    class_speeds=configured_speeds(settings.class_speeds),
                ),
                timer=time.perf_counter,
            )
        if self.remote is not None and (model_dir or trace):
            log.warning(
                "--latency-model-dir and --latency-trace are unused: the latency models are "
                "remote (predictionUrls / %s)",
                PREDICTION_URL_ENV,
            )
        self._trainer: asyncio.Task[None] | None = None

    @property
    def service(self) -> LatencyPredictor:
        """What the plugins call (the ``predicted-latency-producer``)."""
        service = self.local or self.remote
        assert service is not None
        return service

    def register_metrics(self, registry: CollectorRegistry) -> None:
        if self.local is not None:
            registry.register(HardwarePredictorCollector(self.local))
        if self.remote is not None:
            registry.register(RemotePredictorCollector(self.remote))

    async def start(self) -> None:
        """Load saved models (in process) and start training, or connect (remote)."""
        if self.local is not None:
            directory = self.model_dir
            if directory and self.local.load(directory):
                log.info("latency models loaded from %s", directory)
            if self.trace is not None:
                await self._train_from_trace(self.local, self.trace)
            self._trainer = asyncio.create_task(self.local.run_trainer(), name="latency-trainer")
        elif self.remote is not None:
            await self.remote.start()

    async def _train_from_trace(self, local: HardwareAwarePredictor, trace: str) -> None:
        """File ``trace``'s samples and train on them; raises OSError or TraceError.

        Both run in a worker thread: nothing else touches the store yet (the host starts
        before its picker takes requests and before the trainer task)."""
        read = await asyncio.to_thread(load_trace, trace, local)
        if await local.retrain_async():
            log.info("latency models trained on %d samples of %s", read, trace)
        else:
            log.warning(
                "%s: %d TTFT training samples (of %d read), minSamples %d needed; the "
                "models train once live traffic adds the rest",
                trace,
                local.ttft_samples,
                read,
                local.settings.min_samples,
            )

    async def stop(self) -> None:
        if self._trainer is not None:
            self._trainer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._trainer
            self._trainer = None
        if self.remote is not None:
            await self.remote.close()
