"""Histogram bucket bounds of :mod:`sluicegate.metrics`, the reference endpoint picker's
where a family has a reference counterpart (GIE
https://github.com/kubernetes-sigs/gateway-api-inference-extension/blob/1748e829/pkg/epp/metrics/metrics.go).
Times are seconds, sizes bytes, counts tokens."""

from __future__ import annotations

LATENCY = (
    0.005, 0.025, 0.05, 0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 1.25, 1.5, 2, 3, 4, 5, 6,
    8, 10, 15, 20, 30, 45, 60, 120, 180, 240, 300, 360, 480, 600, 900, 1200,
    1800, 2700, 3600,
)  # fmt: skip
"""Request latency, TTFT: 5 ms .. 1 h (GIE ``generalLatencyBuckets``)."""

TPOT = (
    0.0005, 0.00205, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.125, 0.15, 0.2,
    0.3, 0.4, 0.5, 0.6, 0.8, 1, 1.5, 2, 3, 4.5, 6, 12, 18, 24, 30, 36, 48, 60,
    90, 120, 180, 270, 360,
)  # fmt: skip
"""Time per output token: 0.5 ms .. 360 s (GIE ``tpotBuckets``)."""

NTPOT = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0)
"""Normalized time per output token: 1 ms .. 10 s."""

INPUT_TOKENS = (
    1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32778, 65536,
    131072, 262144, 524288, 1048576,
)  # fmt: skip
"""Prompt and cached tokens (GIE's, its ``32778`` included)."""

OUTPUT_TOKENS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192)

REQUEST_BYTES = (
    64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536,
    131072, 262144, 524288, 1048576, 2097152, 4194304, 8388608,
    16777216, 33554432, 67108864, 134217728, 268435456, 536870912, 1073741824,
)  # fmt: skip
"""Request bodies: 64 B .. 1 GiB."""

RESPONSE_BYTES = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32778, 65536)
"""Response bodies: 1 B .. 64 KiB (GIE's, its ``32778`` included)."""

SCHEDULER = (0.0001, 0.0002, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1)
"""Scheduling, plugin calls, flow-control enqueue and dispatch cycles: 100 µs .. 100 ms."""

QUEUE = (
    0.0001, 0.0005, 0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
    10.0, 30.0, 60.0,
)  # fmt: skip
"""Time in flow control, enqueue to outcome: 100 µs .. 60 s."""

MICRO = (
    0.00001, 0.00002, 0.00005, 0.0001, 0.0002, 0.0005, 0.001, 0.002, 0.005, 0.01,
    0.02, 0.05, 0.1, 0.2, 0.5, 1.0,
)  # fmt: skip
"""sluicegate's own finer scale, 10 µs .. 1 s: its scheduling takes tens of µs, below
the reference's first bucket (used for its overhead and prediction-call families)."""

RATIO = (0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0)
"""Prefix-cache hit ratio (GIE's)."""
