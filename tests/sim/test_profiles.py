"""Hardware/model profiles and the step-time function (``sluicegate.sim.profiles``).

Expected numbers are hard-coded, computed independently of the code: linear-op times from
vidur's published profiles (``data/profiling/compute/{h100,a100}/meta-llama/*/mlp.csv``,
https://github.com/microsoft/vidur at 7d475133), step and prefill times worked out by hand from the
iteration model and constants in docs/simulator.md, so the profiles are checked against a
reference, not against themselves.
"""

from __future__ import annotations

import csv
import dataclasses
from importlib import resources

import pytest

from sluicegate.sim.profiles import (
    PROFILES,
    EngineProfile,
    LinearOpsCurve,
    get_profile,
    kv_blocks_for,
)

REL = 0.10  # the issue asks for 10 % agreement with the reference numbers

# Linear ops (32 layers, TP=1, ms per iteration) vs tokens in the batch n, from vidur's mlp.csv
# (H100 Llama-3-8B estimated: H100 Llama-2-7B × the A100 Llama-3-8B / Llama-2-7B ratio).
LINEAR_N = (1, 8, 32, 64, 128, 256, 512, 1024, 2048, 4096)
LINEAR_MS = {
    "llama2-7b-h100": (5.63, 5.54, 5.86, 5.92, 6.43, 9.25, 12.11, 21.25, 40.90, 84.20),
    "llama3-8b-h100": (5.88, 6.10, 6.70, 6.87, 6.92, 10.11, 12.57, 23.50, 43.99, 88.50),
    "llama2-7b-a100": (9.34, 9.12, 9.60, 9.76, 12.34, 17.94, 33.58, 68.32, 134.36, 261.68),
    "llama3-8b-a100": (9.76, 10.05, 10.98, 11.33, 13.28, 19.62, 34.85, 75.55, 144.53, 275.04),
    # vidur's a40/meta-llama/Llama-2-7b-hf/mlp.csv; Llama-3-8B estimated as on H100.
    "llama2-7b-a40": (23.97, 24.22, 26.51, 30.11, 30.37, 44.80, 71.74, 138.27, 261.94, 530.04),
    "llama3-8b-a40": (25.04, 26.69, 30.31, 34.95, 32.69, 49.00, 74.44, 152.91, 281.77, 557.10),
}
# Which calibration.csv column each profile's linear ops come from (see its header).
CALIBRATION_COLUMN = {
    "llama2-7b-h100": "h100_llama2_7b_ms",
    "llama3-8b-h100": "h100_llama3_8b_est_ms",
    "llama2-7b-a100": "a100_llama2_7b_ms",
    "llama3-8b-a100": "a100_llama3_8b_ms",
    "llama2-7b-a40": "a40_llama2_7b_ms",
    "llama3-8b-a40": "a40_llama3_8b_est_ms",
}

# Least-squares fits of vidur's linear-op times for n >= 512 (µs per token).
TAIL_SLOPE_US = {
    "llama2-7b-h100": 20.45,
    "llama3-8b-h100": 21.21,
    "llama2-7b-a100": 64.62,
    "llama3-8b-a100": 67.19,
    "llama2-7b-a40": 127.09,
    "llama3-8b-a40": 133.54,
}

# H100 decode step (ms) by batch size, per-sequence context; worked out by hand, no overhead.
DECODE_B = (1, 8, 32, 64, 128, 256)
DECODE_MS = {
    ("llama3-8b-h100", 1024): (6.3, 6.8, 8.6, 10.4, 13.6, 23.2),
    ("llama3-8b-h100", 2048): (6.3, 7.2, 10.2, 13.6, 20.0, 35.9),
    ("llama2-7b-h100", 1024): (6.2, 7.4, 12.5, 19.0, 32.2, 60.5),
    ("llama2-7b-h100", 2048): (6.3, 9.0, 18.9, 31.7, 57.7, 111.4),
    # A40: LIN(B) + 32 * (0.010 + B * 1024 * 4096 / 0.56e12 * 1e3).
    ("llama3-8b-a40", 1024): (25.6, 28.9, 38.3, 50.6, 63.7, 110.7),
}

# H100 single-request prefill (ms by prompt tokens); worked out by hand, no overhead.
PREFILL_MS = {
    "llama3-8b-h100": {128: 6.9, 512: 12.8, 1024: 24.4, 2048: 47.7, 4096: 103.2},
    "llama2-7b-h100": {128: 6.4, 512: 12.3, 1024: 22.2, 2048: 44.6, 4096: 98.9},
    # A40: LIN(n) + 4 * n * (n/2) * 4096 * 32 / 45e12 * 1e3.
    "llama3-8b-a40": {128: 32.8, 512: 76.0, 1024: 159.0, 2048: 306.2, 4096: 654.8},
}


def _calibration_rows() -> list[dict[str, float]]:
    text = resources.files("sluicegate.sim").joinpath("data/calibration.csv").read_text()
    rows = [line for line in text.splitlines() if line and not line.startswith("#")]
    return [{k: float(v) for k, v in row.items()} for row in csv.DictReader(rows)]


