"""Durations and sizes written the way the reference configuration writes them.

Durations: ``"200ms"``, ``"1.5s"``, ``"2m"``, ``"1h"``, or combinations such as ``"1m30s"``
(Go's ``time.ParseDuration`` forms, minus ns/µs); a bare number means seconds.
Sizes: Kubernetes quantities, ``"10Gi"``, ``"512Mi"``, ``"1G"``, ``"500k"``, or a bare
number of bytes.
"""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import BeforeValidator

_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}
_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ms|s|m|h)")


def parse_duration_s(value: object) -> float:
    """``value`` in seconds; raises ``ValueError`` naming the accepted forms."""
    if isinstance(value, bool):
        raise ValueError("a duration must be a number of seconds or a string like '200ms'")
    if isinstance(value, int | float):
        seconds = float(value)
    elif isinstance(value, str):
        text = value.strip()
        pos, seconds = 0, 0.0
        for match in _PART.finditer(text):
            if match.start() != pos:
                break
            seconds += float(match.group(1)) * _UNITS[match.group(2)]
            pos = match.end()
        if not text or pos != len(text):
            raise ValueError(f"invalid duration {value!r}: use forms like '200ms', '1.5s', '2m'")
    else:
        raise ValueError("a duration must be a number of seconds or a string like '200ms'")
    if seconds < 0:
        raise ValueError(f"a duration cannot be negative: {value!r}")
    return seconds


Seconds = Annotated[float, BeforeValidator(parse_duration_s)]
"""A pydantic field type: a duration, stored in seconds."""


_SIZE_UNITS = {
    "": 1,
    "k": 1000,
    "K": 1000,
    "M": 1000**2,
    "G": 1000**3,
    "T": 1000**4,
    "Ki": 1024,
    "Mi": 1024**2,
    "Gi": 1024**3,
    "Ti": 1024**4,
}
_SIZE = re.compile(r"(\d+(?:\.\d*)?)\s*(Ki|Mi|Gi|Ti|k|K|M|G|T)?")


def parse_bytes(value: object) -> int:
    """``value`` in bytes; raises ``ValueError`` naming the accepted forms."""
    if isinstance(value, bool):
        raise ValueError("a size must be a number of bytes or a quantity like '10Gi'")
    if isinstance(value, int):
        size = value
    elif isinstance(value, float) and value.is_integer():
        size = int(value)
    elif isinstance(value, str):
        match = _SIZE.fullmatch(value.strip())
        if match is None:
            raise ValueError(f"invalid size {value!r}: use forms like '10Gi', '512Mi', '1G'")
        size = int(float(match.group(1)) * _SIZE_UNITS[match.group(2) or ""])
    else:
        raise ValueError("a size must be a number of bytes or a quantity like '10Gi'")
    if size < 0:
        raise ValueError(f"a size cannot be negative: {value!r}")
    return size


Bytes = Annotated[int, BeforeValidator(parse_bytes)]
"""A pydantic field type: a size, stored in bytes."""
