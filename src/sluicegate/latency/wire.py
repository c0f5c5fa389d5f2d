"""Rows and samples as JSON objects: the predictor services' bodies and the trace lines.

A row is an object with the :class:`~sluicegate.latency.features.FeatureRow` fields by
name. The fields the reference predictor also has (its client's request body,
https://github.com/llm-d/llm-d-router/blob/ebab6879/pkg/epp/framework/plugins/requestcontrol/dataproducer/predictedlatency/latencypredictorclient/types.go)
carry the same names and meaning, so its clients' bodies are accepted as they are:
``kv_cache_percentage``, ``input_token_length``, ``num_request_waiting``,
``num_request_running`` and ``prefix_cache_score`` are required; ``prefill_tokens_in_flight``,
``decode_tokens_in_flight``, ``dispatched_since_scrape``, ``expected_output_tokens``,
``prompt_tokens_before_last_token``, ``prompt_tokens_after_last_token`` and
``token_interval_ms`` default to 0,
``ms_since_last_token`` and ``prefix_reuse_distance_tokens`` to their caps (never seen,
never sent); other keys (``num_tokens_generated``, ``pod_type``, ...) are ignored. Fractions
must lie in [0, 1], counts must be non-negative integers (``3.0`` is 3; the reuse distance
is capped at ``REUSE_DISTANCE_CAP_TOKENS``), durations (``*_ms``) non-negative numbers of ms
(capped at ``TOKEN_TIMING_CAP_MS``).

A sample is a row plus ``ttft_ms`` and ``tpot_ms`` (ms; the reference's
``actual_ttft_ms``/``actual_tpot_ms`` are accepted too); a missing, null or zero time means
"not observed". An optional ``hardware_class`` (a lower-case class name such as
``h100-80gb``, or null) says which hardware served it; bodies and traces without it are
of the pool's one unnamed class, as before.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from sluicegate.latency.features import (
    FEATURE_NAMES,
    REUSE_DISTANCE_CAP_TOKENS,
    ROW_FIELDS,
    TOKEN_TIMING_CAP_MS,
    FeatureRow,
    Sample,
)

REQUIRED_FIELDS: frozenset[str] = frozenset(
    {
        "kv_cache_percentage",
        "input_token_length",
        "num_request_waiting",
        "num_request_running",
        "prefix_cache_score",
    }
)
"""Fields a row must carry; the others have defaults (0, or a cap: see below)."""

FRACTION_FIELDS: frozenset[str] = frozenset({"kv_cache_percentage", "prefix_cache_score"})
"""Fields that are fractions in [0, 1]."""

DURATION_FIELDS: dict[str, float] = {
    "ms_since_last_token": TOKEN_TIMING_CAP_MS,
    "token_interval_ms": 0.0,
}
"""Fields that are non-negative durations in ms, and their values when absent. Every
field neither a fraction nor a duration is a count."""

COUNT_CAPS: dict[str, int] = {"prefix_reuse_distance_tokens": REUSE_DISTANCE_CAP_TOKENS}
"""Counts with a cap, which is also their value when absent (other counts default to 0).
A reference client's row thus says its prefix was never sent, whatever its prefix score:
it carries no reuse distance, and the models have only seen the distances the gateway
measures."""

CLASS_NAME = re.compile(r"[a-z0-9][a-z0-9._-]{0,62}")
"""What a hardware class name may be: lower-case letters, digits, ``.``, ``_`` and ``-``,
at most 63 characters (it names a model directory and a metric label)."""

_PREFIX = ROW_FIELDS.index("prefix_cache_score")
_INPUT = ROW_FIELDS.index("input_token_length")


class FieldError(ValueError):
    """A body or trace line with a missing or invalid field; ``field`` names it (with its
    position, e.g. ``requests[3].kv_cache_percentage``)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message

    def at(self, prefix: str) -> FieldError:
        """The same error with ``prefix`` (e.g. ``requests[3]``) in front of the field."""
        return FieldError(f"{prefix}.{self.field}", self.message)


