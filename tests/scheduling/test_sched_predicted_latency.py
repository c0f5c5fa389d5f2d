"""predicted-latency-producer: what each scheduling pass records about its predictions
(predicted, a fallback, or opted out by the request) and what the latency scorer then does."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest

from sluicegate.builtins import default_registry
from sluicegate.clock import ManualClock
from sluicegate.framework import (
    PREDICTION_OUTCOME,
    PREDICTIONS,
    PREDICTOR_SERVICE,
    CycleState,
    PluginContext,
    ProfileResult,
    ResponseOutcome,
    SchedulingResult,
)
from sluicegate.latency.calibration import LatencyCalibration, QuantileTracker
from sluicegate.latency.features import FeatureRow, Sample
from sluicegate.latency.predictor import PredictionQuery, Predictions, SynchronousPredictor
from sluicegate.scheduling.plugins.predicted_latency import PredictedLatencyProducer

REGISTRY = default_registry()

PREDICT_S = 0.003
"""How long the stub's prediction takes on the manual clock."""


class StubPredictor(SynchronousPredictor):
    """An in-process predictor: TTFT 100 ms × (endpoint index + 1), TPOT 10 ms."""

    calibration: LatencyCalibration | None = None

    def __init__(self, clock: ManualClock, ready: bool = True) -> None:
        self.clock = clock
        self.ready = ready
        self.calls = 0
        self.samples: list[Sample] = []

    def predict_query(self, query: PredictionQuery) -> Predictions | None:
        self.calls += 1
        self.clock.advance(PREDICT_S)
        n = len(query.rows)
        return Predictions(
            np.arange(1, n + 1, dtype=np.float32) * 100.0, np.full(n, 10.0, np.float32)
        )

    def observe(self, sample: Sample) -> None:
        self.samples.append(sample)


class StubRemote:
    """A remote predictor whose every call fails (None), as on a timeout; with ``answer``,
    one that answers it (TTFT 50 ms × (index + 1), TPOT 5 ms) after ``FETCH_S``."""

    calibration = None
    needs_io = True
    ready = False  # no success yet: asked all the same
    warming_up = False  # its failures are timeouts: the servers cannot be reached

    def __init__(self, clock: ManualClock | None = None, answer: bool = False) -> None:
        self.clock = clock
        self.answer = answer
        self.calls = 0
        self.samples: list[Sample] = []

    def predict_query(self, query: PredictionQuery) -> Predictions | None:
        raise AssertionError("a predictor that needs I/O is only awaited")

    async def predict_query_async(self, query: PredictionQuery) -> Predictions | None:
        self.calls += 1
        if not self.answer:
            return None
        assert self.clock is not None
        self.clock.advance(FETCH_S)
        n = len(query.rows)
        return Predictions(np.arange(1, n + 1) * 50.0, np.full(n, 5.0))

    def observe(self, sample: Sample) -> None:
        self.samples.append(sample)


FETCH_S = 0.02
"""How long the answering remote stub's call takes on the manual clock."""


class RequestAware(SynchronousPredictor):
    """Answers from the query's request and endpoints, not its rows (as the oracle does):
    TTFT = prompt tokens × (endpoint index + 1) ms, TPOT 0."""

    calibration = None
    ready = True

    def __init__(self) -> None:
        self.queries: list[PredictionQuery] = []

    def predict_query(self, query: PredictionQuery) -> Predictions:
        self.queries.append(query)
        tokens = query.request.prompt_tokens
        ttft = [tokens * (e.index + 1.0) for e in query.endpoints]
        return Predictions(np.array(ttft), np.zeros(len(ttft)))

    def observe(self, sample: Sample) -> None:
        pass


def producer(
    service: object, clock: ManualClock, streaming: bool = True
) -> PredictedLatencyProducer:
    """A producer in streaming mode (TTFT and TPOT, as the ``predicted-latency`` preset
    sets it) unless ``streaming`` is False (the plugin's default)."""
    context = PluginContext(clock, 0, services={PREDICTOR_SERVICE: service})
    params = {"streamingMode": True} if streaming else {}
    plugin = REGISTRY.create("predicted-latency-producer", "p", params, context)
    assert isinstance(plugin, PredictedLatencyProducer)
    return plugin


@pytest.fixture
def endpoints(make_endpoint: Any) -> list[Any]:
    return [make_endpoint(i) for i in range(3)]


