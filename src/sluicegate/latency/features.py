"""What a latency model sees: one row per (request, endpoint), in fixed column order.

The same row is built when predicting (for every candidate, before scheduling) and when
training (for the chosen endpoint, as it was at dispatch), so the model learns from exactly
what it is later asked about. Features follow the reference predictor's
(https://github.com/llm-d/llm-d-latency-predictor/blob/04e44cd8/training/training_server.py),
with the input length a real token estimate rather than a word count, plus what the
gateway alone knows: requests it dispatched since the endpoint's last scrape, the
request's expected output length, and when it last saw the endpoint produce a token.

The token timing is what makes TTFT predictable on a busy engine: a new request waits
for the iteration in progress to end before its prefill runs, and that residual wait is a
large, otherwise random share of a short TTFT. Every token the gateway relays marks the
end of an engine iteration, so ``ms_since_last_token`` and ``token_interval_ms`` (the
last gap between two iterations seen) locate the next one; the prompt tokens dispatched
before and after the last token and not answered yet tell how long the iteration in
progress takes (prefills lengthen it) and what joins the next one ahead of the request.
They count every prompt token: which of them the server has cached is what the index
guesses least well (the prefix-cache score says "cached" for many prompts the server has
long evicted), so they leave that to the model. The prefix's reuse distance tells whether
the server still holds what the gateway's index says it sent it (measured effect of each:
``docs/benchmarks/latency-accuracy.md``).

Where the pool publishes KV-cache events and the profile declares the
``precise-prefix-cache-producer`` (preset ``predicted-latency-precise``), the prefix-cache
score is the share of the prompt's blocks the server's own events say it holds, and the
uncached in-flight prompt tokens follow from it: the cached-token count the models see
is then the server's, not the index's memory of what it sent (no reuse distance is
measured then: the value is its cap, "nothing to doubt").
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from dataclasses import dataclass, fields

import numpy as np

REUSE_DISTANCE_CAP_TOKENS = 10_000_000
"""Cap of ``prefix_reuse_distance_tokens``, and its value when no prefix matches: far
beyond any server's KV capacity, so "long gone" and "never sent" look alike."""

TOKEN_TIMING_CAP_MS = 1000.0
"""Cap of the token-timing features (ms): beyond it the endpoint is simply idle, and a
bounded value keeps never-seen endpoints in the same region of the feature space."""


def token_timing(last_token_at: float | None, interval_s: float, now: float) -> tuple[float, float]:
    """``(ms_since_last_token, token_interval_ms)`` of an endpoint at ``now`` from its
    last token time and iteration interval (clock seconds; see ``InFlight.token``),
    capped at :data:`TOKEN_TIMING_CAP_MS`."""
    cap = TOKEN_TIMING_CAP_MS
    since = cap if last_token_at is None else min(max(now - last_token_at, 0.0) * 1000.0, cap)
    return since, min(interval_s * 1000.0, cap)


@dataclass(frozen=True, slots=True)
class FeatureRow:
    """One (request, endpoint) pair. Token counts are built-in tokens."""

    kv_cache_percentage: float
    """KV-cache use, 0..1 (the gateway's estimate: scrape + prompt tokens since)."""
    input_token_length: int
    num_request_waiting: int
    num_request_running: int
    prefill_tokens_in_flight: int
    """Uncached prompt tokens this gateway dispatched and that have not produced a byte."""
    decode_tokens_in_flight: int
    prefix_cache_score: float
    """Share of the prompt's blocks the endpoint holds, 0..1: as its KV-cache events say
    with the precise prefix producer, else as the approximate index guesses."""
    dispatched_since_scrape: int
    expected_output_tokens: int
    """``max_tokens``, or the gateway's estimate when the request sets none."""
    ms_since_last_token: float = TOKEN_TIMING_CAP_MS
    """Milliseconds since the gateway last saw the endpoint produce a token (any request's
    first byte or streamed chunk), capped at :data:`TOKEN_TIMING_CAP_MS` (also: never)."""
    token_interval_ms: float = 0.0
    """Milliseconds between the last two distinct moments the endpoint produced tokens
    (≈ its iteration time while it streams), capped at :data:`TOKEN_TIMING_CAP_MS`; 0 when
    unknown."""
    prompt_tokens_before_last_token: int = 0
    """Prompt tokens (cached or not) of requests dispatched before the endpoint's last
    token and not answered yet: prefills in the iteration in progress, which lengthen it
    (or still queued)."""
    prompt_tokens_after_last_token: int = 0
    """Prompt tokens of requests dispatched after the endpoint's last token: prefills that
    join its next iteration ahead of this request."""
    prefix_reuse_distance_tokens: int = REUSE_DISTANCE_CAP_TOKENS
    """Prompt tokens sent to the endpoint since the matched prefix last was, capped at
    :data:`REUSE_DISTANCE_CAP_TOKENS` (also the value without a match): the server's cache
    evicts in LRU order to make room for new blocks, so a prefix sent long ago is probably
    gone although the index still lists it."""

    @property
    def effective_input_tokens(self) -> float:
        """Prompt tokens left to compute: (1 − prefix score) · input length."""
        return (1.0 - self.prefix_cache_score) * self.input_token_length


FEATURE_NAMES: tuple[str, ...] = (
    *(f.name for f in fields(FeatureRow)),
    "effective_input_tokens",
)
"""Column names of :func:`feature_matrix`, in order."""


ROW_FIELDS: tuple[str, ...] = tuple(f.name for f in fields(FeatureRow))
"""The :class:`FeatureRow` field names, in declaration order (the first columns)."""

_ROW_VALUES = operator.attrgetter(*ROW_FIELDS)


def feature_vector(row: FeatureRow) -> tuple[float, ...]:
    """One row of :func:`feature_matrix` as a tuple (before the float32 cast)."""
    return (*_ROW_VALUES(row), row.effective_input_tokens)


def feature_matrix(rows: Sequence[FeatureRow]) -> np.ndarray:
    """``len(rows) × len(FEATURE_NAMES)`` float32 matrix."""
    if not rows:
        return np.empty((0, len(FEATURE_NAMES)), dtype=np.float32)
    return np.array([feature_vector(row) for row in rows], dtype=np.float32)


@dataclass(frozen=True, slots=True)
class Sample:
    """A training sample: the row at dispatch and what was observed. Times in ms."""

    row: FeatureRow
    ttft_ms: float | None = None
    """Time to first token (streaming), or end-to-end latency in non-streaming mode."""
    tpot_ms: float | None = None
    """Mean time per output token after the first (streaming only)."""
    hardware_class: str | None = None
    """The hardware class of the endpoint that served it (``Hardware.accelerator``), as
    the producer files it: None for a hardware-blind producer or an endpoint of no named
    class. A hardware-aware predictor keeps one model per class
    (:mod:`sluicegate.latency.hardware`)."""
