"""``sluicegate sim calibrate`` against ``sluicegate sim`` processes with a known profile:
the fit recovers the profile's step times, and the profile it writes loads in ``sim
--profile-file`` and ``bench run --profile-file`` and reproduces them."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import subprocess
import sys
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import aiohttp
import pytest
from test_sim_cli import free_port_pair, sluicegate_command, wait_until_serving

from sluicegate.cli import main
from sluicegate.sim.calibrate import CalibrateOptions, calibrate, fit_profile, predict
from sluicegate.sim.calibrate.client import Target
from sluicegate.sim.calibrate.probes import Point, Prober
from sluicegate.sim.profile_file import dump_profile, load_profile_file, parse_profile
from sluicegate.sim.profiles import LinearOpsCurve, get_profile

# Step times of 4–55 ms: long beside the shared test machine's timer jitter, short enough
# that the whole calibration takes seconds. Every term of the step time is non-zero, the
# per-sequence cost (1.6 ms at 32 sequences) and the per-request overhead outside the
# iterations included (a tiny model on CPU is dominated by such costs).
KNOWN = """
name: known
model_name: known-model
base: llama3-8b-h100
num_gpu_blocks: 3000
linear_ops:
  points: [[1, 4.0], [64, 5.0], [512, 14.0], [4096, 80.0]]
