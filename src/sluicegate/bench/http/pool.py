"""The processes of one HTTP-mode run: the simulated pool and the router under test.

- :func:`start_sim` — the scenario's N replicas as one ``sluicegate sim`` process on
  consecutive free ports, returned once every replica answers ``/health``;
- :func:`start_sluicegate` — ``sluicegate serve`` over them, returned once ``/ready``
  counts every replica (the peer, ``vllm-router``, is started by
  :func:`sluicegate.bench.gateway.routers.start_vllm_router`);
- :func:`engine_counters` — what the engines themselves counted (prefix-cache queries and
  hits, preemptions, their own TTFT and TPOT), read from their ``/metrics`` at the end.

Every process is started by a :class:`ProcessGroups` in its own session, with a startup
deadline, and ended in the caller's ``finally``: SIGTERM to its whole process group,
SIGKILL after a grace period, so that nothing a process spawned outlives the run.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import orjson

from sluicegate.bench.gateway.settings import GATEWAY_CPU
from sluicegate.bench.http.plan import sim_profile_args
from sluicegate.bench.loadgen import read_histogram
from sluicegate.bench.processes import Processes, free_port_block, http_get, wait_ready
from sluicegate.bench.scenario_spec import Scenario

STARTUP_TIMEOUT_S = 30.0
"""Wall seconds each process gets to become ready."""


class ProcessGroups(Processes):
    """:class:`~sluicegate.bench.processes.Processes` whose :meth:`stop` ends the
    whole process group each one leads (every child started in its own session)."""

    def stop(self, name: str, timeout_s: float = 5.0) -> None:
        proc = self.procs.pop(name, None)
        if proc is None:
            return
        if proc.poll() is None:
            _signal_group(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                _signal_group(proc.pid, signal.SIGKILL)
                proc.wait(timeout_s)
        _signal_group(proc.pid, signal.SIGKILL)  # anything the leader left behind


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def _sluicegate(*args: str) -> list[str]:
    return [sys.executable, "-m", "sluicegate", "--log-level", "warning", *args]


def start_sim(
    procs: Processes, scenario: Scenario, time_scale: float, seed: int
) -> tuple[list[str], dict[int, int]]:
    """The scenario's pool as one ``sluicegate sim`` process; returns the replicas' URLs
    and replica index by port, once every replica answers ``/health``."""
    n = scenario.replicas
    base = free_port_block(n)
    cmd = _sluicegate(
        "sim",
        "--replicas",
        str(n),
        "--port",
        str(base),
        *sim_profile_args(scenario.profile),
        "--served-model-name",
        scenario.model,
        "--time-scale",
        repr(time_scale),
        "--seed",
        str(seed),
        *itertools.chain.from_iterable(("--lora", a) for a in scenario.adapters),
    )
    procs.start("sim", cmd)
    urls = [f"http://127.0.0.1:{base + i}" for i in range(n)]
    for url in urls:
        wait_ready(procs, "sim", f"{url}/health", STARTUP_TIMEOUT_S)
    return urls, {base + i: i for i in range(n)}


def start_sluicegate(procs: Processes, config: Path, policy: str, seed: int, replicas: int) -> str:
    """``sluicegate serve`` on core ``GATEWAY_CPU`` (where ``start_vllm_router`` puts the
    peer); its base URL once ``/ready`` counts every replica. The simulator and the load
    generator are not pinned: on a shared machine a pinned simulator cannot dodge other
    load, which distorted its timing more than sharing cores with the router did."""
    port = free_port_block(1)
    cmd = _sluicegate("serve", "--config", str(config), "--policy", policy, "--port", str(port))
    procs.start("gateway", [*cmd, "--seed", str(seed)], GATEWAY_CPU)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while True:
        procs.check("gateway")
        status, body = http_get(f"{url}/ready", 1.0)
        if status == 200 and orjson.loads(body).get("ready_endpoints", 0) >= replicas:
            return url
        if time.monotonic() > deadline:
            raise RuntimeError(
                f"gateway not ready with {replicas} endpoints after {STARTUP_TIMEOUT_S:.0f} "
                f"s:\n{procs.log('gateway')}"
            )
        time.sleep(0.05)


@dataclass(slots=True)
class EngineCounters:
    """Totals over the pool's engines, read from their ``/metrics`` at the end of a run."""

    prefix_queries: int = 0
    """Prompt tokens looked up in the prefix cache."""
    prefix_hits: int = 0
    """Prompt tokens found there."""
    preemptions: int = 0
    ttft_sum_s: float = 0.0
    """Sum of the engines' own time-to-first-token observations, simulated seconds."""
    ttft_count: int = 0
    tpot_sum_s: float = 0.0
    """Sum of the engines' own per-request time per output token, simulated seconds."""
    tpot_count: int = 0

    def engine_view(self) -> dict[str, float | None]:
        """Mean TTFT and TPOT on the engines' own clocks (simulated s): what the client
        measures, less transport and the router."""
        return {
            "ttft_mean_s": self.ttft_sum_s / self.ttft_count if self.ttft_count else None,
            "tpot_mean_s": self.tpot_sum_s / self.tpot_count if self.tpot_count else None,
        }


_COUNTER = re.compile(
    rb"^vllm:(prefix_cache_queries_total|prefix_cache_hits_total|num_preemptions_total)"
    rb"(?:\{[^}]*\})? (\S+)$",
    re.MULTILINE,
)
_TTFT = "vllm:time_to_first_token_seconds"
_TPOT = "vllm:request_time_per_output_token_seconds"


def engine_counters(urls: Sequence[str]) -> EngineCounters:
    """Prefix-cache, preemption and latency totals over the replicas at ``urls`` (their
    ``/metrics``); a replica that does not answer counts zero."""
    out = EngineCounters()
    for url in urls:
        status, body = http_get(f"{url}/metrics", 5.0)
        if status != 200:
            continue
        for name, value in _COUNTER.findall(body):
            match name:
                case b"prefix_cache_queries_total":
                    out.prefix_queries += int(float(value))
                case b"prefix_cache_hits_total":
                    out.prefix_hits += int(float(value))
                case _:
                    out.preemptions += int(float(value))
        text = body.decode()
        ttft, tpot = read_histogram(text, _TTFT), read_histogram(text, _TPOT)
        out.ttft_sum_s += ttft.total
        out.ttft_count += int(ttft.count)
        out.tpot_sum_s += tpot.total
        out.tpot_count += int(tpot.count)
    return out
