"""``weighted-random-picker``: a random endpoint with probability proportional to its score.

Type: picker. Inputs: the combined scores (Σ weight · score; not normalised).
Parameters: ``maxNumOfEndpoints`` (1) — how many distinct endpoints to return, primary
first.

Algorithm A-Res (Efraimidis & Spirakis, weighted sampling without replacement; as in
llm-d-router, source below): every candidate with score w > 0 gets the key ``U^(1/w)`` with
U drawn uniformly from [0, 1) by the context's seeded RNG (U = 0 is replaced by 1e-10); a
candidate with w ≤ 0 gets key 0. The k largest keys win, so for k = 1 ``P(i) = w_i / Σ w``;
ties (only zero keys in practice) keep the candidates' order. When no score is positive the
choice is delegated to ``random-picker``'s uniform draw.
Source: https://github.com/llm-d/llm-d-router/blob/ebab6879/pkg/epp/framework/plugins/scheduling/picker/weightedrandom/picker.go
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence

from sluicegate.datalayer.endpoint import Endpoint
from sluicegate.framework import CycleState, LLMRequest, Picker, PickerParameters, ScoredEndpoint
from sluicegate.framework.helpers import uniform_sample

_MIN_U = 1e-10
"""Replaces a uniform draw of exactly 0, whose key would be 0 for every weight."""


class WeightedRandomPicker(Picker):
    type_name = "weighted-random-picker"
    Parameters = PickerParameters
    params: PickerParameters

    def pick(
        self, request: LLMRequest, state: CycleState, scored: Sequence[ScoredEndpoint]
    ) -> list[Endpoint]:
        rng = self.rng
        k = self.params.max_num_of_endpoints
        if k == 1:
            best: Endpoint | None = None
            best_key = -1.0
            for s in scored:
                w = s.score
                if w > 0.0:
                    key = (rng.random() or _MIN_U) ** (1.0 / w)
                    if key > best_key:
                        best, best_key = s.endpoint, key
            if best is None:
                return uniform_sample(rng, scored, k)
            return [best]
        keys: list[float] = []
        positive = False
        for s in scored:
            w = s.score
            if w > 0.0:
                keys.append((rng.random() or _MIN_U) ** (1.0 / w))
                positive = True
            else:
                keys.append(0.0)
        if not positive:
            return uniform_sample(rng, scored, k)
        top = heapq.nlargest(k, range(len(keys)), key=keys.__getitem__)
        return [scored[i].endpoint for i in top]
