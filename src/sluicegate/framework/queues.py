"""What flow control queues: waiting requests, per-flow queues and priority bands.

A :class:`QueueItem` is one request waiting for room, and its fate.

A :class:`FlowQueue` is a heap ordered by each item's ``sort_key`` (set by the band's
ordering policy). Items leave three ways: dispatched from the head, or expired/cancelled
from anywhere. The last two mark the item and leave it in the heap; dead entries are
skipped at the head and the heap is rebuilt when they outnumber the live ones, so memory
follows the live queue, whatever the churn.
"""

from __future__ import annotations

import enum
import heapq
from collections.abc import Iterator
from dataclasses import dataclass, field

from sluicegate.framework.scheduling import LLMRequest


class ItemState(enum.Enum):
    QUEUED = "queued"
    DISPATCHED = "dispatched"
    EXPIRED = "expired"
    CANCELLED = "cancelled"


@dataclass(slots=True, eq=False)
class QueueItem:
    """A request waiting in a flow's queue. Times are clock seconds; sizes bytes."""

    request: LLMRequest
    enqueued_at: float
    deadline: float | None
    """When it expires (TTL); None waits until dispatched or cancelled."""
    seq: int
    """Arrival order, the final tie-breaker everywhere."""
    state: ItemState = ItemState.QUEUED
    sort_key: tuple[float, ...] = field(default_factory=tuple)

    @property
    def size_bytes(self) -> int:
        return self.request.body_bytes

    @property
    def priority(self) -> int:
        return self.request.priority

    @property
    def flow_id(self) -> str:
        return self.request.fairness_id


_COMPACT_MIN = 8
"""Dead entries a flow tolerates before compaction is considered. Rebuilding only when the
dead outnumber the live already makes it amortised O(1); this minimum just spares tiny
heaps. It is per flow, so it must stay small: dead entries hold whole requests (prompt
and all), and with 64 a thousand one-request flows could pin 64,000 cancelled ones."""


class FlowQueue:
    """One flow's waiting requests, best first."""

    __slots__ = ("_dead", "_heap", "flow_id", "live", "live_bytes")

    def __init__(self, flow_id: str) -> None:
        self.flow_id = flow_id
        self._heap: list[tuple[tuple[float, ...], int, QueueItem]] = []
        self._dead = 0
        self.live = 0
        self.live_bytes = 0

    def __len__(self) -> int:
        return self.live

    def push(self, item: QueueItem) -> None:
        heapq.heappush(self._heap, (item.sort_key, item.seq, item))
        self.live += 1
        self.live_bytes += item.size_bytes

    def head(self) -> QueueItem | None:
        heap = self._heap
        while heap and heap[0][2].state is not ItemState.QUEUED:
            heapq.heappop(heap)
            self._dead -= 1
        return heap[0][2] if heap else None

    def pop_head(self) -> QueueItem:
        item = self.head()
        if item is None:
            raise IndexError("empty flow queue")
        heapq.heappop(self._heap)
        self._forget(item)
        return item

    def remove(self, item: QueueItem) -> None:
        """Take a (just expired or cancelled) item out of the counts; its entry dies."""
        self._forget(item)
        if not self.live:
            return  # _forget dropped every entry, this one included
        self._dead += 1
        if self._dead > _COMPACT_MIN and self._dead > len(self._heap) // 2:
            self._heap = [e for e in self._heap if e[2].state is ItemState.QUEUED]
            heapq.heapify(self._heap)
            self._dead = 0

    def _forget(self, item: QueueItem) -> None:
        self.live -= 1
        self.live_bytes -= item.size_bytes
        if not self.live:
            # Whatever is left is dead: drop it now, so the band can forget an idle flow
            # (otherwise one-off flows would each keep a dead entry, and their flow, forever).
            self._heap.clear()
            self._dead = 0

    @property
    def entries(self) -> int:
        """Heap entries, live and dead (for memory bound checks)."""
        return len(self._heap)


@dataclass(slots=True)
class BandLimits:
    """Capacity of one priority band: requests and bytes (None = unlimited)."""

    max_requests: int | None = None
    max_bytes: int | None = 1_000_000_000
    """Per-band default of the reference flow control: 1 GB (llm-d-router,
    https://github.com/llm-d/llm-d-router/blob/ebab6879/pkg/epp/flowcontrol/registry/config.go)."""


@dataclass(slots=True)
class Band:
    """One priority level: its flows (by fairness id) and its totals."""

    priority: int
    limits: BandLimits
    flows: dict[str, FlowQueue] = field(default_factory=dict)
    requests: int = 0
    bytes: int = 0
    next_flow: str | None = None
    """The flow whose turn it is (round-robin fairness)."""

    def flow(self, flow_id: str) -> FlowQueue:
        queue = self.flows.get(flow_id)
        if queue is None:
            queue = self.flows[flow_id] = FlowQueue(flow_id)
        return queue

    def active(self) -> Iterator[FlowQueue]:
        return (q for q in self.flows.values() if q.live)

    def drop_if_empty(self, queue: FlowQueue) -> None:
        """Forget an idle flow, so flows of one-off tenants do not accumulate."""
        if not queue.live and not queue.entries:
            self.flows.pop(queue.flow_id, None)


__all__ = ["Band", "BandLimits", "FlowQueue", "ItemState", "QueueItem"]
