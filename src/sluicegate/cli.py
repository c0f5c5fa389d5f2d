"""The ``sluicegate`` command: serve, sim and friends."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import sys
from collections.abc import Callable, Coroutine, Sequence
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.text import Text

from sluicegate.latency.commands import add_latency_flags, check_latency_flags

if TYPE_CHECKING:
    from sluicegate.config_watch import ConfigRules
    from sluicegate.runtime import RuntimeOptions

console = Console(stderr=True)


def _fail(message: str, status: int = 2) -> int:
    """Print ``message`` as an error (verbatim: no markup, no wrapping: a one-line problem
    stays one line for scripts and log collectors) and return ``status``."""
    console.print(Text("error: ", style="bold red") + Text(message), soft_wrap=True)
    return status


def _run(main: Coroutine[Any, Any, None]) -> None:
    try:
        import uvloop

        runner: Callable[[Coroutine[Any, Any, None]], None] = uvloop.run
    except ImportError:  # pragma: no cover - uvloop is a dependency; fall back quietly
        runner = asyncio.run
    with contextlib.suppress(KeyboardInterrupt):
        runner(main)


def _cmd_sim(args: argparse.Namespace) -> int:
    from dataclasses import replace

    from sluicegate.sim.faults import parse_fault_spec
    from sluicegate.sim.profiles import get_profile
    from sluicegate.sim.run import fault_table, serve_pool
    from sluicegate.sim.server import ReplicaOptions

    try:
        profile = get_profile(args.profile)
        if args.max_loras is not None:
            profile = replace(profile, max_loras=args.max_loras)
        if args.num_gpu_blocks_override is not None:
            if args.num_gpu_blocks_override < 1:
                return _fail("--num-gpu-blocks-override must be at least 1")
            profile = replace(profile, num_gpu_blocks=args.num_gpu_blocks_override)
        faults = fault_table([parse_fault_spec(s) for s in args.fault], args.replicas)
    except (KeyError, ValueError) as exc:
        return _fail(str(exc.args[0]))
        return 2
    if args.time_scale <= 0:
        return _fail("--time-scale must be positive")
    if args.histogram_max_age < 0:
        return _fail("--histogram-max-age must not be negative")
    loras = dict(_split_lora(spec) for spec in args.lora)
    options = ReplicaOptions(
        profile=profile,
        served_model_name=args.served_model_name,
        time_scale=args.time_scale,
        lora_modules=loras,
        enable_lora=args.enable_lora or bool(loras),
        enable_prefix_caching=not args.no_prefix_caching,
        legacy_metric_names=args.legacy_metrics,
        seed=args.seed,
        histogram_max_age_s=args.histogram_max_age,
    )
    try:
        _run(serve_pool(options, args.replicas, args.host, args.port, faults, console))
    except OSError as exc:  # a port in use, an address not ours...
        return _fail(f"cannot serve on {args.host}:{args.port}: {exc}", status=1)
    return 0


def _cmd_serve(args: argparse.Namespace) -> int:
    import os
    from pathlib import Path

    from sluicegate.api.keys import KeySourceError, collect_keys

    try:  # first: a bad key is refused before the (slower) imports below
        api_keys = collect_keys(args.api_key, args.api_key_file, os.environ)
    except KeySourceError as exc:
        return _fail(str(exc))

    from sluicegate.api.loader import ConfigError
    from sluicegate.framework import PluginConfigError
    from sluicegate.gateway.app import GatewayOptions
    from sluicegate.gateway.run import ServeOptions, serve
    from sluicegate.latency.trace import TraceError

    if args.sim_time_scale <= 0:
        return _fail("--sim-time-scale must be positive")
    if problem := check_latency_flags(args):
        return _fail(problem)
    runtime = _runtime_options(args)
    try:
        rules = _checked_config(args, pools_from_file=True)
    except (ConfigError, PluginConfigError, OSError) as exc:
        return _fail(str(exc))
    options = ServeOptions(
        host=args.host,
        port=args.port,
        config_path=Path(args.config) if args.config else None,
        picker=rules.picker,
        sim_replicas=args.sim_replicas,
        sim_profile=args.sim_profile,
        sim_time_scale=args.sim_time_scale,
        allow_empty_config=rules.allow_empty,
        gateway=GatewayOptions(runtime, access_log=args.access_log, api_keys=api_keys),
    )
    try:
        _run(serve(options, console))
    except TraceError as exc:  # --latency-trace, read when the gateway starts
        return _fail(str(exc))
    except OSError as exc:
        return _fail(f"cannot serve on {args.host}:{args.port}: {exc}", status=1)
    return 0


def _cmd_extproc(args: argparse.Namespace) -> int:
    from pathlib import Path

    from sluicegate.api.loader import ConfigError
    from sluicegate.extproc.run import RunOptions, run_extproc
    from sluicegate.extproc.server import ExtProcOptions
    from sluicegate.extproc.stream import StreamSettings
    from sluicegate.framework import PluginConfigError
    from sluicegate.latency.trace import TraceError

    if not args.kubernetes:
        if args.namespace or args.pool_name or args.kubeconfig:
            return _fail("--namespace, --pool-name and --kubeconfig need --kubernetes")
        if not args.config:
            return _fail("--config is required (the pools to route to), unless --kubernetes")
    ports = (args.grpc_port, args.grpc_health_port, args.metrics_port)
    if any(not 0 <= p <= 65535 for p in ports):
        return _fail("ports must be between 0 and 65535")
    if len({p for p in ports if p}) < len([p for p in ports if p]):
        return _fail("--grpc-port, --grpc-health-port and --metrics-port must differ")
    if args.fallback_endpoints < 0:
        return _fail("--fallback-endpoints must be 0 or more")
    if args.grace_period < 0:
        return _fail("--grace-period must be 0 or more")
    if problem := check_latency_flags(args):
        return _fail(problem)
    try:
        rules = _checked_config(args, pools_from_file=not args.kubernetes)
    except (ConfigError, PluginConfigError, OSError) as exc:
        return _fail(str(exc))
    options = RunOptions(
        config_path=Path(args.config) if args.config else None,
        picker=rules.picker,
        server=ExtProcOptions(
            host=args.host,
            grpc_port=args.grpc_port,
            health_port=args.grpc_health_port,
            metrics_port=args.metrics_port,
            stream=StreamSettings(fallback_endpoints=args.fallback_endpoints),
            grace_period_s=args.grace_period,
        ),
        runtime=_runtime_options(args),
        kubernetes=args.kubernetes,
        namespace=args.namespace,
        pool_name=args.pool_name,
        kubeconfig=args.kubeconfig,
        allow_empty_config=rules.allow_empty,
    )
    try:
        _run(run_extproc(options, console))
    except TraceError as exc:  # --latency-trace, read when the picker starts
        return _fail(str(exc))
    except OSError as exc:  # a port in use, an address not ours, no kubeconfig...
        return _fail(f"cannot start the endpoint picker: {exc}", status=1)
    return 0


def _checked_config(args: argparse.Namespace, pools_from_file: bool) -> ConfigRules:
    """The rules ``--config`` is read by (``--policy``, ``--allow-empty-config``), after
    loading it as start-up and every reload will and building its scheduler and flow
    control: every problem, plugins included, is reported before anything listens.

    Raises ``ConfigError``, ``PluginConfigError`` or ``OSError``."""
    from pathlib import Path

    from sluicegate.config_watch import ConfigRules, read_config
    from sluicegate.runtime import Runtime
    from sluicegate.scheduling.config import load_preset

    picker = load_preset(args.policy) if args.policy else None
    rules = ConfigRules(picker, pools_from_file, allow_empty=args.allow_empty_config)
    if args.config:
        Runtime(read_config(Path(args.config), rules))
    return rules


def _runtime_options(args: argparse.Namespace) -> RuntimeOptions:
    """The picker's options from the flags ``serve`` and ``extproc`` share."""
    from sluicegate.runtime import RuntimeOptions

    return RuntimeOptions(
        seed=args.seed,
        latency_model_dir=args.latency_model_dir,
        latency_trace=args.latency_trace,
    )


