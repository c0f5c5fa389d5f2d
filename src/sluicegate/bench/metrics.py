"""Turning per-request records into the numbers reports show.

Every latency is in seconds and summarised as ``{"mean", "p50", "p90", "p99"}`` over the
requests that completed (percentiles interpolate linearly, as numpy does). Throughput is
measured over the *arrival window*, from the first arrival to the last (the drain after it
is left out): requests/s counts the completions within the window, output tokens/s the
output tokens emitted within it (a request's first token at its first-token time, the
others spread evenly up to its finish). A window of no length (a single arrival) is
widened to the last completion. A request counts
as meeting its SLO when it completed with TTFT ≤ ``x-slo-ttft-ms`` and TPOT ≤
``x-slo-tpot-ms``; shed or failed requests carrying SLOs count as misses. **Goodput** is
the requests/s that completed within the window *and* met their SLOs (a request without
SLOs counts when it completed).

**Cost** (:func:`cost_summary`, pools whose endpoints have a price): USD per 1M output
tokens, two ways. *Busy*: each endpoint's cost per hour × the time its engine spent in
iterations, over every output token of the run — what the work cost when idle servers can
be released or lent out (scaled down); routing that packs work onto cheap or fast servers
shows here. *Fleet*: every endpoint's cost per hour × the arrival window, over the tokens
emitted within it — what a fixed fleet costs per token at that load.

TPOT is the decode time per token after the first, ``(finish − first token) / (output −
1)``; NTPOT, the *normalized* time per output token, is ``E2E / output tokens`` (queueing
and prefill included) — what the Latency Profile Generator reports as
``per_output_token_latency`` and Gateway API Inference Extension's benchmark notebook plots
(``tools/benchmark/benchmark.ipynb`` at tag v0.3.0,
https://github.com/kubernetes-sigs/gateway-api-inference-extension/blob/v0.3.0/tools/benchmark/benchmark.ipynb).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from sluicegate.tokens import BYTES_PER_TOKEN, block_hashes


class Record(Protocol):
    """What a runner records per request (see ``bench.des_spec.RequestRecord``)."""

    @property
    def spec(self) -> Any: ...

    arrival: float
    first_token: float
    finish: float
    output_tokens: int
    prompt_tokens: int
    cached_tokens: int
    status: int
    endpoint: int

    @property
    def completed(self) -> bool: ...


def latency_summary(values: Sequence[float]) -> dict[str, float | None]:
    """Mean and p50/p90/p99 of ``values`` (seconds); None when there are none."""
    if not values:
        return {"mean": None, "p50": None, "p90": None, "p99": None}
    arr = np.asarray(values, dtype=float)
    p50, p90, p99 = np.percentile(arr, [50, 90, 99])
    return {"mean": float(arr.mean()), "p50": float(p50), "p90": float(p90), "p99": float(p99)}


def _tpot(r: Record) -> float | None:
    if r.output_tokens < 2:
        return None
    return (r.finish - r.first_token) / (r.output_tokens - 1)


def _meets_slo(r: Record) -> bool:
    spec = r.spec
    if not r.completed:
        return False
    if spec.slo_ttft_ms is not None and (r.first_token - r.arrival) * 1000 > spec.slo_ttft_ms:
        return False
    tpot = _tpot(r)
    return not (
        spec.slo_tpot_ms is not None and tpot is not None and tpot * 1000 > spec.slo_tpot_ms
    )


def arrival_window(records: Sequence[Record]) -> tuple[float, float]:
    """``(start, end)`` in seconds: the first and last arrival of ``records``; when they
    coincide, ``end`` is the last completion (if any). ``(0, 0)`` for no records."""
    if not records:
        return 0.0, 0.0
    start = min(r.arrival for r in records)
    end = max(r.arrival for r in records)
    if end <= start:
        end = max((r.finish for r in records if r.completed), default=start)
    return start, end


def tokens_within(r: Record, start: float, end: float) -> float:
    """Output tokens of completed ``r`` emitted within ``[start, end]`` (seconds): the first
    at ``first_token``, the other ``output_tokens - 1`` spread evenly over
    ``[first_token, finish]`` (a fraction where the window cuts that interval)."""
    if r.output_tokens <= 0:
        return 0.0
    inside = start <= r.first_token <= end
    tokens = 1.0 if inside else 0.0
    rest = r.output_tokens - 1
    decode = r.finish - r.first_token
    if rest and decode > 0:
        overlap = max(0.0, min(end, r.finish) - max(start, r.first_token))
        tokens += rest * overlap / decode
    elif rest and inside:  # all at once (a zero-length decode)
        tokens += rest
    return tokens


def summarize(records: Sequence[Record]) -> dict[str, Any]:
    """The metrics block of one run (or one class of it)."""
    done = [r for r in records if r.completed]
    shed = sum(1 for r in records if r.status == 429)
    incomplete = sum(1 for r in records if r.status == 0)
    failed = len(records) - len(done) - shed - incomplete
    start, end = arrival_window(records)
    window = end - start
    finished_within = sum(1 for r in done if start <= r.finish <= end)
    tokens = sum(tokens_within(r, start, end) for r in done)
    with_slo = [
        r for r in records if r.spec.slo_ttft_ms is not None or r.spec.slo_tpot_ms is not None
    ]
    prompt = sum(r.prompt_tokens for r in done)
    cached = sum(r.cached_tokens for r in done)
    good = sum(1 for r in done if start <= r.finish <= end and _meets_slo(r))
    return {
        "requests": len(records),
        "completed": len(done),
        "failed": failed,
        "shed": shed,
        "incomplete": incomplete,
        "window_s": window,
        "throughput_rps": finished_within / window if window > 0 else 0.0,
        "output_tokens_per_s": tokens / window if window > 0 else 0.0,
        "goodput_rps": good / window if window > 0 else 0.0,
        "ttft_s": latency_summary([r.first_token - r.arrival for r in done]),
        "tpot_s": latency_summary([t for r in done if (t := _tpot(r)) is not None]),
        "e2e_s": latency_summary([r.finish - r.arrival for r in done]),
        "ntpot_s": latency_summary(
            [(r.finish - r.arrival) / r.output_tokens for r in done if r.output_tokens > 0]
        ),
        "slo_attainment": (
            sum(1 for r in with_slo if _meets_slo(r)) / len(with_slo) if with_slo else None
        ),
        "prefix_hit_rate": cached / prompt if prompt else 0.0,
    }


def by_class(records: Sequence[Record]) -> dict[str, dict[str, Any]]:
    classes: dict[str, list[Record]] = {}
    for r in records:
        classes.setdefault(r.spec.klass, []).append(r)
    if len(classes) < 2:
        return {}
    return {name: summarize(rs) for name, rs in sorted(classes.items())}


def cost_summary(
    records: Sequence[Record], costs: Sequence[float], busy_s: Sequence[float], span_s: float
) -> dict[str, float | None]:
    """Busy and fleet cost per 1M output tokens (see the module docstring) of endpoints
    costing ``costs`` USD/hour whose engines were busy ``busy_s`` seconds of the run's
    ``span_s`` (s from its start to its end: the last completion, or the horizon when the
    run was cut); the records are the requests they served. None where no token was
    produced. ``busy_fraction`` is the busy time over ``span_s`` per engine (measured over
    the last completion instead, it passed 100 % when a cut run's engines kept working on
    requests that never completed)."""
    done = [r for r in records if r.completed]
    total_tokens = sum(r.output_tokens for r in done)
    start, end = arrival_window(records)
    window_tokens = sum(tokens_within(r, start, end) for r in done)
    busy_cost = sum(c * b for c, b in zip(costs, busy_s, strict=True)) / 3600.0
    fleet_cost = sum(costs) * (end - start) / 3600.0
    return {
        "cost_per_1m_output_tokens": busy_cost / total_tokens * 1e6 if total_tokens else None,
        "fleet_cost_per_1m_output_tokens": (
            fleet_cost / window_tokens * 1e6 if window_tokens else None
        ),
        "busy_fraction": sum(busy_s) / (len(busy_s) * span_s) if busy_s and span_s > 0 else None,
    }


def by_accelerator(
    records: Sequence[Record],
    accelerators: Sequence[str],
    costs: Sequence[float | None],
    busy_s: Sequence[float],
    span_s: float,
) -> dict[str, dict[str, Any]]:
    """Per hardware class (``accelerators[i]`` is endpoint *i*'s): the metrics of the
    requests its endpoints served (:func:`summarize`), with its cost when every endpoint
    of it has one and ``busy_s`` is given (``span_s`` as for :func:`cost_summary`).
    Requests no endpoint took (refused) are in no class. Empty for a pool of one class."""
    if len(set(accelerators)) < 2:
        return {}
    out: dict[str, dict[str, Any]] = {}
    for cls in sorted(set(accelerators)):
        members = [i for i, a in enumerate(accelerators) if a == cls]
        served = [r for r in records if r.endpoint in members]
        block = summarize(served)
        block["endpoints"] = len(members)
        prices = [c for i in members if i < len(costs) and (c := costs[i]) is not None]
        if busy_s and len(prices) == len(members):
            block.update(cost_summary(served, prices, [busy_s[i] for i in members], span_s))
        out[cls] = block
    return out


@dataclass(slots=True)
class ReplicaLoad:
    """Work one replica did: requests, prompt tokens computed (not cached), tokens
    generated; ``work`` is their sum, in tokens."""

    requests: int = 0
    prefill_tokens: int = 0
    output_tokens: int = 0

    @property
    def work(self) -> int:
        return self.prefill_tokens + self.output_tokens


def replica_loads(records: Iterable[Record], replicas: int) -> list[ReplicaLoad]:
    loads = [ReplicaLoad() for _ in range(replicas)]
    for r in records:
        if 0 <= r.endpoint < replicas and r.completed:
            load = loads[r.endpoint]
            load.requests += 1
            load.prefill_tokens += r.prompt_tokens - r.cached_tokens
            load.output_tokens += r.output_tokens
    return loads


def imbalance(loads: Sequence[ReplicaLoad]) -> float | None:
    """Busiest replica's work over the least busy one's (1.0 = perfectly even)."""
    works = [load.work for load in loads]
    if not works or min(works) <= 0:
        return None
    return max(works) / min(works)


def ideal_prefix_hit_rate(
    prompts: Iterable[tuple[bytes, bytes]], block_tokens: int = 16, seed: int = 0
) -> float:
    """Prefix-cache hit rate of one server with unlimited KV cache.

    ``prompts`` are (prompt bytes, generated bytes) in arrival order; every full block of a
    request's prompt and output is cached after it, and a request hits the longest cached
    run of its leading blocks (at least one token is always computed, as on vLLM).
    """
    cached: set[int] = set()
    hits = queried = 0
    for prompt, reply in prompts:
        tokens = -(-len(prompt) // BYTES_PER_TOKEN)
        limit = (tokens - 1) // block_tokens
        matched = 0
        for h in block_hashes(prompt, block_tokens, seed, max_blocks=limit):
            if h not in cached:
                break
            matched += 1
        hits += matched * block_tokens
        queried += tokens
        padded = prompt + b"\0" * (-len(prompt) % BYTES_PER_TOKEN)
        cached.update(block_hashes(padded + reply, block_tokens, seed))
    return hits / queried if queried else 0.0
