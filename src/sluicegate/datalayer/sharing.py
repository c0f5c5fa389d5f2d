"""The approximate prefix index shared between gateway replicas, as the producers see it.

A prefix producer records, after each scheduling decision, which prompt blocks it sent to
which endpoint (:class:`~sluicegate.scheduling.approximate.ApproximatePrefix`). With shared
state on, it also hands that record to a :class:`PrefixShare`: the record goes into a
bounded outbox (a deque append, nothing else on the request path) that the host's
synchroniser (:mod:`sluicegate.runtime.shared`) ships to the other replicas in batches.
Records the other replicas made arrive through :meth:`PrefixShare.deliver` and are inserted
into the producer's own local index, so lookups stay local reads — no round trip to the
store per request (``docs/replicas.md`` has the measurements behind that choice).

The host offers one :class:`PrefixShare` under :data:`SHARED_PREFIX_SERVICE`; without shared
state there is none, and the producers behave as before. No I/O happens here.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Final

SHARED_PREFIX_SERVICE: Final = "shared-prefix"
"""The name under which the host provides a :class:`PrefixShare` (``PluginContext.services``)."""

DEFAULT_OUTBOX_RECORDS = 8192
"""Records waiting to be shipped, at most: while the store is unreachable the oldest go."""

PrefixSink = Callable[[str, Sequence[int], int | None], None]
"""Receives another replica's record: endpoint name, block hashes (head first), the
endpoint's capacity in blocks (None: the index default)."""


@dataclass(frozen=True, slots=True)
class PrefixRecord:
    """One decision's blocks: ``hashes`` (head first) sent to ``endpoint`` by the producer
    whose index is named ``space`` (its plugin name and block size, so that two producers
    with different block sizes never mix)."""

    space: str
    endpoint: str
    hashes: Sequence[int]
    """Not copied: the producer never changes a match's hashes after the decision."""
    capacity: int | None
    """The endpoint's capacity in blocks as the sender sized it (None: the default)."""


class PrefixShare:
    """The outbox of this replica's records and the sinks for the other replicas' records.

    ``max_outbox`` bounds the records waiting to be shipped (oldest dropped, counted in
    :attr:`dropped`); ``known`` tells whether an endpoint name is one of this replica's
    endpoints: records for any other name are ignored, so a peer cannot make the local
    index grow without bound by naming endpoints this replica does not have.
    """

    __slots__ = ("_sinks", "dropped", "enabled", "known", "outbox", "received")

    def __init__(
        self,
        known: Callable[[str], bool],
        max_outbox: int = DEFAULT_OUTBOX_RECORDS,
    ) -> None:
        if max_outbox <= 0:
            raise ValueError("max_outbox must be positive")
        self.known = known
        self.outbox: deque[PrefixRecord] = deque(maxlen=max_outbox)
        self._sinks: dict[str, PrefixSink] = {}
        self.enabled = True
        """False while the store is unreachable: records are not queued (they would be
        stale by the time it returns, and the outbox would only churn)."""
        self.dropped = 0
        """Records dropped because the outbox was full."""
        self.received = 0
        """Records from other replicas inserted into a local index."""

    def register(self, space: str, sink: PrefixSink) -> None:
        """The producer owning index ``space`` takes the other replicas' records for it.
        A later registration under the same space (a rebuilt scheduler) replaces it."""
        self._sinks[space] = sink

    def publish(
        self, space: str, endpoint: str, hashes: Sequence[int], capacity: int | None
    ) -> None:
        """Queue this replica's record for the other replicas (request path: O(1))."""
        if not self.enabled:
            return
        box = self.outbox
        if len(box) == box.maxlen:
            self.dropped += 1
        box.append(PrefixRecord(space, endpoint, hashes, capacity))

    def take(self, limit: int) -> list[PrefixRecord]:
        """Up to ``limit`` queued records, oldest first, removed from the outbox."""
        box = self.outbox
        n = min(limit, len(box))
        return [box.popleft() for _ in range(n)]

    def deliver(self, record: PrefixRecord) -> bool:
        """Insert another replica's record into the local index it names; False when no
        producer here owns that space or the endpoint is not one of ours."""
        sink = self._sinks.get(record.space)
        if sink is None or not record.hashes or not self.known(record.endpoint):
            return False
        sink(record.endpoint, record.hashes, record.capacity)
        self.received += 1
        return True


__all__ = [
    "DEFAULT_OUTBOX_RECORDS",
    "SHARED_PREFIX_SERVICE",
    "PrefixRecord",
    "PrefixShare",
    "PrefixSink",
]
