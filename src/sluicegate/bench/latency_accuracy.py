"""How well the online latency models predict, on the simulator
(``sluicegate bench micro latency-accuracy``).

For each engine profile users run, a pool of simulated engines serves ShareGPT first turns
(Poisson arrivals) at a few load levels, from light to near saturation, with the
``predicted-latency`` policy: the real director and producer, the models trained online
on the run's own traffic on the virtual clock, as in ``sluicegate bench run``. Two more
plans (sections of the same report file): ``latency-accuracy-precise`` routes with
``predicted-latency-precise``, whose features read the servers' cached tokens from their
KV-cache events (:data:`PRECISE_CASES`), and ``latency-accuracy-mixed`` serves a pool
mixing H100s and A100s (:data:`MIXED_CASE`) and scores each hardware class apart. Every
model set is hardware-aware (one model per class, as the ``predicted-latency`` preset's
producer files rows and samples), which on a pool of one class is the single model.

Three model sets see the same samples and train on the same schedule:

- the **routing** models — the configured objective, by default the α-quantile (p90) —
  whose predictions the scheduler uses;
- a **shadow** with the mean objective, which never routes;
- an **ablation** shadow, mean objective, that sees every row with the token-timing
  features blanked (as if the gateway did not time the endpoints' tokens), so the report
  shows what they contribute.

At every scheduling decision after the warm-up all predict the request on every
candidate; when the request completes on the chosen endpoint its prediction there is
scored against what happened. So every scored request is held out: its sample reaches
the store only after it was predicted.

What the numbers mean. MAPE = mean |predicted − observed| / observed, the figure the
issue's goal (≤ 10 %) and the reference's published ≈ 5 % speak of; it is a property of
a point (mean or median) estimate. A calibrated p90 model is *meant* to lie above 90 %
of the outcomes, so its MAPE grows with the spread of the outcomes and is no measure of
its quality: coverage (share of observed ≤ predicted, goal α ± 3 points) is. The report
therefore gives MAPE of the mean model, coverage of the quantile model, and the quantile
model's MAPE only for reference.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Final

import numpy as np
from rich.console import Console

from sluicegate.bench.des import ClusterSimulation
from sluicegate.bench.des_spec import ClusterSpec
from sluicegate.bench.latency_accuracy_scores import Diagnosis, TargetScores, diagnose, score
from sluicegate.bench.policies import policy_config
from sluicegate.bench.workloads import OpenLoop, sharegpt_first_turn
from sluicegate.clock import Clock
from sluicegate.latency.calibration import LatencyCalibration
from sluicegate.latency.features import TOKEN_TIMING_CAP_MS, FeatureRow, Sample
from sluicegate.latency.hardware import HardwareAwarePredictor
from sluicegate.latency.inprocess import PredictorSettings
from sluicegate.latency.predictor import PredictionQuery, Predictions, SynchronousPredictor
from sluicegate.sim.profiles import get_profile

GOAL_MAPE = 0.10
"""The issue's MAPE goal (fraction)."""
GOAL_COVERAGE_BAND = 0.03
"""Coverage goal: within ±3 points of α."""
MIXED_CAPACITY_QPS = 225.0
"""ShareGPT first turns per second the mixed pool (:data:`MIXED_CASE`) sustains under
``predicted-latency``, found as the homogeneous cases' were (DES, 90 s of arrivals,
seed 0): at 200 req/s TTFT p50 stayed at 35–36 ms (p90 48–50 ms), at 225 its p90
climbed from 0.34 s to 0.88 s (queues growing); an earlier guess of 280 (2 H100s + 4
A100s counted at 0.7 H100 each) put the 90 % level at 252 req/s, past saturation (TTFT
p50 ≈ 8 s)."""


@dataclass(frozen=True, slots=True)
class Case:
    """One pool: a profile, its size, and the load it saturates at."""

    profile: str
    model: str
    replicas: int
    capacity_qps: float
    """ShareGPT first turns per second the pool sustains under ``predicted-latency``,
    found by running the DES for 120 s of arrivals: llama2 kept TTFT p50 at 31 ms at
    104 req/s and queued without bound at 117 (p50 1.7 s); llama3 kept 45 ms at 252
    req/s and queued at 288 (p50 2.7 s). Llama-2-7B keeps 4× more KV per token than
    Llama-3-8B (no grouped-query attention), so its pool saturates far earlier."""
    policy: str = "predicted-latency"
    """The routing policy (a preset with a ``predicted-latency-producer``):
    ``predicted-latency-precise`` feeds the features the servers' cached tokens from
    their KV events (the DES delivers them) instead of the approximate index's guess."""
    mix: tuple[tuple[str, int], ...] = ()
    """A mixed pool: (profile, replicas) per hardware class, ``replicas`` in all (empty:
    ``replicas`` × ``profile``)."""

    @property
    def label(self) -> str:
        """The pool as the report names it."""
        if not self.mix:
            return self.profile
        return " + ".join(f"{n} × {name}" for name, n in self.mix)

    def profiles(self) -> tuple[str, ...]:
        """Each replica's profile name."""
        if not self.mix:
            return (self.profile,) * self.replicas
        names = tuple(name for name, n in self.mix for _ in range(n))
        if len(names) != self.replicas:
            raise ValueError(f"mix {self.mix} has {len(names)} replicas, not {self.replicas}")
        return names


