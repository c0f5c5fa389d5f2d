"""The flow-control policy interfaces: how full endpoints are, which band may use how much,
which flow goes next, and which request of a flow goes first.

Flow control (:mod:`sluicegate.flowcontrol`) dispatches waiting requests, in order, by
strict priority between bands, the band's :class:`FairnessPolicy` between its flows and
the band's :class:`OrderingPolicy` within a flow, to endpoints the
:class:`SaturationDetector` says have room under the :class:`UsageLimitPolicy`'s ceiling.
Built-in policies live in :mod:`sluicegate.flowcontrol.policies`.
"""

from __future__ import annotations

import abc
from collections.abc import Iterator, Sequence

from sluicegate.datalayer.endpoint import Endpoint
from sluicegate.framework.plugin import Plugin
from sluicegate.framework.queues import Band, FlowQueue, QueueItem


class SaturationDetector(Plugin):
    """How full endpoints are, from 0 (idle) to 1.0 (full) and beyond."""

    @abc.abstractmethod
    def endpoint_saturation(self, endpoint: Endpoint, now: float) -> float:
        """Saturation of one endpoint at clock time ``now`` (seconds)."""

    def usable(self, endpoint: Endpoint, now: float) -> bool:
        """Whether the detector can judge ``endpoint`` at all (e.g. its metrics are fresh)."""
        return True

    @property
    def headroom(self) -> float:
        return 0.0

    def has_room(self, endpoint: Endpoint, now: float, ceiling: float = 1.0) -> bool:
        """Whether ``endpoint`` can take another request under the usage ``ceiling``."""
        return self.usable(endpoint, now) and self.endpoint_saturation(endpoint, now) < ceiling * (
            1.0 + self.headroom
        )

    def saturation(self, endpoints: Sequence[Endpoint], now: float) -> float:
        """Mean saturation of ``endpoints``; 1.0 when there are none."""
        if not endpoints:
            return 1.0
        return sum(self.endpoint_saturation(e, now) for e in endpoints) / len(endpoints)


class UsageLimitPolicy(Plugin):
    """The saturation ceiling of each priority."""

    @abc.abstractmethod
    def ceiling(self, priority: int) -> float:
        """Saturation above which requests of ``priority`` wait (or are shed)."""


class FairnessPolicy(Plugin):
    """Which flow of a band is served next."""

    @abc.abstractmethod
    def order(self, band: Band) -> Iterator[FlowQueue]:
        """The band's non-empty flows, most deserving first."""

    def dispatched(self, band: Band, queue: FlowQueue) -> None:
        """``queue``'s head was just dispatched."""
        return


class OrderingPolicy(Plugin):
    """Which request of a flow goes first: a sort key given once, when it is queued."""

    @abc.abstractmethod
    def sort_key(self, item: QueueItem) -> tuple[float, ...]:
        """The item's key; smaller is served first."""


__all__ = ["FairnessPolicy", "OrderingPolicy", "SaturationDetector", "UsageLimitPolicy"]
