"""Ids for requests that arrive without an ``x-request-id``.

32 hex digits: a random half drawn when the process starts (again in a forked child), so
ids differ across replicas and restarts, and a counter, so none repeats within a process —
without a system call per request.
"""

from __future__ import annotations

import itertools
import os


class _RequestIds:
    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self._prefix = os.urandom(8).hex()
        self._counter = itertools.count(1)

    def next(self) -> str:
        return f"{self._prefix}{next(self._counter):016x}"


_IDS = _RequestIds()
os.register_at_fork(after_in_child=_IDS.reset)

new_request_id = _IDS.next
"""A fresh request id (32 hex digits)."""
