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

from collections.abc import Sequence

from sluicegate.datalayer.endpoint import Endpoint
from sluicegate.framework import CycleState, LLMRequest, Picker, PickerParameters, ScoredEndpoint
from sluicegate.framework.helpers import uniform_sample


class RandomPicker(Picker):
    type_name = "random-picker"
    Parameters = PickerParameters
    params: PickerParameters

    def pick(
        self, request: LLMRequest, state: CycleState, scored: Sequence[ScoredEndpoint]
    ) -> list[Endpoint]:
        return uniform_sample(self.rng, scored, self.params.max_num_of_endpoints)