CASES: tuple[Case, ...] = (
    Case("llama2-7b-h100", "meta-llama/Llama-2-7b-hf", 4, 115.0),
    Case("llama3-8b-h100", "meta-llama/Meta-Llama-3-8B", 4, 280.0),
)

PRECISE_CASES: tuple[Case, ...] = (
    Case("llama3-8b-h100", "meta-llama/Meta-Llama-3-8B", 4, 280.0, "predicted-latency-precise"),
)
"""The precise section's pool: the profile whose approximate features miss 5 % TTFT MAPE
(Llama-2-7B's pool meets it without: 2.6–3.4 %). One pool, so the section's run fits
the lab's wall-time budget on a shared machine."""

MIXED_CASE = Case(
    "llama3-8b-h100",
    "meta-llama/Meta-Llama-3-8B",
    6,
    MIXED_CAPACITY_QPS,
    mix=(("llama3-8b-h100", 2), ("llama3-8b-a100", 4)),
)
"""Issue 19's mixed pool: 2 × H100 + 4 × A100 serving Llama-3-8B (the
``heterogeneous-pool`` scenario's mix) on this report's ShareGPT workload."""


@dataclass(frozen=True, slots=True)
class Plan:
    """What one report runs. Times are simulated seconds."""

    cases: tuple[Case, ...] = CASES
    load_fractions: tuple[float, ...] = (0.25, 0.6, 0.9)
    """Arrival rates as fractions of each case's capacity."""
    duration_s: float = 240.0
    """Arrivals span this long; the run drains for up to as long again."""
    warmup_s: float = 120.0
    """Requests dispatched before this are not scored. Not only the models warm up: from
    empty engines the running batches take tens of seconds to fill (ShareGPT answers run
    up to 2,048 tokens, ≈ 30 s of decoding), and near saturation the queues take longer
    still to settle; TPOT keeps rising until they have. With a 60 s warm-up the scored
    window of the 90 % loads was still that climb (TPOT coverage 72 % and 96 %, the online
    calibration trailing a load that kept moving); from 120 s it is the steady state."""
    seeds: tuple[int, ...] = (0,)
    """One run per seed and level (arrivals, prompts, the simulation's randomness)."""
    settings: PredictorSettings = field(default_factory=PredictorSettings)
    """The routing models' training (objective, α, interval); the shadows differ only in
    their mean objective (and the ablation in its blanked token timing)."""
    ablation: bool = True
    """Train and score the ablation shadow (without token timing); the sections that do
    not report it skip its cost."""

    @classmethod
    def quick(cls) -> Plan:
        """A run of a few wall seconds per case (smoke tests)."""
        return cls(
            load_fractions=(0.5,),
            duration_s=12.0,
            warmup_s=5.0,
            settings=replace(PredictorSettings(), retrain_interval_s=2.0),
        )

    @classmethod
    def precise(cls, quick: bool = False) -> Plan:
        """The precise-features section: :data:`PRECISE_CASES`, no ablation, seeds 0–2,
        180 s of arrivals (the same 120 s warm-up, a 60 s scored window: still ≥ 4,000
        requests per level, and the section's runs fit the lab's wall-time budget)."""
        if quick:
            return replace(cls.quick(), cases=PRECISE_CASES, ablation=False, load_fractions=(0.25,))
        return cls(cases=PRECISE_CASES, ablation=False, duration_s=180.0, seeds=(0, 1, 2))

    @classmethod
    def mixed(cls, quick: bool = False) -> Plan:
        """The mixed-pool section: :data:`MIXED_CASE`, no ablation, seeds 0–2, 180 s of
        arrivals (as :meth:`precise`). Three seeds because the routing decides which
        samples each class's model learns from: on seed 0 alone the A100s' TTFT MAPE at
        90 % load read 9.8, 10.3, 8.6 and 10.5 % across four routing changes."""
        if quick:
            return replace(cls.quick(), cases=(MIXED_CASE,), ablation=False, load_fractions=(0.25,))
        return cls(cases=(MIXED_CASE,), ablation=False, duration_s=180.0, seeds=(0, 1, 2))


