"""gRPC health of the endpoint picker.

Services, as the reference endpoint picker serves them (GIE
https://github.com/kubernetes-sigs/gateway-api-inference-extension/blob/1748e829/cmd/epp/runner/health.go):

- ``liveness`` — SERVING while the process runs;
- ``accepting`` — SERVING from start until the drain begins (SIGTERM), whatever the sync
  state: what a proxy in front of several picker replicas health checks, so that it moves
  new streams off a replica that is draining while a picker that has not synced yet still
  answers (503) rather than vanishing;
- ``readiness``, ``envoy.service.ext_proc.v3.ExternalProcessor`` and ``""`` (the whole
  server) — SERVING once the picker can route: with Kubernetes discovery, once it has
  synced and the pool exists (as the reference reports it); with a configuration file,
  while some endpoint is ready. NOT_SERVING before that and while shutting down.

``Watch`` is served too (the grpcio-health-checking servicer streams changes).
"""

from __future__ import annotations

from typing import Any

from grpc_health.v1 import health_pb2
from grpc_health.v1.health import aio as health_aio

LIVENESS = "liveness"
ACCEPTING = "accepting"
READINESS = "readiness"
EXT_PROC_SERVICE = "envoy.service.ext_proc.v3.ExternalProcessor"
_READY_SERVICES = (READINESS, EXT_PROC_SERVICE, "")

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


class PickerHealth:
    """The health servicer and the readiness it reports."""

    def __init__(self) -> None:
        self.servicer: Any = health_aio.HealthServicer()
        self.ready: bool | None = None
        self.draining = False

    async def start(self) -> None:
        """Alive, not ready yet."""
        await self.servicer.set(LIVENESS, SERVING)
        await self.servicer.set(ACCEPTING, SERVING)
        await self.set_ready(False)

    async def set_ready(self, ready: bool) -> None:
        """Report the readiness services as SERVING (``ready``) or NOT_SERVING."""
        if ready == self.ready or (ready and self.draining):
            return
        self.ready = ready
        for service in _READY_SERVICES:
            await self.servicer.set(service, SERVING if ready else NOT_SERVING)

    async def shutting_down(self) -> None:
        """Not ready nor accepting from now on (the process is draining); ``liveness``
        stays SERVING."""
        await self.servicer.set(ACCEPTING, NOT_SERVING)
        await self.set_ready(False)
        self.draining = True
