"""The latency-accuracy benchmark: its scoring, the predictor that records predictions at
dispatch, and a smoke run of the quick report."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest
from rich.console import Console

from sluicegate.bench import latency_accuracy as la
from sluicegate.bench import latency_accuracy_report as lar
from sluicegate.bench.des import ClusterSimulation
from sluicegate.bench.des_spec import ClusterSpec
from sluicegate.bench.micro import REPORTS, merge_report
from sluicegate.bench.policies import policy_config
from sluicegate.bench.workloads import OpenLoop, RequestSpec, random_text
from sluicegate.cli import build_parser
from sluicegate.clock import ManualClock
from sluicegate.latency.features import ROW_FIELDS, TOKEN_TIMING_CAP_MS, FeatureRow, Sample
from sluicegate.latency.inprocess import InProcessPredictor, PredictorSettings
from sluicegate.latency.model import TrainConfig
from sluicegate.sim.profiles import get_profile


def test_score_of_known_predictions() -> None:
    observed = np.array([10.0, 20.0, 40.0, math.nan, 0.0])
    mean = np.array([11.0, 18.0, 40.0, 5.0, 5.0])
    quantile = np.array([12.0, 19.0, 50.0, 5.0, 5.0])
    s = la.score(observed, mean, quantile)
    assert s.n == 3  # NaN and 0 observations are not scored
    assert s.mean_mape == pytest.approx((0.1 + 0.1 + 0.0) / 3)
    assert s.mean_median_ape == pytest.approx(0.1)
    assert s.quantile_coverage == pytest.approx(2 / 3)  # 20 > 19
    assert s.quantile_mape == pytest.approx((0.2 + 0.05 + 0.25) / 3)
    assert s.observed_p50_ms == pytest.approx(20.0)


def test_score_of_nothing_is_nan() -> None:
    empty = np.array([], dtype=np.float64)
    s = la.score(empty, empty, empty)
    assert s.n == 0
    assert math.isnan(s.mean_mape)
    assert math.isnan(s.quantile_coverage)


def _row(i: int, waiting: int = 0) -> FeatureRow:
    timing = (3.0 + i % 7, 12.0, 10 * (i % 5), i % 3)
    return FeatureRow(0.3, 100 + i, waiting, 2, 0, 0, 0.0, 0, 50, *timing)


def test_scoring_predictor_scores_only_predicted_requests_after_warmup() -> None:
    clock = ManualClock()
    settings = PredictorSettings(
        retrain_interval_s=1.0, min_samples=20, train=TrainConfig(n_estimators=5)
    )
    p = la.ScoringPredictor(clock, settings, warmup_s=5.0, max_pending=3)
    for i in range(40):
        p.observe(Sample(_row(i), ttft_ms=10.0 + i, tpot_ms=5.0))
    clock.set(2.0)
    assert p.maybe_retrain()
    assert p.ready
    assert p.ready_at == 2.0
    assert p.shadow.ready
    assert p.shadow.settings.train.objective == "mean"
    assert p.routing.settings.train.objective == "quantile"
    rows = [_row(1000), _row(1001)]
    assert p.predict(rows) is not None
    p.observe(Sample(rows[0], ttft_ms=12.0, tpot_ms=5.0))
    assert p.scored == []  # predicted during the warm-up: not scored
    clock.set(6.0)
    rows = [_row(2000 + i) for i in range(5)]
    out = p.predict(rows)
    assert out is not None
    assert len(p._pending) == 3  # bounded: the oldest candidates are dropped
    p.observe(Sample(rows[4], ttft_ms=12.0, tpot_ms=5.0))
    p.observe(Sample(rows[0], ttft_ms=12.0, tpot_ms=5.0))  # dropped: unscored
    assert p.unscored == 1
    assert len(p.scored) == 1
    ttft, tpot, q_ttft, q_tpot, m_ttft, m_tpot, a_ttft, a_tpot = p.scored[0]
    assert (ttft, tpot) == (12.0, 5.0)
    assert q_ttft == pytest.approx(float(out.ttft_ms[4]))
    assert all(math.isfinite(v) for v in (q_tpot, m_ttft, m_tpot, a_ttft, a_tpot))
    # The ablation models never see token timing.
    assert p.ablation is not None
    x = p.ablation.lanes[None].store.ttft.training_arrays()[0]
    assert set(x[:, ROW_FIELDS.index("ms_since_last_token")]) == {TOKEN_TIMING_CAP_MS}
    assert set(x[:, ROW_FIELDS.index("prompt_tokens_before_last_token")]) == {0.0}


def test_latency_accuracy_is_a_micro_benchmark() -> None:
    assert "latency-accuracy" in REPORTS
    args = build_parser().parse_args(["bench", "micro", "latency-accuracy", "--quick"])
    assert args.name == "latency-accuracy"
    assert args.quick


_PCT = r"(\d+\.\d)%"


def test_quick_report_structure_and_finite_numbers() -> None:
    text = lar.report(True, Console(quiet=True), "test machine")
    assert text.startswith("# Latency prediction accuracy\n")
    assert "sluicegate bench micro latency-accuracy --quick" in text
    assert "Machine: test machine." in text
    plan = la.Plan.quick()
    goals = text.split("## Goals", 1)[1].split("## Per load level", 1)[0]
    for case in plan.cases:
        line = next(x for x in goals.splitlines() if x.startswith(f"| {case.label} |"))
        assert len(re.findall(_PCT, line)) >= 4, line
    table = [
        line
        for line in text.split("## Per load level", 1)[1].splitlines()
        if line.startswith("| llama")
    ]
    assert len(table) == 2 * len(plan.cases) * len(plan.load_fractions)
    for line in table:
        cells = [c.strip() for c in line.strip("|").split("|")]
        assert cells[4] in ("TTFT", "TPOT")
        assert int(cells[5].replace(",", "")) > 0  # scored requests
        # p50, MAPE, median APE, coverage, quantile MAPE, MAPE without token timing
        for cell in cells[6:12]:
            value = float(cell.rstrip("%"))
            assert math.isfinite(value), line
            assert value >= 0.0, line
        coverage = float(cells[9].rstrip("%"))
        assert 0.0 <= coverage <= 100.0
        assert cells[13] != "never"  # the models were trained during the run


def test_des_uses_the_factory_and_times_tokens() -> None:
    """The run's predictor comes from ``predictor_factory``, and rows carry the token
    timing the simulated gateway observed while relaying streams."""
    seen: list[Sample] = []

    class Recording(InProcessPredictor):
        def observe(self, sample: Sample) -> None:
            seen.append(sample)
            super().observe(sample)

    picker, _ = policy_config("predicted-latency")
    spec = ClusterSpec(
        get_profile("tiny"),
        2,
        picker,
        model="tiny-llama",
        predictor="model",
        predictor_factory=Recording,
    )
    sim = ClusterSimulation(spec)
    workload = OpenLoop(
        40.0,
        3.0,
        lambda i, rng: RequestSpec("completions", "tiny-llama", 20, prompt=random_text(rng, 50)),
    )
    sim.run(workload, horizon_s=10.0)
    assert isinstance(sim.predictor, Recording)
    assert len(seen) > 50
    assert all(e.inflight.last_token_at is not None for e in sim.endpoints)
    timed = [s.row for s in seen if s.row.ms_since_last_token < TOKEN_TIMING_CAP_MS]
    assert len(timed) > len(seen) // 2  # most arrive while an endpoint streams
    assert any(r.token_interval_ms > 0 for r in timed)
    # Unanswered prompts are counted (split at the last token), and none is left over.
    assert any(s.row.prompt_tokens_after_last_token > 0 for s in seen)
    for e in sim.endpoints:
        assert (e.inflight.prompt_tokens_before_last_token, e.inflight.requests) == (0, 0)
        assert e.inflight.prompt_tokens_after_last_token == 0


def test_scoring_predictor_files_samples_per_class() -> None:
    """On a mixed pool each class gets its own models, and scored requests keep the class
    their sample was filed under."""
    clock = ManualClock()
    settings = PredictorSettings(
        retrain_interval_s=1.0, min_samples=20, train=TrainConfig(n_estimators=5)
    )
    p = la.ScoringPredictor(clock, settings, warmup_s=0.0, ablation=False)
    assert p.ablation is None
    for i in range(40):
        p.observe(Sample(_row(i), ttft_ms=10.0 + i, tpot_ms=5.0, hardware_class="fast"))
        p.observe(Sample(_row(i), ttft_ms=30.0 + 3 * i, tpot_ms=15.0, hardware_class="slow"))
    clock.set(2.0)
    assert p.maybe_retrain()
    assert set(p.routing.lanes) == {"fast", "slow"}
    rows = [_row(3000), _row(3001)]
    out = p.predict(rows, ["fast", "slow"])
    assert out is not None
    assert out.ttft_ms[1] > out.ttft_ms[0]  # the slow class's own model
    p.observe(Sample(rows[1], ttft_ms=40.0, tpot_ms=15.0, hardware_class="slow"))
    assert p.scored_classes == ["slow"]
    assert p.scored_rows == [rows[1]]
    assert math.isnan(p.scored[0][6])  # no ablation


def test_mixed_case_names_each_replica() -> None:
    case = la.MIXED_CASE
    assert case.profiles().count("llama3-8b-h100") == 2
    assert case.profiles().count("llama3-8b-a100") == 4
    assert case.label == "2 × llama3-8b-h100 + 4 × llama3-8b-a100"
    with pytest.raises(ValueError, match="replicas"):
        la.Case("x", "m", 3, 1.0, mix=(("a", 1), ("b", 1))).profiles()


def test_quick_precise_section() -> None:
    """The precise section routes on the precise producer, and diagnoses its levels."""
    assert all(c.policy == "predicted-latency-precise" for c in la.Plan.precise().cases)
    text = lar.report_precise(True, Console(quiet=True), "test machine")
    assert text.startswith("## With the servers' cached tokens")
    assert "sluicegate bench micro latency-accuracy-precise --quick" in text
    rows = [x for x in text.splitlines() if x.startswith("| llama3-8b-h100 |")]
    assert len(rows) == len(la.Plan.precise(True).load_fractions)
    for line in rows:
        assert len(re.findall(_PCT, line)) >= 9, line


def test_quick_mixed_section() -> None:
    """The mixed section scores each class; it is a section of the latency-accuracy file."""
    mixed = lar.report_mixed(True, Console(quiet=True), "test machine")
    lines = [x for x in mixed.splitlines() if x.startswith(f"| {la.MIXED_CASE.label} |")]
    assert {line.split("|")[4].strip() for line in lines} == {"h100-80gb", "a100-80gb"}
    for line in lines:
        assert len(re.findall(_PCT, line)) >= 4, line
    merged = merge_report(
        merge_report(None, "latency-accuracy", "# Latency prediction accuracy\n"),
        "latency-accuracy-mixed",
        mixed,
    )
    assert merge_report(merged, "latency-accuracy", "# new\n").count("## A mixed pool") == 1


def test_scoring_predictor_keeps_each_class_s_prediction_of_an_identical_row() -> None:
    """Two idle endpoints of different classes have equal feature rows: the sample of the
    one chosen is scored against its own class's prediction, not the other's."""
    clock = ManualClock()
    settings = PredictorSettings(
        retrain_interval_s=1.0, min_samples=20, train=TrainConfig(n_estimators=5)
    )
    p = la.ScoringPredictor(clock, settings, warmup_s=0.0, ablation=False)
    for i in range(40):
        p.observe(Sample(_row(i), ttft_ms=10.0 + i, tpot_ms=5.0, hardware_class="fast"))
        p.observe(Sample(_row(i), ttft_ms=30.0 + 3 * i, tpot_ms=15.0, hardware_class="slow"))
    clock.set(2.0)
    assert p.maybe_retrain()
    row = _row(3000)
    out = p.predict([row, row], ["fast", "slow"])
    assert out is not None
    assert out.ttft_ms[1] > out.ttft_ms[0]
    p.observe(Sample(row, ttft_ms=12.0, tpot_ms=5.0, hardware_class="fast"))
    assert p.scored[0][2] == pytest.approx(float(out.ttft_ms[0]))  # the fast class's
    p.observe(Sample(row, ttft_ms=40.0, tpot_ms=15.0, hardware_class="slow"))
    assert p.scored[1][2] == pytest.approx(float(out.ttft_ms[1]))  # the slow class's
