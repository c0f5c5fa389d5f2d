"""``sluicegate sim``: simulated vLLM-compatible model servers."""

from __future__ import annotations

import argparse

from sluicegate.cli import sim_calibrate as calibrate
from sluicegate.cli.common import Subparsers, console, fail, run


def add_parser(sub: Subparsers) -> None:
    sim = sub.add_parser(
        "sim",
        help="run simulated vLLM-compatible model servers",
        description="Run N simulated vLLM servers on consecutive ports.",
    )
    sim.add_argument(
        "--replicas",
        type=int,
        default=None,
        help="number of servers (default 1, or the sum of --profile's counts)",
    )
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
        help="engine profile (default llama3-8b-h100), or a mixed pool as PROFILE:COUNT "
        "entries, e.g. llama3-8b-h100:2,llama3-8b-a100:4; see docs/simulator.md",
    )
    sim.add_argument(
        "--profile-file",
        default=None,
        metavar="FILE",
        help="engine profile from a YAML file (e.g. written by `sluicegate sim calibrate`); "
        "replaces --profile",
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
    sim.add_argument(
        "--kv-events-config",
        default=None,
        metavar="JSON",
        help='publish KV-cache events as vLLM does, e.g. \'{"enable_kv_cache_events": true, '
        '"endpoint": "tcp://*:5557", "replay_endpoint": "tcp://*:5558"}\'; replica i '
        "binds each port + i (see docs/simulator.md)",
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
    sim_sub = sim.add_subparsers(dest="sim_command", metavar="COMMAND")
    calibrate.add_parser(sim_sub)


def _cmd_sim(args: argparse.Namespace) -> int:
    from dataclasses import replace

    from sluicegate.sim.faults import parse_fault_spec
    from sluicegate.sim.kvevents import KVEventsConfig
    from sluicegate.sim.profile_file import load_profile_file
    from sluicegate.sim.profiles import EngineProfile, profile_mix
    from sluicegate.sim.run import fault_table, serve_pool
    from sluicegate.sim.server import ReplicaOptions

    try:
        mix = (
            [(load_profile_file(args.profile_file), None)]
            if args.profile_file is not None
            else profile_mix(args.profile)
        )
        if args.num_gpu_blocks_override is not None and args.num_gpu_blocks_override < 1:
            return fail("--num-gpu-blocks-override must be at least 1")
        counted = len(mix) > 1 or mix[0][1] is not None
        if len(mix) > 1 and any(count is None for _, count in mix):
            return fail("--profile: give every entry of a mixed pool a count (NAME:COUNT)")
        total = sum(count or 0 for _, count in mix)
        if counted and args.replicas is not None and args.replicas != total:
            return fail(f"--replicas {args.replicas} but --profile counts {total} replicas")
        replicas = total if counted else (args.replicas if args.replicas is not None else 1)

        def adjusted(profile: EngineProfile) -> EngineProfile:
            if args.max_loras is not None:
                profile = replace(profile, max_loras=args.max_loras)
            if args.num_gpu_blocks_override is not None:
                profile = replace(profile, num_gpu_blocks=args.num_gpu_blocks_override)
            return profile

        per_replica = tuple(adjusted(p) for p, count in mix for _ in range(count or 0))
        profile = per_replica[0] if per_replica else adjusted(mix[0][0])
        faults = fault_table([parse_fault_spec(s) for s in args.fault], replicas)
        kv_events = (
            KVEventsConfig()
            if args.kv_events_config is None
            else KVEventsConfig.parse(args.kv_events_config)
        )
    except (KeyError, ValueError) as exc:
        return fail(str(exc.args[0]))
        return 2
    if args.time_scale <= 0:
        return fail("--time-scale must be positive")
    if args.histogram_max_age < 0:
        return fail("--histogram-max-age must not be negative")
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
        kv_events=kv_events,
    )
    try:
        run(serve_pool(options, replicas, args.host, args.port, faults, console, per_replica))
    except OSError as exc:  # a port in use, an address not ours...
        return fail(f"cannot serve on {args.host}:{args.port}: {exc}", status=1)
    return 0


def _split_lora(spec: str) -> tuple[str, str]:
    name, _, path = spec.partition("=")
    return name, path or f"/adapters/{name}"