def test_predictions_and_their_duration_are_recorded(
    endpoints: list[Any], make_request: Any
) -> None:
    clock = ManualClock()
    stub = StubPredictor(clock)
    plugin = producer(stub, clock)
    state = CycleState()
    plugin.produce(make_request("hi", slo_ttft_ms=250.0), state, endpoints)
    outcome = state.get(PREDICTION_OUTCOME)
    assert outcome is not None
    assert outcome.status == "predicted"
    assert not outcome.fallback
    assert outcome.duration_s == pytest.approx(PREDICT_S)
    predictions = state.get(PREDICTIONS)
    assert predictions is not None
    assert [predictions[e.name].ttft_ms for e in endpoints] == [100.0, 200.0, 300.0]
    assert [predictions[e.name].ttft_valid for e in endpoints] == [True, True, False]


def test_predictions_are_scaled_by_the_online_calibration(
    endpoints: list[Any], make_request: Any
) -> None:
    """A quantile predictor's calibration multiplies what the plugins see, headroom and
    validity included, and each completed request feeds it the prediction it was routed
    on (unscaled) and what happened."""
    clock = ManualClock()
    stub = StubPredictor(clock)
    stub.calibration = LatencyCalibration(alpha=0.9)
    stub.calibration.ttft = QuantileTracker(
        alpha=0.9, scale=2.0, min_observations=1, refresh_every=1
    )
    stub.calibration.tpot = QuantileTracker(alpha=0.9, min_observations=1, refresh_every=1)
    plugin = producer(stub, clock)
    request = make_request("hi", slo_ttft_ms=250.0)
    request.stream = True
    state = CycleState()
    plugin.produce(request, state, endpoints)
    predictions = state.get(PREDICTIONS)
    assert predictions is not None
    assert [predictions[e.name].ttft_ms for e in endpoints] == [200.0, 400.0, 600.0]
    assert [predictions[e.name].ttft_valid for e in endpoints] == [True, False, False]
    assert predictions[endpoints[0].name].ttft_headroom == pytest.approx(50.0)
    assert predictions[endpoints[0].name].tpot_ms == pytest.approx(10.0)  # TPOT scale 1

    chosen = endpoints[0]
    plugin.pre_request(
        request, state, SchedulingResult({"default": ProfileResult([chosen])}, "default")
    )
    # Observed: TTFT 150 ms (the model said 100: a miss at scale 1, a hit at scale 2),
    # TPOT 12 ms (the model said 10: a miss).
    outcome = ResponseOutcome(chosen, 1.0, 1.15, 1.15 + 0.012 * 9, 10, ok=True)
    plugin.on_complete(request, state, outcome)
    ttft, tpot = stub.calibration.ttft, stub.calibration.tpot
    assert (ttft.observations, ttft.misses) == (1, 0)
    assert ttft.scale == pytest.approx(1.5)  # 150 / 100: the window's only ratio
    assert (tpot.observations, tpot.misses) == (1, 1)
    assert tpot.scale == pytest.approx(1.2)
    assert len(stub.samples) == 1  # and it is still a training sample


def test_a_failed_request_still_calibrates_its_ttft(
    endpoints: list[Any], make_request: Any
) -> None:
    """Clients abandon slow requests: a failed one whose first token came still counts for
    the TTFT calibration (not for TPOT, and it is no training sample)."""
    clock = ManualClock()
    stub = StubPredictor(clock)
    stub.calibration = LatencyCalibration(alpha=0.9)
    plugin = producer(stub, clock)
    request = make_request("hi")
    request.stream = True
    state = CycleState()
    plugin.produce(request, state, endpoints)
    chosen = endpoints[0]
    plugin.pre_request(
        request, state, SchedulingResult({"default": ProfileResult([chosen])}, "default")
    )
    plugin.on_complete(request, state, ResponseOutcome(chosen, 1.0, 1.3, 2.0, None, ok=False))
    assert (stub.calibration.ttft.observations, stub.calibration.ttft.misses) == (1, 1)
    assert stub.calibration.tpot.observations == 0
    assert stub.samples == []


def test_a_second_pass_without_predictions_forgets_the_first(
    endpoints: list[Any], make_request: Any
) -> None:
    """A request produced again after waiting in flow control: when the second pass has
    no predictions, the first pass's (for other candidates, at another time) are gone."""
    clock = ManualClock()
    stub = StubPredictor(clock)
    plugin = producer(stub, clock)
    request = make_request("hi")
    state = CycleState()
    plugin.produce(request, state, endpoints)
    assert state.get(PREDICTIONS) is not None
    stub.ready = False
    plugin.produce(request, state, endpoints[:2])
    assert state.get(PREDICTIONS) is None
    outcome = state.get(PREDICTION_OUTCOME)
    assert outcome is not None
    assert outcome.status == "warming-up"


