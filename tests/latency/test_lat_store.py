"""The stratified sample window: buckets, bounds, FIFO order, held-out split, snapshots."""

from __future__ import annotations

import collections
import math
from dataclasses import replace

import numpy as np
import pytest
from lat_support import samples

from sluicegate.latency.features import FEATURE_NAMES, FeatureRow, Sample, feature_matrix
from sluicegate.latency.store import (
    BUCKETS,
    SampleStore,
    StoreConfig,
    bucket_index,
    bucket_key,
    queue_bucket,
)

ROW = FeatureRow(0.5, 1000, 0, 4, 0, 0, 0.5, 0, 100)


@pytest.mark.parametrize(
    ("waiting", "bucket"),
    [(0, 0), (1, 1), (2, 1), (3, 2), (5, 2), (6, 3), (10, 3), (11, 4), (500, 4), (-1, 0)],
)
def test_queue_buckets_follow_the_reference(waiting: int, bucket: int) -> None:
    assert queue_bucket(waiting) == bucket


@pytest.mark.parametrize(
    ("kv", "prefix", "expected"),
    [
        (0.0, 0.0, (0, 0)),
        (0.049, 0.249, (0, 0)),
        (0.05, 0.25, (1, 1)),
        (0.5, 0.5, (10, 2)),
        (0.999, 0.999, (19, 3)),
        (1.0, 1.0, (19, 3)),
        (1.7, 2.0, (19, 3)),  # clamped
        (-0.1, -1.0, (0, 0)),
    ],
)
def test_kv_and_prefix_buckets(kv: float, prefix: float, expected: tuple[int, int]) -> None:
    row = replace(ROW, kv_cache_percentage=kv, prefix_cache_score=prefix)
    assert bucket_key(row)[1:] == expected


def test_bucket_index_is_flat_and_add_uses_it() -> None:
    row = replace(ROW, num_request_waiting=7, kv_cache_percentage=0.33, prefix_cache_score=0.8)
    assert bucket_key(row) == (3, 6, 3)
    assert bucket_index(row) == (3 * 20 + 6) * 4 + 3
    store = SampleStore(StoreConfig(test_ratio=0.0))
    store.add(Sample(row, 10.0, 2.0))
    counts = store.ttft.bucket_counts()
    assert counts.shape == (5, 20, 4)
    assert counts[3, 6, 3] == 1
    assert counts.sum() == 1
    assert store.tpot.bucket_counts()[3, 6, 3] == 1


def test_never_exceeds_its_caps_under_a_million_adds() -> None:
    config = StoreConfig(bucket_capacity=3, test_capacity=7)
    store = SampleStore(config)
    pool = samples(4096, seed=3)
    chunk = pool * 25  # 102,400 adds
    for _ in range(10):
        collections.deque(map(store.add, chunk), maxlen=0)
        assert store.ttft.train_count <= BUCKETS * 3
        assert store.ttft.test_count <= 7
    for sample_set in (store.ttft, store.tpot):
        counts = sample_set.bucket_counts()
        assert counts.max() == 3
        assert sample_set.train_count == counts.sum() <= BUCKETS * 3
        assert sample_set.test_count == 7
        x, y = sample_set.training_arrays()
        assert x.shape == (counts.sum(), len(FEATURE_NAMES))
        assert y.shape == (counts.sum(),)
    assert store.ttft.added == 1_024_000


def test_default_caps_hold_two_hundred_thousand_per_target() -> None:
    store = SampleStore()
    per_bucket = [
        replace(
            ROW,
            num_request_waiting=waiting,
            kv_cache_percentage=kv / 20 + 0.01,
            prefix_cache_score=prefix / 4 + 0.01,
        )
        for waiting in (0, 1, 3, 6, 11)
        for kv in range(20)
        for prefix in range(4)
    ]
    for i in range(600):  # 240,000 adds, 600 per bucket of which ~10 % held out
        for row in per_bucket:
            store.add(Sample(row, 1.0 + i, None))
    counts = store.ttft.bucket_counts()
    assert (counts == 500).all()
    assert store.ttft.train_count == 200_000
    assert store.ttft.test_count == 1000
    assert store.tpot.train_count == 0


def test_a_bucket_is_a_fifo_of_the_newest_samples() -> None:
    store = SampleStore(StoreConfig(bucket_capacity=500, test_ratio=0.0))
    for i in range(1, 601):
        store.add(Sample(ROW, float(i), None))
    _, y = store.ttft.training_arrays()
    assert sorted(y.tolist()) == [float(i) for i in range(101, 601)]


