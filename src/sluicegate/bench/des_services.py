"""What the discrete-event lab offers each gateway replica as its host's services.

A live ``sluicegate serve`` offers its plugins services under names
(``PluginContext.services``); in the lab each replica gets its own: its view of the
engines' KV events (``kv-events``: every replica subscribes) and its latency predictor
(``latency-predictor``: models trained online on that replica's own traffic — or, for
shared replicas, by one training service fed by all of them,
:mod:`sluicegate.bench.des_models` — or the oracle that asks the simulated engines what a
request would take). :class:`ReplicaServices` builds them, one replica at a time, for
:class:`~sluicegate.bench.des_gateway.GatewayGroup`.
"""

from __future__ import annotations

from collections.abc import Callable

from sluicegate.bench.des_kvevents import KVEventDelivery
from sluicegate.bench.des_models import TrainingService
from sluicegate.bench.des_requests import retarget
from sluicegate.bench.des_spec import ClusterSpec, TrainedPredictor
from sluicegate.bench.oracle import OraclePredictor
from sluicegate.clock import ManualClock
from sluicegate.datalayer.kvevents.service import KV_EVENTS_SERVICE
from sluicegate.framework import PREDICTOR_SERVICE, LLMRequest
from sluicegate.latency.hardware import HardwareAwarePredictor
from sluicegate.latency.predictor import LatencyPredictor
from sluicegate.sim.engine import Engine, Sequence

SequenceMaker = Callable[[bytes, bool, str, str, float, int], Sequence]
"""(body, chat, target model, request id, now, engine index) → the engine's sequence."""


class ReplicaServices:
    """Calling it with a replica's number gives that replica's services.

    ``next_step(i)`` is when engine *i*'s next iteration starts (simulated s: now when it
    is idle), ``bodies`` the request bodies the directors are deciding about (by request
    id: what the oracle simulates), ``sequence`` how a body becomes an engine sequence.
    """

    def __init__(
        self,
        spec: ClusterSpec,
        clock: ManualClock,
        engines: list[Engine],
        kv_events: KVEventDelivery | None,
        next_step: Callable[[int], float],
        bodies: dict[str, tuple[bytes, bool]],
        sequence: SequenceMaker,
    ) -> None:
        self.spec = spec
        self.clock = clock
        self.engines = engines
        self.kv_events = kv_events
        self._next_step = next_step
        self._bodies = bodies
        self._sequence = sequence
        self._index = {f"sim-{i}": i for i in range(len(engines))}
        self.predictors: list[TrainedPredictor] = []
        """The online-trained latency models (``predictor="model"``), one per replica."""
        self.training: TrainingService | None = None
        """The training service of shared replicas' models (``models_shared``), else None."""
        gateways = spec.gateways
        if spec.predictor == "model" and gateways.models_shared:
            if spec.predictor_factory is not None:
                raise ValueError(
                    "a predictor factory cannot be used with shared replicas' models "
                    "(one training service trains the default predictor)"
                )
            self.training = TrainingService(
                clock, spec.predictor_settings, gateways.gateways, gateways.model_sync_s
            )

    def __call__(self, replica: int) -> dict[str, object]:
        services = self._predictor_service(replica)
        if self.kv_events is not None:
            services[KV_EVENTS_SERVICE] = self.kv_events.views[replica].service
        return services

    def _predictor_service(self, replica: int) -> dict[str, object]:
        spec = self.spec
        if self.training is not None:
            view = self.training.views[replica]
            self.predictors.append(view)
            return {PREDICTOR_SERVICE: view}
        if spec.predictor == "model":
            # Trained on the replica's own traffic, in virtual time (the simulation
            # retrains every predictor at engine 0's scrapes).
            factory = spec.predictor_factory or HardwareAwarePredictor
            predictor = factory(self.clock, spec.predictor_settings)
            self.predictors.append(predictor)
            return {PREDICTOR_SERVICE: predictor}
        if spec.predictor == "oracle":
            oracle: LatencyPredictor = OraclePredictor(
                self._engine_of, self._oracle_sequence, self.clock.now
            )
            return {PREDICTOR_SERVICE: oracle}
        return {}

    def _engine_of(self, endpoint: str) -> tuple[Engine, float]:
        i = self._index[endpoint]
        return self.engines[i], self._next_step(i)

    def _oracle_sequence(self, request: LLMRequest, endpoint: str) -> Sequence:
        raw, chat = self._bodies[request.request_id]
        body = raw if request.target_model == request.model else retarget(raw, request.target_model)
        return self._sequence(
            body,
            chat,
            request.target_model,
            "oracle-what-if",
            self.clock.now(),
            self._index[endpoint],
        )


__all__ = ["ReplicaServices", "SequenceMaker"]
