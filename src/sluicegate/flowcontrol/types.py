"""What flow control queues: one request waiting for room, and its fate."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

from sluicegate.scheduling.framework import LLMRequest


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
    payload: Any = None
    """The caller's: what it needs to answer the request later."""
    state: ItemState = ItemState.QUEUED
    sort_key: tuple[float, ...] = field(default_factory=tuple)
    admitted: Any = None
    """The director's: the admitted request (pool, parsed body) to schedule later."""
    candidates: list[Any] = field(default_factory=list)
    """The endpoints with room found when it was last considered for dispatch."""
    cycle_state: Any = None
    """The director's: the scheduling state from admission (what was prefetched for it)."""

    @property
    def size_bytes(self) -> int:
        return self.request.body_bytes

    @property
    def priority(self) -> int:
        return self.request.priority

    @property
    def flow_id(self) -> str:
        return self.request.fairness_id
