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

An ``InferenceModelRewrite`` maps requested names to weighted ``targets`` the same way
(GIE at 1748e829: ``apix/v1alpha2/inferencemodelrewrite_types.go`` for the shape,
``pkg/epp/datastore/modelrewritestore.go`` for the precedence,
https://github.com/kubernetes-sigs/gateway-api-inference-extension/tree/1748e829). Which
route a requested name takes, first match wins:

1. a rewrite rule with an ``Exact`` match on the name — among several, the oldest
   InferenceModelRewrite (``creationTimestamp``; in a file without timestamps, the first
   read), then the first rule in it;
2. an ``InferenceModel`` whose ``modelName`` is the name;
3. a rewrite rule without ``matches`` (it matches every name), the oldest first;
4. none: the name is sent as is to the only pool.

GIE has no InferenceModel next to the rewrites, so 2 is ours: a named model beats a
catch-all rule, an exact rewrite beats the older kind. A rewrite route keeps the
criticality of an InferenceModel of the same name for its priority. GIE draws the target
at random by weight; the split here is the same smooth round-robin as InferenceModel's.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sluicegate.api.loader import Config
from sluicegate.metrics import ANY_MODEL_LABEL, NO_MODEL_LABEL

CRITICALITY_PRIORITY = {"Critical": 100, "Standard": 0, "Sheddable": -10}


@dataclass(slots=True)
class ModelRoute:
    """Where one public model name goes."""

    public_name: str
    pool: str
    targets: list[str]
    weights: list[int]
    priority: int
    rewrite: str | None = None
    """The InferenceModelRewrite whose rule made this route; None for an InferenceModel."""
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
        """Every configured public name (exact rewrite matches and InferenceModels)."""
        self.generic: ModelRoute | None = None
        """The rewrite rule without matches that takes every other name (its
        ``public_name`` is empty)."""
        priorities: dict[str, int] = {}
        for public, model in config.models.items():
            spec = model.spec
            targets = [t.name for t in spec.target_models] or [public]
            weights = [t.weight or 1 for t in spec.target_models] or [1]
            priority = priorities[public] = CRITICALITY_PRIORITY[spec.criticality or "Standard"]
            self.routes[public] = ModelRoute(public, spec.pool_ref.name, targets, weights, priority)
        self._add_rewrites(config, priorities)
        self.objectives: dict[str, int] = {
            name: obj.spec.priority or 0 for name, obj in config.objectives.items()
        }

    def _add_rewrites(self, config: Config, priorities: dict[str, int]) -> None:
        # Oldest first; objects without a timestamp after those with one, in file order
        # (sorted() is stable).
        ordered = sorted(
            config.rewrites.values(), key=lambda r: r.metadata.creation_timestamp or "~"
        )
        exact: dict[str, ModelRoute] = {}
        for rewrite in ordered:
            pool, name = rewrite.spec.pool_ref.name, rewrite.metadata.name
            for rule in rewrite.spec.rules:
                targets = [t.model_rewrite for t in rule.targets]
                weights = [t.weight or 1 for t in rule.targets]
                models = rule.exact_models
                if not models and self.generic is None:
                    self.generic = ModelRoute("", pool, targets, weights, 0, name)
                for public in models:
                    if public not in exact:
                        priority = priorities.get(public, 0)
                        route = ModelRoute(public, pool, targets, list(weights), priority, name)
                        exact[public] = route
        self.routes.update(exact)

    def route(self, public_name: str) -> ModelRoute | None:
        """The route of a requested name (see the module docstring), or None."""
        return self.routes.get(public_name) or self.generic

    def label(self, public_name: str) -> str:
        """The ``model_name`` metrics label for a requested name: the name itself, except
        :data:`NO_MODEL_LABEL` for a request without one and :data:`ANY_MODEL_LABEL` for a
        name only a catch-all rewrite takes (any string a client sends: never a label)."""
        if not public_name:
            return NO_MODEL_LABEL
        if self.generic is not None and public_name not in self.routes:
            return ANY_MODEL_LABEL
        return public_name

    def priority(self, route: ModelRoute | None, objective: str | None) -> int:
        """The request's priority: objective header first, then criticality, else 0."""
        if objective is not None and objective in self.objectives:
            return self.objectives[objective]
        return route.priority if route is not None else 0

    def public_names(self) -> list[str]:
        return sorted(self.routes)
