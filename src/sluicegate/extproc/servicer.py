"""The ``envoy.service.ext_proc.v3.ExternalProcessor`` servicer (grpc.aio).

One ``Process`` call is one bidirectional stream, which Envoy opens per HTTP request. The
handler reads messages one at a time and writes the answers of each before reading the
next (the protocol is ordered). Whatever ends the stream — Envoy half-closing it, Envoy
cancelling it because the client left, a fault, the server shutting down — the
``finally`` clause releases the request's dispatch, so in-flight counts cannot drift.
An unexpected exception while handling a message is logged and answered (a 500 before the
request is routed, an untouched pass-through after); it never ends the server.
"""

from __future__ import annotations

import logging
from typing import Any

import grpc
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc

from sluicegate.extproc.metrics import ExtProcMetrics
from sluicegate.extproc.stream import ExtProcStream, StreamSettings
from sluicegate.runtime import Runtime

log = logging.getLogger("sluicegate.extproc")


class PickerServicer(pb_grpc.ExternalProcessorServicer):  # type: ignore[misc]
    """Routes every request Envoy sends through ``runtime``."""

    def __init__(self, runtime: Runtime, settings: StreamSettings, metrics: ExtProcMetrics) -> None:
        self.runtime = runtime
        self.settings = settings
        self.metrics = metrics

    async def Process(self, request_iterator: Any, context: Any) -> None:  # noqa: N802 (gRPC name)
        stream = ExtProcStream(self.runtime, self.settings, self.metrics)
        metrics = self.metrics
        metrics.streams.inc()
        metrics.active_streams.inc()
        try:
            while True:
                message = await context.read()
                if message is grpc.aio.EOF:
                    return
                try:
                    responses = await stream.handle(message)
                except Exception:
                    log.exception(
                        "ext_proc: unexpected error handling %s of request %s",
                        message.WhichOneof("request"),
                        stream.request_id or "?",
                    )
                    responses = stream.fail(message)
                for response in responses:
                    await context.write(response)
        finally:
            metrics.active_streams.dec()
            stream.close()
