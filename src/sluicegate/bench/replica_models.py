"""Do gateway replicas lose SLO attainment because each trains its own latency models?

``python -m sluicegate.bench.replica_models --qps 85 --seed 0 --out FILE.json`` runs
``slo-mixed`` with ``predicted-latency`` five ways on the same arrivals and prints one
table row per run (the JSON keeps them):

- one replica, and one replica whose plugins draw from another random stream (the
  stream replica 1 of a replica run gets: what the picker's draws alone move);
- ``--gateways`` independent replicas (each trains on its own share of the samples);
- as many shared replicas with their own models (shared state as it was before the
  training service was simulated);
- as many shared replicas served by one training service (:mod:`sluicegate.bench.
  des_models`, models pulled every ``--model-sync-ms``).

Per run: SLO attainment, shed requests, requests scheduled on the heuristic fallback
(models not ready, or no usable prediction), and per model (each replica's, or the
service's): TTFT training samples at the end, trainings, and the last model's held-out
TTFT MAPE.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TypedDict

from sluicegate.bench.des import ClusterSimulation
from sluicegate.bench.des_gateway import SEED_STRIDE
from sluicegate.bench.des_sharing import DEFAULT_MODEL_SYNC_S, ReplicaSettings
from sluicegate.bench.runner import cluster_spec, run_entry
from sluicegate.bench.scenarios import get_scenario
from sluicegate.latency.hardware import HardwareAwarePredictor
from sluicegate.latency.inprocess import InProcessPredictor

POLICY = "predicted-latency"
SCENARIO = "slo-mixed"


@dataclass(frozen=True, slots=True)
class Variant:
    name: str
    gateways: ReplicaSettings
    plugin_seed_offset: int = 0


def variants(gateways: int, model_sync_s: float) -> list[Variant]:
    return [
        Variant("one replica", ReplicaSettings()),
        Variant("one replica, other random stream", ReplicaSettings(), SEED_STRIDE),
        Variant(f"{gateways} independent", ReplicaSettings(gateways, "independent")),
        Variant(
            f"{gateways} shared, own models",
            ReplicaSettings(gateways, "shared", share_models=False),
        ),
        Variant(
            f"{gateways} shared, one training service",
            ReplicaSettings(gateways, "shared", model_sync_s=model_sync_s),
        ),
    ]


class ModelStats(TypedDict):
    """One model's (a replica's, or the training service's) state at the end of a run."""

    ttft_samples: int
    """TTFT training samples held."""
    trainings: int
    ttft_mape: float | None
    """The last model's held-out TTFT MAPE (fraction; the worst class's); None: unscored."""


class VariantRun(TypedDict):
    """One variant's run, as the JSON keeps it."""

    variant: str
    gateways: dict[str, object]
    slo_attainment: float
    shed: int
    fallbacks: int
    """Requests scheduled on the heuristic fallback."""
    requests: int
    models: list[ModelStats]
    sharing: dict[str, int] | None
    wall_s: float


def _service_stats(model: InProcessPredictor) -> ModelStats:
    """The training service's one (hardware-blind) model."""
    return {
        "ttft_samples": model.ttft_samples,
        "trainings": model.trainings,
        "ttft_mape": model.ttft_mape,
    }


def _replica_stats(model: HardwareAwarePredictor) -> ModelStats:
    """A replica's own (hardware-aware) models: the worst class's MAPE."""
    mapes = [lane.ttft_mape for lane in model.lanes.values() if lane.ttft_mape is not None]
    return {
        "ttft_samples": model.ttft_samples,
        "trainings": model.trainings,
        "ttft_mape": max(mapes) if mapes else None,
    }


def run_variant(variant: Variant, qps: float, seed: int) -> VariantRun:
    scenario = get_scenario(SCENARIO)
    spec = cluster_spec(
        scenario,
        POLICY,
        seed,
        gateways=variant.gateways,
        decision_seed=seed + variant.plugin_seed_offset if variant.plugin_seed_offset else None,
    )
    started = time.perf_counter()
    sim = ClusterSimulation(spec)
    duration = scenario.duration_s
    workload = scenario.workload(qps, duration, seed)  # the same arrivals in every variant
    result = sim.run(workload, horizon_s=duration * (1.0 + scenario.drain_factor))
    wall = time.perf_counter() - started
    metrics = run_entry(scenario, POLICY, qps, result, wall)["metrics"]
    if sim.training is not None:
        models = [_service_stats(sim.training.trainer)]
    else:
        own = (p for p in sim.predictors if isinstance(p, HardwareAwarePredictor))
        models = [_replica_stats(p) for p in own]
    return {
        "variant": variant.name,
        "gateways": variant.gateways.describe(result.latency_models),
        "slo_attainment": metrics["slo_attainment"],
        "shed": metrics["shed"],
        "fallbacks": sum(1 for r in result.records if r.fell_back),
        "requests": metrics["requests"],
        "models": models,
        "sharing": result.sharing,
        "wall_s": wall,
    }


def row(run: VariantRun) -> str:
    models = run["models"]
    samples = ", ".join(str(m["ttft_samples"]) for m in models)
    trainings = ", ".join(str(m["trainings"]) for m in models)
    mapes = ", ".join("–" if m["ttft_mape"] is None else f"{m['ttft_mape']:.1%}" for m in models)
    return (
        f"| {run['variant']} | {run['slo_attainment']:.1%} | {run['shed']} | "
        f"{run['fallbacks']} | {samples} | {trainings} | {mapes} |"
    )


HEADER = (
    "| run | SLO attainment | shed | fallback requests | TTFT samples per model | "
    "trainings per model | last TTFT MAPE per model |\n|---|---|---|---|---|---|---|"
)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sluicegate.bench.replica_models")
    parser.add_argument("--qps", type=float, default=85.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--gateways", type=int, default=2)
    parser.add_argument("--model-sync-ms", type=float, default=DEFAULT_MODEL_SYNC_S * 1000.0)
    parser.add_argument("--only", type=int, nargs="*", default=None, help="variant indexes")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    chosen = variants(args.gateways, args.model_sync_ms / 1000.0)
    if args.only:
        chosen = [chosen[i] for i in args.only]
    runs = []
    print(f"{SCENARIO}, {POLICY}, {args.qps:g} req/s, seed {args.seed}\n\n{HEADER}", flush=True)
    for variant in chosen:
        run = run_variant(variant, args.qps, args.seed)
        runs.append(run)
        print(row(run), flush=True)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        doc = {"scenario": SCENARIO, "policy": POLICY, "qps": args.qps, "seed": args.seed}
        args.out.write_text(json.dumps({**doc, "runs": runs}, indent=1) + "\n")
    return 0


__all__ = ["ModelStats", "Variant", "VariantRun", "main", "run_variant", "variants"]

if __name__ == "__main__":
    raise SystemExit(main())