# ---------------------------------------------------------------- linear ops


@pytest.mark.parametrize("name", sorted(LINEAR_MS))
def test_linear_ops_reproduce_the_reference_table(name: str) -> None:
    profile = get_profile(name)
    for n, expected in zip(LINEAR_N, LINEAR_MS[name], strict=True):
        assert profile.linear_ops(n) == pytest.approx(expected, rel=REL), f"n={n}"


@pytest.mark.parametrize("name", sorted(CALIBRATION_COLUMN))
def test_linear_ops_reproduce_every_calibration_row(name: str) -> None:
    rows = _calibration_rows()
    assert len(rows) >= 30
    assert rows[-1]["num_tokens"] >= 4096
    profile = get_profile(name)
    column = CALIBRATION_COLUMN[name]
    for row in rows:
        n = row["num_tokens"]
        assert profile.linear_ops(n) == pytest.approx(row[column], rel=REL), f"n={n}"


def test_calibration_data_matches_the_reference_table() -> None:
    by_n = {int(row["num_tokens"]): row for row in _calibration_rows()}
    for name, column in CALIBRATION_COLUMN.items():
        for n, expected in zip(LINEAR_N, LINEAR_MS[name], strict=True):
            assert by_n[n][column] == pytest.approx(expected, abs=0.006), (name, n)


@pytest.mark.parametrize("name", sorted(CALIBRATION_COLUMN))
def test_linear_ops_interpolate_between_rows_and_extend_the_fit(name: str) -> None:
    profile = get_profile(name)
    lin = profile.linear_ops
    # Linear interpolation between the 1024 and 1280 rows.
    mid = (lin(1024) + lin(1280)) / 2
    assert lin(1152) == pytest.approx(mid)
    # Beyond the table the least-squares fit takes over without a jump (within 10 %) and
    # keeps growing linearly.
    last = lin(4096)
    assert lin(4097) == pytest.approx(last, rel=REL)
    assert lin(8192) > lin(6144) > last
    slope_ms_per_token = (lin(8192) - lin(6144)) / 2048
    assert lin(10240) - lin(8192) == pytest.approx(slope_ms_per_token * 2048)
    assert slope_ms_per_token * 1000 == pytest.approx(TAIL_SLOPE_US[name], rel=0.01)
    assert lin(0) == 0.0
    assert lin(-5) == 0.0
    assert lin(0.5) == pytest.approx(lin(1))


def test_affine_curve() -> None:
    curve = LinearOpsCurve.affine(1.5, 0.004)
    assert curve(0) == 0.0
    assert curve(1) == pytest.approx(1.504)
    assert curve(1000) == pytest.approx(5.5)


# ---------------------------------------------------------------- step time


@pytest.mark.parametrize(("name", "ctx"), sorted(DECODE_MS))
def test_decode_step_reproduces_the_reference_table(name: str, ctx: int) -> None:
    profile = get_profile(name)
    for batch, expected in zip(DECODE_B, DECODE_MS[name, ctx], strict=True):
        assert profile.decode_ms(batch, ctx) == pytest.approx(expected, rel=REL), f"B={batch}"


@pytest.mark.parametrize("name", sorted(PREFILL_MS))
def test_single_request_prefill_reproduces_the_reference_times(name: str) -> None:
    profile = get_profile(name)
    for tokens, expected in PREFILL_MS[name].items():
        assert profile.prefill_ms(tokens) == pytest.approx(expected, rel=REL), f"n={tokens}"


@pytest.mark.parametrize("name", sorted(PROFILES))
def test_step_time_grows_with_batch_context_and_prefill(name: str) -> None:
    p = get_profile(name)
    assert p.step_ms(0, 0, 0, 0.0) == 0.0
    for ctx in (128, 1024, 4096):
        times = [p.decode_ms(b, ctx) for b in (1, 8, 64, 256)]
        assert times == sorted(times)
        assert times[-1] > times[0]
    assert p.decode_ms(64, 2048) > p.decode_ms(64, 1024)
    # Prefill attention is quadratic: a chunk after cached context costs more than alone.
    assert p.prefill_attention_flops(512, 1024) > p.prefill_attention_flops(512, 0)
    assert p.prefill_ms(2048) > p.prefill_ms(1024) > p.prefill_ms(128)
    # Every iteration pays at least the fixed overhead.
    assert p.step_ms(1, 1, 1, 0.0) > p.step_overhead_ms > 0


def test_step_time_components() -> None:
    p = get_profile("llama3-8b-h100")
    # Decode attention: layers * (fixed + context * bytes per layer / bandwidth).
    expected_attn = 32 * (0.010 + 1000 * 4096 / 2.7e12 * 1e3)
    assert p.decode_attention_ms(4, 1000) == pytest.approx(expected_attn)
    assert p.decode_attention_ms(0, 1000) == 0.0
    # Prefill attention FLOPs: 4 * c * (p + c/2) * hidden * layers.
    assert p.prefill_attention_flops(100, 300) == pytest.approx(4 * 100 * 350 * 4096 * 32)
    flops = p.prefill_attention_flops(100, 300)
    total = p.step_ms(104, 4, 1000, flops)
    assert total == pytest.approx(
        p.linear_ops(104) + expected_attn + flops / 300e12 * 1e3 + p.step_overhead_ms
    )
    # LoRA scales the model work, not the fixed overhead.
    lora = p.step_ms(104, 4, 1000, flops, with_lora=True)
    assert lora - p.step_overhead_ms == pytest.approx(
        (total - p.step_overhead_ms) * p.lora_step_factor
    )