def _field_value(obj: Mapping[str, Any], name: str) -> float:
    value = obj.get(name)
    if value is None:
        if name in REQUIRED_FIELDS:
            raise FieldError(name, "is required")
        return DURATION_FIELDS.get(name, COUNT_CAPS.get(name, 0))
    kind = type(value)
    if kind is not int and kind is not float:
        raise FieldError(name, f"must be a number, got {type(value).__name__}")
    if name in DURATION_FIELDS:
        if not (math.isfinite(value) and value >= 0):
            raise FieldError(name, f"must be a non-negative number of ms, got {value!r}")
        return min(float(value), TOKEN_TIMING_CAP_MS)
    if name in FRACTION_FIELDS:
        if not 0.0 <= value <= 1.0:  # also rejects NaN
            raise FieldError(name, f"must be a fraction in [0, 1], got {value!r}")
        return float(value)
    if kind is float and not (math.isfinite(value) and value == int(value)):
        raise FieldError(name, f"must be a whole number, got {value!r}")
    if value < 0:
        raise FieldError(name, f"must be non-negative, got {value!r}")
    cap = COUNT_CAPS.get(name)
    return int(value) if cap is None else min(int(value), cap)


def row_values(obj: object) -> tuple[float, ...]:
    """The :class:`FeatureRow` field values of a JSON object, validated, in field order.

    Raises :class:`FieldError` naming the first bad field.
    """
    if not isinstance(obj, dict):
        raise FieldError("(row)", f"must be an object, got {type(obj).__name__}")
    return tuple(_field_value(obj, name) for name in ROW_FIELDS)


def row_from_json(obj: object) -> FeatureRow:
    """A :class:`FeatureRow` from a JSON object (see the module docstring)."""
    return FeatureRow(*row_values(obj))  # type: ignore[arg-type]


def matrix_from_json(items: Sequence[object], where: str = "requests") -> np.ndarray:
    """The feature matrix (as :func:`~sluicegate.latency.features.feature_matrix`) of a
    list of JSON rows, without building :class:`FeatureRow` objects.

    Raises :class:`FieldError` naming the item, e.g. ``requests[3].prefix_cache_score``.
    """
    vectors: list[tuple[float, ...]] = []
    for i, item in enumerate(items):
        try:
            values = row_values(item)
        except FieldError as exc:
            raise exc.at(f"{where}[{i}]") from None
        vectors.append((*values, (1.0 - values[_PREFIX]) * values[_INPUT]))
    if not vectors:
        return np.empty((0, len(FEATURE_NAMES)), dtype=np.float32)
    return np.array(vectors, dtype=np.float32)


def row_to_json(row: FeatureRow) -> dict[str, float]:
    """The JSON object of a row (every field, by name)."""
    return {name: getattr(row, name) for name in ROW_FIELDS}


def _time_ms(obj: Mapping[str, Any], name: str) -> float | None:
    value = obj.get(name)
    if value is None:
        value = obj.get(f"actual_{name}")
    if value is None:
        return None
    if type(value) is not int and type(value) is not float:
        raise FieldError(name, f"must be a number, got {type(value).__name__}")
    if not (math.isfinite(value) and value >= 0):
        raise FieldError(name, f"must be a non-negative number of ms, got {value!r}")
    return float(value) if value > 0 else None


def sample_from_json(obj: object) -> Sample:
    """A :class:`Sample` from a JSON object: the row fields plus ``ttft_ms``/``tpot_ms``."""
    row = row_from_json(obj)
    assert isinstance(obj, dict)  # row_from_json checked
    return Sample(row, _time_ms(obj, "ttft_ms"), _time_ms(obj, "tpot_ms"), class_from_json(obj))


def class_from_json(obj: Mapping[str, Any]) -> str | None:
    """The optional ``hardware_class`` of a body or trace line (None: absent or null)."""
    value = obj.get("hardware_class")
    if value is None:
        return None
    if type(value) is not str or CLASS_NAME.fullmatch(value) is None:
        raise FieldError(
            "hardware_class",
            f"must be a lower-case class name ([a-z0-9._-], at most 63), got {value!r}",
        )
    return value


def sample_to_json(sample: Sample) -> dict[str, float | str]:
    """The JSON object of a sample; unobserved times and no class are left out."""
    out: dict[str, float | str] = dict(row_to_json(sample.row))
    if sample.ttft_ms is not None:
        out["ttft_ms"] = sample.ttft_ms
    if sample.tpot_ms is not None:
        out["tpot_ms"] = sample.tpot_ms
    if sample.hardware_class is not None:
        out["hardware_class"] = sample.hardware_class
    return out