attention_fixed_ms_per_layer: 0.02
memory_bandwidth_bytes_per_s: 1.0e12
attention_flops_per_s: 1.0e14
step_overhead_ms: 0.5
step_ms_per_seq: 0.05
request_overhead_ms: 3.0
"""


# The simulator runs 4 × slower than real time: on a saturated 2-core machine a process
# wakes milliseconds late, and past 5 ms the simulator resynchronises its clock (its steps
# then really are longer); at 4 wall seconds per simulated second such lateness weighs 4 ×
# less in the step times measured (at 1, decode steps came out 12–16 % long at load 11).
TIME_SCALE = 4.0


@asynccontextmanager
async def sim_process(profile_file: Path) -> AsyncIterator[str]:
    """``sluicegate sim --profile-file`` as a process (its own core, when there is one)."""
    port = free_port_pair()
    args = ["sim", "--port", str(port), "--profile-file", str(profile_file)]
    args += ["--time-scale", str(TIME_SCALE)]
    process = await asyncio.create_subprocess_exec(
        *sluicegate_command(),
        "--log-level",
        "warning",
        *args,
        "--histogram-max-age",
        "0",
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        async with aiohttp.ClientSession() as http:
            await wait_until_serving(http, [url], process)
        yield url
    finally:
        process.terminate()
        await process.wait()


def _within(fitted: float, known: float, tol: float) -> bool:
    return abs(fitted - known) <= tol * known


@pytest.mark.timeout(90)
async def test_calibrate_recovers_a_known_profile_and_round_trips(tmp_path: Path) -> None:
    known_file = tmp_path / "known.yaml"
    known_file.write_text(KNOWN)
    known = load_profile_file(known_file)
    async with sim_process(known_file) as url:
        result = await calibrate(
            CalibrateOptions(
                target=url,
                batch_sizes=(1, 8, 32),
                max_num_seqs=64,
                max_num_batched_tokens=8192,
                budget_s=60,
                decode_tokens=32,
                passes=1,
                time_scale=TIME_SCALE,
            )
        )
    print("\n" + result.table())  # the fit's error per point (pytest -s shows it)
    print(f"fixed: {result.fit.fixed}; o {result.fit.o_ms:.3f} ms; notes: {result.notes}")
    kinds = {p.kind for p in result.points}
    assert kinds == {"prefill", "cached-prefill", "decode", "mixed"}, result.notes
    fitted = result.fit.profile
    # The KV cache is the server's (vllm:cache_config_info), the limits what we stated.
    assert (fitted.num_gpu_blocks, fitted.block_size) == (3000, 16)
    assert (fitted.max_num_seqs, fitted.max_model_len) == (64, known.max_model_len)
    off = [
        f"{p.label}: known {predict(known, p):.3f} ms, fitted {predict(fitted, p):.3f} ms"
        for p in result.points
        if not _within(predict(fitted, p), predict(known, p), 0.10)
    ]
    assert not off, "\n".join(off)
    # The per-request overhead outside the iterations: the server's TTFT minus prefill time.
    assert _within(fitted.request_overhead_ms, known.request_overhead_ms, 0.10)
    assert any(p.source == "server" for p in result.points if p.kind == "decode")
    # The printed error per point is the fit's against what was measured.
    table = result.table()
    assert all(p.label in table for p in result.points)
    assert all(abs(err) <= 0.10 for _, _, err in result.errors())

    # Round trip: the written file reads back to the same profile ...
    out = tmp_path / "calibrated.yaml"
    out.write_text(dump_profile(fitted, result.document()))
    assert load_profile_file(out) == fitted
    # ... and a simulator started with it runs the fitted step times.
    async with sim_process(out) as url, aiohttp.ClientSession() as http:
        prober = Prober(Target(http, url, 30.0), fitted.model_name, TIME_SCALE)
        prefill = await prober.prefill(512, 3)
        decode = (await prober.decode(8, 1024, 48))[0]
    assert prefill is not None
    assert prefill.source == "server"
    assert _within(prefill.measured_ms, fitted.prefill_ms(512), 0.01)
    assert _within(decode.measured_ms, predict(fitted, decode), 0.10)


def test_bench_run_uses_the_profile_file(tmp_path: Path) -> None:
    profile = parse_profile(KNOWN)
    path = tmp_path / "p.yaml"
    path.write_text(dump_profile(profile))
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "sluicegate", "--log-level", "warning", "bench", "run"]
    cmd += ["multi-turn-chat", "--quick", "--policies", "random", "--qps", "1"]
    cmd += ["--duration", "3", "--profile-file", str(path), "--out", str(out)]
    subprocess.run(cmd, check=True, capture_output=True, timeout=120)
    results = json.loads((out / "results.json").read_text())
    assert results["pool"]["profile"] == "known"
    # HTTP mode: the simulator processes load the same profile (as a profile file).
    http = [*cmd[:-1], str(tmp_path / "http"), "--mode", "http", "--time-scale", "0.25"]
    subprocess.run(http, check=True, capture_output=True, timeout=120)
    results = json.loads((tmp_path / "http" / "results.json").read_text())
    assert results["mode"] == "http"
    assert results["pool"]["profile"] == "known"
    (run,) = results["runs"]
    assert run["metrics"]["completed"] == run["metrics"]["requests"] > 0
    # A bad file is refused before the run, naming the field.
    path.write_text("base: tiny\nmax_num_seqs: 0\n")
    bad = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2
    assert "max_num_seqs" in bad.stderr


@pytest.mark.parametrize(
    ("flag", "value"),
    [
        ("--max-num-seqs", "0"),
        ("--max-num-batched-tokens", "0"),
        ("--max-num-seqs", "-3"),
        ("--budget-s", "nan"),
        ("--time-scale", "0"),
    ],
)
def test_calibrate_refuses_a_non_positive_option(
    flag: str, value: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Refused before any probe (the target does not exist), with exit status 2."""
    out = tmp_path / "p.yaml"
    argv = ["sim", "calibrate", "--target", "http://127.0.0.1:9", "--out", str(out)]
    with pytest.raises(SystemExit) as exit_:
        main([*argv, flag, value])
    assert exit_.value.code == 2
    assert f"{flag} must be a positive number, got" in capsys.readouterr().err
    assert not out.exists()


def _synthetic(profile_points: Callable[[Point], float], points: list[Point]) -> list[Point]:
    return [
        Point(
            p.kind,
            p.batched_tokens,
            p.decode_seqs,
            p.decode_context,
            p.chunks,
            profile_points(p),
            1,
            "x",
        )
        for p in points
    ]


SHAPES = [
    Point("prefill", 1, 0, 0, ((1, 0),), 0, 1, ""),
    Point("prefill", 8, 0, 0, ((8, 0),), 0, 1, ""),
    Point("prefill", 32, 0, 0, ((32, 0),), 0, 1, ""),
    Point("prefill", 512, 0, 0, ((512, 0),), 0, 1, ""),
    Point("prefill", 2048, 0, 0, ((2048, 0),), 0, 1, ""),
    Point("cached-prefill", 512, 0, 0, ((512, 2048),), 0, 1, ""),
    Point("decode", 1, 1, 100, (), 0, 1, ""),
    Point("decode", 8, 8, 8 * 300, (), 0, 1, ""),
    Point("decode", 32, 32, 32 * 60, (), 0, 1, ""),
    Point("decode", 32, 32, 32 * 1000, (), 0, 1, ""),
    Point("mixed", 512, 32, 32 * 60, ((480, 0),), 0, 1, ""),
]


