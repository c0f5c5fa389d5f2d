"""The one predictor interface the ``predicted-latency-producer`` calls, whatever runs
the models.

Implementations: in-process XGBoost models (:class:`~sluicegate.latency.inprocess.
InProcessPredictor`, the default), a client of remote prediction servers
(:class:`~sluicegate.latency.client.RemotePredictor`), and — in the benchmark lab — an
oracle that asks the simulator (``sluicegate.bench.oracle``). The host provides one under
:data:`~sluicegate.framework.PREDICTOR_SERVICE`.

How the producer asks depends on :attr:`LatencyPredictor.needs_io`: a predictor that
needs I/O is awaited once per request (:meth:`~LatencyPredictor.predict_query_async`, in
the producer's prefetch, before scheduling); any other is asked synchronously while
scheduling (:meth:`~LatencyPredictor.predict_query`) — the benchmark lab's discrete-event
simulation is synchronous. A predictor that cannot answer (models still warming up,
servers down, a timeout) returns None and the plugins fall back to the heuristic
composite score.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np

from sluicegate.datalayer.endpoint import Endpoint
from sluicegate.framework import LLMRequest
from sluicegate.latency.calibration import LatencyCalibration
from sluicegate.latency.features import FeatureRow, Sample


@dataclass(frozen=True, slots=True)
class Predictions:
    """Predicted TTFT and TPOT in ms, one entry per input row."""

    ttft_ms: np.ndarray
    tpot_ms: np.ndarray


@dataclass(slots=True)  # not frozen: that costs ~0.4 µs more per scheduling decision
class PredictionQuery:
    """One scheduling decision's question: how would ``request`` do on each of
    ``endpoints``? ``rows[i]`` is the models' view of it on ``endpoints[i]``; models read
    the rows, the benchmark oracle the request and endpoints themselves. Predictors
    read it and never change it."""

    request: LLMRequest
    endpoints: Sequence[Endpoint]
    rows: Sequence[FeatureRow]
    classes: Sequence[str | None] | None = None
    """``classes[i]``: the hardware class whose model predicts ``rows[i]``; None (a
    hardware-blind producer): every row is of the one unnamed class. Predictors with a
    single model ignore it."""


@runtime_checkable
class LatencyPredictor(Protocol):
    """What the ``predicted-latency-producer`` calls (see the module docstring)."""

    @property
    def calibration(self) -> LatencyCalibration | None:
        """Online rescaling of quantile predictions, applied and fed by the plugins (None:
        the predictions are used as they come)."""
        ...

    @property
    def ready(self) -> bool:
        """Whether predictions can be made (False while warming up: no model trained or
        loaded yet). A predictor that does not need I/O is not asked while not ready (the
        request is a ``warming-up`` fallback); one that does is asked anyway, since asking
        is how it finds out the servers are back."""
        ...

    @property
    def warming_up(self) -> bool:
        """For a predictor that needs I/O: whether a call it answered None is a
        ``warming-up`` fallback (the servers have no model yet) rather than an
        ``unavailable`` one (they cannot be reached). Not consulted otherwise."""
        ...

    @property
    def needs_io(self) -> bool:
        """True: the producer awaits :meth:`predict_query_async` once per request before
        scheduling and never calls :meth:`predict_query`. False: it calls
        :meth:`predict_query` while scheduling and never awaits."""
        ...

    def predict_query(self, query: PredictionQuery) -> Predictions | None:
        """TTFT/TPOT (ms) for every candidate in one call, synchronously; None when no
        prediction can be made."""
        ...

    async def predict_query_async(self, query: PredictionQuery) -> Predictions | None:
        """TTFT/TPOT (ms) for every candidate; None on failure or timeout (callers fall
        back)."""
        ...

    def observe(self, sample: Sample) -> None:
        """Record a completed request for training (cheap; never blocks)."""
        ...


class SynchronousPredictor(ABC):
    """Base of predictors that answer without I/O: subclasses implement
    :meth:`predict_query`, ``ready``, ``calibration`` and ``observe``."""

    needs_io = False

    @property
    def warming_up(self) -> bool:
        """False: a predictor without I/O is judged by ``ready`` alone (the producer
        does not ask one that is not ready and counts the request as warming up)."""
        return False

    @abstractmethod
    def predict_query(self, query: PredictionQuery) -> Predictions | None:
        """TTFT/TPOT (ms) for every candidate in one call; None when no prediction can be
        made."""

    async def predict_query_async(self, query: PredictionQuery) -> Predictions | None:
        """The synchronous answer (for callers that await every predictor alike)."""
        return self.predict_query(query)
