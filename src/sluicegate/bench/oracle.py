"""The oracle predictor: latencies read from the simulated engines instead of predicted.

For each candidate, the oracle forks the engine's exact state (``Engine.fork``), adds the
request as the server would receive it, and steps the copy until the request's first
token, then ``tpot_tokens`` more: the TTFT and TPOT it would see if nothing else arrived.
That is the exact latency of the *present* — the ``predicted-latency-oracle`` policy. It is
a bound on the error of predicting from the state at scheduling time, **not** an upper
bound on what a policy achieves: knowing nothing of the arrivals to come, its admitter lets
in requests the later load pushes past their SLOs, and on ``slo-mixed`` at 100 req/s it
meets 28.9 % of the SLOs where ``predicted-latency``'s trained models (which learn what the
load will do) meet 71.4 %. No goal is measured against it. Forking costs a few milliseconds
per candidate, so oracle runs are slower.

It is a :class:`~sluicegate.latency.predictor.LatencyPredictor` like the others — always
ready, no I/O, no calibration, nothing to learn — that reads the query's request and
endpoints rather than its feature rows; it exists only in the lab (``bench/des.py``
provides it as the ``latency-predictor`` service of ``predictor="oracle"`` runs).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from sluicegate.framework import LLMRequest
from sluicegate.latency.calibration import LatencyCalibration
from sluicegate.latency.features import Sample
from sluicegate.latency.predictor import PredictionQuery, Predictions, SynchronousPredictor
from sluicegate.sim.engine import Engine
from sluicegate.sim.engine import Sequence as EngineSequence

# What-if simulations stop after this many engine steps (a request that has not started
# by then is predicted to wait at least as long as those steps took).
_MAX_STEPS = 4000


class OraclePredictor(SynchronousPredictor):
    """Answers with the simulator's what-if latencies (ms)."""

    calibration: LatencyCalibration | None = None
    """None: the simulator's latencies are used as they come."""
    ready = True

    def __init__(
        self,
        engine_of: Callable[[str], tuple[Engine, float]],
        sequence_for: Callable[[LLMRequest, str], EngineSequence],
        now: Callable[[], float],
        tpot_tokens: int = 8,
    ) -> None:
        """``engine_of(endpoint name)`` gives the engine and when its next step starts;
        ``sequence_for(request, endpoint name)`` builds the sequence the server would run."""
        self._engine_of = engine_of
        self._sequence_for = sequence_for
        self._now = now
        self.tpot_tokens = tpot_tokens

    def predict_query(self, query: PredictionQuery) -> Predictions:
        """The what-if TTFT and TPOT of the query's request on each of its endpoints."""
        now = self._now()
        endpoints = query.endpoints
        ttft = np.empty(len(endpoints))
        tpot = np.empty(len(endpoints))
        for i, endpoint in enumerate(endpoints):
            ttft[i], tpot[i] = self._what_if(query.request, endpoint.name, now)
        return Predictions(ttft, tpot)

    def _what_if(self, request: LLMRequest, endpoint: str, now: float) -> tuple[float, float]:
        engine, next_step = self._engine_of(endpoint)
        fork = engine.fork()
        seq = self._sequence_for(request, endpoint)
        seq.arrival = now
        fork.add(seq)
        t = max(now, next_step)
        want = 1 + self.tpot_tokens
        for _ in range(_MAX_STEPS):
            if seq.num_output >= want or seq.finished:
                break
            result = fork.step(t)
            if result.idle:
                break
            t += result.duration
        first = seq.first_token_time if seq.first_token_time >= 0 else t
        ttft_ms = (first - now) * 1000.0
        if seq.num_output > 1:
            tpot_ms = (seq.last_token_time - seq.first_token_time) / (seq.num_output - 1) * 1000
        else:
            tpot_ms = (t - first) * 1000.0 / max(1, self.tpot_tokens)
        return ttft_ms, tpot_ms

    def observe(self, sample: Sample) -> None:
        """Nothing to learn: the simulator is the ground truth."""
