"""The bounded, stratified window of training samples (as the reference predictor keeps it).

Each target (TTFT, TPOT) keeps its own :class:`SampleSet`. A sample lands in one of
5 × 20 × 4 = 400 buckets keyed by its row at dispatch:

- queue: ``num_request_waiting`` in {0, 1–2, 3–5, 6–10, 11+};
- KV: ``kv_cache_percentage`` in 20 steps of 5 % (clamped to [0, 1]);
- prefix: ``prefix_cache_score`` in 4 steps of 0.25 (clamped to [0, 1]).

Every bucket is a FIFO of at most ``bucket_capacity`` (500) samples, so rare load regimes
are not pushed out by the common one and the window holds at most 200,000 samples per
target. A deterministic hash of the sample (row and times) sends ``test_ratio`` (10 %) of
samples to a held-out FIFO of at most ``test_capacity`` (1,000) per target instead, for
the model metrics; the same sample always goes the same way.

Buckets are ring buffers of float32 feature vectors, allocated when first used: adding is
O(1); a snapshot for training is O(buckets) and copies nothing on the adding thread (the
rings copy on write), so training can read it from a worker thread.

Reference: https://github.com/llm-d/llm-d-latency-predictor/blob/04e44cd8/training/training_server.py
"""

from __future__ import annotations

import math
import struct
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import xxhash

from sluicegate.latency.features import FEATURE_NAMES, FeatureRow, Sample, feature_vector

QUEUE_BUCKETS = 5
KV_BUCKETS = 20
PREFIX_BUCKETS = 4
BUCKETS = QUEUE_BUCKETS * KV_BUCKETS * PREFIX_BUCKETS
"""Buckets per target (400)."""

_WIDTH = len(FEATURE_NAMES)
_PACK_HASHED = struct.Struct(f"<{_WIDTH + 2}d").pack
_RECORD = struct.Struct(f"<{_WIDTH + 1}f")
_PACK_RECORD = _RECORD.pack_into
_RECORD_BYTES = _RECORD.size
_FLOAT32_MAX = float(np.finfo(np.float32).max)
_QUEUE = (0, 1, 1, 2, 2, 2, 3, 3, 3, 3, 3)
"""Queue bucket of 0..10 waiting requests (11+ → 4)."""


@dataclass(frozen=True, slots=True)
class StoreConfig:
    """Bounds of the sample window (defaults: the reference's)."""

    bucket_capacity: int = 500
    """Samples per bucket (a FIFO: the oldest goes first)."""
    test_ratio: float = 0.1
    """Share of samples held out for the model metrics (0 disables the split)."""
    test_capacity: int = 1000
    """Held-out samples per target (a FIFO)."""

    def __post_init__(self) -> None:
        if self.bucket_capacity < 1 or self.test_capacity < 1:
            raise ValueError("bucket_capacity and test_capacity must be at least 1")
        if not 0.0 <= self.test_ratio < 1.0:
            raise ValueError(f"test_ratio must be in [0, 1), got {self.test_ratio}")


def queue_bucket(waiting: int) -> int:
    """Bucket of ``num_request_waiting``: 0 | 1–2 | 3–5 | 6–10 | 11+ → 0..4."""
    if waiting <= 0:
        return 0
    if waiting <= 2:
        return 1
    if waiting <= 5:
        return 2
    if waiting <= 10:
        return 3
    return 4


def _fraction_bucket(value: float, buckets: int) -> int:
    clamped = min(max(value, 0.0), 1.0)
    return min(int(clamped * buckets), buckets - 1)


def bucket_key(row: FeatureRow) -> tuple[int, int, int]:
    """``(queue, kv, prefix)`` bucket of a row."""
    return (
        queue_bucket(row.num_request_waiting),
        _fraction_bucket(row.kv_cache_percentage, KV_BUCKETS),
        _fraction_bucket(row.prefix_cache_score, PREFIX_BUCKETS),
    )


