"""The flow controller of one pool: bands, flows, capacity, time to live, dispatch.

Dispatch, in order (as llm-d-router's flow control, source below): strict priority between
bands (the highest non-empty band first), the band's fairness policy between its flows,
the ordering policy within a flow. A request leaves the queue as soon as some endpoint it
may use has room; one that cannot go yet does not hold back another that can, in its band
or below. Source: https://github.com/llm-d/llm-d-router/blob/ebab6879/pkg/epp/flowcontrol/README.md

The controller is pure: it does no I/O and reads no clock. Its caller enqueues requests,
asks for the next dispatchable one whenever room may have appeared (a request finished,
fresh metrics arrived, a request was queued), and expires requests at the deadlines it
reports, so the live gateway and the discrete-event simulation drive the same code.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from sluicegate.errors import GatewayError, shed
from sluicegate.framework import (
    Band,
    BandLimits,
    FairnessPolicy,
    FlowQueue,
    ItemState,
    LLMRequest,
    OrderingPolicy,
    QueueItem,
)


@dataclass(slots=True)
class BandPolicy:
    """How one priority band is bounded, ordered and shared."""

    limits: BandLimits
    ordering: OrderingPolicy
    fairness: FairnessPolicy


@dataclass(slots=True)
class FlowControlSettings:
    """Global bounds and the policy of each band. Sizes in bytes, times in seconds."""

    default_band: BandPolicy
    bands: dict[int, BandPolicy] = field(default_factory=dict)
    max_requests: int | None = None
    max_bytes: int | None = None
    default_ttl_s: float | None = 60.0
    """Time a request may wait (the current reference default); None waits forever."""

    def policy(self, priority: int) -> BandPolicy:
        return self.bands.get(priority, self.default_band)


def capacity_exceeded(message: str) -> GatewayError:
    return shed(message, reason="rejected-capacity")


class FlowController:
    """Waiting requests of one pool."""

    def __init__(self, settings: FlowControlSettings) -> None:
        self.settings = settings
        self._bands: dict[int, Band] = {}
        self._order: list[Band] = []
        """Bands by priority, highest first."""
        self._seq = itertools.count()
        self._expiry: list[tuple[float, int, QueueItem]] = []
        self._expiry_dead = 0
        self.requests = 0
        self.bytes = 0

    # ------------------------------------------------------------------ queueing

    def enqueue(self, request: LLMRequest, now: float) -> QueueItem:
        """Queue ``request``; raises a 429 GatewayError when a capacity bound is reached."""
        s = self.settings
        size = request.body_bytes
        if s.max_requests is not None and self.requests + 1 > s.max_requests:
            raise capacity_exceeded("the gateway's queue is full")
        if s.max_bytes is not None and self.bytes + size > s.max_bytes:
            raise capacity_exceeded("the gateway's queue is full (bytes)")
        policy = s.policy(request.priority)
        band = self._band(request.priority, policy)
        limits = policy.limits
        if limits.max_requests is not None and band.requests + 1 > limits.max_requests:
            raise capacity_exceeded(f"the queue of priority {request.priority} is full")
        if limits.max_bytes is not None and band.bytes + size > limits.max_bytes:
            raise capacity_exceeded(f"the queue of priority {request.priority} is full (bytes)")
        ttl = s.default_ttl_s
        item = QueueItem(request, now, None if ttl is None else now + ttl, next(self._seq))
        item.sort_key = policy.ordering.sort_key(item)
        band.flow(request.fairness_id).push(item)
        band.requests += 1
        band.bytes += size
        self.requests += 1
        self.bytes += size
        if item.deadline is not None:
            heapq.heappush(self._expiry, (item.deadline, item.seq, item))
        return item

    def _band(self, priority: int, policy: BandPolicy) -> Band:
        band = self._bands.get(priority)
        if band is None:
            band = self._bands[priority] = Band(priority, policy.limits)
            self._order = sorted(self._bands.values(), key=lambda b: -b.priority)
        return band

    # ------------------------------------------------------------------ dispatch

    def pop_dispatchable(self, room: Callable[[QueueItem], bool]) -> QueueItem | None:
        """The first waiting request, in priority/fairness/ordering order, for which
        ``room(item)`` is true — taken out of the queue — or None."""
        for band in self._order:
            if not band.requests:
                continue
            fairness = self.settings.policy(band.priority).fairness
            for queue in fairness.order(band):
                head = queue.head()
                if head is not None and room(head):
                    queue.pop_head()
                    # Before _leave, which may drop the emptied flow from the band: the
                    # fairness policy looks the flow up there (round-robin's cursor).
                    fairness.dispatched(band, queue)
                    self._leave(band, queue, head, ItemState.DISPATCHED)
                    return head
        return None

    def cancel(self, item: QueueItem) -> bool:
        """Remove a waiting request (its client went away); False if it already left."""
        if item.state is not ItemState.QUEUED:
            return False
        band = self._bands[item.priority]
        queue = band.flows[item.flow_id]
        self._leave(band, queue, item, ItemState.CANCELLED)
        queue.remove(item)
        band.drop_if_empty(queue)
        return True

    def expire(self, now: float) -> list[QueueItem]:
        """Requests whose time to live ran out by ``now``, taken out of the queue."""
        out: list[QueueItem] = []
        heap = self._expiry
        while heap and heap[0][0] <= now:
            _, _, item = heapq.heappop(heap)
            if item.state is not ItemState.QUEUED:
                self._expiry_dead -= 1
                continue
            band = self._bands[item.priority]
            queue = band.flows[item.flow_id]
            self._leave(band, queue, item, ItemState.EXPIRED, in_expiry=False)
            queue.remove(item)
            band.drop_if_empty(queue)
            out.append(item)
        return out

    def next_deadline(self) -> float | None:
        """When the next waiting request expires (clock seconds), if any does."""
        heap = self._expiry
        while heap and heap[0][2].state is not ItemState.QUEUED:
            heapq.heappop(heap)
            self._expiry_dead -= 1
        return heap[0][0] if heap else None

    def _leave(
        self,
        band: Band,
        queue: FlowQueue,
        item: QueueItem,
        state: ItemState,
        in_expiry: bool = True,
    ) -> None:
        item.state = state
        band.requests -= 1
        band.bytes -= item.size_bytes
        self.requests -= 1
        self.bytes -= item.size_bytes
        if state is ItemState.DISPATCHED:
            band.drop_if_empty(queue)
        if in_expiry and item.deadline is not None:
            self._expiry_dead += 1
            if self._expiry_dead > 64 and self._expiry_dead > len(self._expiry) // 2:
                self._expiry = [e for e in self._expiry if e[2].state is ItemState.QUEUED]
                heapq.heapify(self._expiry)
                self._expiry_dead = 0

    # ------------------------------------------------------------------ introspection

    def bands(self) -> Iterator[Band]:
        """Bands by priority, highest first."""
        return iter(self._order)

    def waiting(self) -> int:
        return self.requests

    @property
    def expiry_entries(self) -> int:
        """Entries in the expiry heap, live and dead (for memory bound checks)."""
        return len(self._expiry)


__all__ = ["BandPolicy", "FlowControlSettings", "FlowController", "QueueItem"]
