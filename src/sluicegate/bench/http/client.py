"""The load generator of HTTP mode: a workload replayed on schedule, every answer streamed.

:func:`replay` sends a :class:`~sluicegate.bench.workloads.Workload`'s requests from this
process (asyncio on uvloop, aiohttp, one connection per request in flight: no client-side
limit holds a request back) at their arrival times × the time scale, and hands each
outcome back to the workload, which may follow up (the next turn of a chat quotes the
reply). Arrivals after the simulated horizon are dropped, as in DES mode; the replay ends
when everything is answered or a wall deadline passes.

Per request it records an :class:`HttpRequestRecord`: when it was actually sent (and how
late versus its schedule), the arrival of every streamed token (so TTFT is the first one
and the inter-token latencies are the gaps), the end of the stream, the usage the server
reported, the replica that answered (its ``x-inference-port`` header) and the reply. Every
instant is read from ``time.perf_counter`` and converted to simulated seconds,
``(wall − t0) / S``; SLO headers go out multiplied by ``S`` (:func:`wire_headers`), since
the router compares them with wall-clock latencies.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
import time
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import orjson

from sluicegate.bench.des_spec import RequestRecord
from sluicegate.bench.workloads import RequestSpec, Workload
from sluicegate.requestcontrol.parse import SLO_TPOT_HEADERS, SLO_TTFT_HEADERS
from sluicegate.sim.text import PromptError, render_chat, render_prompt

GRACE_S = 10.0
"""Wall seconds a run may last beyond its horizon (× S) before it is cut."""

_SLO_HEADERS = frozenset((*SLO_TTFT_HEADERS, *SLO_TPOT_HEADERS))


@dataclass(slots=True, eq=False)
class HttpRequestRecord(RequestRecord):
    """A :class:`~sluicegate.bench.des_spec.RequestRecord` measured by the HTTP client.

    ``arrival`` is when the request was actually sent, ``first_token`` when the first
    streamed token arrived, ``finish`` when the stream ended; all in simulated seconds.
    """

    token_times: list[float] = field(default_factory=list)
    """Arrival of each streamed token (SSE event carrying generated text), simulated s."""
    lag: float = 0.0
    """How late the request was sent versus its schedule, simulated seconds."""

    @property
    def itl(self) -> list[float]:
        """Inter-token latencies, simulated seconds: gaps between consecutive tokens."""
        t = self.token_times
        return [b - a for a, b in itertools.pairwise(t)]


def wire_headers(spec: RequestSpec, time_scale: float) -> dict[str, str]:
    """The headers sent for ``spec``: its own, with SLOs (ms) scaled to wall time."""
    headers = {"Content-Type": "application/json"}
    for name, value in spec.all_headers().items():
        if name.lower() in _SLO_HEADERS:
            value = f"{float(value) * time_scale:g}"
        headers[name] = value
    return headers


def _prompt_bytes(spec: RequestSpec) -> bytes:
    """The prompt as the model server renders it (for the ideal prefix-hit rate)."""
    try:
        return render_chat(spec.messages) if spec.kind == "chat" else render_prompt(spec.prompt)
    except PromptError:
        return b""


def _error_reason(data: bytes) -> str:
    try:
        payload = orjson.loads(data)
    except orjson.JSONDecodeError:
        return ""
    error = payload.get("error") if isinstance(payload, dict) else None
    if isinstance(error, dict):
        return str(error.get("code") or error.get("type") or "")
    return ""


@dataclass(slots=True)
class Replay:
    """What :func:`replay` returns. Times in simulated seconds."""

    records: list[HttpRequestRecord]
    end_time: float
    cut: bool
    """True when the horizon (or the wall deadline) ended the run with work left."""
    wall_s: float


class _Client:
    """Sends one workload's requests and follows up on their answers."""

    def __init__(
        self,
        workload: Workload,
        base_url: str,
        time_scale: float,
        horizon_s: float,
        ports: dict[int, int],
    ) -> None:
        self.workload = workload
        self.base_url = base_url
        self.scale = time_scale
        self.horizon_s = horizon_s
        self.ports = ports
        self.loop = asyncio.get_running_loop()
        self.t0 = 0.0
        self.heap: list[tuple[float, int, RequestSpec]] = []
        self.order = itertools.count()
        self.wake = asyncio.Event()
        self.records: list[HttpRequestRecord] = []
        self.tasks: set[asyncio.Task[None]] = set()
        self.dropped = False

    def now(self) -> float:
        """Simulated seconds since the start (from ``time.perf_counter``: uvloop's
        ``loop.time()`` only advances in whole milliseconds)."""
        return (time.perf_counter() - self.t0) / self.scale

    def push(self, t: float, spec: RequestSpec) -> None:
        if t > self.horizon_s:
            self.dropped = True  # as in DES mode: nothing happens after the horizon
            return
        heapq.heappush(self.heap, (t, next(self.order), spec))
        self.wake.set()

    async def run(self, deadline_s: float) -> Replay:
        """Replay until everything is answered or ``deadline_s`` wall seconds pass."""
        loop = self.loop
        connector = aiohttp.TCPConnector(limit=0, force_close=False)
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=10.0)
        async with aiohttp.ClientSession(
            connector=connector, timeout=timeout, auto_decompress=False
        ) as session:
            clock = time.perf_counter
            self.t0 = clock() + 0.05
            for t, spec in self.workload.initial():
                self.push(t, spec)
            deadline = self.t0 + deadline_s
            while True:
                now = clock()
                while self.heap and self.t0 + self.heap[0][0] * self.scale <= now:
                    t, _, spec = heapq.heappop(self.heap)
                    record = HttpRequestRecord(spec, t)
                    self.records.append(record)
                    task = loop.create_task(self._send(session, record))
                    self.tasks.add(task)
                    task.add_done_callback(self.tasks.discard)
                if (not self.heap and not self.tasks) or now >= deadline:
                    break
                due = self.t0 + self.heap[0][0] * self.scale if self.heap else deadline
                self.wake.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.wake.wait(), max(0.0, min(due, deadline) - now))
            cut = self.dropped or bool(self.heap) or bool(self.tasks)
            for task in list(self.tasks):
                task.cancel()
            await asyncio.gather(*self.tasks, return_exceptions=True)
        last = max((r.finish for r in self.records if r.finish >= 0), default=0.0)
        return Replay(self.records, self.horizon_s if cut else last, cut, 0.0)

    def _ended(self, record: HttpRequestRecord, reply: str | None) -> None:
        """Hand the workload the request's outcome (as DES mode does when it ends)."""
        at = record.finish if reply is not None else self.now()
        for t, spec in self.workload.follow_up(record.spec, at, reply):
            self.push(t, spec)

    async def _send(self, session: aiohttp.ClientSession, record: HttpRequestRecord) -> None:
        spec = record.spec
        path = "/v1/chat/completions" if spec.kind == "chat" else "/v1/completions"
        body = orjson.dumps(spec.body())
        headers = wire_headers(spec, self.scale)
        scheduled = record.arrival
        record.arrival = self.now()
        record.lag = record.arrival - scheduled
        try:
            async with session.post(self.base_url + path, data=body, headers=headers) as resp:
                port = resp.headers.get("x-inference-port", "")
                record.endpoint = self.ports.get(int(port), -1) if port.isdigit() else -1
                if resp.status != 200:
                    record.reason = _error_reason(await resp.read())
                    record.status = resp.status
                elif spec.stream:
                    await self._read_stream(resp, record)
                else:
                    self._read_whole(await resp.read(), record)
        except (aiohttp.ClientError, OSError) as exc:
            record.status, record.reason = 502, f"client: {type(exc).__name__}"
        if record.completed:
            record.prompt_bytes = _prompt_bytes(spec)
            self._ended(record, record.reply)
        else:
            self._ended(record, None)
        self.wake.set()  # the main loop checks whether everything is done

    async def _read_stream(self, resp: aiohttp.ClientResponse, record: HttpRequestRecord) -> None:
        chat = record.spec.kind == "chat"
        parts: list[str] = []
        pending = b""
        done = False
        error: str | None = None
        error_status = 502
        usage: dict[str, Any] | None = None
        times = record.token_times
        async for chunk in resp.content.iter_any():
            now = self.now()
            pending += chunk
            *events, pending = pending.split(b"\n\n")
            for event in events:
                if not event.startswith(b"data:"):
                    continue
                data = event[5:].strip()
                if data == b"[DONE]":
                    done = True
                    continue
                try:
                    payload = orjson.loads(data)
                except orjson.JSONDecodeError:
                    error = "bad-event"
                    continue
                if "error" in payload:
                    err = payload["error"]
                    error = str(err.get("code", "error")) if isinstance(err, dict) else "error"
                    if isinstance(err, dict) and isinstance(err.get("code"), int):
                        error_status = err["code"]
                    continue
                choices = payload.get("choices")
                if choices:
                    choice = choices[0]
                    if chat:
                        delta = choice.get("delta") or {}
                        if "role" not in delta:
                            times.append(now)
                            parts.append(delta.get("content") or "")
                    else:
                        times.append(now)
                        parts.append(choice.get("text") or "")
                if payload.get("usage"):
                    usage = payload["usage"]
        record.finish = self.now()
        if times:
            record.first_token = times[0]
        if usage is not None:
            record.output_tokens = int(usage.get("completion_tokens", len(times)))
            record.prompt_tokens = int(usage.get("prompt_tokens", 0))
            details = usage.get("prompt_tokens_details") or {}
            record.cached_tokens = int(details.get("cached_tokens") or 0)
        else:
            record.output_tokens = len(times)
        if chat:
            record.reply = "".join(parts)
        if error is not None:
            record.status, record.reason = error_status, error
        elif not done or not times:
            record.status, record.reason = 502, "stream-truncated"
        else:
            record.status = 200

    def _read_whole(self, data: bytes, record: HttpRequestRecord) -> None:
        """A non-streamed answer: first token = finish = when it arrived."""
        record.finish = record.first_token = self.now()
        payload = orjson.loads(data)
        usage = payload.get("usage") or {}
        record.output_tokens = int(usage.get("completion_tokens", 0))
        record.prompt_tokens = int(usage.get("prompt_tokens", 0))
        record.cached_tokens = int(
            (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
        )
        if record.spec.kind == "chat":
            choices = payload.get("choices") or [{}]
            record.reply = str((choices[0].get("message") or {}).get("content") or "")
        record.status = 200


async def replay(
    workload: Workload,
    base_url: str,
    time_scale: float,
    horizon_s: float,
    ports: dict[int, int],
    grace_s: float = GRACE_S,
) -> Replay:
    """Send ``workload``'s requests to ``base_url`` at their arrival times × ``time_scale``
    (wall s per simulated s) and follow up as they end, until all are answered or the
    simulated ``horizon_s`` passes (then + ``grace_s`` wall seconds at most). ``ports``
    maps a replica's port (its ``x-inference-port`` answer header) to its index."""
    client = _Client(workload, base_url, time_scale, horizon_s, ports)
    started = time.perf_counter()
    result = await client.run(horizon_s * time_scale + grace_s)
    result.wall_s = time.perf_counter() - started
    return result
