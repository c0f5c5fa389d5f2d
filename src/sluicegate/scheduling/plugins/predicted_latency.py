"""``predicted-latency-producer``: predicted TTFT/TPOT per endpoint, and training samples.

Type: data producer (also pre-request hook and response observer). Inputs per candidate:
the gateway's view of the endpoint (KV use, waiting and running requests, in-flight
prefill and decode tokens, requests dispatched since the last scrape, how long ago it
last produced a token and its last iteration interval), the request's
prompt tokens and expected output, and its prefix-cache score; the latency predictor is
the host's ``latency-predictor`` service, a :class:`~sluicegate.latency.predictor.
LatencyPredictor` (in-process XGBoost models, remote prediction servers, or the benchmark
lab's oracle). One batched prediction covers all candidates: asked while scheduling, or —
when it needs I/O (remote servers) — awaited once per request before scheduling.

Output per endpoint (llm-d-router's ``validatePrediction``,
https://github.com/llm-d/llm-d-router/blob/ebab6879/pkg/epp/framework/plugins/requestcontrol/dataproducer/predictedlatency/prediction.go):
``ttftHeadroom = ttftSLO − predTTFT`` and ``ttftValid = predTTFT < ttftSLO``; in streaming
mode ``bufTPOT = tpotSLO · sloBufferFactor``, lowered to the tightest TPOT SLO of the
requests already running there (so a newcomer cannot break it), ``tpotHeadroom = bufTPOT −
predTPOT``, ``tpotValid = predTPOT < bufTPOT``; in non-streaming mode TPOT is neutral
(valid, headroom 0). Without SLO headers the SLO is 0: headroom is −prediction, never
valid, and scorers pick the lowest predicted latency.

Calibration: with a quantile predictor, every prediction is the model's times the
predictor's online scale for its target and the endpoint's hardware class
(:mod:`sluicegate.latency.calibration`; one pair of scales when hardware-blind), and each
routed request updates its class's scales with the chosen endpoint's prediction and what
happened — at the end, or, on a mixed pool, a streamed TTFT at its first token — so
that on routed requests, not only on held-out samples, a share α of outcomes stays at or
below the prediction; unless the class's calibration restarted since the request was
routed (another model predicts it now: the outcome is skipped).

Training: when a request completes on the endpoint it was scheduled to, its features at
dispatch and what happened are a sample — in streaming mode TTFT (first byte − dispatch)
and TPOT ((end − first byte) / (output tokens − 1)); in non-streaming mode the end-to-end
latency stands in for TTFT (the reference's semantics).

Parameters (reference names and defaults): ``sloBufferFactor`` (1.0), ``streamingMode``
(false, as the reference: every request trains one end-to-end latency and TPOT is
neutral; true: TTFT and TPOT are learnt from streaming requests — sluicegate sees each
request's ``stream`` flag — and TPOT SLOs bind; the ``predicted-latency`` preset sets
it), ``predictInProduce`` (true; false = train only), ``hardwareAware`` (false, as the
reference: one model for the whole pool; true: every row and sample carries its
endpoint's hardware class, ``Endpoint.hardware.accelerator``, and a hardware-aware
predictor keeps one model per class — :mod:`sluicegate.latency.hardware`; on a pool of
one class, or of none named, both predict the same); six more are compatibility-only
(:class:`PredictedLatencyProducer.Parameters` lists them and says why).

Opting out: a request with ``x-prediction-based-scheduling: false`` or an
``x-prediction-based-scheduling-off`` header (or, without either, when
``latencyPredictor.predictionBasedSchedulingDefault`` is false) gets no
prediction at all — the scorers use their heuristic composite, the filters and the
admitter pass — and it still becomes a training sample. Each request's
:data:`PREDICTION_OUTCOME` says what happened, for the metrics.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence

from pydantic import Field

from sluicegate.api.units import Seconds
from sluicegate.datalayer.endpoint import Endpoint
from sluicegate.framework import (
    PREDICTION_OUTCOME,
    PREDICTIONS,
    PREDICTOR_SERVICE,
    PREFIX_MATCH,
    PREFIX_PRODUCER_TYPE,
    AsyncDataProducer,
    CycleState,
    DataProducer,
    EndpointObserver,
    EndpointPrediction,
    LLMRequest,
    PluginContext,
    PluginParameters,
    PredictionOutcome,
    PredictionStatus,
    PrefixMatch,
    PreRequest,
    ResponseObserver,
    ResponseOutcome,
    SchedulingResult,
    StateKey,
)
from sluicegate.latency.calibration import LatencyCalibration
from sluicegate.latency.features import (
    REUSE_DISTANCE_CAP_TOKENS,
    FeatureRow,
    Sample,
    token_timing,
)
from sluicegate.latency.predictor import LatencyPredictor, PredictionQuery, Predictions

_ROWS: StateKey[dict[str, FeatureRow]] = StateKey("latency-feature-rows")
_CHOSEN: StateKey[tuple[str, FeatureRow, str | None]] = StateKey("latency-chosen-row")
"""The chosen endpoint, its row and the hardware class its sample is filed under."""
_ROUTED_AT: StateKey[float] = StateKey("latency-routed-at")
"""Clock time (s) the request was handed to its endpoint (its TTFT starts there)."""
_TTFT_CALIBRATED: StateKey[bool] = StateKey("latency-ttft-calibrated")
"""The request's TTFT already fed the calibration, at its first token."""
_SCALES: StateKey[dict[str, tuple[float, float]]] = StateKey("latency-calibration-scales")
"""The TTFT and TPOT scales each endpoint's predictions were multiplied by."""
_GENERATIONS: StateKey[dict[str, int]] = StateKey("latency-calibration-generations")
"""The generation of the trackers that gave each endpoint's scales
(:meth:`LatencyCalibration.trackers_for_outcome`: an outcome is not fed to newer ones)."""
_PREFETCHED: StateKey[tuple[dict[str, FeatureRow], Predictions | None, float]] = StateKey(
    "latency-prefetched"
)
"""Rows, the remote predictions (None: failed or timed out) and the call's duration (s)."""


