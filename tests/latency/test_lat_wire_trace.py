"""JSON rows and samples, the trace format, and ``sluicegate predictor train``."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from lat_support import random_rows, samples

from sluicegate.cli import main
from sluicegate.latency.features import (
    FEATURE_NAMES,
    REUSE_DISTANCE_CAP_TOKENS,
    TOKEN_TIMING_CAP_MS,
    FeatureRow,
    Sample,
    feature_matrix,
    token_timing,
)
from sluicegate.latency.model import ModelBundle
from sluicegate.latency.trace import TraceError, TraceWriter, read_trace
from sluicegate.latency.wire import (
    FieldError,
    matrix_from_json,
    row_from_json,
    row_to_json,
    sample_from_json,
    sample_to_json,
)

REFERENCE_BODY: dict[str, Any] = {
    # What the reference EPP client sends (llm-d-router's types.go,
    # https://github.com/llm-d/llm-d-router/blob/ebab6879/pkg/epp/framework/plugins/requestcontrol/dataproducer/predictedlatency/latencypredictorclient/types.go).
    "kv_cache_percentage": 0.42,
    "input_token_length": 1830,
    "num_request_waiting": 2,
    "num_request_running": 17,
    "num_tokens_generated": 1,
    "prefix_cache_score": 0.75,
    "encoder_input_size": 0,
    "encoder_matched_size": 0,
    "pod_type": "",
    "prefill_tokens_in_flight": 4096,
    "decode_tokens_in_flight": 3100,
}


def test_reference_bodies_are_accepted_with_defaults_for_our_fields() -> None:
    row = row_from_json(REFERENCE_BODY)
    assert row == FeatureRow(0.42, 1830, 2, 17, 4096, 3100, 0.75, 0, 0)
    assert isinstance(row.input_token_length, int)
    assert row.prompt_tokens_before_last_token == row.prompt_tokens_after_last_token == 0
    assert row.prefix_reuse_distance_tokens == REUSE_DISTANCE_CAP_TOKENS  # never sent


def test_reuse_distance_is_a_count_capped_at_its_cap() -> None:
    near = row_from_json({**REFERENCE_BODY, "prefix_reuse_distance_tokens": 640.0})
    assert near.prefix_reuse_distance_tokens == 640
    far = row_from_json({**REFERENCE_BODY, "prefix_reuse_distance_tokens": 10**12})
    assert far.prefix_reuse_distance_tokens == REUSE_DISTANCE_CAP_TOKENS
    with pytest.raises(FieldError, match="prefix_reuse_distance_tokens: must be non-negative"):
        row_from_json({**REFERENCE_BODY, "prefix_reuse_distance_tokens": -1})


def test_token_timing_fields_default_validate_and_cap() -> None:
    row = row_from_json(REFERENCE_BODY)
    assert (row.ms_since_last_token, row.token_interval_ms) == (TOKEN_TIMING_CAP_MS, 0.0)
    timed = row_from_json({**REFERENCE_BODY, "ms_since_last_token": 3.5, "token_interval_ms": 5e6})
    assert (timed.ms_since_last_token, timed.token_interval_ms) == (3.5, TOKEN_TIMING_CAP_MS)
    for bad in (-1.0, float("inf"), "3"):
        with pytest.raises(FieldError, match="ms_since_last_token"):
            row_from_json({**REFERENCE_BODY, "ms_since_last_token": bad})


def test_rows_round_trip_and_match_the_feature_matrix() -> None:
    rows = random_rows(25, seed=1)
    assert [row_from_json(row_to_json(r)) for r in rows] == rows
    x = matrix_from_json([row_to_json(r) for r in rows])
    assert np.array_equal(x, feature_matrix(rows))
    assert matrix_from_json([]).shape == (0, len(FEATURE_NAMES))


@pytest.mark.parametrize(
    ("change", "field", "message"),
    [
        ({"kv_cache_percentage": None}, "kv_cache_percentage", "is required"),
        ({"prefix_cache_score": 1.5}, "prefix_cache_score", "fraction in [0, 1]"),
        ({"num_request_waiting": -1}, "num_request_waiting", "non-negative"),
        ({"num_request_running": 2.5}, "num_request_running", "whole number"),
        ({"input_token_length": "12"}, "input_token_length", "must be a number, got str"),
        ({"decode_tokens_in_flight": True}, "decode_tokens_in_flight", "got bool"),
        ({"expected_output_tokens": [1]}, "expected_output_tokens", "got list"),
    ],
)
def test_bad_fields_are_named(change: dict[str, Any], field: str, message: str) -> None:
    body = {**REFERENCE_BODY, **change}
    body = {k: v for k, v in body.items() if v is not None}
    with pytest.raises(FieldError, match=re.escape(message)) as info:
        row_from_json(body)
    assert info.value.field == field
    with pytest.raises(FieldError) as located:
        matrix_from_json([REFERENCE_BODY, body])
    assert located.value.field == f"requests[1].{field}"


def test_whole_floats_count_as_counts() -> None:
    row = row_from_json({**REFERENCE_BODY, "num_request_waiting": 3.0})
    assert row.num_request_waiting == 3
    assert type(row.num_request_waiting) is int


def test_samples_round_trip_and_accept_reference_time_names() -> None:
    for s in samples(10, seed=2):
        assert sample_from_json(sample_to_json(s)) == s
    s = sample_from_json({**REFERENCE_BODY, "actual_ttft_ms": 120.5, "actual_tpot_ms": 0})
    assert s.ttft_ms == 120.5
    assert s.tpot_ms is None  # 0: not observed (non-streaming)
    with pytest.raises(FieldError, match="ttft_ms"):
        sample_from_json({**REFERENCE_BODY, "ttft_ms": -3})
    only = sample_to_json(Sample(random_rows(1)[0], 5.0, None))
    assert "tpot_ms" not in only


def test_trace_round_trip(tmp_path: Path) -> None:
    batch = samples(50, seed=3)
    path = tmp_path / "deep" / "trace.jsonl"
    with TraceWriter(path) as writer:
        writer.write_all(batch[:20])
    with TraceWriter(path) as writer:  # appends
        for s in batch[20:]:
            writer.write(s)
        assert writer.written == 30
    writer.write(batch[0])  # closed: ignored
    assert list(read_trace(path)) == batch
    with TraceWriter(path, append=False) as writer:
        writer.write(batch[0])
    assert list(read_trace(path)) == batch[:1]


def test_bad_trace_lines_name_file_line_and_field(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    good = sample_to_json(samples(1)[0])
    path.write_text(
        "\n".join(
            [
                json.dumps(good),
                "",
                json.dumps({**good, "prefix_cache_score": 2}),
            ]
        )
    )
    with pytest.raises(TraceError, match=r"t\.jsonl:3: prefix_cache_score: must be a fraction"):
        list(read_trace(path))
    path.write_text("{nope\n")
    with pytest.raises(TraceError, match=r":1: not JSON"):
        list(read_trace(path))


def test_cli_trains_from_a_trace(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = tmp_path / "trace.jsonl"
    with TraceWriter(trace) as writer:
        writer.write_all(samples(1500, seed=4, sigma=0.1))
    out = tmp_path / "models"
    with pytest.raises(SystemExit) as exit_info:
        main(
            [
                "predictor",
                "train",
                "--trace",
                str(trace),
                "--out",
                str(out),
                "--n-estimators",
                "30",
                "--objective",
                "mean",
            ]
        )
    assert exit_info.value.code == 0
    bundle = ModelBundle.load(out)
    assert bundle.objective == "mean"
    assert bundle.ttft.samples > 1200
    assert bundle.ttft.booster.num_boosted_rounds() == 30
    err = capsys.readouterr().err
    assert "TTFT:" in err
    assert "MAPE" in err


def test_cli_train_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    def run(*args: str) -> int:
        with pytest.raises(SystemExit) as info:
            main(["predictor", "train", *args])
        code = info.value.code
        assert isinstance(code, int)
        return code

    assert run("--trace", str(tmp_path / "missing.jsonl"), "--out", str(tmp_path / "o")) == 2
    assert "missing.jsonl" in capsys.readouterr().err
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    assert run("--trace", str(empty), "--out", str(tmp_path / "o")) == 1
    assert "0 TTFT training samples" in " ".join(capsys.readouterr().err.split())
    assert run("--trace", str(empty), "--out", str(tmp_path / "o"), "--alpha", "1.5") == 2
    assert "alpha" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["train-server", "--retrain-interval", "0"], "--retrain-interval must be positive"),
        (["train-server", "--min-samples", "0"], "--min-samples must be at least 1"),
        (["train-server", "--objective", "mean", "--alpha", "0"], "alpha"),
        (["predict-server", "--training-server", "ftp://x"], "http(s) URL"),
        (["predict-server", "--training-server", "http://x", "--sync-interval", "0"], "positive"),
    ],
)
def test_cli_server_argument_errors(
    args: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as info:
        main(["predictor", *args])
    assert info.value.code == 2
    assert message in " ".join(capsys.readouterr().err.split())


def test_token_timing_is_relative_and_capped() -> None:
    assert token_timing(None, 0.0, 5.0) == (TOKEN_TIMING_CAP_MS, 0.0)
    since, interval = token_timing(10.0, 0.012, 10.004)
    assert since == pytest.approx(4.0)
    assert interval == pytest.approx(12.0)
    assert token_timing(1.0, 3.0, 100.0) == (TOKEN_TIMING_CAP_MS, TOKEN_TIMING_CAP_MS)
    assert token_timing(10.0, 0.0, 9.0)[0] == 0.0  # a clock behind the token: not negative
