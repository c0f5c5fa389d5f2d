"""``latency-slo-admitter``: refuse sheddable requests no endpoint can serve in time.

Type: admitter. Inputs: the request's priority and SLO headers; the predictions of
``predicted-latency-producer``; each candidate's running requests and KV use.
Parameters: none.

Admits when the request is not sheddable (priority ≥ 0), carries no SLO header, has no
predictions (the predictor is down or warming up: fail open), or when any candidate is
predicted to meet its SLOs, is idle (no running request) or is cold (KV use < 2 %).
Otherwise refuses with **429** ("no valid endpoint available to serve the request") and
``Retry-After`` — the reference surfaces this as 500, a decision sluicegate treats as what
it is: shedding. The rules are llm-d-router's ``latency-slo-admitter``:
https://github.com/llm-d/llm-d-router/blob/ebab6879/pkg/epp/framework/plugins/requestcontrol/admitter/latencyslo/plugin.go
"""

from __future__ import annotations

from collections.abc import Sequence

from sluicegate.datalayer.endpoint import Endpoint
from sluicegate.errors import shed
from sluicegate.framework import PREDICTIONS, Admitter, CycleState, LLMRequest

_COLD_KV = 0.02


class LatencySloAdmitter(Admitter):
    type_name = "latency-slo-admitter"

    def admit(self, request: LLMRequest, state: CycleState, endpoints: Sequence[Endpoint]) -> None:
        if not request.sheddable:
            return
        if request.slo_ttft_ms is None and request.slo_tpot_ms is None:
            return
        predictions = state.get(PREDICTIONS)
        if not predictions:
            return
        for e in endpoints:
            p = predictions.get(e.name)
            if (p is not None and p.valid) or e.running == 0 or e.kv_usage() < _COLD_KV:
                return
        raise shed(
            "no valid endpoint available to serve the request", reason="rejected-slo-unattainable"
        )
