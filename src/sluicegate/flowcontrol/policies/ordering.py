"""Ordering policies: which request of a flow goes first.

Each gives a waiting request a sort key once, when it is queued; lower goes first, and
arrival order breaks ties (llm-d-router, https://github.com/llm-d/llm-d-router/blob/ebab6879/pkg/epp/framework/plugins/flowcontrol/ordering/README.md).

- ``fcfs-ordering-policy``: by arrival at the gateway.
- ``edf-ordering-policy``: earliest deadline first, the deadline being arrival plus the
  request's time to live; requests without one sort last.
- ``slo-deadline-ordering-policy``: by arrival plus the request's TTFT SLO
  (``x-slo-ttft-ms``); requests without an SLO sort last.
"""

from __future__ import annotations

import math

from sluicegate.framework import OrderingPolicy, QueueItem


class FcfsOrdering(OrderingPolicy):
    type_name = "fcfs-ordering-policy"

    def sort_key(self, item: QueueItem) -> tuple[float, ...]:
        return (item.request.arrival,)


class EdfOrdering(OrderingPolicy):
    type_name = "edf-ordering-policy"

    def sort_key(self, item: QueueItem) -> tuple[float, ...]:
        deadline = item.deadline if item.deadline is not None else math.inf
        return (deadline, item.request.arrival)


class SloDeadlineOrdering(OrderingPolicy):
    type_name = "slo-deadline-ordering-policy"

    def sort_key(self, item: QueueItem) -> tuple[float, ...]:
        slo = item.request.slo_ttft_ms
        deadline = item.request.arrival + slo / 1000.0 if slo is not None else math.inf
        return (deadline, item.request.arrival)
