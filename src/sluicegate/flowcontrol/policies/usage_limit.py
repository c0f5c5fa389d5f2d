"""Usage limits: the saturation at which a priority band stops being served.

``static-usage-limit-policy`` — parameters: ``threshold`` (1.0). Every band may use the
pool up to this saturation: requests are dispatched to endpoints whose saturation is below
it, and sheddable requests are refused once the pool's saturation reaches it (reference
anchors, section G).
"""

from __future__ import annotations

import abc

from pydantic import Field

from sluicegate.plugin import Plugin, PluginParameters, register


class UsageLimitPolicy(Plugin):
    """The saturation ceiling of each priority."""

    @abc.abstractmethod
    def ceiling(self, priority: int) -> float:
        """Saturation above which requests of ``priority`` wait (or are shed)."""


@register()
class StaticUsageLimitPolicy(UsageLimitPolicy):
    type_name = "static-usage-limit-policy"

    class Parameters(PluginParameters):
        threshold: float = Field(1.0, gt=0.0)

    params: Parameters

    def ceiling(self, priority: int) -> float:
        return self.params.threshold
