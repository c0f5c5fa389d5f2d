"""``random-picker``: a uniformly random endpoint, blind to scores.

Type: picker. Parameters: ``maxNumOfEndpoints`` (1) — how many distinct endpoints to
return; the extra ones are the proxy's first fallbacks, in random order (the director
always appends the other candidates, by combined score, whatever this number).

Algorithm: each candidate is the primary with probability 1/n; k > 1 draws a sample of
``min(k, n)`` distinct candidates without replacement, as llm-d-router's picker does. The
randomness is the plugin context's seeded RNG, so a seed reproduces the choices. Also the
fallback of ``weighted-random-picker`` when no candidate has a positive score.
Source: https://github.com/llm-d/llm-d-router/blob/ebab6879/pkg/epp/framework/plugins/scheduling/picker/random/picker.go
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from sluicegate.datalayer.endpoint import Endpoint
from sluicegate.plugin import register
from sluicegate.scheduling.framework import (
    CycleState,
    LLMRequest,
    Picker,
    ScoredEndpoint,
)
from sluicegate.scheduling.plugins.max_score_picker import PickerParameters


def uniform_sample(rng: random.Random, scored: Sequence[ScoredEndpoint], k: int) -> list[Endpoint]:
    """``min(k, n)`` distinct endpoints of ``scored`` in uniformly random order."""
    n = len(scored)
    if n == 0:
        return []
    if k == 1:
        return [scored[rng.randrange(n)].endpoint]
    return [s.endpoint for s in rng.sample(scored, min(k, n))]


@register()
class RandomPicker(Picker):
    type_name = "random-picker"
    Parameters = PickerParameters
    params: PickerParameters

    def pick(
        self, request: LLMRequest, state: CycleState, scored: Sequence[ScoredEndpoint]
    ) -> list[Endpoint]:
        return uniform_sample(self.rng, scored, self.params.max_num_of_endpoints)
