"""``sluicegate serve``: the standalone gateway (by default in front of an embedded
simulated pool)."""

from __future__ import annotations

import argparse

from sluicegate.cli.common import (
    Subparsers,
    add_picker_flags,
    check_latency_flags,
    checked_config,
    console,
    fail,
    run,
    runtime_options,
)


def add_parser(sub: Subparsers) -> None:
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
    serve.add_argument("--access-log", action="store_true", help="log one JSON line per request")
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
    serve.add_argument(
        "--sim-base-port",
        type=int,
        default=0,
        metavar="N",
        help="embedded pool's ports: replica i listens on N+i (default 0: any free ports)",
    )
    serve.add_argument(
        "--drain-delay",
        type=float,
        default=2.0,
        metavar="S",
        help="on SIGTERM: seconds to keep serving with /ready failing, so load balancers "
        "move away before the listener closes (default 2)",
    )
    serve.add_argument(
        "--shutdown-grace",
        type=float,
        default=30.0,
        metavar="S",
        help="on SIGTERM, after the drain delay: seconds requests in progress (streams "
        "included) may take to finish before they are cut off (default 30)",
    )
    add_picker_flags(serve, kubernetes=False)
    serve.set_defaults(func=_cmd_serve)


def _cmd_serve(args: argparse.Namespace) -> int:
    import os
    from pathlib import Path

    from sluicegate.api.keys import KeySourceError, collect_keys

    try:  # first: a bad key is refused before the (slower) imports below
        api_keys = collect_keys(args.api_key, args.api_key_file, os.environ)
    except KeySourceError as exc:
        return fail(str(exc))

    from sluicegate.api.loader import ConfigError
    from sluicegate.framework import PluginConfigError
    from sluicegate.gateway.app import GatewayOptions
    from sluicegate.gateway.run import ServeOptions, SimPortsError, serve
    from sluicegate.latency.trace import TraceError

    if args.sim_time_scale <= 0:
        return fail("--sim-time-scale must be positive")
    if args.drain_delay < 0 or args.shutdown_grace < 0:
        return fail("--drain-delay and --shutdown-grace must not be negative")
    if problem := _sim_ports_problem(args):
        return fail(problem)
    if problem := check_latency_flags(args):
        return fail(problem)
    runtime = runtime_options(args)
    try:
        rules = checked_config(args, pools_from_file=True)
    except (ConfigError, PluginConfigError, OSError) as exc:
        return fail(str(exc))
    options = ServeOptions(
        host=args.host,
        port=args.port,
        config_path=Path(args.config) if args.config else None,
        picker=rules.picker,
        sim_replicas=args.sim_replicas,
        sim_profile=args.sim_profile,
        sim_time_scale=args.sim_time_scale,
        sim_base_port=args.sim_base_port,
        allow_empty_config=rules.allow_empty,
        gateway=GatewayOptions(
            runtime,
            access_log=args.access_log,
            api_keys=api_keys,
            shutdown_grace_s=args.shutdown_grace,
            drain_delay_s=args.drain_delay,
        ),
    )
    try:
        run(serve(options, console))
    except TraceError as exc:  # --latency-trace, read when the gateway starts
        return fail(str(exc))
    except SimPortsError as exc:
        return fail(str(exc), status=1)
    except OSError as exc:
        return fail(f"cannot serve on {args.host}:{args.port}: {exc}", status=1)
    return 0


def _sim_ports_problem(args: argparse.Namespace) -> str | None:
    """Why ``--sim-base-port`` (with ``--sim-replicas``) cannot work, or None."""
    base, replicas = args.sim_base_port, args.sim_replicas
    if base == 0:
        return None
    if args.config is not None:
        return "--sim-base-port is for the embedded pool: it cannot be used with --config"
    if base < 1 or base + replicas - 1 > 65535:
        return (
            f"--sim-base-port {base} with {replicas} replicas needs ports {base}-"
            f"{base + replicas - 1}: they must lie within 1-65535"
        )
    if base <= args.port < base + replicas:
        return (
            f"--port {args.port} is one of the embedded pool's ports {base}-"
            f"{base + replicas - 1} (--sim-base-port)"
        )
    return None
