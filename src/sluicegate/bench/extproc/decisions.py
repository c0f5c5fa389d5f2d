"""Ext_proc decisions per second of one picker process on one core.

:func:`measure_decisions` runs ``sluicegate extproc`` pinned to ``PICKER_CPU`` in front of
the simulated replicas (time scale 10⁻⁶, scraped every 50 ms as in production). A gRPC
client in this process (pinned to ``OTHER_CPU``) keeps ``streams`` ext_proc streams in
flight, each one a whole request as Envoy sends it for a non-streamed completion: request
headers, the body → the routing answer (headers and body) → response headers, a response
body with usage → their answers → end of stream. Decisions/s = completed streams per wall
second. CPU per decision comes from the picker process's own CPU time (``/proc``), so it
stays meaningful when the client, not the picker, is the limit; the event-loop thread's
share of it tells Python work from gRPC's own threads, and the picker's CPU with no
traffic (scraping) is measured first so that it can be left out.

:func:`measure_null` sends the same load to a do-nothing servicer (:func:`serve_null`):
the cost of grpc.aio itself, the floor for any Python ext_proc server.
"""

from __future__ import annotations

import asyncio
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import orjson
from rich.console import Console

from sluicegate.bench.extproc.fleet import (
    MODEL,
    OTHER_CPU,
    PICKER_CPU,
    START_TIMEOUT_S,
    STOP_TIMEOUT_S,
    picker,
    request_bodies,
    sim_pool,
)
from sluicegate.bench.processes import (
    Processes,
    can_pin,
    cpu_seconds,
    free_port_block,
    pin_this_thread,
    wait_listening,
)

IDLE_S = 3.0
"""How long the picker's CPU is sampled with no traffic (what scraping costs)."""


@dataclass
class DecisionRun:
    """One load level: completed streams, wall time, and the picker's CPU meanwhile."""

    streams: int
    seconds: float
    decisions: int
    picker_cpu_s: float
    errors: int
    pinned: bool
    idle_share: float = 0.0
    """Share of a core the picker used with no traffic (scraping the replicas)."""
    loop_cpu_s: float = 0.0
    """Of ``picker_cpu_s``, the event-loop (main) thread's; the rest is gRPC's own
    threads (completion-queue poller, event engine)."""

    @property
    def per_s(self) -> float:
        return self.decisions / self.seconds

    @property
    def cpu_us(self) -> float:
        """Picker CPU per decision, µs."""
        return self.picker_cpu_s / max(1, self.decisions) * 1e6

    @property
    def per_cpu_s(self) -> float:
        """Decisions per second of picker CPU (its capacity on one saturated core)."""
        return self.decisions / self.picker_cpu_s if self.picker_cpu_s else 0.0

    @property
    def loop_share(self) -> float:
        """Share of the picker's CPU spent on its event-loop thread."""
        return self.loop_cpu_s / self.picker_cpu_s if self.picker_cpu_s else 0.0

    @property
    def net_cpu_us(self) -> float:
        """Picker CPU per decision without the scraping it does anyway, µs."""
        net = self.picker_cpu_s - self.idle_share * self.seconds
        return max(0.0, net) / max(1, self.decisions) * 1e6


def _messages() -> tuple[Any, Any, Any, list[Any]]:
    """Prebuilt ext_proc messages of one non-streamed completion: request headers,
    response headers, response body, and the request bodies (they vary)."""
    from envoy.config.core.v3 import base_pb2
    from envoy.service.ext_proc.v3 import external_processor_pb2 as pb

    def header_map(headers: dict[str, str]) -> Any:
        return base_pb2.HeaderMap(
            headers=[base_pb2.HeaderValue(key=k, raw_value=v.encode()) for k, v in headers.items()]
        )

    request_headers = pb.ProcessingRequest(
        request_headers=pb.HttpHeaders(
            headers=header_map(
                {
                    ":method": "POST",
                    ":path": "/v1/completions",
                    ":authority": "gateway",
                    "content-type": "application/json",
                    "x-request-id": "bench",
                }
            )
        )
    )
    request_headers.protocol_config.request_body_mode = 4  # FULL_DUPLEX_STREAMED
    request_headers.protocol_config.response_body_mode = 4
    response_headers = pb.ProcessingRequest(
        response_headers=pb.HttpHeaders(
            headers=header_map({":status": "200", "content-type": "application/json"})
        )
    )
    answer = orjson.dumps(
        {
            "model": MODEL,
            "choices": [{"index": 0, "text": "x" * 64, "finish_reason": "length"}],
            "usage": {"prompt_tokens": 256, "completion_tokens": 16, "total_tokens": 272},
        }
    )
    response_body = pb.ProcessingRequest(response_body=pb.HttpBody(body=answer, end_of_stream=True))
    bodies = [
        pb.ProcessingRequest(request_body=pb.HttpBody(body=b, end_of_stream=True))
        for b in request_bodies()
    ]
    return request_headers, response_headers, response_body, bodies