def bucket_index(row: FeatureRow) -> int:
    """Flat index (0..399) of :func:`bucket_key`: ``(queue · 20 + kv) · 4 + prefix``."""
    q, kv, p = bucket_key(row)
    return (q * KV_BUCKETS + kv) * PREFIX_BUCKETS + p


class _Ring:
    """A FIFO of at most ``capacity`` (feature vector, target) pairs, one float32 record
    per sample (the features, then the target), written in place with ``pack_into``.

    Copy on write: :meth:`share` hands out views and marks the array shared; the next
    :meth:`add` copies it first (22 KB for 500 samples), so a snapshot costs no copy on
    the thread that adds and stays unchanged while another thread trains on it.
    """

    __slots__ = ("capacity", "count", "data", "head", "shared", "view")

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.data = np.zeros((capacity, _WIDTH + 1), dtype=np.float32)
        self.view = self.data.data
        self.head = 0
        self.count = 0
        self.shared = False

    def add(self, vector: tuple[float, ...], target: float) -> None:
        if self.shared:
            self.data = self.data.copy()
            self.view = self.data.data
            self.shared = False
        _PACK_RECORD(self.view, self.head * _RECORD_BYTES, *vector, target)
        self.head += 1
        if self.head == self.capacity:
            self.head = 0
        if self.count < self.capacity:
            self.count += 1

    def share(self) -> Part:
        """Read-only views of the filled part (slot order, not age order), valid for
        good: the ring copies its array before its next write."""
        self.shared = True
        filled = self.data[: self.count]
        return filled[:, :_WIDTH], filled[:, _WIDTH]

    def clear(self) -> None:
        self.head = 0
        self.count = 0


Part = tuple[np.ndarray, np.ndarray]
"""``(X, y)`` of some samples: float32 feature rows and times in ms."""


def stack(parts: Sequence[Part]) -> Part:
    """One ``(X, y)`` from several (a copy; empty arrays when there are none)."""
    if not parts:
        return np.empty((0, _WIDTH), dtype=np.float32), np.empty(0, dtype=np.float32)
    return (
        np.concatenate([x for x, _ in parts]),
        np.concatenate([y for _, y in parts]),
    )


class SampleSet:
    """One target's window: 400 stratified training buckets and a held-out FIFO."""

    def __init__(self, config: StoreConfig) -> None:
        self.config = config
        self._buckets: list[_Ring | None] = [None] * BUCKETS
        self._test = _Ring(config.test_capacity)
        self._train_count = 0
        self.added = 0
        """Samples ever added (training and held-out): a cheap "anything new?" check."""

    def add(self, bucket: int, vector: tuple[float, ...], target: float, test: bool) -> None:
        """Add one sample (``target`` in ms) to ``bucket`` or to the held-out set. O(1)."""
        self.added += 1
        if test:
            self._test.add(vector, target)
            return
        ring = self._buckets[bucket]
        if ring is None:
            ring = self._buckets[bucket] = _Ring(self.config.bucket_capacity)
        if ring.count < ring.capacity:
            self._train_count += 1
        ring.add(vector, target)

    @property
    def train_count(self) -> int:
        """Training samples held (≤ 400 · bucket_capacity)."""
        return self._train_count

    @property
    def test_count(self) -> int:
        """Held-out samples held (≤ test_capacity)."""
        return self._test.count

    def training_parts(self) -> list[Part]:
        """Per-bucket ``(X, y)`` views of the training samples, buckets in index order.

        O(buckets), no copy: the views never change (copy on write), so another thread
        may read them while samples keep arriving here.
        """
        return [ring.share() for ring in self._buckets if ring is not None and ring.count]

    def test_part(self) -> Part:
        """``(X, y)`` view of the held-out samples (unchanging, as :meth:`training_parts`)."""
        return self._test.share()

    def training_arrays(self) -> Part:
        """``(X, y)``: a copy of every training sample (float32; X as
        :func:`~sluicegate.latency.features.feature_matrix`, y in ms), buckets in index
        order — deterministic for a given sequence of adds."""
        return stack(self.training_parts())

    def test_arrays(self) -> Part:
        """``(X, y)``: a copy of the held-out samples."""
        return stack([self.test_part()])

    def bucket_counts(self) -> np.ndarray:
        """Training samples per bucket as a ``5 × 20 × 4`` int array indexed
        ``[queue, kv, prefix]``."""
        counts = np.array([0 if r is None else r.count for r in self._buckets], dtype=np.int64)
        return counts.reshape(QUEUE_BUCKETS, KV_BUCKETS, PREFIX_BUCKETS)

    def clear(self, train: bool = True, test: bool = True) -> None:
        """Forget the training samples and/or the held-out ones."""
        if train:
            self._buckets = [None] * BUCKETS
            self._train_count = 0
        if test:
            self._test.clear()


