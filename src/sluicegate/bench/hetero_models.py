"""Which hardware-aware latency model predicts a mixed pool better: one model per class,
or one model with the class as a feature (``python -m sluicegate.bench.hetero_models``).

Samples: the ``slo-mixed`` scenario's workload (short chat and long documents with
TTFT/TPOT SLOs) run through the discrete-event simulation against a pool of 4 × Llama-3-8B
on H100 and, separately, 4 × Llama-3-8B on A100 (``llama3-8b-h100``, ``llama3-8b-a100``),
each at three loads up to near its saturation, routed by ``predicted-latency``; every
training sample the producer files is recorded and tagged with its pool's class. Each
run's first 70 % of samples (in completion order) train, the last 30 % test, so the
models are scored on later traffic than they saw, as online.

Designs, trained with the predictor's own parameters (mean objective, for MAPE):

- ``per-class``: one model per class on that class's samples (what
  :class:`~sluicegate.latency.hardware.HardwareAwarePredictor` does);
- ``class-feature``: one model on every sample with one more column, the class (0 / 1);
- ``pool``: one model on every sample, no class (the hardware-blind reference).

MAPE is reported per class and target on the test samples. Nothing here asserts.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from sluicegate.bench.des import ClusterSimulation
from sluicegate.bench.des_spec import ClusterSpec
from sluicegate.bench.policies import policy_config
from sluicegate.bench.scenarios import get_scenario
from sluicegate.clock import Clock
from sluicegate.latency.features import Sample, feature_matrix
from sluicegate.latency.hardware import HardwareAwarePredictor
from sluicegate.latency.inprocess import PredictorSettings
from sluicegate.latency.model import TrainConfig, scores, train_target
from sluicegate.sim.profiles import get_profile

CASES: tuple[tuple[str, str, tuple[float, ...]], ...] = (
    ("llama3-8b-h100", "h100-80gb", (30.0, 60.0, 85.0)),
    ("llama3-8b-a100", "a100-80gb", (10.0, 20.0, 28.0)),
)
"""(profile, class, arrival rates in req/s): the H100 pool saturates between 85 and 100
req/s on this workload (``slo-mixed``); the A100 rates are a third of those (its prefill
is ~3× slower)."""
TRAIN_SHARE = 0.7
DESIGNS = ("per-class", "class-feature", "pool")


@dataclass(frozen=True, slots=True)
class Split:
    train: list[Sample]
    test: list[Sample]


def collect(profile: str, cls: str, qps: float, duration_s: float, seed: int) -> Split:
    """One DES run's samples, tagged with ``cls``, split in completion order."""
    recorded: list[Sample] = []

    class Recording(HardwareAwarePredictor):
        def observe(self, sample: Sample) -> None:
            recorded.append(replace(sample, hardware_class=cls))
            super().observe(sample)

    def factory(clock: Clock, settings: PredictorSettings) -> Recording:
        return Recording(clock, settings)

    scenario = get_scenario("slo-mixed")
    spec = ClusterSpec(
        profile=get_profile(profile),
        replicas=4,
        picker=policy_config("predicted-latency")[0],
        predictor="model",
        model=scenario.model,
        seed=seed,
        predictor_factory=factory,
        extra_docs=list(scenario.extra_docs),
    )
    ClusterSimulation(spec).run(scenario.workload(qps, duration_s, seed), duration_s * 2.0)
    cut = int(len(recorded) * TRAIN_SHARE)
    return Split(recorded[:cut], recorded[cut:])


def _arrays(
    items: Sequence[Sample], target: str, codes: dict[str, int] | None
) -> tuple[np.ndarray, np.ndarray]:
    kept = [s for s in items if (s.ttft_ms if target == "ttft" else s.tpot_ms)]
    x = feature_matrix([s.row for s in kept])
    if codes is not None:
        column = np.array([[codes[str(s.hardware_class)]] for s in kept], dtype=np.float32)
        x = np.hstack([x, column]) if len(kept) else np.empty((0, x.shape[1] + 1), np.float32)
    y = np.array([s.ttft_ms if target == "ttft" else s.tpot_ms for s in kept], dtype=np.float32)
    return x, y


def compare(
    splits: dict[str, list[Split]], config: TrainConfig
) -> dict[tuple[str, str, str], float | None]:
    """MAPE by (design, class, target)."""
    classes = list(splits)
    codes = {c: i for i, c in enumerate(classes)}
    train = {c: [s for sp in splits[c] for s in sp.train] for c in classes}
    test = {c: [s for sp in splits[c] for s in sp.test] for c in classes}
    everything = [s for c in classes for s in train[c]]
    out: dict[tuple[str, str, str], float | None] = {}
    empty = (np.empty((0, 1), np.float32), np.empty(0, np.float32))
    for target in ("ttft", "tpot"):
        pooled = train_target(_arrays(everything, target, None), empty, config)
        featured = train_target(_arrays(everything, target, codes), empty, config)
        for c in classes:
            own = train_target(_arrays(train[c], target, None), empty, config)
            x, y = _arrays(test[c], target, None)
            xf, _ = _arrays(test[c], target, codes)
            out[("per-class", c, target)] = scores(y, own.predict(x))[0]
            out[("class-feature", c, target)] = scores(y, featured.predict(xf))[0]
            out[("pool", c, target)] = scores(y, pooled.predict(x))[0]
    return out


def render(
    results: Sequence[dict[tuple[str, str, str], float | None]],
    counts: dict[str, tuple[int, int]],
    command: str,
    wall_s: float,
) -> str:
    def cell(design: str, cls: str, target: str) -> str:
        values = sorted(r[(design, cls, target)] or float("nan") for r in results)
        median = values[len(values) // 2]
        if len(values) == 1:
            return f"{median:.1%}"
        return f"{median:.1%} ({values[0]:.1%}–{values[-1]:.1%})"

    lines = [
        "| class | samples (train / test, last seed) | target | "
        + " | ".join(f"`{d}` MAPE" for d in DESIGNS)
        + " |",
        "|---|---|---|" + "---|" * len(DESIGNS),
    ]
    for cls, (n_train, n_test) in counts.items():
        for target in ("ttft", "tpot"):
            row = " | ".join(cell(d, cls, target) for d in DESIGNS)
            lines.append(f"| {cls} | {n_train} / {n_test} | {target.upper()} | {row} |")
    seeds = len(results)
    return "\n".join(
        [
            f"Command: `{command}` ({seeds} seed{'s' if seeds > 1 else ''}; {wall_s:.0f} s wall).",
            "",
            *lines,
            "",
            "Cells: median over the seeds (range in brackets when there are several).",
        ]
    )


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--duration", type=float, default=60.0, help="arrival seconds per run")
    parser.add_argument("--seeds", type=int, default=1)
    args = parser.parse_args(argv)
    started = time.perf_counter()
    config = TrainConfig(objective="mean")
    results = []
    counts: dict[str, tuple[int, int]] = {}
    for seed in range(args.seeds):
        splits: dict[str, list[Split]] = {}
        for profile, cls, levels in CASES:
            splits[cls] = [collect(profile, cls, q, args.duration, seed) for q in levels]
            counts[cls] = (
                sum(len(s.train) for s in splits[cls]),
                sum(len(s.test) for s in splits[cls]),
            )
        results.append(compare(splits, config))
    command = "python -m sluicegate.bench.hetero_models " + " ".join(
        f"--{k} {v}" for k, v in (("duration", args.duration), ("seeds", args.seeds))
    )
    print(render(results, counts, command, time.perf_counter() - started))


if __name__ == "__main__":
    main()
