"""Fairness policies: which flow of a band is served next.

A flow is the requests sharing a fairness id (``x-gateway-inference-fairness-id``, default
``default-flow``) and a priority.

- ``global-strict-fairness-policy`` (default): no fairness — the flow whose head request
  comes first by the band's ordering goes first.
- ``round-robin-fairness-policy``: flows take turns, one dispatch each, so a tenant with a
  deep queue cannot starve one with a shallow queue.

Both offer the flows in order of preference; flow control dispatches the first head that has
room, so one flow waiting for full endpoints does not hold back another. The policies are
llm-d-router's, https://github.com/llm-d/llm-d-router/blob/ebab6879/pkg/epp/framework/plugins/flowcontrol/fairness/README.md
"""

from __future__ import annotations

from collections.abc import Iterator

from sluicegate.framework import Band, FairnessPolicy, FlowQueue


class GlobalStrictFairness(FairnessPolicy):
    type_name = "global-strict-fairness-policy"

    def order(self, band: Band) -> Iterator[FlowQueue]:
        heads = []
        for queue in band.active():
            head = queue.head()
            if head is not None:
                heads.append((head.sort_key, head.seq, queue))
        heads.sort(key=lambda h: (h[0], h[1]))
        return (queue for _, _, queue in heads)


class RoundRobinFairness(FairnessPolicy):
    type_name = "round-robin-fairness-policy"

    def order(self, band: Band) -> Iterator[FlowQueue]:
        flows = [q for q in band.flows.values() if q.live]
        ids = [q.flow_id for q in flows]
        start = ids.index(band.next_flow) if band.next_flow in ids else 0
        return iter(flows[start:] + flows[:start])

    def dispatched(self, band: Band, queue: FlowQueue) -> None:
        # The turn passes to the next flow after this one that still waits.
        ids = list(band.flows)
        at = ids.index(queue.flow_id)
        for flow_id in ids[at + 1 :] + ids[: at + 1]:
            if band.flows[flow_id].live:
                band.next_flow = flow_id
                return
        band.next_flow = None
