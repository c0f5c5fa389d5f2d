"""Load generators and what they measure: open-loop streaming load, wrk, server histograms.

- :func:`open_loop` — Poisson arrivals at a fixed rate, whatever the server does (an
  open loop: a slow server gets a queue, not fewer requests), from this process with
  uvloop + aiohttp over at most ``CLIENT_CONNECTIONS`` connections. Per request it records
  TTFT (the first SSE ``data:`` chunk) and end-to-end time from the send, and how late
  the send was versus its schedule, so that a generator that cannot keep up shows.
- :func:`wrk` — the most requests/s a server sustains: ``wrk`` (one thread, a fixed
  number of connections, closed loop) with a Lua script from :func:`wrk_rotating_script`
  that rotates request bodies; :func:`parse_wrk` reads its ``--latency`` output.
- :func:`read_histogram` — a Prometheus histogram from a ``/metrics`` page, so that a
  server's own view of a run is the difference of two reads (:meth:`Histogram.minus`).

:func:`percentile` is the nearest-rank quantile the open-loop results are summarized with.
"""

from __future__ import annotations

import asyncio
import math
import os
import random
import re
import shutil
import subprocess
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

import aiohttp

from sluicegate.bench.processes import pinned

CLIENT_CONNECTIONS = 128
"""Connections the open-loop generator keeps at most (requests beyond wait for one)."""

# --------------------------------------------------------------------------- open loop


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-quantile (0..1) of ``values``, nearest-rank; NaN when empty."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


@dataclass(slots=True)
class LoadResult:
    """One open-loop run. Times in seconds."""

    rate: float
    wall_s: float
    ttft: list[float] = field(default_factory=list)
    e2e: list[float] = field(default_factory=list)
    lag: list[float] = field(default_factory=list)
    """How late each request was sent versus its schedule."""
    errors: Counter[str] = field(default_factory=Counter)
    generator_cpu: float = 0.0
    """Share of a core this process (the generator) used during the run."""

    @property
    def sent(self) -> int:
        return len(self.lag)

    @property
    def achieved_rate(self) -> float:
        """Requests sent per second of the run."""
        return self.sent / self.wall_s if self.wall_s else 0.0


async def open_loop(
    urls: Sequence[str], bodies: Sequence[bytes], rate: float, seconds: float, seed: int
) -> LoadResult:
    """Send streaming completions at Poisson arrivals of ``rate``/s for ``seconds`` s,
    round-robin over ``urls``; wait for every answer (each at most 30 s)."""
    rng = random.Random(seed)
    result = LoadResult(rate, seconds)
    timeout = aiohttp.ClientTimeout(total=30.0)
    # A bounded pool: when a server stalls, an unbounded one opens a burst of connections
    # that overflows its listen backlog, and each dropped SYN costs a 1 s retransmit.
    connector = aiohttp.TCPConnector(limit=CLIENT_CONNECTIONS)
    headers = {"Content-Type": "application/json"}
    loop = asyncio.get_running_loop()
    clock = time.perf_counter

    async def one(i: int, due: float) -> None:
        sent = clock()
        result.lag.append(sent - due)
        try:
            async with session.post(
                urls[i % len(urls)], data=bodies[i % len(bodies)], headers=headers
            ) as resp:
                ttft: float | None = None
                async for chunk in resp.content.iter_any():
                    if ttft is None and b"data:" in chunk:
                        ttft = clock() - sent
                done = clock() - sent
                if resp.status != 200:
                    result.errors[f"HTTP {resp.status}"] += 1
                elif ttft is None:
                    result.errors["no data"] += 1
                else:
                    result.ttft.append(ttft)
                    result.e2e.append(done)
        except (aiohttp.ClientError, TimeoutError) as exc:
            result.errors[type(exc).__name__] += 1

    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        tasks: set[asyncio.Task[None]] = set()
        cpu0 = time.process_time()
        start = clock() + 0.01
        due = start
        end = start + seconds
        i = 0
        while due < end:
            now = clock()
            if due > now:
                await asyncio.sleep(due - now)
            while due <= clock() and due < end:
                task = loop.create_task(one(i, due))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
                i += 1
                due += rng.expovariate(rate)
        await asyncio.gather(*tasks)
        result.wall_s = clock() - start
        result.generator_cpu = (time.process_time() - cpu0) / result.wall_s
    return result


# --------------------------------------------------------------------------- histograms


