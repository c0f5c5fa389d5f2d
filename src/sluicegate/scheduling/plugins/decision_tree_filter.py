"""``decision-tree-filter``: run other filters as a flow chart, branching on their result.

Type: filter. Inputs: whatever its node filters read. Parameters: ``tree`` — a node
``{filter: REF, nextOnSuccess: NODE, nextOnFailure: NODE, nextOnSuccessOrFailure: NODE}``
(the three ``next*`` optional), ``REF`` naming a filter plugin declared earlier in the
configuration's ``plugins``. No defaults: the tree is the configuration.

Algorithm (the ``filter`` type of Gateway API Inference Extension v0.3.0,
``pkg/epp/scheduling/filter.go`` at tag v0.3.0,
https://github.com/kubernetes-sigs/gateway-api-inference-extension/blob/v0.3.0/pkg/epp/scheduling/filter.go):
a node runs its filter on its input; the filter *succeeds* when it keeps at least one
endpoint. On success the next node is ``nextOnSuccess``, else ``nextOnSuccessOrFailure``,
and it gets the endpoints kept; on failure the next node is ``nextOnFailure``, else
``nextOnSuccessOrFailure``, and it gets the node's *input* back. A node without a next
node for its outcome returns its filter's output — on failure nothing, so the profile has
no endpoint (that is how a tree drops a request). Node filters listed here should not also
be listed in the profile, or they run twice.
"""

from __future__ import annotations

from collections.abc import Sequence

from sluicegate.datalayer.endpoint import Endpoint
from sluicegate.framework import CycleState, Filter, LLMRequest, PluginParameters
from sluicegate.framework.plugin import PluginConfigError, PluginContext


class TreeNode(PluginParameters):
    """One node: a filter plugin's name and where to go after it."""

    filter: str
    next_on_success: TreeNode | None = None
    next_on_failure: TreeNode | None = None
    next_on_success_or_failure: TreeNode | None = None


class _Node:
    """A resolved node: the filter plugin itself and the resolved next nodes."""

    __slots__ = ("filter", "on_failure", "on_success")

    def __init__(self, spec: TreeNode, lookup: dict[str, Filter], owner: str) -> None:
        if spec.filter not in lookup:
            raise PluginConfigError(
                f"plugin {owner!r}: {spec.filter!r} is not a filter plugin declared before it; "
                f"filters declared before it: {', '.join(sorted(lookup)) or 'none'}"
            )
        self.filter = lookup[spec.filter]
        either = spec.next_on_success_or_failure
        success = spec.next_on_success or either
        failure = spec.next_on_failure or either
        self.on_success = _Node(success, lookup, owner) if success is not None else None
        self.on_failure = _Node(failure, lookup, owner) if failure is not None else None


class DecisionTreeFilter(Filter):
    type_name = "decision-tree-filter"

    class Parameters(PluginParameters):
        tree: TreeNode

    params: Parameters

    def __init__(
        self, name: str, context: PluginContext, params: PluginParameters | None = None
    ) -> None:
        super().__init__(name, context, params)
        # The configuration's plugins so far, by name: a node can name only filters declared
        # before this plugin, so a tree cannot contain itself.
        filters = {n: p for n, p in context.lookup.items() if isinstance(p, Filter)}
        self._root = _Node(self.params.tree, filters, name)

    def filter(
        self, request: LLMRequest, state: CycleState, endpoints: Sequence[Endpoint]
    ) -> list[Endpoint]:
        node = self._root
        current: Sequence[Endpoint] = endpoints
        while True:  # a tree is finite: every path ends at a node without a next
            kept = node.filter.filter(request, state, current)
            following = node.on_success if kept else node.on_failure
            if following is None:
                return kept
            if kept:
                current = kept  # on failure the node's input goes on unchanged
            node = following