def _cmd_bench_micro(args: argparse.Namespace) -> int:
    from pathlib import Path

    from sluicegate.bench.micro import REPORTS

    names = list(REPORTS) if args.name == "all" else [args.name]
    for name in names:
        text = REPORTS[name](args.quick, console)
        if args.out:
            out = Path(args.out)
            path = out / f"{name}.md" if out.is_dir() or len(names) > 1 else out
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
            console.print(f"wrote {path}")
        else:
            print(text)
    return 0


def _cmd_bench_list(args: argparse.Namespace) -> int:
    from sluicegate.bench.scenarios import SCENARIOS, available_policies

    for name, make in SCENARIOS.items():
        print(f"{name:<18} {make().description}")
    print(f"\npolicies available: {', '.join(available_policies())}")
    return 0


def _cmd_bench_run(args: argparse.Namespace) -> int:
    import shlex
    from pathlib import Path

    from rich.progress import Progress

    from sluicegate.bench.report import write
    from sluicegate.bench.runner import RunPlan, run_plan
    from sluicegate.bench.scenarios import available_policies, get_scenario

    try:
        scenario = get_scenario(args.scenario)
    except ValueError as exc:
        return _fail(str(exc))
    if args.quick:
        scenario = scenario.quick_variant()
    if args.time_scale is not None and args.mode != "http":
        return _fail("--time-scale applies to --mode http only")
    policies = tuple(
        p for p in (args.policies.split(",") if args.policies else scenario.policies) if p
    )
    if args.mode == "http":
        from sluicegate.bench.http.plan import check_time_scale, plan_policies, sim_profile_args
        from sluicegate.bench.http.run import HttpOptions, run_plan_http

        try:
            sim_profile_args(scenario.profile)
            if args.time_scale is not None:
                check_time_scale(args.time_scale)
            http_options = HttpOptions(args.time_scale)
        except ValueError as exc:  # UnsupportedScenarioError, a bad --time-scale
            return _fail(str(exc))
        runnable, notes = plan_policies(policies, scenario)
        for note in notes:
            console.print(note)
        policies = tuple(runnable)
    else:
        missing = [p for p in policies if p not in available_policies()]
        if missing:
            console.print(f"skipping policies not available in this build: {', '.join(missing)}")
            policies = tuple(p for p in policies if p not in missing)
    if not policies:
        return _fail("no policy to run")
    try:
        levels = tuple(float(x) for x in args.qps.split(",")) if args.qps else scenario.levels
    except ValueError:
        return _fail(f"--qps must be comma-separated numbers, got {args.qps!r}")
    duration = args.duration or scenario.duration_s
    flow = {"off": (False,), "on": (True,), "both": (False, True)}
    flow_control = flow[args.flow_control] if args.flow_control else scenario.flow_control
    plan = RunPlan(scenario, policies, levels, duration, args.seed, flow_control)
    with Progress(console=console, transient=True) as bar:
        task = bar.add_task(scenario.name, total=plan.count)

        def progress(label: str) -> None:
            bar.update(task, description=label)
            if bar.tasks[task].description != scenario.name:
                bar.advance(task, 0)

        done: list[str] = []

        def step(label: str) -> None:
            if done:
                bar.advance(task)
            done.append(label)
            progress(label)

        if args.mode == "http":
            try:
                results = run_plan_http(plan, http_options, step)
            except RuntimeError as exc:  # a process that would not start or died
                return _fail(str(exc), status=1)
        else:
            results = run_plan(plan, step)
        bar.advance(task)
    command = "sluicegate bench " + " ".join(shlex.quote(a) for a in args.argv)
    out = Path(args.out)
    for path in write(results, scenario, out, command):
        console.print(f"wrote {path}")
    return 0


