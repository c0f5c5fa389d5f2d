"""Flow control's metric helpers: the reference's outcome names, and queue sizes by flow
that stay bounded whatever fairness ids clients send."""

from __future__ import annotations

from sluicegate.flowcontrol.observe import (
    MAX_FAIRNESS_LABELS,
    MAX_FLOW_SERIES,
    FairnessLabels,
    band_flows,
    queue_outcome,
)
from sluicegate.framework import LLMRequest, QueueItem
from sluicegate.framework.queues import Band, BandLimits
from sluicegate.instruments import OVERFLOW_LABEL


def item(flow: str, seq: int, size: int = 10) -> QueueItem:
    request = LLMRequest(
        request_id=str(seq),
        model="m",
        target_model="m",
        prompt=b"x",
        prompt_tokens=1,
        arrival=0.0,
        fairness_id=flow,
        body_bytes=size,
    )
    return QueueItem(request, 0.0, None, seq)


def test_outcomes_are_the_references() -> None:
    assert queue_outcome("dispatched", queued=True) == "Dispatched"
    assert queue_outcome("cancelled", queued=True) == "EvictedContextCancelled"
    assert queue_outcome("rejected-ttl-expired", queued=True) == "EvictedTTL"
    assert queue_outcome("rejected-capacity", queued=False) == "RejectedCapacity"
    assert queue_outcome("rejected-no-endpoint", queued=True) == "EvictedOther"
    assert queue_outcome("rejected-no-endpoint", queued=False) == "RejectedOther"


def test_an_empty_band_reads_zero() -> None:
    assert band_flows(Band(5, BandLimits())) == [(5, "", 0, 0)]


def test_flows_past_the_limit_are_summed_under_other() -> None:
    band = Band(0, BandLimits())
    seq = 0
    for f in range(MAX_FLOW_SERIES + 50):
        for _ in range(2 if f < 10 else 1):  # ten flows with two requests: kept first
            band.flow(f"tenant-{f}").push(item(f"tenant-{f}", seq))
            seq += 1
    flows = band_flows(band)
    assert len(flows) == MAX_FLOW_SERIES + 1
    kept = {name: n for _, name, n, _ in flows}
    assert all(kept[f"tenant-{f}"] == 2 for f in range(10))
    assert kept[OVERFLOW_LABEL] == 50
    assert sum(n for _, _, n, _ in flows) == seq
    assert sum(b for *_, b in flows) == seq * 10


def test_fairness_labels_are_bounded() -> None:
    label = FairnessLabels()
    ids = [f"tenant-{i}" for i in range(MAX_FAIRNESS_LABELS + 50)]
    labels = [label(i) for i in ids]
    assert labels[:MAX_FAIRNESS_LABELS] == ids[:MAX_FAIRNESS_LABELS]
    assert set(labels[MAX_FAIRNESS_LABELS:]) == {OVERFLOW_LABEL}
    assert label("tenant-0") == "tenant-0"  # a known id keeps its label