def feature_row(
    request: LLMRequest, endpoint: Endpoint, match: PrefixMatch | None, now: float
) -> FeatureRow:
    """The latency models' view of ``request`` on ``endpoint`` at ``now`` (clock s), with
    the prefix producer's ``match`` (None: no prefix information)."""
    inflight = endpoint.inflight
    since_token_ms, token_interval_ms = token_timing(
        inflight.last_token_at, inflight.token_interval_s, now
    )
    if match is None:
        prefix_score, distance = 0.0, None
    else:
        prefix_score = match.score(endpoint.name)
        distance = match.reuse_distance_tokens(endpoint.name)
    return FeatureRow(
        kv_cache_percentage=endpoint.kv_usage(),
        input_token_length=request.prompt_tokens,
        num_request_waiting=endpoint.waiting,
        num_request_running=endpoint.running,
        prefill_tokens_in_flight=inflight.prompt_tokens,
        decode_tokens_in_flight=inflight.decode_tokens,
        prefix_cache_score=prefix_score,
        dispatched_since_scrape=inflight.requests_since_scrape,
        expected_output_tokens=request.expected_output_tokens,
        ms_since_last_token=since_token_ms,
        token_interval_ms=token_interval_ms,
        prompt_tokens_before_last_token=inflight.prompt_tokens_before_last_token,
        prompt_tokens_after_last_token=inflight.prompt_tokens_after_last_token,
        prefix_reuse_distance_tokens=(
            REUSE_DISTANCE_CAP_TOKENS
            if distance is None
            else min(distance, REUSE_DISTANCE_CAP_TOKENS)
        ),
    )


