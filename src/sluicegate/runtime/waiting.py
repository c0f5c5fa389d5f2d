"""Requests waiting in the runtime's flow control, on the event loop.

A request the director queues (the pool saturated: :mod:`sluicegate.flowcontrol`) gets a
:class:`Waiter` ticket whose future its task awaits; the director resolves it when the
request is dispatched or refused. :class:`FlowWaits` keeps one timer armed at the queue's
next deadline (queue timeouts, in the clock's seconds), so that a request nothing
dispatches is still answered on time, and gives up a request's place when its client
leaves (the awaiting task is cancelled).
"""

from __future__ import annotations

import asyncio

from sluicegate.clock import Clock
from sluicegate.errors import GatewayError
from sluicegate.framework import QueueItem
from sluicegate.requestcontrol.director import Director
from sluicegate.requestcontrol.dispatch import Dispatch
from sluicegate.runtime.observe import RequestMetrics


class Waiter:
    """The ticket of a request waiting in flow control: its task awaits ``future``."""

    __slots__ = ("clock", "future", "observe", "pool")

    def __init__(
        self, observe: RequestMetrics, clock: Clock, future: asyncio.Future[Dispatch], pool: str
    ) -> None:
        self.observe = observe
        self.clock = clock
        self.future = future
        self.pool = pool

    def dispatched(self, item: QueueItem, dispatch: Dispatch) -> None:
        self.observe.wait(item, self.pool, "dispatched")
        if self.future.done():  # its client left while it was being scheduled
            dispatch.finish(self.clock.now(), ok=False)
        else:
            self.future.set_result(dispatch)

    def rejected(self, item: QueueItem, error: GatewayError) -> None:
        self.observe.wait(item, self.pool, error.reason)
        if not self.future.done():
            self.future.set_exception(error)


class FlowWaits:
    """The waits of ``director``'s queued requests, and the timer at its next deadline."""

    def __init__(self, director: Director, observe: RequestMetrics, clock: Clock) -> None:
        self.director = director
        self.observe = observe
        self.clock = clock
        self._expiry: asyncio.TimerHandle | None = None

    def ticket(self, pool: str) -> Waiter:
        """A fresh ticket for a request to ``pool`` (on the running loop)."""
        future: asyncio.Future[Dispatch] = asyncio.get_running_loop().create_future()
        return Waiter(self.observe, self.clock, future, pool)

    async def wait(self, item: QueueItem, ticket: Waiter) -> Dispatch:
        """Wait for a queued request to be dispatched (or refused: raises its
        :class:`~sluicegate.errors.GatewayError`)."""
        self.arm()
        waiter = ticket.future
        try:
            return await waiter
        except asyncio.CancelledError:
            # The client left: free its place in the queue. If it was dispatched just
            # before (the result set, this task not resumed yet), release the dispatch.
            if self.director.cancel(item):
                self.observe.wait(item, ticket.pool, "cancelled")
            elif waiter.done() and not waiter.cancelled() and waiter.exception() is None:
                waiter.result().finish(self.clock.now(), ok=False)
                self.director.pump()
            raise

    def arm(self) -> None:
        """Make sure a timer fires at the next queue deadline."""
        if self._expiry is not None:
            return
        deadline = self.director.next_deadline()
        if deadline is None:
            return
        delay = max(0.0, deadline - self.clock.now())
        self._expiry = asyncio.get_running_loop().call_later(delay, self._expire)

    def stop(self) -> None:
        """Cancel the timer (the runtime is stopping)."""
        if self._expiry is not None:
            self._expiry.cancel()
            self._expiry = None

    def _expire(self) -> None:
        self._expiry = None
        self.director.expire()
        self.arm()


__all__ = ["FlowWaits", "Waiter"]