def test_a_flood_in_one_bucket_does_not_push_out_the_others() -> None:
    store = SampleStore(StoreConfig(bucket_capacity=50, test_ratio=0.0))
    rare = replace(ROW, num_request_waiting=12, kv_cache_percentage=0.97)
    for i in range(10):
        store.add(Sample(rare, 1000.0 + i, None))
    for i in range(100_000):
        store.add(Sample(ROW, float(i % 97) + 1, None))
    counts = store.ttft.bucket_counts()
    assert counts[bucket_key(rare)] == 10
    assert counts[bucket_key(ROW)] == 50
    assert store.ttft.train_count == 60


def test_training_arrays_are_the_feature_matrix_of_the_rows() -> None:
    store = SampleStore(StoreConfig(test_ratio=0.0))
    batch = samples(300, seed=2)
    for s in batch:
        store.add(s)
    x, y = store.ttft.training_arrays()
    expected = feature_matrix([s.row for s in batch])
    got = sorted(zip(map(tuple, x.tolist()), y.tolist(), strict=True))
    want = sorted(
        zip(
            map(tuple, expected.tolist()),
            np.array([s.ttft_ms for s in batch], dtype=np.float32).tolist(),
            strict=True,
        )
    )
    assert got == want
    assert x.dtype == np.float32
    assert x.flags.c_contiguous


def test_held_out_split_is_about_a_tenth_and_deterministic() -> None:
    batch = samples(5000, seed=9)
    a, b = SampleStore(), SampleStore()
    for s in batch:
        a.add(s)
    for s in reversed(batch):
        b.add(s)
    assert 380 <= a.ttft.test_count <= 620  # 10 % of 5000 = 500
    assert a.ttft.test_count == b.ttft.test_count
    assert a.ttft.test_count + a.ttft.train_count == 5000
    ya = sorted(a.ttft.test_arrays()[1].tolist())
    yb = sorted(b.ttft.test_arrays()[1].tolist())
    assert ya == yb  # the same samples, whatever the order
    # TTFT and TPOT of one sample go the same way.
    assert a.tpot.test_count == a.ttft.test_count


def test_held_out_set_is_bounded() -> None:
    store = SampleStore(StoreConfig(test_ratio=0.5, test_capacity=100))
    for s in samples(3000, seed=4):
        store.add(s)
    assert store.ttft.test_count == 100
    assert store.ttft.train_count > 1000


def test_refuses_samples_without_times_or_with_non_finite_values() -> None:
    store = SampleStore()
    assert not store.add(Sample(ROW, None, None))
    assert not store.add(Sample(ROW, 0.0, -1.0))
    assert not store.add(Sample(ROW, math.nan, 1.0))
    assert not store.add(Sample(ROW, math.inf, None))
    assert not store.add(Sample(replace(ROW, kv_cache_percentage=math.nan), 1.0, None))
    assert not store.add(Sample(replace(ROW, input_token_length=10**40), 1.0, None))
    assert store.rejected == 6
    assert store.ttft.added == 0
    assert store.add(Sample(ROW, 5.0, 0.0))  # a TTFT only
    assert store.ttft.added == 1
    assert store.tpot.added == 0


def test_snapshot_views_do_not_change_when_samples_keep_coming() -> None:
    store = SampleStore(StoreConfig(bucket_capacity=10, test_ratio=0.0))
    for i in range(10):
        store.add(Sample(ROW, float(i + 1), None))
    parts = store.ttft.training_parts()
    before = [(x.copy(), y.copy()) for x, y in parts]
    for i in range(25):
        store.add(Sample(ROW, 100.0 + i, None))
    for (x, y), (x0, y0) in zip(parts, before, strict=True):
        assert np.array_equal(x, x0)
        assert np.array_equal(y, y0)
    _, y_now = store.ttft.training_arrays()
    assert sorted(y_now.tolist()) == [100.0 + i for i in range(15, 25)]


def test_clear() -> None:
    store = SampleStore()
    for s in samples(500, seed=1):
        store.add(s)
    store.clear(train=True, test=False)
    assert store.ttft.train_count == 0
    assert store.ttft.test_count > 0
    assert store.ttft.bucket_counts().sum() == 0
    store.clear()
    assert store.ttft.test_count == 0
    assert store.ttft.training_arrays()[0].shape == (0, len(FEATURE_NAMES))


def test_config_is_validated() -> None:
    with pytest.raises(ValueError, match="test_ratio"):
        StoreConfig(test_ratio=1.0)
    with pytest.raises(ValueError, match="capacity"):
        StoreConfig(bucket_capacity=0)
