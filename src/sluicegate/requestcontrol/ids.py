"""Request ids: the client's ``x-request-id`` when it is usable, else a generated one.

A client's id is used when it is 1 to :data:`MAX_REQUEST_ID_LENGTH` printable ASCII
characters; any other (a byte that is not ASCII, a control character, an oversized value)
is replaced by a generated id, so answers, upstream requests and logs only ever carry
clean ids.

Generated ids are 32 hex digits: a random half drawn when the process starts (again in a
forked child), so ids differ across replicas and restarts, and a counter passed through a
random bijection of 64-bit numbers (an odd multiplier, then a mask), so none repeats
within a process and the ids do not tell a client how many requests came before — all
without a system call per request.
"""

from __future__ import annotations

import itertools
import os

_MASK = (1 << 64) - 1
MAX_REQUEST_ID_LENGTH = 128
"""Longest client ``x-request-id`` kept (characters)."""


class _RequestIds:
    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self._prefix = os.urandom(8).hex()
        self._multiplier = int.from_bytes(os.urandom(8), "little") | 1  # odd: invertible
        self._key = int.from_bytes(os.urandom(8), "little")
        self._counter = itertools.count(1)

    def next(self) -> str:
        n = (next(self._counter) * self._multiplier & _MASK) ^ self._key
        return f"{self._prefix}{n:016x}"


_IDS = _RequestIds()
os.register_at_fork(after_in_child=_IDS.reset)

new_request_id = _IDS.next
"""A fresh request id (32 hex digits)."""


def request_id_from(value: str | None) -> str:
    """The request's id: ``value`` (the client's ``x-request-id``) when it is 1 to
    :data:`MAX_REQUEST_ID_LENGTH` printable ASCII characters, else a new id."""
    if value and len(value) <= MAX_REQUEST_ID_LENGTH and value.isascii() and value.isprintable():
        return value
    return new_request_id()