def test_a_cold_predictor_is_a_warming_up_fallback(endpoints: list[Any], make_request: Any) -> None:
    clock = ManualClock()
    plugin = producer(StubPredictor(clock, ready=False), clock)
    state = CycleState()
    plugin.produce(make_request("hi"), state, endpoints)
    outcome = state.get(PREDICTION_OUTCOME)
    assert outcome is not None
    assert (outcome.status, outcome.fallback) == ("warming-up", True)
    assert state.get(PREDICTIONS) is None


def test_opted_out_requests_get_no_prediction_and_are_no_fallback(
    endpoints: list[Any], make_request: Any
) -> None:
    clock = ManualClock()
    stub = StubPredictor(clock)
    plugin = producer(stub, clock)
    state = CycleState()
    request = make_request("hi", prediction_based=False)
    plugin.produce(request, state, endpoints)
    outcome = state.get(PREDICTION_OUTCOME)
    assert outcome is not None
    assert (outcome.status, outcome.fallback) == ("opted-out", False)
    assert state.get(PREDICTIONS) is None
    assert stub.calls == 0


def test_opted_out_requests_are_scored_by_the_composite_fallback(
    make_endpoint: Any, make_request: Any
) -> None:
    clock = ManualClock()
    plugin = producer(StubPredictor(clock), clock)
    scorer = REGISTRY.create("latency-scorer", "s", {}, PluginContext(clock))
    # ep-0 has the lowest predicted TTFT but the longest queue: predictions favour it,
    # the composite (KV, queue, prefix) does not.
    loaded = [
        make_endpoint(0, waiting=9, kv_usage=0.9),
        make_endpoint(1, waiting=0, kv_usage=0.1),
    ]
    scores = {}
    for prediction_based in (True, False):
        state = CycleState()
        request = make_request("hi", prediction_based=prediction_based)
        plugin.produce(request, state, loaded)
        scores[prediction_based] = scorer.score(request, state, loaded)  # type: ignore[attr-defined]
    assert scores[True][0] > scores[True][1]
    assert scores[False][0] < scores[False][1]


async def test_remote_failure_is_unavailable_and_opting_out_skips_the_call(
    endpoints: list[Any], make_request: Any
) -> None:
    clock = ManualClock()
    remote = StubRemote()
    plugin = producer(remote, clock)
    state = CycleState()
    request = make_request("hi")
    await plugin.prefetch(request, state, endpoints)
    plugin.produce(request, state, endpoints)
    outcome = state.get(PREDICTION_OUTCOME)
    assert outcome is not None
    assert (outcome.status, outcome.fallback) == ("unavailable", True)
    opted_out = make_request("hi", prediction_based=False)
    await plugin.prefetch(opted_out, CycleState(), endpoints)
    assert remote.calls == 1


async def test_remote_predictions_are_fetched_once_before_scheduling(
    endpoints: list[Any], make_request: Any
) -> None:
    """A predictor that needs I/O is awaited in the prefetch, never asked in produce; its
    call's duration is the recorded one, and a later pass over fewer candidates (after a
    wait in flow control) reuses the fetched predictions of those still there."""
    clock = ManualClock()
    remote = StubRemote(clock, answer=True)
    plugin = producer(remote, clock)
    assert plugin.fetches
    assert not producer(StubPredictor(clock), clock).fetches
    request = make_request("hi", slo_ttft_ms=120.0)
    state = CycleState()
    await plugin.prefetch(request, state, endpoints)
    plugin.produce(request, state, endpoints)
    outcome = state.get(PREDICTION_OUTCOME)
    assert outcome is not None
    assert outcome.status == "predicted"
    assert outcome.duration_s == pytest.approx(FETCH_S)
    predictions = state.get(PREDICTIONS)
    assert predictions is not None
    assert [predictions[e.name].ttft_ms for e in endpoints] == [50.0, 100.0, 150.0]
    plugin.produce(request, state, endpoints[1:])
    predictions = state.get(PREDICTIONS)
    assert predictions is not None
    assert {name: p.ttft_ms for name, p in predictions.items()} == {
        endpoints[1].name: 100.0,
        endpoints[2].name: 150.0,
    }
    assert remote.calls == 1


