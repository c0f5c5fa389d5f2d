"""Engine profiles as YAML files (``sluicegate sim --profile-file``, ``bench run
--profile-file``, written by ``sluicegate sim calibrate``).

A file holds exactly the parameters of :class:`~sluicegate.sim.profiles.EngineProfile`, under
the same names (the scheduler limits are vLLM's option names), and the linear-op curve as
``(tokens, ms)`` points::

    name: my-gpu
    model_name: meta-llama/Llama-3.1-8B
    base: llama3-8b-h100        # optional: fields left out come from this built-in profile
    num_gpu_blocks: 20000
    linear_ops:
      points: [[1, 5.9], [512, 14.7], [2048, 48.0]]
      tail_slope_ms_per_token: 0.0213   # optional: beyond the last point (default: the
      tail_intercept_ms: 4.5            #   line through the last two points)
    tokenizer: ~/models/my-model/tokenizer.json   # optional: size text prompts with the
                                # model's tokenizer (relative to this file's folder)
    calibration: {...}          # optional and ignored: what `sim calibrate` measured

Without ``base`` every field without a default in ``EngineProfile`` is required. Unknown
fields and out-of-range values are errors naming the field (:class:`ProfileFileError`).
"""

from __future__ import annotations

import atexit
import dataclasses
import hashlib
import itertools
import os
import shutil
import tempfile
from pathlib import Path
from typing import Annotated

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from sluicegate.sim.profiles import PROFILES, EngineProfile, LinearOpsCurve

Positive = Annotated[float, Field(gt=0)]
NonNegative = Annotated[float, Field(ge=0)]
PositiveInt = Annotated[int, Field(ge=1)]


class ProfileFileError(ValueError):
    """A profile file that cannot be read or does not describe a valid profile."""


class _Strict(BaseModel):
    # NaN and infinity are refused everywhere: one in a step time or a bandwidth would make
    # the simulator's clock NaN or never advance.
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class LinearOpsSpec(_Strict):
    """The linear-op curve: ms per iteration at ``points`` (tokens, ms), interpolated
    linearly between them, constant below the first and a line beyond the last."""

    points: list[tuple[Positive, NonNegative]] = Field(default_factory=list)
    tail_intercept_ms: float | None = None
    tail_slope_ms_per_token: NonNegative | None = None

    @field_validator("points")
    @classmethod
    def _increasing(cls, points: list[tuple[float, float]]) -> list[tuple[float, float]]:
        xs = [x for x, _ in points]
        if any(b <= a for a, b in itertools.pairwise(xs)):
            raise ValueError("token counts must be strictly increasing")
        return points

    def curve(self) -> LinearOpsCurve:
        xs = tuple(float(x) for x, _ in self.points)
        ys = tuple(float(y) for _, y in self.points)
        slope = self.tail_slope_ms_per_token
        if slope is None:
            slope = (ys[-1] - ys[-2]) / (xs[-1] - xs[-2]) if len(xs) >= 2 else 0.0
            slope = max(0.0, slope)
        intercept = self.tail_intercept_ms
        if intercept is None:
            if not xs:
                raise ValueError("linear_ops needs points or tail_intercept_ms")
            intercept = ys[-1] - slope * xs[-1]
        # The tail is increasing (slope >= 0), so it is non-negative everywhere it is used
        # when it is at its start: the last point (0 tokens without points). A negative
        # intercept is fine as long as the line is above 0 there.
        start = xs[-1] if xs else 0.0
        if intercept + slope * start < 0:
            raise ValueError(
                f"the tail line is negative at {start:g} tokens "
                f"({intercept:g} + {slope:g} * {start:g} ms); step times must be >= 0"
            )
        return LinearOpsCurve(xs, ys, intercept, slope)

    @classmethod
    def of(cls, curve: LinearOpsCurve) -> LinearOpsSpec:
        return cls(
            points=list(zip(curve.xs, curve.ys, strict=True)),
            tail_intercept_ms=curve.tail_intercept_ms,
            tail_slope_ms_per_token=curve.tail_slope_ms_per_token,
        )


class ProfileSpec(_Strict):
    """One profile file. Units: ms unless a name says otherwise; bytes, FLOP/s, tokens."""

    base: str | None = None
    name: Annotated[str, Field(min_length=1)] | None = None
    description: str | None = None
    model_name: Annotated[str, Field(min_length=1)] | None = None
    linear_ops: LinearOpsSpec | None = None
    num_layers: PositiveInt | None = None
    hidden_size: PositiveInt | None = None
    kv_bytes_per_token_per_layer: PositiveInt | None = None
    memory_bandwidth_bytes_per_s: Positive | None = None
    attention_flops_per_s: Positive | None = None
    num_gpu_blocks: PositiveInt | None = None
    block_size: PositiveInt | None = None
    max_num_seqs: PositiveInt | None = None
    max_num_batched_tokens: PositiveInt | None = None
    max_model_len: PositiveInt | None = None
    max_loras: PositiveInt | None = None
    max_lora_rank: PositiveInt | None = None
    lora_load_ms: NonNegative | None = None
    lora_step_factor: Positive | None = None
    attention_fixed_ms_per_layer: NonNegative | None = None
    step_overhead_ms: NonNegative | None = None
    step_ms_per_seq: NonNegative | None = None
    request_overhead_ms: NonNegative | None = None
    tokenizer: Annotated[str, Field(min_length=1)] | None = None
    """A ``tokenizer.json`` sizing text prompts (relative to the file's folder)."""
    gpu_memory_utilization: Annotated[float, Field(gt=0, le=1)] | None = None
    accelerator: Annotated[str, Field(min_length=1, max_length=63)] | None = None
    """The hardware class the profile's endpoints report (e.g. ``h100-80gb``)."""
    cost_per_hour: NonNegative | None = None
    """Their price, currency per hour (for the lab's cost per 1M output tokens)."""
    calibration: dict[str, object] | None = None
    """What ``sim calibrate`` measured (informational; not read back)."""


