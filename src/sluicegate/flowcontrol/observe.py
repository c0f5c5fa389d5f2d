"""What flow control's metrics are made of: the reference's outcome names for the ways a
request leaves flow control, and a band's queue sizes by flow (bounded, since fairness ids
come from clients)."""

from __future__ import annotations

from sluicegate.framework.queues import Band
from sluicegate.instruments import OVERFLOW_LABEL

MAX_FLOW_SERIES = 100
"""Flows (fairness ids: the client's word) exported per band; the rest are summed under
``_other``. Idle flows are forgotten, so a band's flows are its queued requests'."""


def band_flows(band: Band) -> list[tuple[int, str, int, int]]:
    """(priority, fairness id, queued requests, queued bytes) of ``band``'s flows: the
    largest :data:`MAX_FLOW_SERIES`, then the rest together; one zero series with an
    empty fairness id when nothing waits in it."""
    flows = [(q.flow_id, q.live, q.live_bytes) for q in band.active()]
    if not flows:  # an empty band reads 0 rather than vanishing from the dashboards
        return [(band.priority, "", 0, 0)]
    if len(flows) > MAX_FLOW_SERIES:
        flows.sort(key=lambda f: f[1], reverse=True)
        rest = flows[MAX_FLOW_SERIES:]
        del flows[MAX_FLOW_SERIES:]
        flows.append((OVERFLOW_LABEL, sum(f[1] for f in rest), sum(f[2] for f in rest)))
    return [(band.priority, flow, requests, nbytes) for flow, requests, nbytes in flows]


_QUEUE_OUTCOMES = {
    "dispatched": "Dispatched",
    "cancelled": "EvictedContextCancelled",
    "rejected-ttl-expired": "EvictedTTL",
    "rejected-capacity": "RejectedCapacity",
}


def queue_outcome(reason: str, queued: bool) -> str:
    """The reference's flow-control outcome (``Dispatched``, ``EvictedTTL``, ...; GIE
    ``pkg/epp/flowcontrol/types/outcomes.go`` at 1748e829) of a request that left flow
    control for ``reason``, after waiting in a queue (``queued``) or at the door."""
    outcome = _QUEUE_OUTCOMES.get(reason)
    if outcome is not None:
        return outcome
    return "EvictedOther" if queued else "RejectedOther"


__all__ = ["MAX_FLOW_SERIES", "band_flows", "queue_outcome"]
