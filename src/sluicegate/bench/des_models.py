"""Shared latency models for gateway replicas in the lab: one training service fed by
every replica, each replica predicting with the model version it last pulled.

With ``--replica-state shared`` and online-trained models (``predicted-latency``), the
simulated replicas do what replicas pointed at one training server do
(``docs/replicas.md``, "Latency models"; :mod:`sluicegate.latency.trainserver`,
:mod:`sluicegate.latency.predictserver`, :mod:`sluicegate.latency.client`):

- **samples**: each replica buffers its completed requests' samples and flushes them to
  the training service every ``sample_flush_s`` (the client's ``flush_interval_s``, 1 s;
  replica *g* of *n* flushes at ``(k + (g + 1) / n) × sample_flush_s``); a buffer holds at
  most ``max_buffered`` samples (the client's bound: the oldest are dropped and counted);
- **training**: one hardware-blind predictor — an
  :class:`~sluicegate.latency.inprocess.InProcessPredictor`, as the training server's, with
  a single gateway's settings and schedule (a model as soon as ``min_samples`` are there,
  then every ``retrain_interval_s``) — trains one model on the pooled samples of every
  hardware class, checked at engine 0's scrapes and taking no simulated time, as a single
  gateway's is; every training publishes a *version* (its bundle, never mutated);
- **pull**: replica *g*'s prediction server syncs every ``model_sync_s`` (at
  ``(k + g / n) × model_sync_s``) and then predicts with the newest version published by
  that sync: a model trained at *t* is in use on a replica from 0 to ``model_sync_s``
  later. Each replica's online calibration stays its own (the client's is per gateway)
  and is hardware-blind, as the client's is (one pair of scales, ``max_classes`` 0).

The lab matches the runtime here rather than simulating a hardware-aware training service
the runtime does not have: a single gateway's and independent replicas' models are
hardware-aware (one model and one calibration per class, in process), shared replicas'
are not, so on a pool mixing accelerators shared replicas give up what per-class models
gain. A single gateway's models are in use the moment they are trained; here the lag is
one flush (samples) plus up to one sync (models). What it simplifies: HTTP round trips
(milliseconds) are not modelled.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

from sluicegate.clock import Clock
from sluicegate.latency.calibration import LatencyCalibration
from sluicegate.latency.features import Sample, feature_matrix
from sluicegate.latency.inprocess import InProcessPredictor, PredictorSettings
from sluicegate.latency.model import ModelBundle
from sluicegate.latency.predictor import PredictionQuery, Predictions, SynchronousPredictor

DEFAULT_SAMPLE_FLUSH_S = 1.0
"""The client's ``flush_interval_s`` (:class:`~sluicegate.latency.client.RemoteSettings`)."""
DEFAULT_MAX_BUFFERED = 10_000
"""The client's ``max_buffered_samples``."""


@dataclass(frozen=True, slots=True)
class ModelVersion:
    """One training's models, as every replica that pulls it predicts with them."""

    number: int
    published_at: float
    """Simulated s."""
    bundle: ModelBundle
    """This training's models (one for every hardware class)."""


