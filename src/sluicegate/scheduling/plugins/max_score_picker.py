"""``max-score-picker``: the highest combined score wins; ties are broken at random.

Type: picker. Parameters: ``maxNumOfEndpoints`` (1) — how many endpoints to return, best
first; the extra ones are the proxy's first fallbacks (the director always appends the
other candidates, by combined score, whatever this number).

Algorithm: shuffle the candidates, then stable-sort by score, highest first, so equal
scores are ordered at random, as llm-d-router's picker does. For one endpoint (the default)
the same choice is made in one pass: the best score, a uniformly random one among equals.
Source: https://github.com/llm-d/llm-d-router/blob/ebab6879/pkg/epp/framework/plugins/scheduling/picker/maxscore/picker.go
"""

from __future__ import annotations

from collections.abc import Sequence

from sluicegate.datalayer.endpoint import Endpoint
from sluicegate.framework import CycleState, LLMRequest, Picker, PickerParameters, ScoredEndpoint


class MaxScorePicker(Picker):
    type_name = "max-score-picker"
    Parameters = PickerParameters
    params: PickerParameters

    def pick(
        self, request: LLMRequest, state: CycleState, scored: Sequence[ScoredEndpoint]
    ) -> list[Endpoint]:
        if self.params.max_num_of_endpoints == 1:
            return [self._best(scored)] if scored else []
        order = list(scored)
        self.rng.shuffle(order)
        order.sort(key=lambda s: s.score, reverse=True)
        return [s.endpoint for s in order[: self.params.max_num_of_endpoints]]

    def _best(self, scored: Sequence[ScoredEndpoint]) -> Endpoint:
        """The highest score; among ``n`` equal ones, each wins with probability 1/n
        (reservoir sampling: the k-th tie replaces the choice with probability 1/k)."""
        best = scored[0]
        top, ties = best.score, 1
        for s in scored[1:]:
            if s.score > top:
                best, top, ties = s, s.score, 1
            elif s.score == top:
                ties += 1
                if self.rng.random() * ties < 1.0:
                    best = s
        return best.endpoint