def _split_lora(spec: str) -> tuple[str, str]:
    name, _, path = spec.partition("=")
    return name, path or f"/adapters/{name}"


def _add_allow_empty_flag(parser: argparse.ArgumentParser, kubernetes: bool) -> None:
    what = "any InferencePool"
    if kubernetes:  # the pools then come from the API server: only an empty file is refused
        what += " (with --kubernetes: without any document)"
    parser.add_argument(
        "--allow-empty-config",
        action="store_true",
        help=f"accept, at start and on reload, a --config without {what}; refused by "
        "default, since an empty or truncated file is likelier a partial write",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="sluicegate",
        description="An inference gateway for self-hosted LLM fleets.",
    )
    parser.add_argument(
        "--log-level", default="info", choices=["debug", "info", "warning", "error"]
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    serve = sub.add_parser(
        "serve",
        help="run the gateway (default: in front of an embedded simulated pool)",
        description="Run the OpenAI-compatible gateway. Without --config it starts a "
        "simulated pool in-process and fronts it.",
    )
    serve.add_argument(
        "--config",
        default=None,
        metavar="FILE",
        help="YAML with InferencePool/InferenceModel/... documents",
    )
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8080)
    serve.add_argument(
        "--policy",
        default=None,
        metavar="PRESET",
        help="scheduling preset (default, round-robin, random, least-request, "
        "...); overrides the config's EndpointPickerConfig",
    )
    serve.add_argument(
        "--api-key",
        action="append",
        default=[],
        metavar="KEY",
        help="accepted bearer token (repeatable); visible to every user in `ps`: prefer "
        "--api-key-file or $SLUICEGATE_API_KEYS",
    )
    serve.add_argument(
        "--api-key-file",
        action="append",
        default=[],
        metavar="FILE",
        help="file of accepted bearer tokens, one per line; blank lines and # comments "
        "skipped (repeatable). $SLUICEGATE_API_KEYS (comma- or newline-separated) is "
        "read too. Keys: 16+ characters of A-Z a-z 0-9 -._~+/ and trailing =",
    )
    _add_allow_empty_flag(serve, kubernetes=False)
    serve.add_argument("--access-log", action="store_true", help="log one JSON line per request")
    serve.add_argument("--seed", type=int, default=0, help="seed of the scheduler's RNG")
    serve.add_argument(
        "--sim-replicas",
        type=int,
        default=4,
        help="embedded pool size when no --config (default 4)",
    )
    serve.add_argument(
        "--sim-profile",
        default="llama3-8b-h100",
        help="embedded pool's engine profile (default llama3-8b-h100)",
    )
    serve.add_argument(
        "--sim-time-scale",
        type=float,
        default=1.0,
        help="embedded pool's wall seconds per simulated second",
    )
    add_latency_flags(serve)
    serve.set_defaults(func=_cmd_serve)

    extproc = sub.add_parser(
        "extproc",
        help="run the Envoy ext_proc endpoint picker",
        description="Serve the Gateway API Inference Extension endpoint-picker protocol "
        "over Envoy's ext_proc gRPC API: Envoy asks for every request where to send it. "
        "Pools come from --config (static endpoints, reloaded on change or SIGHUP) or, with "
        "--kubernetes, from the API server. See docs/extproc.md.",
    )
    extproc.add_argument(
        "--config",
        default=None,
        metavar="FILE",
        help="YAML with InferencePool/InferenceModel/... documents; with --kubernetes only "
        "its EndpointPickerConfig and GatewayConfig are used",
    )
    extproc.add_argument(
        "--policy",
        default=None,
        metavar="PRESET",
        help="scheduling preset; overrides the config's EndpointPickerConfig",
    )
    extproc.add_argument(
        "--host", default="0.0.0.0", help="address to listen on (default 0.0.0.0: all)"
    )
    extproc.add_argument("--grpc-port", type=int, default=9002, help="ext_proc (default 9002)")
    extproc.add_argument(
        "--grpc-health-port", type=int, default=9003, help="gRPC health (default 9003)"
    )
    extproc.add_argument(
        "--metrics-port", type=int, default=9090, help="Prometheus /metrics (default 9090)"
    )
    extproc.add_argument(
        "--kubernetes",
        action="store_true",
        help="read pools, models, objectives and pods from the Kubernetes API server",
    )
    extproc.add_argument(
        "--namespace", default=None, help="namespace to watch (default: the pod's own)"
    )
    extproc.add_argument(
        "--pool-name", default=None, help="serve this InferencePool only (default: all)"
    )
    extproc.add_argument(
        "--kubeconfig", default=None, metavar="FILE", help="outside a pod: the kubeconfig"
    )
    extproc.add_argument(
        "--fallback-endpoints",
        type=int,
        default=0,
        metavar="N",
        help="fallback endpoints listed after the chosen one in the destination "
        "(default 0: Envoy's ORIGINAL_DST cluster takes a single ip:port)",
    )
    extproc.add_argument(
        "--grace-period",
        type=float,
        default=120.0,
        metavar="S",
        help="seconds streams in flight may take to finish on SIGTERM (default 120)",
    )
    extproc.add_argument("--seed", type=int, default=0, help="seed of the scheduler's RNG")
    _add_allow_empty_flag(extproc, kubernetes=True)
    add_latency_flags(extproc)
    extproc.set_defaults(func=_cmd_extproc)

    bench = sub.add_parser("bench", help="benchmarks", description="The benchmark lab.")
    bench_sub = bench.add_subparsers(dest="bench_command", metavar="COMMAND", required=True)
    micro = bench_sub.add_parser("micro", help="micro-benchmarks (scheduling cost, simulator)")
    micro.add_argument(
        "name",
        choices=["all", "scheduling", "sim", "gateway", "latency", "extproc", "latency-accuracy"],
    )
    micro.add_argument("--quick", action="store_true", help="a short run (for smoke tests)")
    micro.add_argument("--out", default=None, help="file (or folder for 'all') to write")
    micro.set_defaults(func=_cmd_bench_micro)
    listing = bench_sub.add_parser("list", help="the scenarios, one line each")
    listing.set_defaults(func=_cmd_bench_list)
    run = bench_sub.add_parser("run", help="run a scenario and write results, report, plots")
    run.add_argument("scenario")
    run.add_argument(
        "--mode",
        choices=["des", "http"],
        default="des",
        help="des: discrete-event simulation (default); http: real processes",
    )
    run.add_argument("--policies", default=None, help="comma-separated policy names")
    run.add_argument(
        "--qps", default=None, help="comma-separated load levels (req/s, sessions/s or streams)"
    )
    run.add_argument("--duration", type=float, default=None, help="seconds of arrivals")
    run.add_argument("--seed", type=int, default=0)
    run.add_argument("--quick", action="store_true", help="a reduced run (under a minute)")
    run.add_argument(
        "--flow-control",
        choices=["off", "on", "both"],
        default=None,
        help="queue requests in the gateway while saturated (default: per scenario)",
    )
    run.add_argument(
        "--time-scale",
        type=float,
        default=None,
        metavar="S",
        help="--mode http: wall seconds per simulated second (default: picked from the "
        "plan's token rate, at least 1)",
    )
    run.add_argument("--out", required=True, help="output folder")
    run.set_defaults(func=_cmd_bench_run)

    sim = sub.add_parser(
        "sim",
        help="run simulated vLLM-compatible model servers",
        description="Run N simulated vLLM servers on consecutive ports.",
    )
    sim.add_argument("--replicas", type=int, default=1, help="number of servers (default 1)")
    sim.add_argument("--host", default="127.0.0.1")
    sim.add_argument(
        "--port",
        type=int,
        default=8000,
        help="first port; replica i listens on port+i (default 8000)",
    )
    sim.add_argument(
        "--profile",
        default="llama3-8b-h100",
        help="engine profile (default llama3-8b-h100); see docs/simulator.md",
    )
    sim.add_argument(
        "--time-scale",
        type=float,
        default=1.0,
        help="wall seconds per simulated second (default 1.0 = real time)",
    )
    sim.add_argument(
        "--served-model-name",
        default=None,
        help="model name clients use (default: the profile's model)",
    )
    sim.add_argument(
        "--lora",
        action="append",
        default=[],
        metavar="NAME[=PATH]",
        help="a LoRA adapter loaded at start (repeatable)",
    )
    sim.add_argument(
        "--enable-lora", action="store_true", help="accept LoRA adapters loaded at run time"
    )
    sim.add_argument(
        "--max-loras",
        type=int,
        default=None,
        help="distinct adapters per batch (default: the profile's)",
    )
    sim.add_argument(
        "--num-gpu-blocks-override",
        type=int,
        default=None,
        metavar="N",
        help="KV-cache blocks per replica instead of the profile's (as vLLM's option)",
    )
    sim.add_argument("--no-prefix-caching", action="store_true")
    sim.add_argument(
        "--legacy-metrics", action="store_true", help="also export vllm:gpu_cache_usage_perc"
    )
    sim.add_argument(
        "--fault",
        action="append",
        default=[],
        metavar="[REPLICA:]KEY=VALUE,...",
        help="inject faults, e.g. 1:error_rate=0.5,error_status=503 (repeatable)",
    )
    sim.add_argument("--seed", type=int, default=0)
    sim.add_argument(
        "--histogram-max-age",
        type=float,
        default=1.0,
        metavar="S",
        help="wall seconds /metrics may reuse its histograms' text (default 1; 0 renders "
        "them on every scrape; gauges and counters are always live)",
    )
    sim.set_defaults(func=_cmd_sim)

    from sluicegate.latency.commands import add_predictor_parser

    add_predictor_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> None:
    parser = build_parser()
    raw = list(sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(raw)
    args.argv = raw[raw.index("bench") + 1 :] if "bench" in raw else raw
    logging.getLogger("matplotlib").setLevel(logging.WARNING)
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    if not getattr(args, "func", None):
        parser.print_help()
        sys.exit(2)
    sys.exit(args.func(args))
