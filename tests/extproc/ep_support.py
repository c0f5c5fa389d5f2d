"""Helpers for the endpoint-picker tests: configuration documents, hand-built ext_proc
messages, a client for one ext_proc stream, and readers for the picker's answers."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import grpc
import orjson
from envoy.config.core.v3 import base_pb2
from envoy.extensions.filters.http.ext_proc.v3 import processing_mode_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc

from sluicegate.extproc.server import ExtProcServer
from sluicegate.runtime import Runtime
from sluicegate.scheduling.config import load_preset

POOL = "pool"
BASE = "tiny-llama"
"""The model the ``tiny`` simulator profile serves."""
DESTINATION = "x-gateway-destination-endpoint"
MODES = processing_mode_pb2.ProcessingMode
WAIT_S = 10.0


# ---------------------------------------------------------------------------- documents


QUEUEING_ANNOTATION = "inference-epp-env.networking.x-k8s.io/experimental-use-queueing"
"""The InferencePool annotation that turns flow control on for that pool."""


def pool_doc(urls: Sequence[str], name: str = POOL, queueing: bool = False) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": name}
    if queueing:
        metadata["annotations"] = {QUEUEING_ANNOTATION: "true"}
    return {
        "apiVersion": "inference.networking.k8s.io/v1",
        "kind": "InferencePool",
        "metadata": metadata,
        "spec": {
            "targetPorts": [{"number": 8000}],
            "endpoints": [{"address": u, "name": f"{name}-{i}"} for i, u in enumerate(urls)],
        },
    }


def model_doc(
    public: str, targets: Mapping[str, int], criticality: str = "Standard", pool: str = POOL
) -> dict[str, Any]:
    return {
        "apiVersion": "inference.networking.x-k8s.io/v1alpha2",
        "kind": "InferenceModel",
        "metadata": {"name": public},
        "spec": {
            "modelName": public,
            "criticality": criticality,
            "poolRef": {"name": pool},
            "targetModels": [{"name": n, "weight": w} for n, w in targets.items()],
        },
    }


def gateway_doc(**spec: Any) -> dict[str, Any]:
    return {"apiVersion": "sluicegate.dev/v1alpha1", "kind": "GatewayConfig", "spec": spec}


def picker_doc(preset: str = "default", **fields: Any) -> dict[str, Any]:
    """An EndpointPickerConfig: the shipped ``preset`` plus top-level ``fields`` (camelCase),
    whose ``plugins`` are added to the preset's."""
    doc = load_preset(preset).model_dump(by_alias=True, exclude_none=True)
    doc["plugins"] = [*doc["plugins"], *fields.pop("plugins", [])]
    doc.update(fields)
    return doc


