"""How long one scheduling decision takes: parse → resolve → schedule → pre-request hooks.

Builds a pool of ``endpoints`` endpoints with varied load, a director with the chosen
scheduling preset, and requests whose prompts share long prefixes (so the prefix index is
walked, as in production), then times ``parse_request`` + ``Director.route`` + the request's
release, one request at a time, with ``time.perf_counter_ns``. Wall-clock costs in µs.
"""

from __future__ import annotations

import random
import statistics
import time
from dataclasses import dataclass

import orjson

from sluicegate.api.loader import build_config
from sluicegate.builtins import default_registry
from sluicegate.clock import MonotonicClock
from sluicegate.datalayer.datastore import Datastore, EndpointSpec
from sluicegate.datalayer.endpoint import EngineMetrics, ServedModels
from sluicegate.framework import PluginContext
from sluicegate.requestcontrol.director import Director
from sluicegate.requestcontrol.models import ModelTable
from sluicegate.requestcontrol.parse import parse_request
from sluicegate.scheduling.config import build_scheduler, load_preset

MODEL = "bench-model"


@dataclass(frozen=True, slots=True)
class CostResult:
    endpoints: int
    prompt_bytes: int
    preset: str
    iterations: int
    p50_us: float
    p90_us: float
    p99_us: float
    mean_us: float


def _director(endpoints: int, preset: str, seed: int) -> Director:
    clock = MonotonicClock()
    config = build_config(
        [
            {
                "apiVersion": "inference.networking.k8s.io/v1",
                "kind": "InferencePool",
                "metadata": {"name": "bench"},
                "spec": {
                    "targetPorts": [{"number": 8000}],
                    "endpoints": [
                        {"address": f"10.0.{i // 250}.{i % 250 + 1}:8000"} for i in range(endpoints)
                    ],
                },
            }
        ]
    )
    datastore = Datastore()
    datastore.set_endpoints(
        "bench",
        [EndpointSpec(f"ep-{i}", f"10.0.{i // 250}.{i % 250 + 1}", 8000) for i in range(endpoints)],
    )
    rng = random.Random(seed)
    now = clock.now()
    for e in datastore.all_endpoints():
        e.metrics = EngineMetrics(
            scraped_at=now + 3600,
            waiting=rng.randint(0, 8),
            running=rng.randint(0, 64),
            kv_usage=rng.random() * 0.9,
            block_size=16,
            num_gpu_blocks=27_118,
        )
        e.models = ServedModels(frozenset({MODEL}), frozenset(), now)
    built = build_scheduler(load_preset(preset), PluginContext(clock, seed), default_registry())
    return Director(datastore, built, ModelTable(config), clock, staleness_s=7200.0)


def _bodies(prompt_bytes: int, count: int, groups: int, seed: int) -> list[bytes]:
    """Completions bodies: ``groups`` shared prefixes (3/4 of the prompt) + unique tails."""
    rng = random.Random(seed)
    alphabet = "abcdefghijklmnopqrstuvwxyz      "
    prefix_len = prompt_bytes * 3 // 4
    prefixes = ["".join(rng.choices(alphabet, k=prefix_len)) for _ in range(groups)]
    bodies = []
    for i in range(count):
        tail = "".join(rng.choices(alphabet, k=prompt_bytes - prefix_len))
        prompt = prefixes[i % groups] + tail
        bodies.append(
            orjson.dumps({"model": MODEL, "prompt": prompt, "max_tokens": 128, "temperature": "0"})
        )
    return bodies


def measure(
    endpoints: int,
    prompt_bytes: int,
    preset: str = "default",
    iterations: int = 2000,
    seed: int = 0,
) -> CostResult:
    """Time ``iterations`` scheduling decisions (after a warm-up of the same size)."""
    director = _director(endpoints, preset, seed)
    bodies = _bodies(prompt_bytes, 256, groups=16, seed=seed)
    headers: dict[str, str] = {}
    for i in range(min(iterations, 512)):  # warm the prefix index and the interpreter
        director.route(
            parse_request("completions", bodies[i % len(bodies)], headers), str(i)
        ).finish(0.0)
    samples = []
    clock = time.perf_counter_ns
    for i in range(iterations):
        body = bodies[i % len(bodies)]
        t0 = clock()
        dispatch = director.route(parse_request("completions", body, headers), str(i))
        t1 = clock()
        dispatch.finish(0.0)
        samples.append((t1 - t0) / 1000.0)
    samples.sort()
    return CostResult(
        endpoints,
        prompt_bytes,
        preset,
        iterations,
        p50_us=samples[len(samples) // 2],
        p90_us=samples[int(len(samples) * 0.9)],
        p99_us=samples[int(len(samples) * 0.99)],
        mean_us=statistics.fmean(samples),
    )