_FIELDS = [f.name for f in dataclasses.fields(EngineProfile)]


def profile_from_spec(spec: ProfileSpec, where: str = "profile") -> EngineProfile:
    """The :class:`EngineProfile` a validated file describes."""
    values: dict[str, object] = {}
    if spec.base is not None:
        if spec.base not in PROFILES:
            known = ", ".join(sorted(PROFILES))
            raise ProfileFileError(f"{where}: base: unknown profile {spec.base!r}; known: {known}")
        base = PROFILES[spec.base]
        values = {name: getattr(base, name) for name in _FIELDS}
    for name in _FIELDS:
        value = getattr(spec, name)
        if value is None:
            continue
        if name == "linear_ops":
            assert isinstance(value, LinearOpsSpec)
            try:
                value = value.curve()
            except ValueError as exc:
                raise ProfileFileError(f"{where}: linear_ops: {exc}") from None
        values[name] = value
    required = [
        f.name
        for f in dataclasses.fields(EngineProfile)
        if f.default is dataclasses.MISSING and f.name not in values and f.name != "description"
    ]
    if required:
        raise ProfileFileError(f"{where}: missing field(s) {', '.join(required)} (or a base)")
    values.setdefault("description", f"profile file {where}")
    return EngineProfile(**values)  # type: ignore[arg-type]


def parse_profile(text: str, where: str = "profile") -> EngineProfile:
    """The profile a YAML document describes; :class:`ProfileFileError` naming the field."""
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ProfileFileError(f"{where}: not YAML: {exc}") from None
    if not isinstance(doc, dict):
        raise ProfileFileError(f"{where}: expected a mapping of profile fields")
    try:
        spec = ProfileSpec.model_validate(doc)
    except ValidationError as exc:
        problems = [
            f"{where}: {'.'.join(str(p) for p in e['loc']) or '(document)'}: {e['msg']}"
            for e in exc.errors()
        ]
        raise ProfileFileError("\n".join(problems)) from None
    return profile_from_spec(spec, where)


def load_profile_file(path: str | Path) -> EngineProfile:
    """Read a profile file (see the module docstring). A relative ``tokenizer`` path is
    relative to the file's folder (``~`` is the user's home); it must exist."""
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as exc:
        raise ProfileFileError(f"{p}: cannot read: {exc.strerror}") from None
    profile = parse_profile(text, str(p))
    if profile.tokenizer is not None:
        tokenizer = Path(profile.tokenizer).expanduser()
        if not tokenizer.is_absolute():
            tokenizer = p.parent / tokenizer
        if not tokenizer.exists():
            raise ProfileFileError(f"{p}: tokenizer: {tokenizer} does not exist")
        from sluicegate.model_tokenizer import TokenizerLoadError
        from sluicegate.sim.prompt_tokens import PromptTokens

        try:  # refused here, naming the field, rather than when an engine starts
            PromptTokens.load(str(tokenizer))
        except TokenizerLoadError as exc:
            raise ProfileFileError(f"{p}: tokenizer: {exc}") from None
        profile = dataclasses.replace(profile, tokenizer=str(tokenizer.absolute()))
    return profile


def profile_document(
    profile: EngineProfile, calibration: dict[str, object] | None = None
) -> dict[str, object]:
    """Every parameter of ``profile`` as a file's mapping (self-contained: no ``base``)."""
    doc: dict[str, object] = {}
    for name in _FIELDS:
        value = getattr(profile, name)
        if name == "linear_ops":
            spec = LinearOpsSpec.of(value)
            value = {
                "points": [[x, y] for x, y in spec.points],
                "tail_intercept_ms": spec.tail_intercept_ms,
                "tail_slope_ms_per_token": spec.tail_slope_ms_per_token,
            }
        doc[name] = value
    if calibration is not None:
        doc["calibration"] = calibration
    return doc


def dump_profile(profile: EngineProfile, calibration: dict[str, object] | None = None) -> str:
    """``profile`` as YAML that :func:`parse_profile` reads back to an equal profile."""
    return yaml.safe_dump(profile_document(profile, calibration), sort_keys=False)


_private_dir: Path | None = None
_O_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)  # absent on Windows; O_EXCL alone still refuses


def _private_folder() -> Path:
    """This process's own folder for profile files: made by :func:`tempfile.mkdtemp` (mode
    0700, a fresh unpredictable name, so nobody else can plant a file or symlink in it) and
    removed with everything in it when the process exits."""
    global _private_dir
    if _private_dir is None or not _private_dir.is_dir():
        _private_dir = Path(tempfile.mkdtemp(prefix="sluicegate-profiles-"))
        atexit.register(shutil.rmtree, _private_dir, ignore_errors=True)
    return _private_dir


def materialise(profile: EngineProfile) -> Path:
    """A profile file holding ``profile``, so a child process (``sluicegate sim
    --profile-file``) can load it. It lives in this process's private temporary folder
    (removed at exit), named by its content, so the same profile reuses the same file.
    The file is created with ``O_EXCL`` and never through a symlink."""
    text = dump_profile(profile)
    digest = hashlib.sha256(text.encode()).hexdigest()[:16]
    path = _private_folder() / f"profile-{digest}.yaml"
    if path.is_file() and not path.is_symlink() and path.read_text() == text:
        return path
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(text)
    return path


__all__ = [
    "LinearOpsSpec",
    "ProfileFileError",
    "ProfileSpec",
    "dump_profile",
    "load_profile_file",
    "materialise",
    "parse_profile",
    "profile_document",
    "profile_from_spec",
]
