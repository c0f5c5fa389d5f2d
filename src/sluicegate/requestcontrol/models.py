"""Model routing: the public model name a client asks for → pool, target model, priority.

An ``InferenceModel`` maps a public ``modelName`` to one or more ``targetModels`` (base
models or LoRA adapters) with weights; the split is a smooth weighted round-robin, so over
any window of requests each target gets its share to within one request (better than a
random draw, whose 10 % share over 2,000 requests varies by ±0.7 points). A model without
an InferenceModel is sent as is to the only pool, if there is one.

Priority (for shedding and flow control) comes from the request's objective header
(``InferenceObjective.priority``, negative = sheddable), else from the InferenceModel's
``criticality``: Critical 100, Standard 0, Sheddable −10 (the values of llm-d-benchmark's
``priority-mix`` objectives,
https://github.com/llm-d/llm-d-benchmark/blob/8bc9f1dd/workload/profiles/priority-mix/priority_mix.yaml.in),
else 0.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sluicegate.api.loader import Config

CRITICALITY_PRIORITY = {"Critical": 100, "Standard": 0, "Sheddable": -10}


@dataclass(slots=True)
class ModelRoute:
    """Where one public model name goes."""

    public_name: str
    pool: str
    targets: list[str]
    weights: list[int]
    priority: int
    _current: list[int] = field(default_factory=list)

    def next_target(self) -> str:
        """The next target by smooth weighted round-robin (nginx's algorithm)."""
        if len(self.targets) == 1:
            return self.targets[0]
        if not self._current:
            self._current = [0] * len(self.targets)
        current, weights = self._current, self.weights
        total = 0
        best = 0
        for i, w in enumerate(weights):
            current[i] += w
            total += w
            if current[i] > current[best]:
                best = i
        current[best] -= total
        return self.targets[best]


class ModelTable:
    """Public model names, objectives and the pool to use for everything else."""

    def __init__(self, config: Config) -> None:
        self.default_pool = next(iter(config.pools)) if len(config.pools) == 1 else None
        self.routes: dict[str, ModelRoute] = {}
        for public, model in config.models.items():
            spec = model.spec
            targets = [t.name for t in spec.target_models] or [public]
            weights = [t.weight or 1 for t in spec.target_models] or [1]
            priority = CRITICALITY_PRIORITY[spec.criticality or "Standard"]
            self.routes[public] = ModelRoute(public, spec.pool_ref.name, targets, weights, priority)
        self.objectives: dict[str, int] = {
            name: obj.spec.priority or 0 for name, obj in config.objectives.items()
        }

    def route(self, public_name: str) -> ModelRoute | None:
        return self.routes.get(public_name)

    def priority(self, route: ModelRoute | None, objective: str | None) -> int:
        """The request's priority: objective header first, then criticality, else 0."""
        if objective is not None and objective in self.objectives:
            return self.objectives[objective]
        return route.priority if route is not None else 0

    def public_names(self) -> list[str]:
        return sorted(self.routes)