def test_fit_recovers_exact_step_times_and_parameters() -> None:
    known = parse_profile(KNOWN)
    points = _synthetic(lambda p: predict(known, p), SHAPES)
    fit = fit_profile(points, get_profile("llama3-8b-h100"))
    # no first-token latency beyond the steps in these points: o fits to 0 (or is dropped)
    assert set(fit.fixed) <= {"o"}
    assert fit.o_ms == pytest.approx(0.0, abs=1e-9)
    for p in points:
        assert predict(fit.profile, p) == pytest.approx(p.measured_ms, rel=1e-6)
    assert fit.profile.memory_bandwidth_bytes_per_s == pytest.approx(1e12, rel=1e-6)
    assert fit.profile.attention_flops_per_s == pytest.approx(1e14, rel=1e-6)
    # Overhead and the decode constant are folded as documented: LIN carries the overhead.
    assert fit.profile.step_overhead_ms == 0.0
    assert fit.f_ms == pytest.approx(32 * 0.02, rel=1e-6)
    assert fit.profile.step_ms_per_seq == pytest.approx(0.05, rel=1e-6)


def test_fit_separates_a_first_token_latency_from_the_steps() -> None:
    """A server whose prefill times (to the first token) run 2 ms past the iteration, as
    vLLM's on CPU do: o carries the 2 ms, the step terms stay the profile's, and the
    per-request overhead is o plus the measured TTFT-minus-prefill time."""
    known = parse_profile(KNOWN)
    points = _synthetic(lambda p: predict(known, p) + (2.0 if p.first_token else 0.0), SHAPES)
    fit = fit_profile(points, get_profile("llama3-8b-h100"), request_overhead_ms=1.5)
    assert fit.fixed == ()
    assert fit.o_ms == pytest.approx(2.0, rel=1e-6)
    assert fit.profile.request_overhead_ms == pytest.approx(3.5, rel=1e-6)
    for p in points:
        assert predict(fit.profile, p) == pytest.approx(predict(known, p), rel=1e-6)
        assert fit.predict_ms(p) == pytest.approx(p.measured_ms, rel=1e-6)


@pytest.mark.parametrize("low", [3, 8], ids=lambda i: SHAPES[i].label)
def test_a_noisy_point_never_fits_a_negative_step_time(low: int) -> None:
    """A CPU-like server (linear ops near 0, 0.3 ms per sequence, 3 ms first-token
    latency) with one point measured 10 % low: the unconstrained least squares puts LIN
    below 0 at some knots. The fit keeps every knot at or above 0, so the profile's step
    times are durations and the file it writes loads."""
    cpu = dataclasses.replace(
        parse_profile(KNOWN),
        linear_ops=LinearOpsCurve.affine(0.05, 0.001),
        step_ms_per_seq=0.3,
    )
    shape = SHAPES[low]

    def measured(p: Point) -> float:
        ms = predict(cpu, p) + (3.0 if p.first_token else 0.0)
        return ms * 0.9 if p is shape else ms

    points = _synthetic(measured, SHAPES)
    fit = fit_profile(points, get_profile("llama3-8b-h100"))
    assert min(fit.lin_ms) >= 0.0, fit.lin_ms
    for p in points:
        assert predict(fit.profile, p) >= 0.0
        assert _within(fit.predict_ms(p), p.measured_ms, 0.15), p.label
    parse_profile(dump_profile(fit.profile))  # what `sim calibrate --out` writes loads


def test_fit_fixes_terms_the_points_cannot_tell_apart() -> None:
    known = parse_profile(KNOWN)
    no_cached = [p for p in SHAPES if p.kind != "cached-prefill" and p.kind != "mixed"]
    no_cached = [p for p in no_cached if not (p.kind == "prefill" and p.batched_tokens != 32)]
    fit = fit_profile(_synthetic(lambda p: predict(known, p), no_cached), known)
    # b (prefill attention) rides on the LIN knots alone: fixed at 0, the fit still exact.
    assert "b" in fit.fixed
    assert fit.profile.attention_flops_per_s == 1e30
    for p in no_cached:
        assert predict(fit.profile, p) == pytest.approx(predict(known, p), rel=1e-6)
