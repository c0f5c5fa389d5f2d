"""``latency-scorer``: score endpoints by predicted latency and SLO headroom.

Type: scorer (balance). Inputs: the predictions of ``predicted-latency-producer``; for the
fallback, KV use, waiting requests and prefix scores. Parameters (llm-d-router,
https://github.com/llm-d/llm-d-router/blob/ebab6879/pkg/epp/framework/plugins/scheduling/scorer/latency/plugin.go):
``ttftWeight`` (0.8), ``tpotWeight`` (0.2), ``headroomSelectionStrategy``
(``least`` — pack requests where the SLO is just met —, ``most``, or ``load``, below),
``compositeKVWeight``, ``compositeQueueWeight``, ``compositePrefixWeight`` (1 each).

1. No endpoint has a prediction → composite fallback (below).
2. If some endpoint has non-negative TTFT and TPOT headroom, only those are scored, with
   the configured strategy; the others score 0.
3. Otherwise, if some endpoint has nothing in flight from this gateway, only those are
   scored; else only the first non-empty group of [TPOT-only negative], [TTFT-only
   negative], [both negative] — always with ``least`` (``most`` would favour the most
   overloaded endpoint).
4. Within the scored group: α = ttftWeight/(ttftWeight+tpotWeight), β = 1 − α; each
   dimension's |headroom| is min-max normalised within the group (0.5 when all equal; if
   only one dimension varies, it gets all the weight); c = α·nTTFT + β·nTPOT; ``least``:
   ⌊(1 − c)·100 + 1⌋/100, ``most``: ⌊c·100 + 1⌋/100, clamped to [0, 1].

Without SLO headers headroom is −prediction, so the lowest predicted latency wins.

``load`` (sluicegate's; only in step 2, the group that meets both SLOs): on a pool mixing
hardware classes the least capacity-weighted load wins, ``l = inflight · f`` with
``inflight`` the requests this gateway has in flight there and ``f = c_max / c`` the load
factor of capacity normalisation below (1 for every candidate while a capacity is
unknown), score ``⌊(1 − l / l_max)·100 + 1⌋/100`` (1 when all are idle). While fewer
than two classes appeared among the candidates of the last 60 s
(:mod:`sluicegate.latency.presence`) it is ``most``, so a pool of one class — also one
whose other class's servers have all left — is scored exactly as with ``most``. Why:
once every candidate is predicted to meet the SLO, the size of the margin says more
about the model's errors than about the endpoint — on a mixed pool the largest headroom
kept going to the faster class, whose queues then grew past anything the models
were trained on (heterogeneous-pool, 80 req/s, 3 seeds: docs/benchmarks/heterogeneous-pool).

Composite fallback: weights normalised to sum 1; relQ = (maxQ − q)/maxQ (1 if maxQ = 0);
c = w_kv·(1 − KV) + w_q·relQ + w_p·prefixScore; score = round(100·c)/100.
With ``capacityNormalization`` (``off`` | ``configured`` | ``measured``, default ``off``,
and ``classCapacity``; :mod:`sluicegate.scheduling.capacity`) the fallback weighs load by
each endpoint's class capacity as the heuristic scorers do: ``q`` becomes ``q · f`` and
the KV term ``(1 − KV) / f``, ``f = c_max / c`` (1 for the fastest class; exactly 1
everywhere on a homogeneous pool) — so that while the latency models warm up a mixed pool
is not loaded as if every endpoint were equally fast. Predictions, when there are any,
are not touched: they already account for the hardware.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Literal

from pydantic import Field

from sluicegate.datalayer.endpoint import Endpoint
from sluicegate.framework import (
    PREDICTIONS,
    PREFIX_MATCH,
    CycleState,
    EndpointPrediction,
    LLMRequest,
    PluginContext,
    PluginParameters,
)
from sluicegate.latency.presence import ClassPresence
from sluicegate.scheduling.capacity import MAX_CLASSES, CapacityParameters, CapacityScorer

_FLAT = 1e-9


class LatencyScorer(CapacityScorer):
    type_name = "latency-scorer"
    category = "balance"

    class Parameters(CapacityParameters):
        ttft_weight: float = Field(0.8, ge=0.0)
        tpot_weight: float = Field(0.2, ge=0.0)
        headroom_selection_strategy: Literal["least", "most", "load"] = "least"
        composite_kv_weight: float = Field(1.0, ge=0.0, alias="compositeKVWeight")
        composite_queue_weight: float = Field(1.0, ge=0.0)
        composite_prefix_weight: float = Field(1.0, ge=0.0)

    params: Parameters

    def __init__(
        self, name: str, context: PluginContext, params: PluginParameters | None = None
    ) -> None:
        super().__init__(name, context, params)
        self._presence = ClassPresence(max_classes=MAX_CLASSES)
        """Hardware classes among recent candidates (``load`` applies while two are)."""

    def score(
        self, request: LLMRequest, state: CycleState, endpoints: Sequence[Endpoint]
    ) -> list[float]:
        predictions = state.get(PREDICTIONS) or {}
        predicted = [
            (i, predictions[e.name]) for i, e in enumerate(endpoints) if e.name in predictions
        ]
        if not predicted:
            return self._composite(state, endpoints)
        positive = [(i, p) for i, p in predicted if p.ttft_headroom >= 0 and p.tpot_headroom >= 0]
        strategy = self.params.headroom_selection_strategy
        if positive:
            group = positive
        else:
            strategy = "least"
            idle = [(i, p) for i, p in predicted if p.dispatched == 0]
            group = idle or next(
                g
                for g in (
                    [(i, p) for i, p in predicted if p.ttft_headroom >= 0 > p.tpot_headroom],
                    [(i, p) for i, p in predicted if p.tpot_headroom >= 0 > p.ttft_headroom],
                    [(i, p) for i, p in predicted if p.ttft_headroom < 0 and p.tpot_headroom < 0],
                    predicted,
                )
                if g
            )
        scores = [0.0] * len(endpoints)
        values = None
        if strategy == "load":
            values = self._load_scores([endpoints[i] for i, _ in group], endpoints)
        if values is None:
            values = self._group_scores(
                [p for _, p in group], "most" if strategy == "load" else strategy
            )
        for (i, _), value in zip(group, values, strict=True):
            scores[i] = value
        return scores

    def _group_scores(self, group: list[EndpointPrediction], strategy: str) -> list[float]:
        p = self.params
        total = p.ttft_weight + p.tpot_weight
        alpha = p.ttft_weight / total if total > 0 else 0.5
        beta = 1.0 - alpha
        ttft = [abs(x.ttft_headroom) for x in group]
        tpot = [abs(x.tpot_headroom) for x in group]
        ttft_range, tpot_range = max(ttft) - min(ttft), max(tpot) - min(tpot)
        if ttft_range <= _FLAT < tpot_range:
            alpha, beta = 0.0, 1.0
        elif tpot_range <= _FLAT < ttft_range:
            alpha, beta = 1.0, 0.0
        out = []
        for a, b in zip(ttft, tpot, strict=True):
            n_ttft = (a - min(ttft)) / ttft_range if ttft_range > _FLAT else 0.5
            n_tpot = (b - min(tpot)) / tpot_range if tpot_range > _FLAT else 0.5
            c = alpha * n_ttft + beta * n_tpot
            raw = (1.0 - c) if strategy == "least" else c
            out.append(min(1.0, max(0.0, (math.floor(raw * 100) + 1) / 100)))
        return out

    def _load_scores(
        self, group: list[Endpoint], endpoints: Sequence[Endpoint]
    ) -> list[float] | None:
        """``load`` within the group that meets the SLOs (module docstring); None while
        fewer than two hardware classes are present among recent candidates (then
        ``most``)."""
        now = self.context.clock.now()
        self._presence.see((e.hardware.accelerator for e in endpoints), now)
        if not self._presence.mixed(now):
            return None
        factors = self.capacity.factors(endpoints) or [1.0] * len(endpoints)
        f_of = {e.name: f for e, f in zip(endpoints, factors, strict=True)}
        loads = [e.inflight.requests * f_of[e.name] for e in group]
        top = max(loads, default=0.0)
        out = []
        for load in loads:
            raw = 1.0 - load / top if top > 0 else 1.0
            out.append(min(1.0, max(0.0, (math.floor(raw * 100) + 1) / 100)))
        return out

    def _composite(self, state: CycleState, endpoints: Sequence[Endpoint]) -> list[float]:
        p = self.params
        total = p.composite_kv_weight + p.composite_queue_weight + p.composite_prefix_weight
        if total <= 0:
            return [0.0] * len(endpoints)
        w_kv = p.composite_kv_weight / total
        w_q = p.composite_queue_weight / total
        w_p = p.composite_prefix_weight / total
        factors = self.capacity.factors(endpoints) or [1.0] * len(endpoints)
        queues = [e.waiting * f for e, f in zip(endpoints, factors, strict=True)]
        max_q = max(queues, default=0)
        match = state.get(PREFIX_MATCH)
        out = []
        for e, q, f in zip(endpoints, queues, factors, strict=True):
            rel_q = (max_q - q) / max_q if max_q > 0 else 1.0
            prefix = match.score(e.name) if match is not None else 0.0
            c = w_kv * (1.0 - e.kv_usage()) / f + w_q * rel_q + w_p * prefix
            out.append(round(100 * c) / 100)
        return out