@dataclass(frozen=True, slots=True)
class Histogram:
    """A Prometheus histogram's cumulative buckets (upper bound, count), sum and count."""

    buckets: tuple[tuple[float, float], ...]
    total: float
    count: float

    def minus(self, earlier: Histogram) -> Histogram:
        """The observations made since ``earlier``."""
        before = dict(earlier.buckets)
        return Histogram(
            tuple((le, n - before.get(le, 0.0)) for le, n in self.buckets),
            self.total - earlier.total,
            self.count - earlier.count,
        )

    @property
    def mean(self) -> float:
        return self.total / self.count if self.count else float("nan")

    def quantile(self, q: float) -> float:
        """Linear interpolation within the bucket holding the ``q``-quantile (as PromQL's
        ``histogram_quantile``); NaN without observations."""
        if not self.count:
            return float("nan")
        rank = q * self.count
        lower_le, lower_n = 0.0, 0.0
        for le, n in self.buckets:
            if n >= rank:
                if le == float("inf"):
                    return lower_le
                span = n - lower_n
                return lower_le + (le - lower_le) * ((rank - lower_n) / span if span else 0.0)
            lower_le, lower_n = le, n
        return lower_le


def read_histogram(text: str, name: str) -> Histogram:
    """The unlabelled histogram ``name`` summed over label sets, from exposition ``text``."""
    buckets: dict[float, float] = {}
    total = count = 0.0
    bucket = re.compile(rf'^{re.escape(name)}_bucket\{{(?:.*,)?le="([^"]+)".*\}} (\S+)$')
    for line in text.splitlines():
        if not line.startswith(name):
            continue
        m = bucket.match(line)
        if m:
            le = float(m.group(1))
            buckets[le] = buckets.get(le, 0.0) + float(m.group(2))
        elif line.startswith(f"{name}_sum"):
            total += float(line.rsplit(" ", 1)[1])
        elif line.startswith(f"{name}_count"):
            count += float(line.rsplit(" ", 1)[1])
    return Histogram(tuple(sorted(buckets.items())), total, count)


# --------------------------------------------------------------------------- wrk


def wrk_rotating_script(bodies: Sequence[bytes], path: str) -> str:
    """A wrk Lua script POSTing JSON ``bodies`` to ``path`` in turn (one per request)."""
    for body in bodies:
        if b"]==]" in body:
            raise ValueError("a body holds the Lua long-string terminator")
    items = ",\n".join(f"[==[{b.decode()}]==]" for b in bodies)
    return (
        'wrk.method = "POST"\n'
        'wrk.headers["Content-Type"] = "application/json"\n'
        f"local bodies = {{\n{items}\n}}\n"
        "local n = #bodies\nlocal i = 0\n"
        "request = function()\n"
        "  i = i + 1\n"
        f'  return wrk.format(nil, "{path}", nil, bodies[(i % n) + 1])\n'
        "end\n"
    )


_UNITS = {"us": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0}


@dataclass(frozen=True, slots=True)
class WrkResult:
    """What one wrk run reports. Latencies in seconds."""

    requests: int
    seconds: float
    p50: float
    p90: float
    p99: float
    non_2xx: int
    socket_errors: int

    @property
    def rps(self) -> float:
        return self.requests / self.seconds if self.seconds else 0.0


def parse_wrk(out: str) -> WrkResult:
    """Read wrk's ``--latency`` output."""
    m = re.search(r"(\d+) requests in ([\d.]+)(us|ms|s|m)\b", out)
    if m is None:
        raise RuntimeError(f"cannot read wrk's output:\n{out}")
    seconds = float(m.group(2)) * _UNITS[m.group(3)]
    dist = {
        int(q): float(v) * _UNITS[u]
        for q, v, u in re.findall(r"^\s+(50|90|99)%\s+([\d.]+)(us|ms|s|m)\s*$", out, re.M)
    }
    errors = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    sock = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", out)
    return WrkResult(
        int(m.group(1)),
        seconds,
        dist.get(50, float("nan")),
        dist.get(90, float("nan")),
        dist.get(99, float("nan")),
        int(errors.group(1)) if errors else 0,
        sum(int(g) for g in sock.groups()) if sock else 0,
    )


def wrk_output(
    url: str, script: str, connections: int, seconds: float, cpu: int | None = None
) -> str:
    """Run wrk (one thread, ``connections`` connections, ``--latency``) with the Lua
    ``script`` against ``url`` for ``seconds`` s, pinned to core ``cpu``; its output."""
    binary = shutil.which("wrk")
    if binary is None:
        raise RuntimeError("wrk is not installed (Debian: apt-get install wrk)")
    with tempfile.NamedTemporaryFile("w", suffix=".lua", delete=False) as f:
        f.write(script)
    cmd = [binary, "-t1", f"-c{connections}", f"-d{seconds}s", "--latency", "-s", f.name, url]
    try:
        return subprocess.run(
            pinned(cmd, cpu), capture_output=True, text=True, check=True, timeout=seconds + 60
        ).stdout
    finally:
        os.unlink(f.name)


def wrk(url: str, script: str, connections: int, seconds: int, cpu: int | None) -> WrkResult:
    """One wrk run (see :func:`wrk_output`), read; a run with failed requests keeps its
    numbers (its ``non_2xx`` tells)."""
    return parse_wrk(wrk_output(url, script, connections, seconds, cpu))