_COLUMNS: Final = 8
"""Per scored request: observed TTFT, TPOT, then routing, shadow and ablation TTFT, TPOT."""


def without_token_timing(row: FeatureRow) -> FeatureRow:
    """``row`` as a gateway that does not time tokens would see it: no token ever seen,
    so every unanswered prompt token counts as dispatched after the last one."""
    return replace(
        row,
        ms_since_last_token=TOKEN_TIMING_CAP_MS,
        token_interval_ms=0.0,
        prompt_tokens_before_last_token=0,
        prompt_tokens_after_last_token=row.prompt_tokens_before_last_token
        + row.prompt_tokens_after_last_token,
    )


class ScoringPredictor(SynchronousPredictor):
    """The routing predictor of a run plus a mean-objective shadow and its ablation;
    records their predictions for every candidate at dispatch and scores the chosen one
    at completion.

    Implements :class:`~sluicegate.bench.des_spec.TrainedPredictor`. Predictions are keyed by
    the feature row and its hardware class (the producer hands the chosen row and class
    back in the sample; idle endpoints of two classes have equal rows but not equal
    predictions); at most ``max_pending`` are kept (oldest dropped: candidates that were
    not chosen).
    """

    def __init__(
        self,
        clock: Clock,
        settings: PredictorSettings,
        warmup_s: float,
        max_pending: int = 200_000,
        ablation: bool = True,
    ) -> None:
        self.clock = clock
        # Per-class models (one model on a pool of one class: the same as an
        # InProcessPredictor), as the hardware-aware producer files rows and samples.
        self.routing = HardwareAwarePredictor(clock, settings)
        shadow_train = replace(settings.train, objective="mean")
        self.shadow = HardwareAwarePredictor(clock, replace(settings, train=shadow_train))
        self.ablation = (
            HardwareAwarePredictor(clock, replace(settings, train=shadow_train))
            if ablation
            else None
        )
        """None: not trained, its predictions NaN."""
        self.warmup_s = warmup_s
        self.max_pending = max_pending
        self._pending: dict[tuple[FeatureRow, str | None], tuple[float, ...]] = {}
        self.ready_at: float | None = None
        """Clock time of the first routing model (s)."""
        self.scored: list[tuple[float, ...]] = []
        """Per scored request: observed TTFT, TPOT (ms; TPOT NaN when < 2 tokens), then
        the routing model's, the shadow's and the ablation's TTFT, TPOT predictions (ms;
        NaN when that model did not exist yet)."""
        self.scored_rows: list[FeatureRow] = []
        """The chosen endpoint's row at dispatch, per scored request (same order)."""
        self.scored_classes: list[str | None] = []
        """The hardware class each scored request's sample was filed under."""
        self.unscored = 0
        """Requests completed after the warm-up without a prediction at dispatch."""

    @property
    def ready(self) -> bool:
        return self.routing.ready

    @property
    def calibration(self) -> LatencyCalibration | None:
        """The routing predictor's: the producer applies it to what :meth:`predict`
        returns, and so does the record of what the request was routed on."""
        return self.routing.calibration

    def predict_query(self, query: PredictionQuery) -> Predictions | None:
        return self.predict(query.rows, query.classes)

    def predict(
        self, rows: Sequence[FeatureRow], classes: Sequence[str | None] | None = None
    ) -> Predictions | None:
        """The routing model's predictions for ``rows`` (``classes[i]``: the hardware
        class of ``rows[i]``); after the warm-up, also records every model's for scoring."""
        out = self.routing.predict(rows, classes)
        if out is None or self.clock.now() < self.warmup_s:
            return out
        mean = self.shadow.predict(rows, classes)
        blind = (
            None
            if self.ablation is None
            else self.ablation.predict([without_token_timing(row) for row in rows], classes)
        )
        pending = self._pending
        cal = self.routing.calibration
        for i, row in enumerate(rows):
            ttft, tpot = _pair(out, i)
            # The scales the producer applies (the TTFT one depends on the prediction's size).
            hardware_class = classes[i] if classes else None
            ttft_scale, tpot_scale = cal.scales(hardware_class, ttft) if cal else (1.0, 1.0)
            pending[row, hardware_class] = (
                ttft * ttft_scale,
                tpot * tpot_scale,
                *_pair(mean, i),
                *_pair(blind, i),
            )
        while len(pending) > self.max_pending:
            del pending[next(iter(pending))]
        return out

    def observe(self, sample: Sample) -> None:
        self.routing.observe(sample)
        self.shadow.observe(sample)
        if self.ablation is not None:
            self.ablation.observe(replace(sample, row=without_token_timing(sample.row)))
        entry = self._pending.pop((sample.row, sample.hardware_class), None)
        if entry is None:
            if self.clock.now() >= self.warmup_s and self.ready:
                self.unscored += 1
            return
        tpot = sample.tpot_ms if sample.tpot_ms is not None else math.nan
        ttft = sample.ttft_ms if sample.ttft_ms is not None else math.nan
        self.scored.append((ttft, tpot, *entry))
        self.scored_rows.append(sample.row)
        self.scored_classes.append(sample.hardware_class)

    def maybe_retrain(self, now: float | None = None) -> bool:
        trained = self.routing.maybe_retrain(now)
        self.shadow.maybe_retrain(now)
        if self.ablation is not None:
            self.ablation.maybe_retrain(now)
        if trained and self.ready_at is None:
            self.ready_at = self.clock.now() if now is None else now
        return trained


