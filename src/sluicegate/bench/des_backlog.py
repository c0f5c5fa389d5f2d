"""Flow control across gateway replicas in the discrete-event lab: the backlog feed.

With ``--replica-state shared`` and flow control on, each simulated replica runs what
``sharedState.backlog`` runs in the live gateway (:mod:`sluicegate.runtime.shared_backlog`):

- every ``backlog_sync_s`` (``backlogSyncMs``, 25 ms by default) the replica publishes its
  waiting requests per pool and priority (:func:`~sluicegate.flowcontrol.peers.local_backlog`,
  packed by :func:`~sluicegate.runtime.shared_backlog.encode_backlog`) over the run's
  :class:`~sluicegate.bench.des_sharing.ShareChannel` (its delay and loss);
- a receiver keeps each sender's last snapshot for ``lease_s`` (``leaseMs``) and sums the
  live ones into its own :class:`~sluicegate.flowcontrol.peers.PeerBacklogView`
  (``update(counts, as_of)``, stamped with the virtual clock), on every delivery and on
  its own tick, as the live sync reads the others' snapshots on each of its calls;
- the replica's director gets the real
  :class:`~sluicegate.flowcontrol.peers.PeerYield` over that view (``maxYieldMs``), and
  after each reading the lab pumps it (``on_update``), as the live gateway pumps at every
  reading; the scrapes pump it too, as they already do.

A replica without flow-control queues publishes nothing and keeps no reading (the live
sync's ``active()``). What the model simplifies: a reading here is made of snapshots
applied on arrival (up to one period plus the channel's delay old), where the live one
reads what is in Redis at its own call (up to two periods old). A reading that is empty and
was empty before changes nothing the rule decided, so it does not pump — which keeps a
channel that loses everything (``loss=1.0``) routing exactly as ``independent`` (with
online-trained models, only with ``share_models`` off: the training service's models do
not travel over the channel, :mod:`sluicegate.bench.des_sharing`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from sluicegate.flowcontrol.peers import PeerBacklogView, PeerYield, add_backlog, local_backlog
from sluicegate.requestcontrol.director import Director
from sluicegate.runtime.shared_backlog import decode_backlog, encode_backlog
from sluicegate.runtime.shared_wire import WireError

Pump = Callable[[int, float], None]
"""Runs replica *g*'s dispatch pass at a simulated time (s)."""


class BacklogFeed:
    """Each replica's per-band waiting counts, summed by the others into their
    :class:`PeerBacklogView` (see the module). Times in simulated seconds."""

    name = "backlog"

    def __init__(
        self,
        directors: Sequence[Director],
        interval_s: float,
        lease_s: float,
        max_yield_s: float,
        on_update: Pump,
    ) -> None:
        self.directors = directors
        self.interval_s = interval_s
        self.lease_s = lease_s
        self.on_update = on_update
        self.views = [PeerBacklogView(max_age_s=lease_s) for _ in directors]
        """Replica *g*'s reading of the others' backlog."""
        self.rules = [PeerYield(view, max_yield_s) for view in self.views]
        """Replica *g*'s dispatch rule over its reading (set on its director)."""
        for director, rule in zip(directors, self.rules, strict=True):
            director.peer_yield = rule
        self._latest: list[dict[int, tuple[float, bytes]]] = [{} for _ in directors]
        """Per receiver: each sender's last snapshot and when it was sent (bounded by the
        number of replicas)."""
        self.bad_snapshots = 0

    def publish(self, replica: int, now: float) -> Sequence[bytes]:
        controllers = self.directors[replica].controllers()
        if not controllers:
            self.views[replica].clear()
            return ()
        self._apply(replica, now)  # the live call reads the others' on the same tick
        return (encode_backlog(local_backlog(controllers)),)

    def receive(
        self, replica: int, sender: int, payload: bytes, sent_at: float, now: float
    ) -> None:
        if not self.directors[replica].controllers():
            return
        latest = self._latest[replica]
        held = latest.get(sender)
        if held is not None and held[0] > sent_at:
            return  # overtaken by a newer snapshot (never with a fixed delay)
        latest[sender] = (sent_at, payload)
        self._apply(replica, now)

    def _apply(self, replica: int, now: float) -> None:
        latest = self._latest[replica]
        totals: dict[str, dict[int, int]] = {}
        for sender in list(latest):
            sent_at, blob = latest[sender]
            if now - sent_at > self.lease_s:
                del latest[sender]  # its lease ran out
                continue
            try:
                add_backlog(totals, decode_backlog(blob))
            except WireError:  # never from this lab's writer; skipped like the runtime's
                self.bad_snapshots += 1
                del latest[sender]
        view = self.views[replica]
        before = view.reading(now)
        view.update(totals, now)
        if before or view.reading(now):
            self.on_update(replica, now)

    def counters(self) -> dict[str, int]:
        """Requests that held for the peers' higher bands, and those that went anyway
        after ``max_yield_s``, over every replica and band."""
        return {
            "peer_yields": sum(sum(r.yielded.values()) for r in self.rules),
            "peer_yield_releases": sum(sum(r.released.values()) for r in self.rules),
        }


def backlog_feed(
    directors: Sequence[Director],
    interval_s: float,
    lease_s: float,
    max_yield_s: float,
    on_update: Pump,
) -> BacklogFeed | None:
    """The backlog feed of ``directors`` (its rules set on them), or None when flow
    control is off for every pool of every one (they never queue: nothing to share, and
    no events for it). Queues are made on a pool's first queued request, so this asks
    the configuration, not :meth:`Director.controllers`."""
    if not any(
        d.flow.enabled_for(pool.annotations)
        for d in directors
        for pool in d.datastore.pools.values()
    ):
        return None
    return BacklogFeed(directors, interval_s, lease_s, max_yield_s, on_update)


__all__ = ["BacklogFeed", "Pump", "backlog_feed"]