class TrainingService:
    """The one training service of ``replicas`` shared replicas (see the module).

    :attr:`views` are the replicas' predictors (``views[g]`` is replica *g*'s)."""

    def __init__(
        self,
        clock: Clock,
        settings: PredictorSettings,
        replicas: int,
        model_sync_s: float,
        sample_flush_s: float = DEFAULT_SAMPLE_FLUSH_S,
        max_buffered: int = DEFAULT_MAX_BUFFERED,
    ) -> None:
        for name, value in (("model sync", model_sync_s), ("sample flush", sample_flush_s)):
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"{name} must be a positive number of seconds, got {value:g}")
        if max_buffered < 1:
            raise ValueError(f"max_buffered must be at least 1, got {max_buffered}")
        self.clock = clock
        self.settings = settings
        self.replicas = replicas
        self.model_sync_s = model_sync_s
        self.sample_flush_s = sample_flush_s
        self.trainer = InProcessPredictor(clock, settings)
        """The training service's model, trained on every replica's samples, of every
        hardware class (the training server's is hardware-blind)."""
        self._buffers: list[deque[tuple[float, Sample]]] = [
            deque(maxlen=max_buffered) for _ in range(replicas)
        ]
        """Per replica: (flush time, sample) not yet at the service, in flush-time order."""
        self._versions: deque[ModelVersion] = deque()
        """The versions a replica may still pull (see :meth:`_prune`): those published
        within the last ``model_sync_s`` and the one before. One model trains at most once
        per ``retrain_interval_s`` after its first, so at most
        ``model_sync_s / retrain_interval_s + 2``."""
        self.samples_pooled = 0
        self.samples_dropped = 0
        self.versions_published = 0
        self.views = [ReplicaModels(self, g) for g in range(replicas)]

    # ------------------------------------------------------------------ samples

    def submit(self, replica: int, sample: Sample, now: float) -> None:
        """Replica ``replica`` observed ``sample`` at ``now``: it leaves at its next flush."""
        buffer = self._buffers[replica]
        if len(buffer) == buffer.maxlen:
            self.samples_dropped += 1  # the deque drops the oldest
        buffer.append((self._next_tick(replica, now, self.sample_flush_s, 1), sample))

    def _next_tick(self, replica: int, now: float, period: float, offset: int) -> float:
        """The first of replica ``replica``'s ticks at or after ``now``; its ticks are at
        ``(k + (replica + offset) / n) × period``."""
        phase = period * (replica + offset) / self.replicas
        return phase + max(0, math.ceil((now - phase) / period)) * period

    def last_sync(self, replica: int, now: float) -> float | None:
        """When replica ``replica``'s prediction server last synced at or before ``now``
        (None: not yet)."""
        phase = self.model_sync_s * replica / self.replicas
        if now < phase:
            return None
        return phase + math.floor((now - phase) / self.model_sync_s) * self.model_sync_s

    # ------------------------------------------------------------------ training

    def advance(self, now: float) -> bool:
        """Deliver the samples flushed by ``now`` and train if due; True when a new
        version was published. Idempotent at one ``now`` (every view calls it)."""
        due: list[tuple[float, int, Sample]] = []
        for replica, buffer in enumerate(self._buffers):
            while buffer and buffer[0][0] <= now:
                at, sample = buffer.popleft()
                due.append((at, replica, sample))
        # As the service receives them: flush by flush, each flush's samples in order.
        due.sort(key=lambda d: (d[0], d[1]))
        for _, _, sample in due:
            self.trainer.observe(sample)
        self.samples_pooled += len(due)
        if not self.trainer.maybe_retrain(now):
            return False
        self._publish(now)
        return True

    def _publish(self, now: float) -> None:
        bundle = self.trainer.bundle
        assert bundle is not None  # maybe_retrain just put it in use
        self.versions_published += 1
        self._versions.append(ModelVersion(self.versions_published, now, bundle))
        self._prune(now)

    def _prune(self, now: float) -> None:
        # A replica's last sync is never earlier than now - model_sync_s from here on
        # (the clock only moves forward): of the versions published by then, only the
        # newest can still be pulled.
        versions = self._versions
        while len(versions) >= 2 and versions[1].published_at <= now - self.model_sync_s:
            versions.popleft()

    def version_at(self, t: float) -> ModelVersion | None:
        """The newest version published at or before ``t`` (of those still kept)."""
        found = None
        for version in self._versions:
            if version.published_at > t:
                break
            found = version
        return found

    def counters(self) -> dict[str, int]:
        return {
            "model_versions": self.versions_published,
            "model_samples_pooled": self.samples_pooled,
            "model_samples_dropped": self.samples_dropped,
            "model_pulls": sum(v.pulls for v in self.views),
        }


class ReplicaModels(SynchronousPredictor):
    """Replica *g*'s latency predictor: the version its prediction server last pulled,
    its own online calibration; its samples go to the training service."""

    def __init__(self, service: TrainingService, replica: int) -> None:
        self.service = service
        self.replica = replica
        self.held: ModelVersion | None = None
        self.pulls = 0
        """Versions put in use (one per sync that found a newer one)."""
        settings = service.settings
        train = settings.train
        # As the client builds its own: hardware-blind (max_classes 0), as the one model
        # it rescales is.
        self._calibration = (
            LatencyCalibration(train.alpha)
            if settings.online_calibration and train.objective == "quantile"
            else None
        )

    @property
    def calibration(self) -> LatencyCalibration | None:
        return self._calibration

    def _current(self) -> ModelVersion | None:
        service = self.service
        synced = service.last_sync(self.replica, service.clock.now())
        if synced is not None:
            version = service.version_at(synced)
            if version is not None and (self.held is None or version.number > self.held.number):
                self.held = version
                self.pulls += 1
        return self.held

    @property
    def ready(self) -> bool:
        return self._current() is not None

    def predict_query(self, query: PredictionQuery) -> Predictions | None:
        held = self._current()
        return None if held is None else held.bundle.predict(feature_matrix(query.rows))

    def observe(self, sample: Sample) -> None:
        self.service.submit(self.replica, sample, self.service.clock.now())

    def maybe_retrain(self, now: float | None = None) -> bool:
        """The training service's step at ``now`` (the run loop calls it per replica at
        engine 0's scrapes; the service trains at most once per ``now``)."""
        return self.service.advance(self.service.clock.now() if now is None else now)


__all__ = [
    "DEFAULT_MAX_BUFFERED",
    "DEFAULT_SAMPLE_FLUSH_S",
    "ModelVersion",
    "ReplicaModels",
    "TrainingService",
]
