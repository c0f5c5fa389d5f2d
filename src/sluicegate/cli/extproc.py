"""``sluicegate extproc``: the Envoy ext_proc endpoint picker."""

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
    extproc.add_argument(
        "--drain-delay",
        type=float,
        default=0.0,
        metavar="S",
        help="on SIGTERM, seconds readiness reports NOT_SERVING while new streams are still "
        "served, before they are refused (default 0; under Kubernetes a few seconds, so the "
        "Service and Envoy's health checks drop the pod first)",
    )
    add_picker_flags(extproc, kubernetes=True)
    extproc.set_defaults(func=_cmd_extproc)


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
            return fail("--namespace, --pool-name and --kubeconfig need --kubernetes")
        if not args.config:
            return fail("--config is required (the pools to route to), unless --kubernetes")
    ports = (args.grpc_port, args.grpc_health_port, args.metrics_port)
    if any(not 0 <= p <= 65535 for p in ports):
        return fail("ports must be between 0 and 65535")
    if len({p for p in ports if p}) < len([p for p in ports if p]):
        return fail("--grpc-port, --grpc-health-port and --metrics-port must differ")
    if args.fallback_endpoints < 0:
        return fail("--fallback-endpoints must be 0 or more")
    if args.grace_period < 0:
        return fail("--grace-period must be 0 or more")
    if args.drain_delay < 0:
        return fail("--drain-delay must be 0 or more")
    if problem := check_latency_flags(args):
        return fail(problem)
    try:
        rules = checked_config(args, pools_from_file=not args.kubernetes)
    except (ConfigError, PluginConfigError, OSError) as exc:
        return fail(str(exc))
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
            drain_delay_s=args.drain_delay,
        ),
        runtime=runtime_options(args),
        kubernetes=args.kubernetes,
        namespace=args.namespace,
        pool_name=args.pool_name,
        kubeconfig=args.kubeconfig,
        allow_empty_config=rules.allow_empty,
    )
    try:
        run(run_extproc(options, console))
    except TraceError as exc:  # --latency-trace, read when the picker starts
        return fail(str(exc))
    except OSError as exc:  # a port in use, an address not ours, no kubeconfig...
        return fail(f"cannot start the endpoint picker: {exc}", status=1)
    return 0
