"""Profile files: every built-in profile round-trips, bad files are refused naming the
field, and ``sluicegate sim --profile-file`` refuses a bad one at start."""

from __future__ import annotations

import dataclasses
import hashlib
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from sluicegate.sim.profile_file import (
    ProfileFileError,
    dump_profile,
    load_profile_file,
    materialise,
    parse_profile,
)
from sluicegate.sim.profiles import PROFILES


@pytest.mark.parametrize("name", sorted(PROFILES))
def test_every_built_in_profile_round_trips(name: str) -> None:
    assert parse_profile(dump_profile(PROFILES[name])) == PROFILES[name]


def test_base_fills_what_the_file_leaves_out() -> None:
    p = parse_profile("base: tiny\nname: t\nmax_num_seqs: 4\nlinear_ops: {points: [[1, 2]]}")
    assert p.max_num_seqs == 4
    assert p.num_gpu_blocks == PROFILES["tiny"].num_gpu_blocks
    # one point: flat beyond it as below it
    assert p.linear_ops(1) == p.linear_ops(5000) == 2.0


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("base: tiny\nmax_num_seqs: 0", "max_num_seqs: Input should be greater than or equal"),
        ("base: tiny\nmax_num_sqs: 4", "max_num_sqs: Extra inputs are not permitted"),
        ("base: nope", "base: unknown profile 'nope'"),
        ("name: x\nmodel_name: m", "missing field(s) linear_ops, num_layers"),
        ("base: tiny\nlinear_ops: {points: [[8, 1], [4, 2]]}", "strictly increasing"),
        ("base: tiny\nlinear_ops: {}", "linear_ops: linear_ops needs points"),
        ("- 1", "expected a mapping"),
        ("base: [", "not YAML"),
    ],
)
def test_bad_files_name_the_field(text: str, message: str) -> None:
    with pytest.raises(ProfileFileError, match=message.replace("(", r"\(").replace(")", r"\)")):
        parse_profile(text)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "linear_ops: {points: [[1, 2]], tail_intercept_ms: .nan}",
            "tail_intercept_ms: Input should be a finite",
        ),
        ("linear_ops: {points: [[1, .inf]]}", "linear_ops.points.0.1: Input should be a finite"),
        ("linear_ops: {points: [[.nan, 1]]}", "linear_ops.points.0.0: Input should be a finite"),
        (
            "linear_ops: {points: [[1, -1]]}",
            "linear_ops.points.0.1: Input should be greater than or equal to 0",
        ),
        (
            "linear_ops: {points: [[1, 2]], tail_slope_ms_per_token: .inf}",
            "tail_slope_ms_per_token: Input should be a finite",
        ),
        (
            "linear_ops: {points: [[1, 2]], tail_intercept_ms: -100}",
            "tail line is negative at 1 tokens",
        ),
        (
            "linear_ops: {tail_intercept_ms: -1, tail_slope_ms_per_token: 1}",
            "tail line is negative at 0 tokens",
        ),
        (
            "memory_bandwidth_bytes_per_s: .inf",
            "memory_bandwidth_bytes_per_s: Input should be a finite",
        ),
        (
            "memory_bandwidth_bytes_per_s: 0",
            "memory_bandwidth_bytes_per_s: Input should be greater than 0",
        ),
        ("attention_flops_per_s: .nan", "attention_flops_per_s: Input should be a finite"),
        ("step_overhead_ms: -1", "step_overhead_ms: Input should be greater than or equal to 0"),
        ("lora_load_ms: .inf", "lora_load_ms: Input should be a finite"),
        ("cost_per_hour: .nan", "cost_per_hour: Input should be a finite"),
    ],
)
def test_non_finite_and_negative_numbers_are_refused(text: str, message: str) -> None:
    """NaN, infinity or a negative time would make the simulator's clock NaN or go back."""
    with pytest.raises(ProfileFileError, match=message):
        parse_profile("base: tiny\n" + text)


def test_a_negative_intercept_is_accepted_when_the_tail_starts_above_zero() -> None:
    p = parse_profile(
        "base: tiny\nlinear_ops: {points: [[1, 2], [10, 3]], tail_intercept_ms: -1,"
        " tail_slope_ms_per_token: 1}"
    )
    assert p.linear_ops(4096) == 4095.0


def test_a_missing_file_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ProfileFileError, match="cannot read"):
        load_profile_file(tmp_path / "none.yaml")


def test_sim_refuses_a_bad_profile_file_at_start(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("base: tiny\nblock_size: -1\n")
    run = subprocess.run(
        [sys.executable, "-m", "sluicegate", "sim", "--profile-file", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 2
    assert "block_size" in run.stderr


def test_materialise_writes_a_private_file_and_follows_no_planted_symlink(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Someone who can write the temporary folder plants symlinks at every name a
    predictable scheme would use; materialise must neither write through them nor reuse them."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setattr("sluicegate.sim.profile_file._private_dir", None)
    profile = dataclasses.replace(PROFILES["tiny"], name="custom", num_layers=3)
    text = dump_profile(profile)
    digest = hashlib.sha256(text.encode()).hexdigest()[:16]
    victim = tmp_path / "victim"
    victim.write_text("precious")
    for name in (
        f"sluicegate-profile-{digest}.yaml",
        f"sluicegate-profile-{digest}.{digest}.tmp",
        f"profile-{digest}.yaml",
    ):
        (tmp_path / name).symlink_to(victim)
    path = materialise(profile)
    assert victim.read_text() == "precious"
    assert not path.is_symlink()
    assert path.read_text() == text
    assert load_profile_file(path) == profile
    folder = path.parent
    assert folder.parent == tmp_path
    assert folder.name.startswith("sluicegate-profiles-")
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    # the same profile reuses its file; a file swapped for a symlink is replaced, not followed
    assert materialise(profile) == path
    path.unlink()
    path.symlink_to(victim)
    assert materialise(profile) == path
    assert victim.read_text() == "precious"
    assert not path.is_symlink()