def _pair(predictions: Predictions | None, i: int) -> tuple[float, float]:
    if predictions is None:
        return math.nan, math.nan
    return float(predictions.ttft_ms[i]), float(predictions.tpot_ms[i])


@dataclass(frozen=True, slots=True)
class LevelResult:
    case: Case
    qps: float
    seed: int
    requests: int
    ttft: TargetScores
    tpot: TargetScores
    fallbacks: int
    """Scheduling decisions made without predictions (the producer's count, warm-up
    included)."""
    unscored: int
    ready_at_s: float | None
    trainings: int
    wall_s: float
    by_class: dict[str, tuple[TargetScores, TargetScores]] = field(default_factory=dict)
    """TTFT and TPOT scores per hardware class (a mixed pool's; empty otherwise)."""
    diagnosis: Diagnosis | None = None
    scorer: ScoringPredictor | None = field(default=None, compare=False, repr=False)
    """The run's predictor, with every scored row (for diagnostics)."""


def run_level(case: Case, qps: float, plan: Plan, seed: int = 0) -> LevelResult:
    """One DES run of ``case`` at ``qps`` arrivals/s with ``seed``, scored as the module
    says."""
    picker, _ = policy_config(case.policy)
    holder: list[ScoringPredictor] = []

    def factory(clock: Clock, settings: PredictorSettings) -> ScoringPredictor:
        holder.append(ScoringPredictor(clock, settings, plan.warmup_s, ablation=plan.ablation))
        return holder[-1]

    names = case.profiles()
    spec = ClusterSpec(
        profile=get_profile(names[0]),
        replicas=case.replicas,
        profiles=tuple(get_profile(n) for n in names) if case.mix else (),
        picker=picker,
        predictor="model",
        model=case.model,
        seed=seed,
        predictor_settings=plan.settings,
        predictor_factory=factory,
    )
    started = time.perf_counter()
    sim = ClusterSimulation(spec)
    workload = OpenLoop(qps, plan.duration_s, sharegpt_first_turn(case.model), seed)
    result = sim.run(workload, horizon_s=plan.duration_s * 2.0)
    wall = time.perf_counter() - started
    scorer = holder[0]
    data = np.array(scorer.scored, dtype=np.float64).reshape(-1, _COLUMNS)
    by_class: dict[str, tuple[TargetScores, TargetScores]] = {}
    if case.mix:
        classes = np.array([c or "" for c in scorer.scored_classes])
        for cls in sorted(set(classes.tolist())):
            part = data[classes == cls]
            by_class[cls or "none"] = (
                score(part[:, 0], part[:, 4], part[:, 2], part[:, 6]),
                score(part[:, 1], part[:, 5], part[:, 3], part[:, 7]),
            )
    return LevelResult(
        case=case,
        qps=qps,
        seed=seed,
        requests=len(result.records),
        ttft=score(data[:, 0], data[:, 4], data[:, 2], data[:, 6]),
        tpot=score(data[:, 1], data[:, 5], data[:, 3], data[:, 7]),
        fallbacks=sum(1 for r in result.records if r.fell_back),
        unscored=scorer.unscored,
        ready_at_s=scorer.ready_at,
        trainings=scorer.routing.trainings,
        wall_s=wall,
        by_class=by_class,
        diagnosis=diagnose(scorer.scored_rows, data[:, 0], data[:, 4]),
        scorer=scorer,
    )


def run_plan(plan: Plan, console: Console | None = None) -> list[LevelResult]:
    """Every case at every load level, once per seed (seeds innermost)."""
    out = []
    for case in plan.cases:
        for fraction in plan.load_fractions:
            qps = round(case.capacity_qps * fraction, 1)
            for seed in plan.seeds:
                if console is not None:
                    console.print(
                        f"latency accuracy: {case.label} ({case.policy}) @ {qps:g} req/s, "
                        f"seed {seed} ..."
                    )
                out.append(run_level(case, qps, plan, seed))
    return out