def test_a_request_aware_predictor_gets_the_request_and_the_endpoints(
    endpoints: list[Any], make_request: Any
) -> None:
    clock = ManualClock()
    predictor = RequestAware()
    plugin = producer(predictor, clock)
    request = make_request("a somewhat longer prompt")
    state = CycleState()
    plugin.produce(request, state, endpoints)
    (query,) = predictor.queries
    assert query.request is request
    assert list(query.endpoints) == endpoints
    assert len(query.rows) == len(endpoints)
    assert [row.input_token_length for row in query.rows] == [request.prompt_tokens] * 3
    predictions = state.get(PREDICTIONS)
    assert predictions is not None
    tokens = request.prompt_tokens
    assert [predictions[e.name].ttft_ms for e in endpoints] == [tokens, 2 * tokens, 3 * tokens]


def test_a_service_that_is_not_a_predictor_is_refused(make_request: Any) -> None:
    class Predict:
        def predict(self, rows: Sequence[FeatureRow]) -> None:
            return None

    with pytest.raises(TypeError, match="not a LatencyPredictor"):
        producer(Predict(), ManualClock())


def test_without_a_predictor_every_request_is_unavailable(
    endpoints: list[Any], make_request: Any
) -> None:
    clock = ManualClock()
    context = PluginContext(clock, 0)
    plugin = REGISTRY.create("predicted-latency-producer", "p", {}, context)
    assert isinstance(plugin, PredictedLatencyProducer)
    assert not plugin.fetches
    state = CycleState()
    plugin.produce(make_request("hi"), state, endpoints)
    outcome = state.get(PREDICTION_OUTCOME)
    assert outcome is not None
    assert outcome.status == "unavailable"


def test_compatibility_only_parameters_are_accepted_and_change_nothing(
    endpoints: list[Any], make_request: Any
) -> None:
    """Configurations written for the reference set them: they load, and predictions are
    the same as without them."""
    compatibility = {
        "contextTTL": "30s",
        "endpointRoleLabel": "llm-d.ai/role",
        "samplingMean": 50.0,
        "maxDecodeTokenSamplesForPrediction": 8,
        "prefixMatchInfoProducerName": "prefix",
        "inFlightLoadProducerName": "inflight",
    }
    answers = []
    for params in ({}, compatibility):
        clock = ManualClock()
        context = PluginContext(clock, 0, services={PREDICTOR_SERVICE: StubPredictor(clock)})
        plugin = REGISTRY.create("predicted-latency-producer", "p", params, context)
        assert isinstance(plugin, PredictedLatencyProducer)
        state = CycleState()
        plugin.produce(make_request("hi", slo_ttft_ms=250.0), state, endpoints)
        answers.append(state.get(PREDICTIONS))
    assert answers[0] is not None
    assert answers[0] == answers[1]
    with pytest.raises(ValueError, match="contextTTL"):
        REGISTRY.create("predicted-latency-producer", "p", {"contextTTL": "soon"}, context)


def test_streaming_mode_is_off_by_default_as_in_the_reference(
    endpoints: list[Any], make_request: Any
) -> None:
    """llm-d-router's producer defaults ``streamingMode`` to false: TPOT is neutral (valid,
    no headroom) whatever the SLO, and a sample's TTFT is the end-to-end latency."""
    clock = ManualClock()
    stub = StubPredictor(clock)
    plugin = producer(stub, clock, streaming=False)
    assert plugin.params.streaming_mode is False
    request = make_request("hi", slo_ttft_ms=250.0, slo_tpot_ms=1.0)
    request.stream = True
    state = CycleState()
    plugin.produce(request, state, endpoints)
    predictions = state.get(PREDICTIONS)
    assert predictions is not None
    assert all(p.tpot_valid and p.tpot_headroom == 0.0 for p in predictions.values())
    chosen = endpoints[0]
    plugin.pre_request(
        request, state, SchedulingResult({"default": ProfileResult([chosen])}, "default")
    )
    plugin.on_complete(request, state, ResponseOutcome(chosen, 1.0, 1.1, 1.5, 10, ok=True))
    (sample,) = stub.samples
    assert sample.ttft_ms == pytest.approx(500.0)  # dispatch → end, not → first token
    assert sample.tpot_ms is None


def test_the_predicted_latency_preset_turns_streaming_mode_on() -> None:
    from sluicegate.scheduling.config import load_preset

    plugins = load_preset("predicted-latency").plugins
    (spec,) = [p for p in plugins if p.type == "predicted-latency-producer"]
    assert spec.parameters.get("streamingMode") is True
