"""The director's queues: a flow controller for each pool whose flow control is on, and
what is kept for each request waiting in one until it leaves — dispatched
(:meth:`WaitingRoom.pump`), out of time (:meth:`WaitingRoom.expire`), unservable
(:meth:`WaitingRoom.reject_unservable`) or given up by its client
(:meth:`WaitingRoom.cancel`). Every way out but a cancel tells the request's ticket, once.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from sluicegate.datalayer.datastore import Pool
from sluicegate.datalayer.endpoint import Endpoint
from sluicegate.errors import GatewayError
from sluicegate.flowcontrol.config import FlowControlSetup
from sluicegate.flowcontrol.controller import FlowController
from sluicegate.flowcontrol.peers import PeerYield
from sluicegate.framework import CycleState, QueueItem
from sluicegate.requestcontrol.dispatch import Dispatch
from sluicegate.requestcontrol.refusals import unservable

if TYPE_CHECKING:
    from sluicegate.requestcontrol.director import Admitted, Ticket


@dataclass(slots=True)
class Waiting:
    """What the director keeps for a queued request until it leaves the queue."""

    admitted: Admitted
    ticket: Ticket
    state: CycleState | None
    """The scheduling state from admission (what was prefetched for it)."""
    candidates: list[Endpoint] = field(default_factory=list)
    """The endpoints with room found when it was last considered for dispatch."""
    first_held: float | None = None
    """When it first held back for the other replicas' higher bands (clock seconds;
    :class:`~sluicegate.flowcontrol.peers.PeerYield`), None if it never did."""


class WaitingRoom:
    """Flow controllers by pool name, and the requests queued in them."""

    def __init__(self) -> None:
        self._controllers: dict[str, FlowController] = {}
        self._waiting: dict[QueueItem, Waiting] = {}
        """Queued requests: removed as each leaves the queue, whichever way."""

    def set_flow(self, flow: FlowControlSetup) -> None:
        """New flow-control settings for every queue; requests already waiting stay."""
        for controller in self._controllers.values():
            controller.settings = flow.settings

    def controller(self, pool: Pool, flow: FlowControlSetup) -> FlowController | None:
        """The pool's flow controller, or None when flow control is off for it."""
        controller = self._controllers.get(pool.name)
        if not flow.enabled_for(pool.annotations):
            # Turned off by a reload: new requests bypass the queue; those waiting in it
            # still leave through pump(), and it goes once drained.
            if controller is not None and not controller.requests:
                del self._controllers[pool.name]
            return None
        if controller is None:
            controller = self._controllers[pool.name] = FlowController(flow.settings)
        return controller

    def add(self, item: QueueItem, entry: Waiting) -> None:
        """Keep ``entry`` for ``item``, just queued in its pool's controller."""
        self._waiting[item] = entry

    def pump(
        self,
        flow: FlowControlSetup,
        now: float,
        candidates: Callable[[Admitted, float], list[Endpoint]],
        dispatch: Callable[[QueueItem, Waiting], Dispatch | GatewayError],
        peer_yield: PeerYield | None = None,
    ) -> int:
        """Hand every waiting request that has room now (some of its ``candidates`` have
        room under its band's ceiling) and does not hold for the other replicas'
        higher bands (``peer_yield``) to ``dispatch``, and tell its ticket what came of it
        (a Dispatch, or the GatewayError refusing it); returns how many left."""
        left = 0
        waiting = self._waiting
        detector = flow.detector

        def room(item: QueueItem) -> bool:
            entry = waiting[item]
            ceiling = flow.usage_limit.ceiling(item.priority)
            found = candidates(entry.admitted, now)
            entry.candidates = [e for e in found if detector.has_room(e, now, ceiling)]
            if not entry.candidates:
                return False
            if peer_yield is None:
                return True

            def free(priority: int) -> int:
                top = flow.usage_limit.ceiling(priority)
                return sum(1 for e in found if detector.has_room(e, now, top))

            pool = entry.admitted.pool.name
            if peer_yield.holds(pool, item.priority, entry.first_held, now, free):
                if entry.first_held is None:
                    entry.first_held = now
                return False
            return True

        for controller in self._controllers.values():
            while controller.requests:
                item = controller.pop_dispatchable(room)
                if item is None:
                    break
                left += 1
                entry = waiting.pop(item)
                routed = dispatch(item, entry)
                if isinstance(routed, GatewayError):
                    entry.ticket.rejected(item, routed)
                else:
                    entry.ticket.dispatched(item, routed)
        return left

    def expire(self, now: float) -> int:
        """Answer requests whose time to live ran out (503); returns how many."""
        count = 0
        for controller in self._controllers.values():
            for item in controller.expire(now):
                count += 1
                self._waiting.pop(item).ticket.rejected(
                    item,
                    GatewayError(
                        503,
                        "request timed out in queue",
                        code="queue_timeout",
                        retry_after_s=1,
                        reason="rejected-ttl-expired",
                    ),
                )
        return count

    def cancel(self, item: QueueItem) -> bool:
        """Forget a waiting request whose client went away (its ticket is not told);
        False when it already left the queue."""
        entry = self._waiting.get(item)
        if entry is None:
            return False
        controller = self._controllers.get(entry.admitted.pool.name)
        if controller is None or not controller.cancel(item):
            return False
        del self._waiting[item]
        return True

    def reject_unservable(self, pools: Mapping[str, Pool]) -> int:
        """Answer at once (503) every waiting request nothing in ``pools`` (the pools as
        they are now) can serve any more; returns how many were answered."""
        doomed: list[tuple[QueueItem, Waiting, GatewayError]] = []
        for item, entry in self._waiting.items():
            name = entry.admitted.pool.name
            error = unservable(name, pools.get(name), entry.admitted.request)
            if error is not None:
                doomed.append((item, entry, error))
        answered = 0
        for item, entry, error in doomed:
            controller = self._controllers.get(entry.admitted.pool.name)
            if controller is not None and controller.cancel(item):
                del self._waiting[item]
                entry.ticket.rejected(item, error)
                answered += 1
        return answered

    def __len__(self) -> int:
        """Requests queued in every pool."""
        return len(self._waiting)

    def next_deadline(self) -> float | None:
        """The clock time of the next queue expiry, if any request waits with a TTL."""
        deadlines = [d for c in self._controllers.values() if (d := c.next_deadline()) is not None]
        return min(deadlines) if deadlines else None

    def controllers(self) -> Mapping[str, FlowController]:
        """Flow controllers by pool name."""
        return self._controllers


__all__ = ["Waiting", "WaitingRoom"]