class SampleStore:
    """The TTFT and TPOT windows. Not thread-safe: add from one thread (the event loop)
    and take the arrays from that same thread."""

    def __init__(self, config: StoreConfig | None = None) -> None:
        self.config = config or StoreConfig()
        self.ttft = SampleSet(self.config)
        self.tpot = SampleSet(self.config)
        self.rejected = 0
        """Samples refused: a non-finite feature or time, or no time at all."""
        self._test_threshold = int(self.config.test_ratio * 2**32)

    def add(self, sample: Sample) -> bool:
        """File a sample under its bucket (or hold it out); False if refused. O(1).

        A TTFT (or TPOT) of None, zero or less is "not observed" for that target; a sample
        with no time at all, or a non-finite feature or time, is refused.
        """
        ttft = sample.ttft_ms
        if ttft is not None and ttft <= 0:  # NaN stays, and is refused below
            ttft = None
        tpot = sample.tpot_ms
        if tpot is not None and tpot <= 0:
            tpot = None
        row = sample.row
        vector = feature_vector(row)
        # One sum: NaN or ±inf anywhere (features or times) makes it non-finite.
        if (ttft is None and tpot is None) or not math.isfinite(
            sum(vector) + (ttft or 0.0) + (tpot or 0.0)
        ):
            self.rejected += 1
            return False
        if max(*vector, ttft or 0.0, tpot or 0.0) > _FLOAT32_MAX or min(vector) < -_FLOAT32_MAX:
            self.rejected += 1  # would not fit a float32 column
            return False
        test = self.is_held_out(vector, ttft, tpot)
        waiting = row.num_request_waiting
        bucket = (
            (_QUEUE[int(waiting)] if 0 <= waiting <= 10 else (4 if waiting > 10 else 0))
            * KV_BUCKETS
            + _fraction_bucket(row.kv_cache_percentage, KV_BUCKETS)
        ) * PREFIX_BUCKETS + _fraction_bucket(row.prefix_cache_score, PREFIX_BUCKETS)
        if ttft is not None:
            self.ttft.add(bucket, vector, ttft, test)
        if tpot is not None:
            self.tpot.add(bucket, vector, tpot, test)
        return True

    def is_held_out(
        self, vector: tuple[float, ...], ttft: float | None, tpot: float | None
    ) -> bool:
        """Whether a sample goes to the held-out set: xxh64 of its values, stable across
        processes and runs."""
        if self._test_threshold == 0:
            return False
        digest = xxhash.xxh64_intdigest(_PACK_HASHED(*vector, ttft or 0.0, tpot or 0.0))
        return (digest & 0xFFFFFFFF) < self._test_threshold

    @property
    def added(self) -> int:
        """Samples ever accepted by either target (for "anything new since training?")."""
        return self.ttft.added + self.tpot.added

    def clear(self, train: bool = True, test: bool = True) -> None:
        self.ttft.clear(train, test)
        self.tpot.clear(train, test)
