"""How well the online latency models predict, on the simulator
(``sluicegate bench micro latency-accuracy``).

For each engine profile users run, a pool of simulated engines serves ShareGPT first turns
(Poisson arrivals) at a few load levels, from light to near saturation, with the
``predicted-latency`` policy: the real director and producer, the models trained online
on the run's own traffic on the virtual clock, as in ``sluicegate bench run``.

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
from sluicegate.bench.policies import policy_config
from sluicegate.bench.workloads import OpenLoop, sharegpt_first_turn
from sluicegate.clock import Clock
from sluicegate.latency.calibration import LatencyCalibration
from sluicegate.latency.features import TOKEN_TIMING_CAP_MS, FeatureRow, Sample
from sluicegate.latency.inprocess import InProcessPredictor, PredictorSettings
from sluicegate.latency.predictor import PredictionQuery, Predictions, SynchronousPredictor
from sluicegate.sim.profiles import get_profile

GOAL_MAPE = 0.10
"""The issue's MAPE goal (fraction)."""
GOAL_COVERAGE_BAND = 0.03
"""Coverage goal: within ±3 points of α."""


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


CASES: tuple[Case, ...] = (
    Case("llama2-7b-h100", "meta-llama/Llama-2-7b-hf", 4, 115.0),
    Case("llama3-8b-h100", "meta-llama/Meta-Llama-3-8B", 4, 280.0),
)


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
    seed: int = 0
    settings: PredictorSettings = field(default_factory=PredictorSettings)
    """The routing models' training (objective, α, interval); the shadows differ only in
    their mean objective (and the ablation in its blanked token timing)."""

    @classmethod
    def quick(cls) -> Plan:
        """A run of a few wall seconds per case (smoke tests)."""
        return cls(
            load_fractions=(0.5,),
            duration_s=12.0,
            warmup_s=5.0,
            settings=replace(PredictorSettings(), retrain_interval_s=2.0),
        )


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
    the feature row (the producer hands the chosen row back in the sample); at most
    ``max_pending`` rows are kept (oldest dropped: candidates that were not chosen).
    """

    def __init__(
        self,
        clock: Clock,
        settings: PredictorSettings,
        warmup_s: float,
        max_pending: int = 200_000,
    ) -> None:
        self.clock = clock
        self.routing = InProcessPredictor(clock, settings)
        shadow_train = replace(settings.train, objective="mean")
        self.shadow = InProcessPredictor(clock, replace(settings, train=shadow_train))
        self.ablation = InProcessPredictor(clock, replace(settings, train=shadow_train))
        self.warmup_s = warmup_s
        self.max_pending = max_pending
        self._pending: dict[FeatureRow, tuple[float, ...]] = {}
        self.ready_at: float | None = None
        """Clock time of the first routing model (s)."""
        self.scored: list[tuple[float, ...]] = []
        """Per scored request: observed TTFT, TPOT (ms; TPOT NaN when < 2 tokens), then
        the routing model's, the shadow's and the ablation's TTFT, TPOT predictions (ms;
        NaN when that model did not exist yet)."""
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
        return self.predict(query.rows)

    def predict(self, rows: Sequence[FeatureRow]) -> Predictions | None:
        """The routing model's predictions for ``rows``; after the warm-up, also records
        every model's for scoring."""
        out = self.routing.predict(rows)
        if out is None or self.clock.now() < self.warmup_s:
            return out
        mean = self.shadow.predict(rows)
        blind = self.ablation.predict([without_token_timing(row) for row in rows])
        pending = self._pending
        cal = self.routing.calibration
        for i, row in enumerate(rows):
            ttft, tpot = _pair(out, i)
            # The scales the producer applies (the TTFT one depends on the prediction's size).
            ttft_scale, tpot_scale = cal.scales(None, ttft) if cal else (1.0, 1.0)
            pending[row] = (
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
        self.ablation.observe(replace(sample, row=without_token_timing(sample.row)))
        entry = self._pending.pop(sample.row, None)
        if entry is None:
            if self.clock.now() >= self.warmup_s and self.ready:
                self.unscored += 1
            return
        tpot = sample.tpot_ms if sample.tpot_ms is not None else math.nan
        ttft = sample.ttft_ms if sample.ttft_ms is not None else math.nan
        self.scored.append((ttft, tpot, *entry))

    def maybe_retrain(self, now: float | None = None) -> bool:
        trained = self.routing.maybe_retrain(now)
        self.shadow.maybe_retrain(now)
        self.ablation.maybe_retrain(now)
        if trained and self.ready_at is None:
            self.ready_at = self.clock.now() if now is None else now
        return trained


def _pair(predictions: Predictions | None, i: int) -> tuple[float, float]:
    if predictions is None:
        return math.nan, math.nan
    return float(predictions.ttft_ms[i]), float(predictions.tpot_ms[i])


@dataclass(frozen=True, slots=True)
class TargetScores:
    """One target's scores over the held-out requests (fractions; NaN: nothing scored)."""

    n: int
    mean_mape: float
    mean_median_ape: float
    quantile_coverage: float
    quantile_mape: float
    observed_p50_ms: float
    ablation_mape: float
    """MAPE of the mean model without the token-timing features."""


def score(
    observed: np.ndarray,
    mean: np.ndarray,
    quantile: np.ndarray,
    ablation: np.ndarray | None = None,
) -> TargetScores:
    """Scores of predictions against observed times (ms); rows with no observation or a
    missing prediction are left out."""
    if ablation is None:
        ablation = np.full_like(observed, math.nan)
    keep = (observed > 0) & np.isfinite(observed) & np.isfinite(mean) & np.isfinite(quantile)
    y, m, q, a = observed[keep], mean[keep], quantile[keep], ablation[keep]
    if len(y) == 0:
        nan = math.nan
        return TargetScores(0, nan, nan, nan, nan, nan, nan)
    ape = np.abs(m - y) / y
    blind = np.isfinite(a)
    return TargetScores(
        n=len(y),
        mean_mape=float(ape.mean()),
        mean_median_ape=float(np.median(ape)),
        quantile_coverage=float(np.mean(y <= q)),
        quantile_mape=float(np.mean(np.abs(q - y) / y)),
        observed_p50_ms=float(np.median(y)),
        ablation_mape=(
            float(np.mean(np.abs(a[blind] - y[blind]) / y[blind])) if blind.any() else math.nan
        ),
    )


@dataclass(frozen=True, slots=True)
class LevelResult:
    case: Case
    qps: float
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


def run_level(case: Case, qps: float, plan: Plan) -> LevelResult:
    """One DES run of ``case`` at ``qps`` arrivals/s, scored as the module says."""
    picker, _ = policy_config("predicted-latency")
    holder: list[ScoringPredictor] = []

    def factory(clock: Clock, settings: PredictorSettings) -> ScoringPredictor:
        holder.append(ScoringPredictor(clock, settings, plan.warmup_s))
        return holder[-1]

    spec = ClusterSpec(
        profile=get_profile(case.profile),
        replicas=case.replicas,
        picker=picker,
        predictor="model",
        model=case.model,
        seed=plan.seed,
        predictor_settings=plan.settings,
        predictor_factory=factory,
    )
    started = time.perf_counter()
    sim = ClusterSimulation(spec)
    workload = OpenLoop(qps, plan.duration_s, sharegpt_first_turn(case.model), plan.seed)
    result = sim.run(workload, horizon_s=plan.duration_s * 2.0)
    wall = time.perf_counter() - started
    scorer = holder[0]
    data = np.array(scorer.scored, dtype=np.float64).reshape(-1, _COLUMNS)
    return LevelResult(
        case=case,
        qps=qps,
        requests=len(result.records),
        ttft=score(data[:, 0], data[:, 4], data[:, 2], data[:, 6]),
        tpot=score(data[:, 1], data[:, 5], data[:, 3], data[:, 7]),
        fallbacks=sum(1 for r in result.records if r.fell_back),
        unscored=scorer.unscored,
        ready_at_s=scorer.ready_at,
        trainings=scorer.routing.trainings,
        wall_s=wall,
    )


def run_plan(plan: Plan, console: Console | None = None) -> list[LevelResult]:
    out = []
    for case in plan.cases:
        for fraction in plan.load_fractions:
            qps = round(case.capacity_qps * fraction, 1)
            if console is not None:
                console.print(f"latency accuracy: {case.profile} @ {qps:g} req/s ...")
            out.append(run_level(case, qps, plan))
    return out


# ---------------------------------------------------------------------- report


def _pct(x: float) -> str:
    return "n/a" if math.isnan(x) else f"{x:.1%}"


def _ms(x: float) -> str:
    return "n/a" if math.isnan(x) else f"{x:.1f}"


def _mape_verdict(values: Sequence[float]) -> str:
    return "met" if values and all(v <= GOAL_MAPE for v in values) else "**not met**"


def _coverage_verdict(values: Sequence[float], alpha: float) -> str:
    ok = values and all(abs(v - alpha) <= GOAL_COVERAGE_BAND for v in values)
    return "met" if ok else "**not met**"


def render(results: Sequence[LevelResult], plan: Plan, command: str, machine: str) -> str:
    """The Markdown report."""
    train = plan.settings.train
    alpha = train.alpha
    routing = f"p{alpha * 100:g} (α = {alpha:g})" if train.objective == "quantile" else "mean"
    lines = [
        "# Latency prediction accuracy",
        "",
        "How well the online TTFT/TPOT models predict on the simulator: each profile's pool "
        "serves ShareGPT first turns (Poisson arrivals, streaming, `max_tokens` = the recorded "
        "answer length) at load levels from light to near saturation, routed by the "
        "`predicted-latency` policy with models trained online on the run's own traffic "
        f"(every {plan.settings.retrain_interval_s:g} simulated s once "
        f"{plan.settings.min_samples} samples exist; {train.n_estimators} trees of depth ≤ "
        f"{train.max_depth}). "
        f"Routing uses the {routing} models; a shadow with the mean objective sees the same "
        "samples and never routes. Requests dispatched after the warm-up are scored: the "
        "prediction for the chosen endpoint at dispatch against what happened (TTFT = "
        "dispatch to first token, TPOT = (end − first token) / (tokens − 1)), each before its "
        "own sample reached the models.",
        "",
        "MAPE is the goal's measure of a point estimate, so it is reported for the mean model. "
        "A calibrated p90 model is meant to lie above 90 % of outcomes: its MAPE grows with "
        "the spread of the outcomes rather than with its error, and coverage (share of "
        "observed ≤ predicted) is its measure. Its MAPE is listed for reference only.",
        "",
        "Coverage here is measured where it matters and is hardest: on the endpoint the "
        "routing model chose, with the prediction the request was routed on. Choosing the "
        "lowest prediction favours endpoints whose latency the model underestimates, and "
        "near saturation the load keeps moving after dispatch, so raw quantile predictions "
        "cover less than they do on held-out samples of the models' own store. The online "
        "calibration (`sluicegate.latency.calibration`, on by default) rescales them by the "
        "α-quantile of observed ÷ predicted over the last 1,000 routed requests. It holds "
        "TTFT, known at the first token; a TPOT is known only when its request ends, seconds "
        "and thousands of dispatches later, so its correction lags the load it corrects "
        "for while that load still climbs — which is why the warm-up lasts until the "
        "engines' batches and queues have settled (120 s; with 60 s the 90 % loads were "
        "scored on the climb: TPOT coverage 72 % and 96 %).",
        "",
        "```",
        command,
        "```",
        "",
        f"Machine: {machine}. Simulated: {plan.duration_s:g} s of arrivals per run (then "
        f"draining), warm-up {plan.warmup_s:g} s, seed {plan.seed}.",
        "",
        "## Goals",
        "",
        "Issue: after warm-up on a ShareGPT-like workload, TTFT and TPOT MAPE ≤ 10 % and "
        f"α-quantile coverage within ±{GOAL_COVERAGE_BAND * 100:g} points of α, per profile.",
        "",
        "| profile | TTFT MAPE (mean model) | TPOT MAPE (mean model) | TTFT coverage | "
        "TPOT coverage |",
        "|---|---|---|---|---|",
    ]
    for case in dict.fromkeys(r.case for r in results):
        rs = [r for r in results if r.case == case]
        tm = [r.ttft.mean_mape for r in rs]
        pm = [r.tpot.mean_mape for r in rs]
        tc = [r.ttft.quantile_coverage for r in rs]
        pc = [r.tpot.quantile_coverage for r in rs]

        def span(values: list[float]) -> str:
            return " – ".join(dict.fromkeys((_pct(min(values)), _pct(max(values)))))

        cov = train.objective == "quantile"
        lines.append(
            f"| {case.profile} | {span(tm)}: {_mape_verdict(tm)} | {span(pm)}: "
            f"{_mape_verdict(pm)} | "
            + (
                f"{span(tc)}: {_coverage_verdict(tc, alpha)} | {span(pc)}: "
                f"{_coverage_verdict(pc, alpha)} |"
                if cov
                else "n/a (mean routing models) | n/a |"
            )
        )
    lines += [
        "",
        "Ranges are over the load levels below.",
        "",
        "## Per load level",
        "",
        "`n` = scored requests; APE = absolute percentage error; `without token timing` = "
        "a third model set (mean objective) trained and asked with the token-timing "
        "features blanked (`ms_since_last_token`, `token_interval_ms`, and the unanswered "
        "prompt tokens not split at the last token), i.e. what the gateway predicts when it "
        "does not time the tokens it relays; `fallbacks` = decisions made "
        "without predictions (the warm-up's included); `first model` = simulated time of "
        "the first training.",
        "",
        "| profile | replicas | req/s | load | target | n | observed p50 ms | mean model MAPE | "
        "mean model median APE | quantile coverage | quantile MAPE (reference) | "
        "mean model MAPE without token timing | fallbacks | first model s | wall s |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        for name, s in (("TTFT", r.ttft), ("TPOT", r.tpot)):
            ready = "never" if r.ready_at_s is None else f"{r.ready_at_s:g}"
            lines.append(
                f"| {r.case.profile} | {r.case.replicas} | {r.qps:g} | "
                f"{r.qps / r.case.capacity_qps:.0%} | {name} | {s.n:,} | "
                f"{_ms(s.observed_p50_ms)} | {_pct(s.mean_mape)} | {_pct(s.mean_median_ape)} | "
                f"{_pct(s.quantile_coverage)} | {_pct(s.quantile_mape)} | "
                f"{_pct(s.ablation_mape)} | {r.fallbacks:,} | "
                f"{ready} | {r.wall_s:.1f} |"
            )
    lines.append("")
    return "\n".join(lines)


def report(quick: bool, console: Console, machine: str) -> str:
    """Run the plan (quick or full) and render the report."""
    plan = Plan.quick() if quick else Plan()
    results = run_plan(plan, console)
    command = "sluicegate bench micro latency-accuracy" + (" --quick" if quick else "")
    command += " --out docs/benchmarks/latency-accuracy.md"
    return render(results, plan, command, machine)
