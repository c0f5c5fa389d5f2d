"""The Envoy ext_proc endpoint picker (``sluicegate extproc``).

Envoy calls it over gRPC (``envoy.service.ext_proc.v3.ExternalProcessor``) for every
request; it routes the request with the same :class:`~sluicegate.runtime.Runtime` as the
standalone gateway and answers with the endpoint-picker protocol of the Gateway API
Inference Extension (https://github.com/kubernetes-sigs/gateway-api-inference-extension/blob/1748e829/docs/proposals/004-endpoint-picker-protocol/README.md).
Protocol translation only:

- :mod:`~sluicegate.extproc.protocol` — header and metadata names, limits, message builders;
- :mod:`~sluicegate.extproc.stream` — one request/response as a state machine;
- :mod:`~sluicegate.extproc.response` — the response body: usage, model name restored;
- :mod:`~sluicegate.extproc.servicer` — the gRPC servicer;
- :mod:`~sluicegate.extproc.health`, :mod:`~sluicegate.extproc.metrics` — health, metrics;
- :mod:`~sluicegate.extproc.server` — the servers and their lifecycle;
- :mod:`~sluicegate.extproc.run` — the command (configuration file or Kubernetes).

The re-exports are eager: whoever imports this package runs the picker's server, which
loads the gRPC stack anyway. ``RunOptions``/``run_extproc`` stay in
:mod:`~sluicegate.extproc.run`: they would add configuration reloading and the console.
"""

from sluicegate.extproc.server import ExtProcOptions, ExtProcServer
from sluicegate.extproc.stream import StreamSettings

__all__ = ["ExtProcOptions", "ExtProcServer", "StreamSettings"]
