"""How fast the simulator runs: engine steps per wall second, HTTP tokens per second.

- ``engine_speed``: one engine of a profile holding ``running`` sequences in steady decode
  (prompts of ``prompt_tokens``, outputs long enough never to finish during the
  measurement); reports steps per wall second and simulated seconds per wall second.
- ``http_speed``: one simulated server (fast time scale, so the engine never waits) serving
  ``streams`` concurrent streaming completions to a load generator in another process;
  reports SSE token chunks received per second. The server runs on one core.
"""

from __future__ import annotations

import asyncio
import os
import time
from dataclasses import dataclass

import orjson

from sluicegate.bench.loadgen import parse_wrk, wrk_output
from sluicegate.sim.engine import Engine, new_sequence
from sluicegate.sim.profiles import get_profile
from sluicegate.sim.server import ReplicaOptions, SimCluster


@dataclass(frozen=True, slots=True)
class EngineSpeed:
    profile: str
    running: int
    steps: int
    wall_s: float
    simulated_s: float

    @property
    def steps_per_s(self) -> float:
        return self.steps / self.wall_s

    @property
    def speedup(self) -> float:
        """Simulated seconds per wall second."""
        return self.simulated_s / self.wall_s


def engine_speed(
    profile: str = "llama3-8b-h100",
    running: int = 256,
    prompt_tokens: int = 1024,
    steps: int = 2000,
) -> EngineSpeed:
    """Time ``steps`` decode iterations with ``running`` sequences in the batch."""
    p = get_profile(profile)
    engine = Engine(p)
    for i in range(running):
        prompt = (f"{i:08d}" * (prompt_tokens // 2 + 1)).encode()[: prompt_tokens * 4]
        engine.add(
            new_sequence(
                f"r{i}",
                prompt,
                arrival=0.0,
                max_tokens=min(p.max_model_len - prompt_tokens, 10 * steps),
                ignore_eos=True,
                max_model_len=p.max_model_len,
                model="m",
            )
        )
    now = 0.0
    while any(s.num_output == 0 for s in engine.running) or engine.waiting:
        now += engine.step(now).duration  # prefill everything first
    assert len(engine.running) == running, "profile cannot hold that many sequences"
    start_sim = now
    t0 = time.perf_counter()
    for _ in range(steps):
        now += engine.step(now).duration
    wall = time.perf_counter() - t0
    return EngineSpeed(profile, running, steps, wall, now - start_sim)


@dataclass(frozen=True, slots=True)
class HttpSpeed:
    streams: int
    requests: int
    tokens_per_request: int
    wall_s: float
    server_cpu_share: float
    """Share of one core the server process used during the run."""

    @property
    def tokens_per_s(self) -> float:
        return self.requests * self.tokens_per_request / self.wall_s


def wrk_post_script(body: dict[str, object], path: str) -> str:
    """A wrk Lua script POSTing ``body`` as JSON to ``path``."""
    payload = orjson.dumps(body).decode().replace("\\", "\\\\").replace('"', '\\"')
    return (
        f'wrk.method = "POST"\nwrk.path = "{path}"\n'
        f'wrk.headers["Content-Type"] = "application/json"\nwrk.body = "{payload}"\n'
    )


def run_wrk(
    url: str, script: str, connections: int, seconds: float, cpu: int | None = None
) -> tuple[int, float, str]:
    """Run wrk (one thread) against ``url``; returns (completed requests, seconds, output).
    Raises when any request failed (see :func:`~sluicegate.bench.loadgen.wrk` for a run
    whose failures are counted instead)."""
    out = wrk_output(url, script, connections, seconds, cpu)
    result = parse_wrk(out)
    if result.non_2xx:
        raise RuntimeError(f"{result.non_2xx} requests failed:\n{out}")
    return result.requests, result.seconds, out


async def http_speed(
    streams: int = 64, seconds: float = 10.0, tokens_per_request: int = 100
) -> HttpSpeed:
    """Token chunks per second one server, pinned to one core, streams to wrk."""
    options = ReplicaOptions(get_profile("tiny"), time_scale=1e-6)
    cluster = SimCluster(options, 1)
    await cluster.start()
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {0})  # the server gets core 0; wrk core 1
    body = {
        "model": "tiny-llama",
        "prompt": "speed test",
        "max_tokens": tokens_per_request,
        "ignore_eos": True,
        "stream": True,
    }
    loop = asyncio.get_running_loop()
    cpu0 = time.process_time()
    requests, wall, _ = await loop.run_in_executor(
        None,
        run_wrk,
        cluster.urls[0],
        wrk_post_script(body, "/v1/completions"),
        streams,
        seconds,
        1,
    )
    cpu = time.process_time() - cpu0
    await cluster.stop()
    return HttpSpeed(streams, requests, tokens_per_request, wall, cpu / wall)
