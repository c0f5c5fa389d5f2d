"""Usage limits: the saturation at which a priority band stops being served.

``static-usage-limit-policy`` — parameters: ``threshold`` (1.0). Every band may use the
pool up to this saturation: requests are dispatched to endpoints whose saturation is below
it, and sheddable requests are refused once the pool's saturation reaches it (llm-d-router,
https://github.com/llm-d/llm-d-router/blob/ebab6879/pkg/epp/framework/plugins/flowcontrol/usagelimits/usagelimitpolicy.go).

``priority-holdback-policy`` — parameters: ``threshold`` (1.0), ``holdback`` (0.2),
``protectedPriority`` (1). Priorities ≥ ``protectedPriority`` get ``threshold``, the others
``threshold · (1 − holdback)``: the last share of every endpoint is kept for the protected
band. (The reference lists a policy of this name as experimental without documenting its
parameters; these are sluicegate's.)
"""

from __future__ import annotations

from pydantic import Field

from sluicegate.framework import PluginParameters, UsageLimitPolicy


class StaticUsageLimitPolicy(UsageLimitPolicy):
    type_name = "static-usage-limit-policy"

    class Parameters(PluginParameters):
        threshold: float = Field(1.0, gt=0.0)

    params: Parameters

    def ceiling(self, priority: int) -> float:
        return self.params.threshold


class PriorityHoldbackPolicy(UsageLimitPolicy):
    """``priority-holdback-policy``: keep room for important requests.

    Parameters: ``threshold`` (1.0), ``holdback`` (0.2), ``protectedPriority`` (1).
    Requests of priority ≥ ``protectedPriority`` may use the pool up to ``threshold``; the
    rest only up to ``threshold · (1 − holdback)``, so when the pool fills, the last share of
    every endpoint's capacity is left for the protected band — a newly arrived Critical
    request finds room instead of waiting for one to free up.
    """

    type_name = "priority-holdback-policy"

    class Parameters(PluginParameters):
        threshold: float = Field(1.0, gt=0.0)
        holdback: float = Field(0.2, ge=0.0, lt=1.0)
        protected_priority: int = 1

    params: Parameters

    def ceiling(self, priority: int) -> float:
        p = self.params
        if priority >= p.protected_priority:
            return p.threshold
        return p.threshold * (1.0 - p.holdback)
