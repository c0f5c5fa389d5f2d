"""Flow control: holding requests back while the pool is saturated.

When every server that could take a request is full, sending it anyway only makes everyone
slower. With flow control on, such requests wait in the gateway in priority bands
(higher priority first), fair across flows (tenants) within a band, ordered within a flow,
bounded in count and bytes, each with a time to live. Sheddable requests (negative
priority) are refused with 429 instead of queued when the pool is saturated.

- :mod:`~sluicegate.flowcontrol.controller` — ``FlowController`` of one pool, its
  ``FlowControlSettings`` and per-band ``BandPolicy``;
- :mod:`~sluicegate.flowcontrol.config` — ``build_flow_control`` from an
  ``EndpointPickerConfig`` (``FlowControlSetup``);
- :mod:`~sluicegate.flowcontrol.peers` — flow control across gateway replicas: the
  ``PeerBacklog`` the other replicas' waiting counts come through and the ``PeerYield``
  dispatch rule;
- :mod:`~sluicegate.flowcontrol.policies` — the built-in policy plugins, registered by
  :mod:`sluicegate.builtins`, not exported here.

The names are imported on first use (lazy): importing a policy plugin runs this file, and a
plugin leans on the framework layer only, so this file must not load the controller.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sluicegate import lazy

_EXPORTS = {
    "POOL_ANNOTATION": "sluicegate.flowcontrol.config",
    "FlowControlSetup": "sluicegate.flowcontrol.config",
    "build_flow_control": "sluicegate.flowcontrol.config",
    "BandPolicy": "sluicegate.flowcontrol.controller",
    "FlowControlSettings": "sluicegate.flowcontrol.controller",
    "FlowController": "sluicegate.flowcontrol.controller",
    "NoPeerBacklog": "sluicegate.flowcontrol.peers",
    "PeerBacklog": "sluicegate.flowcontrol.peers",
    "PeerBacklogView": "sluicegate.flowcontrol.peers",
    "PeerYield": "sluicegate.flowcontrol.peers",
}

if TYPE_CHECKING:
    from sluicegate.flowcontrol.config import POOL_ANNOTATION, FlowControlSetup, build_flow_control
    from sluicegate.flowcontrol.controller import BandPolicy, FlowController, FlowControlSettings
    from sluicegate.flowcontrol.peers import (
        NoPeerBacklog,
        PeerBacklog,
        PeerBacklogView,
        PeerYield,
    )


__getattr__ = lazy.exports(__name__, _EXPORTS, globals())


__all__ = [
    "POOL_ANNOTATION",
    "BandPolicy",
    "FlowControlSettings",
    "FlowControlSetup",
    "FlowController",
    "NoPeerBacklog",
    "PeerBacklog",
    "PeerBacklogView",
    "PeerYield",
    "build_flow_control",
]