async def drive(port: int, streams: int, seconds: float, warmup_s: float, pid: int) -> DecisionRun:
    """``streams`` concurrent whole-request streams against the server on ``port`` (over
    4 channels) for ``warmup_s`` + ``seconds``; counts and CPU of process ``pid`` over
    ``seconds``."""
    from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc

    req_headers, resp_headers, resp_body, bodies = _messages()
    channels = [grpc.aio.insecure_channel(f"127.0.0.1:{port}") for _ in range(4)]
    stubs = [pb_grpc.ExternalProcessorStub(c) for c in channels]
    done = 0
    errors = 0
    measuring = False
    stop = False

    async def one(stub: Any, body: Any) -> None:
        call = stub.Process()
        await call.write(req_headers)
        await call.write(body)
        await call.read()
        first_body = await call.read()
        if first_body.WhichOneof("response") != "request_body":
            raise RuntimeError(f"refused: {first_body}")
        await call.write(resp_headers)
        await call.read()
        await call.write(resp_body)
        await call.read()
        await call.done_writing()
        await call.read()  # end of stream

    async def worker(index: int) -> None:
        nonlocal done, errors
        stub = stubs[index % len(stubs)]
        i = index
        while not stop:
            try:
                await one(stub, bodies[i % len(bodies)])
            except (grpc.aio.AioRpcError, RuntimeError):
                errors += 1
                await asyncio.sleep(0.01)
                continue
            if measuring:
                done += 1
            i += streams

    tasks = [asyncio.create_task(worker(i)) for i in range(streams)]
    await asyncio.sleep(warmup_s)
    cpu0, loop0, t0 = cpu_seconds(pid), cpu_seconds(pid, pid), time.perf_counter()
    measuring = True
    await asyncio.sleep(seconds)
    measuring = False
    elapsed, cpu = time.perf_counter() - t0, cpu_seconds(pid) - cpu0
    loop_cpu = cpu_seconds(pid, pid) - loop0
    stop = True
    await asyncio.gather(*tasks, return_exceptions=True)
    for channel in channels:
        await channel.close()
    return DecisionRun(streams, elapsed, done, cpu, errors, True, loop_cpu_s=loop_cpu)


def measure_decisions(
    streams_levels: tuple[int, ...], seconds: float, console: Console, policy: str | None = None
) -> list[DecisionRun]:
    """Decisions/s of one picker process at each concurrency level (see the module)."""
    import uvloop

    with (
        tempfile.TemporaryDirectory(prefix="sluicegate-extproc-bench-") as tmp,
        pin_this_thread(OTHER_CPU),
    ):
        procs = Processes(Path(tmp))
        runs = []
        try:
            with sim_pool(procs, 1e-6) as pool, picker(procs, pool.config, policy) as running:
                cpu0 = cpu_seconds(running.pid)
                time.sleep(IDLE_S)
                idle = (cpu_seconds(running.pid) - cpu0) / IDLE_S
                warmup = min(2.0, seconds / 3)
                for streams in streams_levels:
                    console.print(f"extproc decisions: {streams} concurrent streams ...")
                    run = uvloop.run(
                        drive(running.grpc_port, streams, seconds, warmup, running.pid)
                    )
                    run.pinned, run.idle_share = running.pinned, idle
                    runs.append(run)
        finally:
            procs.stop_all()
    return runs


def measure_null(
    streams: int, seconds: float, console: Console, work_us: float = 0.0
) -> DecisionRun:
    """The same load against a servicer that answers every message with an empty
    response at once: what grpc.aio itself costs per stream (the floor for any Python
    ext_proc server). With ``work_us``, the servicer first spends that many µs of CPU on
    its event-loop thread per request body, as a picker's routing would: the difference
    tells what each µs of Python work per decision costs the process in all."""
    import uvloop

    with (
        tempfile.TemporaryDirectory(prefix="sluicegate-extproc-null-") as tmp,
        pin_this_thread(OTHER_CPU),
    ):
        procs = Processes(Path(tmp))
        port = free_port_block(1)
        code = f"from {__name__} import serve_null; serve_null({port}, {work_us!r})"
        try:
            pid = procs.start("null-servicer", [sys.executable, "-c", code], PICKER_CPU)
            wait_listening(procs, "null-servicer", port, START_TIMEOUT_S)
            console.print(
                f"extproc decisions: do-nothing servicer (+{work_us:.0f} µs of work), "
                f"{streams} streams ..."
            )
            run = uvloop.run(drive(port, streams, seconds, min(2.0, seconds / 3), pid))
            run.pinned = can_pin(PICKER_CPU)
            return run
        finally:
            procs.stop("null-servicer", STOP_TIMEOUT_S)


def serve_null(port: int, work_us: float = 0.0) -> None:
    """Serve the do-nothing ext_proc servicer of :func:`measure_null` on ``port``,
    spending ``work_us`` µs of CPU per request body."""
    import uvloop
    from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
    from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc

    work_s = work_us / 1e6
    answers: dict[str, list[Any]] = {
        "request_body": [
            pb.ProcessingResponse(request_headers=pb.HeadersResponse()),
            pb.ProcessingResponse(request_body=pb.BodyResponse()),
        ],
        "response_headers": [pb.ProcessingResponse(response_headers=pb.HeadersResponse())],
        "response_body": [pb.ProcessingResponse(response_body=pb.BodyResponse())],
    }

    class Null(pb_grpc.ExternalProcessorServicer):  # type: ignore[misc]
        async def Process(self, request_iterator: Any, context: Any) -> None:  # noqa: N802
            while True:
                message = await context.read()
                if message is grpc.aio.EOF:
                    return
                kind = message.WhichOneof("request")
                if work_s and kind == "request_body":
                    _spin(work_s)
                for answer in answers.get(kind, ()):
                    await context.write(answer)

    async def serve() -> None:
        server = grpc.aio.server()
        pb_grpc.add_ExternalProcessorServicer_to_server(Null(), server)
        server.add_insecure_port(f"127.0.0.1:{port}")
        await server.start()
        await server.wait_for_termination()

    uvloop.run(serve())


def _spin(cpu_s: float) -> None:
    """Busy the calling thread for ``cpu_s`` seconds of its own CPU time."""
    until = time.thread_time() + cpu_s
    while time.thread_time() < until:
        pass
