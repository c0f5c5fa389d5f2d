"""Flow control across gateway replicas: the other replicas' waiting requests, and when a
replica yields to them (``docs/flow-control.md#across-replicas``).

Each replica keeps its own queues. What crosses replicas is a count: how many requests of
each priority band wait, per pool, on all the *other* replicas together (the
:class:`PeerBacklog`). A channel feeds it — Redis in the live gateway
(:mod:`sluicegate.runtime.shared_backlog`), a simulated channel in the discrete-event lab —
through :meth:`PeerBacklogView.update`, which stamps each reading with the time it was
taken in the caller's clock (:mod:`sluicegate.clock` seconds). Nothing here does I/O or
reads a clock, and the request path only reads the last reading (no round trip per
dispatch).

The dispatch rule (:class:`PeerYield`). A waiting request of priority ``p`` for pool ``P``
that has room on some of its candidate endpoints *holds* (stays queued) when all of:

1. ``W > 0``, where ``W`` = the requests waiting on the other replicas for ``P`` at
   priorities above ``p``, from a reading no older than ``max_age_s`` (the lease);
2. the pool is saturated for them: ``R ≤ W``, where ``R`` = the request's candidate
   endpoints with room under the usage ceiling of the highest of those priorities (the
   detector's ``has_room``; every replica judges it from the same servers' metrics and
   shared in-flight counts). With more endpoints free than peers' requests waiting above
   it, there is room for both and nothing holds;
3. it first held less than ``max_yield_s`` ago: past that it goes anyway, so a peer whose
   count is wrong (its requests wait for endpoints this one cannot use, say) delays it by
   at most ``max_yield_s``, never starves it.

Otherwise it is dispatched as on a single replica. A request holds only for strictly higher
priorities, so holds form no cycle: the highest band waiting anywhere never holds. Whoever
drives the director must run a dispatch pass (``Director.pump``) when a reading changes and
now and then while requests hold (the live gateway: at every reading and every scrape), or
a held request would wait for the next unrelated event. Everything else stays per replica: the
queues, the capacity bounds, time to live, and fairness between flows (tenants) within a
band, which orders only each replica's own requests.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Protocol

from sluicegate.flowcontrol.controller import FlowController

Backlog = Mapping[str, Mapping[int, int]]
"""Waiting requests by pool name, then priority."""

MAX_POOLS = 256
"""Pools a reading keeps, at most (the peers name them: the rest are dropped)."""
MAX_BANDS = 64
"""Priority bands a reading keeps per pool, at most (the highest are kept)."""


class PeerBacklog(Protocol):
    """How many requests wait on the other replicas, as of the last reading."""

    def above(self, pool: str, priority: int, now: float) -> tuple[int, int]:
        """(requests waiting on the other replicas for ``pool`` at priorities above
        ``priority``, the highest such priority) at clock time ``now`` (seconds);
        ``(0, priority)`` when none do or the last reading is too old to trust."""
        ...


class NoPeerBacklog:
    """No other replicas (or no channel to them): nothing ever waits elsewhere."""

    __slots__ = ()

    def above(self, pool: str, priority: int, now: float) -> tuple[int, int]:
        return 0, priority


class PeerBacklogView:
    """The last reading of the other replicas' backlog, as a channel delivered it.

    ``max_age_s`` (seconds, > 0): a reading older than this counts as none — the channel
    stopped delivering (its sync stalled, the store is gone) and the peers' queues may have
    drained since. Memory is bounded by :data:`MAX_POOLS` × :data:`MAX_BANDS`.
    """

    __slots__ = ("_bands", "as_of", "max_age_s")

    def __init__(self, max_age_s: float) -> None:
        if not max_age_s > 0:
            raise ValueError(f"max_age_s must be positive, not {max_age_s}")
        self.max_age_s = max_age_s
        self._bands: dict[str, list[tuple[int, int]]] = {}
        """Per pool: (priority, waiting) with waiting > 0, highest priority first."""
        self.as_of: float | None = None
        """Clock time (seconds) of the last reading; None before the first or after
        :meth:`clear`."""

    def update(self, counts: Backlog, as_of: float) -> None:
        """Replace the reading with ``counts`` (summed over the other replicas), taken at
        clock time ``as_of``. Negative or zero counts are dropped."""
        bands: dict[str, list[tuple[int, int]]] = {}
        for pool, by_priority in counts.items():
            if len(bands) >= MAX_POOLS:
                break
            rows = sorted(((p, n) for p, n in by_priority.items() if n > 0), reverse=True)
            if rows:
                bands[pool] = rows[:MAX_BANDS]
        self._bands = bands
        self.as_of = as_of

    def clear(self) -> None:
        """Forget the reading: the channel is down, this replica works on its own."""
        self._bands = {}
        self.as_of = None

    def fresh(self, now: float) -> bool:
        """Whether there is a reading no older than ``max_age_s`` at ``now``."""
        return self.as_of is not None and now - self.as_of <= self.max_age_s

    def above(self, pool: str, priority: int, now: float) -> tuple[int, int]:
        rows = self._bands.get(pool)
        if not rows or not self.fresh(now):
            return 0, priority
        waiting = 0
        for p, n in rows:
            if p <= priority:
                break
            waiting += n
        return waiting, (rows[0][0] if waiting else priority)

    def reading(self, now: float) -> dict[str, dict[int, int]]:
        """The reading by pool and priority (empty when not fresh), for metrics."""
        if not self.fresh(now):
            return {}
        return {pool: dict(rows) for pool, rows in self._bands.items()}


def local_backlog(controllers: Mapping[str, FlowController]) -> dict[str, dict[int, int]]:
    """This replica's waiting requests by pool and priority (non-empty bands only): what
    it publishes for the others."""
    out: dict[str, dict[int, int]] = {}
    for pool, controller in controllers.items():
        bands = {b.priority: b.requests for b in controller.bands() if b.requests}
        if bands:
            out[pool] = bands
    return out


def add_backlog(into: dict[str, dict[int, int]], rows: Iterable[tuple[str, int, int]]) -> None:
    """Add (pool, priority, waiting) rows of one replica into the sum ``into``, which keeps
    at most :data:`MAX_POOLS` pools of :data:`MAX_BANDS` bands (the peers' word: bounded)."""
    for pool, priority, waiting in rows:
        bands = into.get(pool)
        if bands is None:
            if len(into) >= MAX_POOLS:
                continue
            bands = into[pool] = {}
        if priority in bands:
            bands[priority] += waiting
        elif len(bands) < MAX_BANDS:
            bands[priority] = waiting


class PeerYield:
    """The rule of this module's docstring over ``backlog``, and what it did.

    ``max_yield_s`` (seconds, > 0): how long after it first held a request goes anyway.
    Counters are by (pool, priority) of the local request; pools and priorities come from
    the configuration, so they are bounded by it.
    """

    __slots__ = ("backlog", "max_yield_s", "released", "yielded")

    def __init__(self, backlog: PeerBacklog, max_yield_s: float = 5.0) -> None:
        if not max_yield_s > 0:
            raise ValueError(f"max_yield_s must be positive, not {max_yield_s}")
        self.backlog = backlog
        self.max_yield_s = max_yield_s
        self.yielded: dict[tuple[str, int], int] = {}
        """Requests that held at least once for the peers' higher bands."""
        self.released: dict[tuple[str, int], int] = {}
        """Requests dispatched because they had held for ``max_yield_s`` while the peers'
        higher bands still waited."""

    def holds(
        self,
        pool: str,
        priority: int,
        first_held: float | None,
        now: float,
        free: Callable[[int], int],
    ) -> bool:
        """Whether a request of ``priority`` for ``pool`` that has room holds now.

        ``first_held``: when it first held (clock seconds), None if never; the caller
        records ``now`` there when this returns True for the first time. ``free(q)``: its
        candidate endpoints with room under the usage ceiling of priority ``q``.
        """
        waiting, top = self.backlog.above(pool, priority, now)
        if not waiting or free(top) > waiting:
            return False
        key = (pool, priority)
        if first_held is None:
            self.yielded[key] = self.yielded.get(key, 0) + 1
            return True
        if now - first_held < self.max_yield_s:
            return True
        self.released[key] = self.released.get(key, 0) + 1
        return False


__all__ = [
    "MAX_BANDS",
    "MAX_POOLS",
    "Backlog",
    "NoPeerBacklog",
    "PeerBacklog",
    "PeerBacklogView",
    "PeerYield",
    "add_backlog",
    "local_backlog",
]
