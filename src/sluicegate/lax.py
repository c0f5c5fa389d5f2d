"""Lenient conversion of JSON request fields, as model servers accept them.

vLLM validates requests with pydantic's lax mode, so clients get away with
``"temperature": "0"`` or ``"stream": "true"``. The gateway and the simulator accept the
same forms and reject the rest with an error naming the field.
"""

from __future__ import annotations

import math


class LaxValueError(ValueError):
    """A field's value has the wrong type; ``field`` names it."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


def as_int(value: object, field: str) -> int:
    """``value`` as an int: an integer, an integral float, or a numeric string."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str):
        try:
            number = float(value.strip())
        except ValueError:
            pass
        else:
            if number.is_integer():
                return int(number)
    raise LaxValueError(field, f"'{field}' must be an integer, got {value!r}")


def as_float(value: object, field: str) -> float:
    """``value`` as a finite float: a number or a numeric string."""
    number: float | None = None
    if isinstance(value, int | float) and not isinstance(value, bool):
        number = float(value)
    elif isinstance(value, str):
        try:
            number = float(value.strip())
        except ValueError:
            number = None
    if number is None:
        raise LaxValueError(field, f"'{field}' must be a number, got {value!r}")
    if not math.isfinite(number):
        raise LaxValueError(field, f"'{field}' must be finite, got {value!r}")
    return number


_TRUE = frozenset({"true", "1", "yes", "on", "t", "y"})
_FALSE = frozenset({"false", "0", "no", "off", "f", "n"})


def as_bool(value: object, field: str) -> bool:
    """``value`` as a bool: a JSON boolean, 0/1, or a string such as ``"true"``."""
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    if isinstance(value, str):
        lowered = value.strip().lower()
        if lowered in _TRUE:
            return True
        if lowered in _FALSE:
            return False
    raise LaxValueError(field, f"'{field}' must be a boolean, got {value!r}")