def test_tiny_profile_is_a_fast_toy() -> None:
    p = get_profile("tiny")
    assert 1.0 < p.decode_ms(1, 100) < 3.0
    assert 1.0 < p.decode_ms(16, 500) < 3.0
    assert p.kv_capacity_tokens == 8192
    assert p.max_num_seqs == 16
    assert p.max_loras == 2


# ---------------------------------------------------------------- capacity and limits


def test_kv_capacity_matches_the_derivation() -> None:
    # Worked out by hand from llm-d-benchmark's measured vLLM memory split (docs/simulator.md):
    # Llama-3-8B at utilisation 0.92 holds about 433,900 tokens; Llama-2-7B about 6,950
    # blocks (its weights taken as 12.55 GiB, utilisation 0.9).
    l3 = get_profile("llama3-8b-h100")
    assert l3.kv_capacity_tokens == pytest.approx(433_900, rel=0.01)
    assert l3.kv_bytes_per_token == 131_072
    l2 = get_profile("llama2-7b-h100")
    assert l2.num_gpu_blocks == pytest.approx(6_950, rel=0.05)
    assert l2.kv_bytes_per_token == 524_288
    for name in ("llama3-8b-a100", "llama2-7b-a100"):
        a100 = get_profile(name)
        h100 = get_profile(name.replace("a100", "h100"))
        assert a100.num_gpu_blocks == h100.num_gpu_blocks


def test_a40_kv_capacity_matches_the_derivation() -> None:
    # (44.99 GiB * 0.92 - 14.99 - 4.76 - 0.13) / (128 KiB * 16) = 21.51 GiB / 2 MiB.
    assert get_profile("llama3-8b-a40").num_gpu_blocks == pytest.approx(11_013, abs=2)


@pytest.mark.parametrize(
    ("name", "accelerator", "cost"),
    [
        ("llama3-8b-h100", "h100-80gb", 3.95),
        ("llama3-8b-a100", "a100-80gb", 2.50),
        ("llama3-8b-a100-40gb", "a100-40gb", None),
        ("llama3-8b-a40", "a40-48gb", None),
        ("tiny", None, None),
    ],
)
def test_profiles_name_their_hardware_class_and_price(
    name: str, accelerator: str | None, cost: float | None
) -> None:
    p = get_profile(name)
    assert (p.accelerator, p.cost_per_hour) == (accelerator, cost)


def test_kv_blocks_for() -> None:
    per_token = 131_072
    blocks = kv_blocks_for(80, 0.9, 8, per_token)
    assert blocks == int((80 * 0.9 - 8) * 1024**3 // (per_token * 16))
    assert kv_blocks_for(80, 0.9, 8, per_token, block_size=32) == blocks // 2


@pytest.mark.parametrize(
    ("name", "max_seqs", "max_batched"),
    [
        # vLLM 0.32.0 `vllm serve` defaults (vllm/engine/arg_utils.py): H100 1024 / 8192,
        # A100 256 / 2048.
        ("llama2-7b-h100", 1024, 8192),
        ("llama3-8b-h100", 1024, 8192),
        ("llama2-7b-a100", 256, 2048),
        ("llama3-8b-a100", 256, 2048),
        ("llama3-8b-a40", 256, 2048),  # < 70 GiB: the small defaults
    ],
)
def test_scheduler_limits_follow_vllm_defaults(name: str, max_seqs: int, max_batched: int) -> None:
    p = get_profile(name)
    assert p.max_num_seqs == max_seqs
    assert p.max_num_batched_tokens == max_batched
    assert p.block_size == 16
    assert p.gpu_memory_utilization == pytest.approx(0.92)


@pytest.mark.parametrize("name", sorted(PROFILES))
def test_profiles_are_self_consistent(name: str) -> None:
    p = get_profile(name)
    assert p.name == name
    assert isinstance(p, EngineProfile)
    assert p.num_gpu_blocks > 0
    assert p.max_model_len <= p.kv_capacity_tokens
    assert p.max_num_batched_tokens >= p.block_size
    assert p.max_loras >= 1


def test_get_profile_unknown_name_lists_known_profiles() -> None:
    with pytest.raises(KeyError, match="llama3-8b-h100") as info:
        get_profile("gpt-9")
    assert "gpt-9" in str(info.value)
    assert "tiny" in str(info.value)


def test_profiles_are_immutable_but_replaceable() -> None:
    p = get_profile("tiny")
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.num_gpu_blocks = 1  # type: ignore[misc]
    small = dataclasses.replace(p, num_gpu_blocks=32)
    assert small.kv_capacity_tokens == 512
    assert get_profile("tiny").num_gpu_blocks == 512
