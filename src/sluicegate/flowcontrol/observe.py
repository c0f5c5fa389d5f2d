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


MAX_FAIRNESS_LABELS = 32
"""Fairness ids that get their own ``fairness_id`` label on the flow-control histograms."""


class FairnessLabels:
    """The ``fairness_id`` label of the flow-control histograms, bounded: the first
    :data:`MAX_FAIRNESS_LABELS` ids seen keep their name, later ones are ``_other``.
    Fairness ids are the client's word, and each id multiplies the histograms' series by
    priorities × outcomes × pools × models: unbounded, made-up ids would use up the label
    sets that real pools and models need."""

    __slots__ = ("_known",)

    def __init__(self) -> None:
        self._known: set[str] = set()

    def __call__(self, fairness_id: str) -> str:
        known = self._known
        if fairness_id in known:
            return fairness_id
        if len(known) < MAX_FAIRNESS_LABELS:
            known.add(fairness_id)
            return fairness_id
        return OVERFLOW_LABEL


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


__all__ = [
    "MAX_FAIRNESS_LABELS",
    "MAX_FLOW_SERIES",
    "FairnessLabels",
    "band_flows",
    "queue_outcome",
]