class PredictedLatencyProducer(
    AsyncDataProducer, DataProducer, PreRequest, ResponseObserver, EndpointObserver
):
    type_name = "predicted-latency-producer"
    requires = (PREFIX_PRODUCER_TYPE,)

    class Parameters(PluginParameters):
        """``sloBufferFactor``, ``streamingMode``, ``predictInProduce`` and
        ``hardwareAware`` (module docstring), then the compatibility-only ones: ``contextTTL``,
        ``endpointRoleLabel``, ``samplingMean``, ``maxDecodeTokenSamplesForPrediction``,
        ``prefixMatchInfoProducerName`` and ``inFlightLoadProducerName`` are validated and
        never read, so that configurations written for the reference (llm-d-router's
        producer) load unchanged. A request's context lives in its cycle state and ends
        with it (no TTL); there are no prefill/decode roles; TPOT is predicted per request,
        not sampled; the prefix and in-flight data come from this gateway's own producers,
        not from named ones."""

        slo_buffer_factor: float = Field(1.0, gt=0.0)
        streaming_mode: bool = False
        predict_in_produce: bool = True
        hardware_aware: bool = False
        # Compatibility-only (see the docstring): accepted, never read.
        context_ttl: Seconds = Field(300.0, alias="contextTTL")
        endpoint_role_label: str = ""
        sampling_mean: float = 1000.0
        max_decode_token_samples_for_prediction: int = 0
        prefix_match_info_producer_name: str = ""
        in_flight_load_producer_name: str = ""

    params: Parameters

    def __init__(
        self, name: str, context: PluginContext, params: PluginParameters | None = None
    ) -> None:
        super().__init__(name, context, params)
        service = context.services.get(PREDICTOR_SERVICE)
        if service is not None and not isinstance(service, LatencyPredictor):
            raise TypeError(
                f"the {PREDICTOR_SERVICE!r} service ({type(service).__name__}) is not a "
                "LatencyPredictor (sluicegate.latency.predictor)"
            )
        self.predictor: LatencyPredictor | None = service
        """None: the host provides none, and every request is an ``unavailable`` fallback."""
        self.calibration: LatencyCalibration | None = (
            service.calibration if service is not None else None
        )
        self._tpot_slos: dict[str, Counter[float]] = {}
        """TPOT SLOs (ms) of the requests running on each endpoint."""

    @property
    def hardware_aware(self) -> bool:
        """True with ``hardwareAware`` (one model per class): not reported as blind on a
        mixed pool."""
        return self.params.hardware_aware

    # ------------------------------------------------------------------ prediction

    def _rows(
        self, request: LLMRequest, state: CycleState, endpoints: Sequence[Endpoint]
    ) -> dict[str, FeatureRow]:
        match = state.get(PREFIX_MATCH)
        now = self.context.clock.now()
        return {e.name: feature_row(request, e, match, now) for e in endpoints}

    @property
    def fetches(self) -> bool:
        # Only a predictor that needs I/O is asked here; any other is asked in produce(),
        # once per request rather than once more in a prefetch pass.
        predictor = self.predictor
        return predictor is not None and predictor.needs_io and self.params.predict_in_produce

    async def prefetch(
        self, request: LLMRequest, state: CycleState, endpoints: Sequence[Endpoint]
    ) -> None:
        predictor = self.predictor
        if (
            predictor is None
            or not predictor.needs_io
            or not self.params.predict_in_produce
            or not request.prediction_based
        ):
            return
        rows = self._rows(request, state, endpoints)
        clock = self.context.clock
        started = clock.now()
        query = PredictionQuery(request, endpoints, list(rows.values()), self._classes(endpoints))
        predictions = await predictor.predict_query_async(query)
        state.put(_PREFETCHED, (rows, predictions, clock.now() - started))

    def produce(
        self, request: LLMRequest, state: CycleState, endpoints: Sequence[Endpoint]
    ) -> None:
        rows = self._rows(request, state, endpoints)
        state.put(_ROWS, rows)
        if self.calibration is not None and self.params.hardware_aware:
            # Which classes the pool has now (LatencyCalibration.mixed; a class whose
            # servers all left stops counting after the presence window).
            self.calibration.see(
                [e.hardware.accelerator for e in endpoints], self.context.clock.now()
            )
        # A request that waited in flow control is produced again: what an earlier pass
        # predicted, for other candidates, must not outlive it.
        state.discard(PREDICTIONS)
        state.discard(_SCALES)
        state.discard(_GENERATIONS)
        if not self.params.predict_in_produce:
            return
        if not request.prediction_based:
            # Neither a prediction nor a fallback: the request asked for the heuristics.
            state.put(PREDICTION_OUTCOME, PredictionOutcome("opted-out"))
            return
        predictor = self.predictor
        predictions: Predictions | None = None
        status: PredictionStatus = "unavailable"
        duration = 0.0
        if predictor is None or predictor.needs_io:
            predictions, duration = self._prefetched(state, rows)
            if predictions is None and predictor is not None and predictor.warming_up:
                status = "warming-up"
        elif not predictor.ready:
            status = "warming-up"
        else:
            clock = self.context.clock
            started = clock.now()
            predictions = predictor.predict_query(
                PredictionQuery(request, endpoints, list(rows.values()), self._classes(endpoints))
            )
            duration = clock.now() - started
        if predictions is None:
            state.put(PREDICTION_OUTCOME, PredictionOutcome(status))
            return
        classes = self._classes(endpoints) or [None] * len(endpoints)
        calibration = self.calibration
        scales = {
            e.name: (calibration.scales(c, float(raw)) if calibration is not None else (1.0, 1.0))
            for e, c, raw in zip(endpoints, classes, predictions.ttft_ms, strict=True)
        }
        by_endpoint = self._with_headroom(request, endpoints, predictions, scales)
        if not by_endpoint:  # nothing finite came back
            state.put(PREDICTION_OUTCOME, PredictionOutcome("unavailable"))
            return
        state.put(PREDICTIONS, by_endpoint)
        state.put(_SCALES, scales)
        if calibration is not None:
            state.put(
                _GENERATIONS,
                {
                    e.name: calibration.generation(c)
                    for e, c in zip(endpoints, classes, strict=True)
                },
            )
        state.put(PREDICTION_OUTCOME, PredictionOutcome("predicted", duration))

    def _classes(self, endpoints: Sequence[Endpoint]) -> list[str | None] | None:
        """The candidates' hardware classes (None when hardware-blind)."""
        if not self.params.hardware_aware:
            return None
        return [e.hardware.accelerator for e in endpoints]

    @staticmethod
    def _prefetched(
        state: CycleState, rows: dict[str, FeatureRow]
    ) -> tuple[Predictions | None, float]:
        """The prefetched predictions for ``rows`` (None: none, or not for all of them)
        and how long the call took (s)."""
        prefetched = state.get(_PREFETCHED)
        if prefetched is None:
            return None, 0.0
        fetched_rows, fetched, duration = prefetched
        if fetched is None:
            return None, duration
        if list(fetched_rows) != list(rows):
            # The candidates changed since (e.g. the request waited in flow control):
            # reuse the predictions of the endpoints that are still there.
            index = {name: i for i, name in enumerate(fetched_rows)}
            if any(name not in index for name in rows):
                return None, duration
            picks = [index[name] for name in rows]
            return Predictions(fetched.ttft_ms[picks], fetched.tpot_ms[picks]), duration
        return fetched, duration

    def _with_headroom(
        self,
        request: LLMRequest,
        endpoints: Sequence[Endpoint],
        predictions: Predictions,
        scales: dict[str, tuple[float, float]],
    ) -> dict[str, EndpointPrediction]:
        factor = self.params.slo_buffer_factor
        ttft_slo = request.slo_ttft_ms or 0.0
        streaming = self.params.streaming_mode and request.stream
        out: dict[str, EndpointPrediction] = {}
        for i, e in enumerate(endpoints):
            ttft_scale, tpot_scale = scales[e.name]
            ttft = float(predictions.ttft_ms[i]) * ttft_scale
            tpot = float(predictions.tpot_ms[i]) * tpot_scale
            if not math.isfinite(ttft) or not math.isfinite(tpot):
                continue
            if streaming:
                buffered = (request.slo_tpot_ms or 0.0) * factor
                running = self._tpot_slos.get(e.name)
                if running:
                    tightest = min(running) * factor
                    buffered = min(buffered, tightest) if buffered > 0 else tightest
                tpot_headroom, tpot_valid = buffered - tpot, tpot < buffered
            else:
                tpot_headroom, tpot_valid = 0.0, True
            out[e.name] = EndpointPrediction(
                ttft_ms=ttft,
                tpot_ms=tpot,
                ttft_valid=ttft < ttft_slo,
                tpot_valid=tpot_valid,
                ttft_headroom=ttft_slo - ttft,
                tpot_headroom=tpot_headroom,
                dispatched=e.inflight.requests,
            )
        return out

    # ------------------------------------------------------------------ training

    def pre_request(self, request: LLMRequest, state: CycleState, result: SchedulingResult) -> None:
        chosen = result.targets[0]
        rows = state.get(_ROWS)
        if rows is not None and chosen.name in rows:
            cls = chosen.hardware.accelerator if self.params.hardware_aware else None
            state.put(_CHOSEN, (chosen.name, rows[chosen.name], cls))
            state.put(_ROUTED_AT, self.context.clock.now())
        if request.slo_tpot_ms:
            self._tpot_slos.setdefault(chosen.name, Counter())[request.slo_tpot_ms] += 1

    def on_first_token(
        self, request: LLMRequest, state: CycleState, endpoint: Endpoint, now: float
    ) -> None:
        # A streamed TTFT is known now: calibrating it at the request's end corrects the
        # scale a whole generation late — on a mixed pool long enough for one class to be
        # flooded before its scale moved (LatencyCalibration.mixed: only there).
        calibration = self.calibration
        chosen = state.get(_CHOSEN)
        routed_at = state.get(_ROUTED_AT)
        if (
            calibration is None
            or not calibration.mixed
            or not (self.params.streaming_mode and request.stream)
            or chosen is None
            or routed_at is None
            or chosen[0] != endpoint.name
        ):
            return
        self._calibrate(calibration, state, chosen, (now - routed_at) * 1000.0, None)
        state.put(_TTFT_CALIBRATED, True)

    def on_complete(self, request: LLMRequest, state: CycleState, outcome: ResponseOutcome) -> None:
        chosen = state.get(_CHOSEN)
        if request.slo_tpot_ms and chosen is not None:
            running = self._tpot_slos.get(chosen[0])
            if running is not None:
                running[request.slo_tpot_ms] -= 1
                if running[request.slo_tpot_ms] <= 0:
                    del running[request.slo_tpot_ms]
        if chosen is None or chosen[0] != outcome.endpoint.name:
            return  # no row, or served by a fallback: not a clean sample
        if not outcome.ok:
            # Not a sample; but a failed or abandoned request is often a slow one, and its
            # first token, when it came, still tells the calibration how TTFT went.
            if (
                self.calibration is not None
                and outcome.first_token_at is not None
                and not state.get(_TTFT_CALIBRATED)
            ):
                ttft = (outcome.first_token_at - outcome.dispatched_at) * 1000.0
                self._calibrate(self.calibration, state, chosen, ttft, None)
            return
        sample = self._sample(request, chosen[1], chosen[2], outcome)
        if sample is None:
            return
        if self.calibration is not None:
            seen = state.get(_TTFT_CALIBRATED)
            self._calibrate(
                self.calibration, state, chosen, None if seen else sample.ttft_ms, sample.tpot_ms
            )
        if self.predictor is not None:
            self.predictor.observe(sample)

    @staticmethod
    def _calibrate(
        calibration: LatencyCalibration,
        state: CycleState,
        chosen: tuple[str, FeatureRow, str | None],
        ttft_ms: float | None,
        tpot_ms: float | None,
    ) -> None:
        """Feed the prediction the request was routed on, unscaled, and what happened, to
        the chosen endpoint's class's trackers — unless they restarted since (the
        prediction was another model's: :meth:`LatencyCalibration.trackers_for_outcome`)."""
        endpoint, row, cls = chosen
        predicted = (state.get(PREDICTIONS) or {}).get(endpoint)
        scales = (state.get(_SCALES) or {}).get(endpoint)
        generation = (state.get(_GENERATIONS) or {}).get(endpoint)
        if predicted is None or scales is None or generation is None:
            return  # scheduled without predictions
        trackers = calibration.trackers_for_outcome(cls, generation)
        if trackers is None:
            return  # routed on trackers that restarted since
        if ttft_ms is not None:
            trackers.observe_ttft(predicted.ttft_ms / scales[0], ttft_ms)
        if tpot_ms is not None and predicted.tpot_ms > 0:  # 0: no TPOT model yet
            trackers.observe_tpot(predicted.tpot_ms / scales[1], tpot_ms, row, cls)

    def _sample(
        self, request: LLMRequest, row: FeatureRow, cls: str | None, outcome: ResponseOutcome
    ) -> Sample | None:
        start = outcome.dispatched_at
        if not self.params.streaming_mode:
            return Sample(row, ttft_ms=(outcome.finished_at - start) * 1000.0, hardware_class=cls)
        if not request.stream or outcome.first_token_at is None:
            return None
        ttft = (outcome.first_token_at - start) * 1000.0
        tpot = None
        n = outcome.output_tokens
        if n is not None and n >= 2:
            tpot = (outcome.finished_at - outcome.first_token_at) * 1000.0 / (n - 1)
        return Sample(row, ttft_ms=ttft, tpot_ms=tpot, hardware_class=cls)

    def forget_endpoint(self, endpoint: Endpoint) -> None:
        self._tpot_slos.pop(endpoint.name, None)