ONE_AT_A_TIME = {
    "plugins": [
        {"name": "one", "type": "concurrency-detector", "parameters": {"maxConcurrency": 1}}
    ],
    "saturationDetector": {"pluginRef": "one"},
}
"""Picker fields making an endpoint full (saturated) while one request is in flight."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


# ---------------------------------------------------------------------------- messages


def _header_map(headers: Mapping[str, str]) -> Any:
    return base_pb2.HeaderMap(
        headers=[base_pb2.HeaderValue(key=k, raw_value=v.encode()) for k, v in headers.items()]
    )


def request_headers(
    path: str = "/v1/completions",
    headers: Mapping[str, str] | None = None,
    *,
    method: str = "POST",
    end_of_stream: bool = False,
    request_mode: int | None = None,
    response_mode: int = MODES.FULL_DUPLEX_STREAMED,
    subset: Sequence[str] | None = None,
    legacy_values: bool = False,
) -> Any:
    """The first message of a stream. ``request_mode`` adds a ``protocol_config``;
    ``subset`` the subset hint; ``legacy_values`` writes ``value`` instead of ``raw_value``
    (older Envoy releases)."""
    all_headers = {
        ":method": method,
        ":path": path,
        ":authority": "gateway",
        "content-type": "application/json",
        **(headers or {}),
    }
    header_map = (
        base_pb2.HeaderMap(
            headers=[base_pb2.HeaderValue(key=k, value=v) for k, v in all_headers.items()]
        )
        if legacy_values
        else _header_map(all_headers)
    )
    message = pb.ProcessingRequest(
        request_headers=pb.HttpHeaders(headers=header_map, end_of_stream=end_of_stream)
    )
    if request_mode is not None:
        message.protocol_config.request_body_mode = request_mode
        message.protocol_config.response_body_mode = response_mode
    if subset is not None:
        hint = message.metadata_context.filter_metadata["envoy.lb.subset_hint"]
        values = hint.fields["x-gateway-destination-endpoint-subset"].list_value.values
        for address in subset:
            values.add().string_value = address
    return message


def request_body(data: bytes, end_of_stream: bool = True) -> Any:
    return pb.ProcessingRequest(request_body=pb.HttpBody(body=data, end_of_stream=end_of_stream))


def request_trailers() -> Any:
    return pb.ProcessingRequest(request_trailers=pb.HttpTrailers())


def response_headers(
    status: int = 200,
    headers: Mapping[str, str] | None = None,
    *,
    end_of_stream: bool = False,
    served: str | None = None,
) -> Any:
    all_headers = {":status": str(status), "content-type": "application/json", **(headers or {})}
    message = pb.ProcessingRequest(
        response_headers=pb.HttpHeaders(
            headers=_header_map(all_headers), end_of_stream=end_of_stream
        )
    )
    if served is not None:
        lb = message.metadata_context.filter_metadata["envoy.lb"]
        lb.fields["x-gateway-destination-endpoint-served"].string_value = served
    return message


def response_body(data: bytes, end_of_stream: bool = True) -> Any:
    return pb.ProcessingRequest(response_body=pb.HttpBody(body=data, end_of_stream=end_of_stream))


def completion(model: str = BASE, prompt: str = "Hello", **fields: Any) -> bytes:
    return orjson.dumps({"model": model, "prompt": prompt, "max_tokens": 4, **fields})


def sse(*events: Mapping[str, Any]) -> bytes:
    return b"".join(b"data: " + orjson.dumps(e) + b"\n\n" for e in events) + b"data: [DONE]\n\n"


# ---------------------------------------------------------------------------- reading


def kind(response: Any) -> str:
    return str(response.WhichOneof("response"))


def set_headers(response: Any) -> dict[str, str]:
    """Headers a HeadersResponse or BodyResponse sets."""
    common = getattr(response, kind(response)).response
    return {
        h.header.key: (h.header.raw_value.decode() or h.header.value)
        for h in common.header_mutation.set_headers
    }


def removed_headers(response: Any) -> list[str]:
    return list(getattr(response, kind(response)).response.header_mutation.remove_headers)


def metadata_destination(response: Any) -> str:
    lb = response.dynamic_metadata.fields["envoy.lb"].struct_value
    return str(lb.fields[DESTINATION].string_value)


def streamed_pieces(responses: Sequence[Any], phase: str = "request_body") -> list[Any]:
    """The StreamedBodyResponse pieces of ``phase`` among ``responses``."""
    return [
        getattr(r, phase).response.body_mutation.streamed_response
        for r in responses
        if kind(r) == phase
    ]


def streamed(responses: Sequence[Any], phase: str = "request_body") -> bytes:
    return b"".join(p.body for p in streamed_pieces(responses, phase))


@dataclass
class Immediate:
    status: int
    headers: dict[str, str]
    body: dict[str, Any]


def immediate(response: Any) -> Immediate:
    assert kind(response) == "immediate_response", response
    answer = response.immediate_response
    headers = {
        h.header.key: (h.header.raw_value.decode() or h.header.value)
        for h in answer.headers.set_headers
    }
    return Immediate(answer.status.code, headers, orjson.loads(answer.body))


# ---------------------------------------------------------------------------- streams


class Exchange:
    """One ext_proc stream, driven by hand. A background task reads the answers (a read
    cut short by a timeout would cancel the whole call)."""

    def __init__(self, stub: Any) -> None:
        self.call = stub.Process()
        self._answers: asyncio.Queue[Any] = asyncio.Queue()
        self._reader = asyncio.create_task(self._read())

    async def _read(self) -> None:
        try:
            while True:
                message = await self.call.read()
                await self._answers.put(message)
                if message is grpc.aio.EOF:
                    return
        except (grpc.aio.AioRpcError, asyncio.CancelledError):
            await self._answers.put(grpc.aio.EOF)

    async def send(self, *messages: Any) -> None:
        for message in messages:
            await self.call.write(message)

    async def recv(self, count: int = 1) -> list[Any]:
        out = []
        async with asyncio.timeout(WAIT_S):
            for _ in range(count):
                message = await self._answers.get()
                assert message is not grpc.aio.EOF, f"stream ended after {len(out)} answers"
                out.append(message)
        return out

    async def no_answer(self, wait: float = 0.2) -> None:
        """Nothing arrives within ``wait`` seconds."""
        await asyncio.sleep(wait)
        assert self._answers.empty(), f"unexpected answer: {self._answers.get_nowait()}"

    async def finish(self) -> None:
        """Half-close; the picker must end the stream without another answer."""
        await self.call.done_writing()
        async with asyncio.timeout(WAIT_S):
            assert await self._answers.get() is grpc.aio.EOF
        assert await self.call.code() == grpc.StatusCode.OK

    def cancel(self) -> None:
        self.call.cancel()
        self._reader.cancel()


@dataclass
class Picker:
    """A running picker and a client channel to it."""

    server: ExtProcServer
    runtime: Runtime
    channel: grpc.aio.Channel
    stub: Any

    def exchange(self) -> Exchange:
        return Exchange(self.stub)

    def endpoint(self, address: str) -> Any:
        return next(e for e in self.runtime.datastore.all_endpoints() if e.address == address)

    def inflight(self) -> int:
        return sum(e.inflight.requests for e in self.runtime.datastore.all_endpoints())

    def addresses(self) -> list[str]:
        return [e.address for e in self.runtime.datastore.all_endpoints()]


def new_stub(channel: grpc.aio.Channel) -> Any:
    return pb_grpc.ExternalProcessorStub(channel)


async def wait_for(predicate: Any, what: str = "condition") -> None:
    """Poll ``predicate`` every 10 ms for up to WAIT_S seconds."""
    for _ in range(int(WAIT_S / 0.01)):
        if predicate():
            return
        await asyncio.sleep(0.01)
    assert predicate(), f"timed out waiting for {what}"
