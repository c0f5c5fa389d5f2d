"""bench.metrics on hand-built traces: every field of a summary, checked against numbers
worked out by hand (times are multiples of 1/8 s so differences are exact in binary)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from sluicegate.bench.des_spec import RequestRecord
from sluicegate.bench.metrics import (
    ReplicaLoad,
    by_accelerator,
    by_class,
    cost_summary,
    ideal_prefix_hit_rate,
    imbalance,
    latency_summary,
    replica_loads,
    summarize,
    tokens_within,
)
from sluicegate.bench.workloads import RequestSpec
from sluicegate.tokens import BYTES_PER_TOKEN

EXACT = 1e-12


def spec(
    klass: str = "default", ttft_ms: float | None = None, tpot_ms: float | None = None
) -> RequestSpec:
    return RequestSpec(
        "completions", "m", 16, prompt="x", klass=klass, slo_ttft_ms=ttft_ms, slo_tpot_ms=tpot_ms
    )


def done(
    arrival: float,
    first: float,
    finish: float,
    out: int,
    prompt: int,
    cached: int,
    endpoint: int,
    s: RequestSpec | None = None,
) -> RequestRecord:
    return RequestRecord(
        s or spec(),
        arrival,
        endpoint=endpoint,
        first_token=first,
        finish=finish,
        output_tokens=out,
        prompt_tokens=prompt,
        cached_tokens=cached,
        status=200,
    )


def not_done(arrival: float, status: int, s: RequestSpec | None = None) -> RequestRecord:
    return RequestRecord(s or spec(), arrival, status=status, reason="x" if status else "")


def lin_percentile(values: list[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default), by hand."""
    xs = sorted(values)
    pos = q / 100 * (len(xs) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (pos - lo) * (xs[hi] - xs[lo])


def assert_summary(got: dict[str, Any], values: list[float]) -> None:
    assert got["mean"] == pytest.approx(sum(values) / len(values), abs=EXACT)
    for key, q in (("p50", 50), ("p90", 90), ("p99", 99)):
        assert got[key] == pytest.approx(lin_percentile(values, q), abs=EXACT)
        assert got[key] == pytest.approx(float(np.percentile(values, q)), abs=EXACT)


# --------------------------------------------------------------------------- the trace

# (arrival, first token, finish, output tokens, prompt, cached, endpoint, spec)
# r1: TTFT 0.5, TPOT 2.0/4 = 0.5, E2E 2.5 — meets 500/500 ms exactly (≤ is a hit).
# r2: TTFT 0.25, TPOT 1.0/8 = 0.125, E2E 1.25 — misses its 125 ms TTFT.
# r3: TTFT 0.125, one token (no TPOT), E2E 2.0 — its TPOT SLO cannot be missed: a hit.
# r4: TTFT 0.375, TPOT 1.5/2 = 0.75, E2E 1.875 — misses its 500 ms TPOT.
# r5: TTFT 0.25, TPOT 0.5/4 = 0.125, E2E 0.75; no SLO, last finish at 5.0.


def trace() -> list[RequestRecord]:
    return [
        done(0.0, 0.5, 2.5, 5, 100, 50, 0, spec("a", ttft_ms=500, tpot_ms=500)),
        done(1.0, 1.25, 2.25, 9, 200, 0, 1, spec("a", ttft_ms=125)),
        done(2.0, 2.125, 4.0, 1, 50, 10, 1, spec("b", tpot_ms=10)),
        done(3.0, 3.375, 4.875, 3, 40, 32, 2, spec("b", tpot_ms=500)),
        done(4.25, 4.5, 5.0, 5, 64, 0, 0),
        not_done(0.5, 429, spec("a", ttft_ms=1000)),  # shed: an SLO miss
        not_done(1.5, 503, spec("b")),  # failed, no SLO: excluded
        not_done(2.5, 400, spec("b")),  # failed
        not_done(4.5, 0, spec("a", ttft_ms=1000, tpot_ms=1000)),  # cut by the horizon: a miss
    ]


TTFTS = [0.5, 0.25, 0.125, 0.375, 0.25]
TPOTS = [0.5, 0.125, 0.75, 0.125]
E2ES = [2.5, 1.25, 2.0, 1.875, 0.75]


def test_counts() -> None:
    m = summarize(trace())
    assert m["requests"] == 9
    assert m["completed"] == 5
    assert m["shed"] == 1
    assert m["failed"] == 2
    assert m["incomplete"] == 1
    assert m["requests"] == m["completed"] + m["shed"] + m["failed"] + m["incomplete"]


def test_throughput_over_the_arrival_window() -> None:
    """The window is 0.0 → 4.5 (the last arrival, a failed request's): r4 and r5 finish
    after it. Tokens: r1 5, r2 9, r3 1, r4 its first + 2 × (4.5 - 3.375) / 1.5 = 2.5, r5
    only its first (at 4.5, the window's edge)."""
    m = summarize(trace())
    assert m["window_s"] == 4.5
    assert m["throughput_rps"] == pytest.approx(3 / 4.5, abs=EXACT)
    assert m["output_tokens_per_s"] == pytest.approx((5 + 9 + 1 + 2.5 + 1) / 4.5, abs=EXACT)


def test_the_window_starts_at_the_first_arrival_and_leaves_the_drain_out() -> None:
    """Window 10 → 11: nothing finishes in it; r1 emits its first token at 10.5 and a third
    of its other 3 by 11; r2 starts after the window."""
    late = [done(10.0, 10.5, 12.0, 4, 8, 0, 0), done(11.0, 11.25, 14.0, 8, 8, 0, 0)]
    m = summarize(late)
    assert m["window_s"] == 1.0
    assert m["throughput_rps"] == 0.0
    assert m["output_tokens_per_s"] == pytest.approx(2.0, abs=EXACT)


def test_a_single_arrival_is_measured_to_its_completion() -> None:
    m = summarize([done(3.0, 3.5, 5.0, 7, 8, 0, 0)])
    assert m["window_s"] == 2.0
    assert m["throughput_rps"] == pytest.approx(0.5, abs=EXACT)
    assert m["output_tokens_per_s"] == pytest.approx(3.5, abs=EXACT)


def test_tokens_within_parts_of_a_request() -> None:
    r = done(0.0, 1.0, 3.0, 5, 8, 0, 0)  # first token at 1, four more over [1, 3]
    assert tokens_within(r, 0.0, 10.0) == 5
    assert tokens_within(r, 0.0, 2.0) == pytest.approx(1 + 4 * 0.5, abs=EXACT)
    assert tokens_within(r, 2.5, 10.0) == pytest.approx(4 * 0.25, abs=EXACT)
    assert tokens_within(r, 0.0, 0.5) == 0.0
    burst = done(0.0, 1.0, 1.0, 3, 8, 0, 0)  # every token at once
    assert tokens_within(burst, 0.0, 1.0) == 3
    assert tokens_within(burst, 1.5, 2.0) == 0


def test_latency_summaries() -> None:
    m = summarize(trace())
    assert_summary(m["ttft_s"], TTFTS)
    assert_summary(m["tpot_s"], TPOTS)  # the one-token request has no TPOT
    assert_summary(m["e2e_s"], E2ES)
    # Spot values worked out by hand: E2E sorted 0.75 1.25 1.875 2 2.5; p90 at rank 3.6.
    assert m["e2e_s"]["p50"] == 1.875
    assert m["e2e_s"]["p90"] == pytest.approx(2.0 + 0.6 * 0.5, abs=EXACT)
    assert m["e2e_s"]["p99"] == pytest.approx(2.0 + 0.96 * 0.5, abs=EXACT)
    assert m["e2e_s"]["mean"] == pytest.approx(8.375 / 5, abs=EXACT)
    # TPOT sorted 0.125 0.125 0.5 0.75: p50 at rank 1.5.
    assert m["tpot_s"]["p50"] == pytest.approx(0.3125, abs=EXACT)
    # NTPOT = E2E / output tokens, queueing included: 2.5/5, 1.25/9, 2/1, 1.875/3, 0.75/5.
    assert_summary(m["ntpot_s"], [0.5, 1.25 / 9, 2.0, 0.625, 0.15])


def test_latency_summary_of_nothing_is_none() -> None:
    assert latency_summary([]) == {"mean": None, "p50": None, "p90": None, "p99": None}
    m = summarize([not_done(0.0, 429), not_done(1.0, 0)])
    assert m["completed"] == 0
    assert m["throughput_rps"] == 0.0
    assert m["output_tokens_per_s"] == 0.0
    for key in ("ttft_s", "tpot_s", "e2e_s", "ntpot_s"):
        assert m[key] == {"mean": None, "p50": None, "p90": None, "p99": None}
    assert m["prefix_hit_rate"] == 0.0


def test_slo_attainment() -> None:
    # With SLOs: r1 hit, r2 miss (TTFT), r3 hit, r4 miss (TPOT), shed miss, incomplete miss.
    m = summarize(trace())
    assert m["slo_attainment"] == pytest.approx(2 / 6, abs=EXACT)


def test_slo_attainment_none_without_slos() -> None:
    m = summarize([done(0.0, 0.5, 1.0, 2, 8, 0, 0), not_done(0.5, 429)])
    assert m["slo_attainment"] is None


def test_slo_boundaries() -> None:
    # TTFT exactly at the limit is a hit, just over it a miss; TPOT likewise.
    at = done(0.0, 0.25, 1.25, 5, 8, 0, 0, spec(ttft_ms=250, tpot_ms=250))
    over_ttft = done(0.0, 0.25, 1.25, 5, 8, 0, 0, spec(ttft_ms=249.9))
    over_tpot = done(0.0, 0.25, 1.25, 5, 8, 0, 0, spec(tpot_ms=249.9))
    assert summarize([at])["slo_attainment"] == 1.0
    assert summarize([over_ttft])["slo_attainment"] == 0.0
    assert summarize([over_tpot])["slo_attainment"] == 0.0


def test_prefix_hit_rate_from_cached_over_prompt_tokens_of_completed() -> None:
    m = summarize(trace())
    cached, prompt = 50 + 0 + 10 + 32 + 0, 100 + 200 + 50 + 40 + 64
    assert m["prefix_hit_rate"] == pytest.approx(cached / prompt)


def test_record_properties_match_the_summary() -> None:
    records = [r for r in trace() if r.completed]
    assert [r.ttft for r in records] == TTFTS
    assert [t for r in records if (t := r.tpot) is not None] == TPOTS
    assert [r.e2e for r in records] == E2ES
    assert not RequestRecord(spec(), 0.0, status=200).completed  # no finish time yet


COUNTS = ("requests", "completed", "shed", "failed", "incomplete")


def test_by_class() -> None:
    records = trace()
    classes = by_class(records)
    assert list(classes) == ["a", "b", "default"]
    a = classes["a"]
    assert [a[k] for k in COUNTS] == [4, 2, 1, 0, 1]
    assert a["slo_attainment"] == pytest.approx(1 / 4)
    assert_summary(a["ttft_s"], [0.5, 0.25])
    b = classes["b"]
    assert [b[k] for k in COUNTS] == [4, 2, 0, 2, 0]
    assert b["slo_attainment"] == pytest.approx(1 / 2)
    # Each class's throughput is over its own window: b's arrivals 1.5 → 3.0, in which
    # nothing finishes and only r3's first token (at 2.125) is emitted.
    assert b["window_s"] == 1.5
    assert b["throughput_rps"] == 0.0
    assert b["output_tokens_per_s"] == pytest.approx(1 / 1.5)
    assert classes["default"]["slo_attainment"] is None
    assert sum(c["requests"] for c in classes.values()) == len(records)


def test_by_class_needs_two_classes() -> None:
    assert by_class([done(0.0, 0.5, 1.0, 2, 8, 0, 0), not_done(0.1, 429)]) == {}
    assert by_class([]) == {}


def test_replica_loads_and_imbalance() -> None:
    loads = replica_loads(trace(), 3)
    assert [(x.requests, x.prefill_tokens, x.output_tokens) for x in loads] == [
        (2, (100 - 50) + 64, 5 + 5),
        (2, 200 + (50 - 10), 9 + 1),
        (1, 40 - 32, 3),
    ]
    assert [x.work for x in loads] == [124, 250, 11]
    assert imbalance(loads) == pytest.approx(250 / 11)
    # Unfinished requests and out-of-range endpoints are not counted.
    stray = done(0.0, 0.5, 1.0, 2, 8, 0, 7)
    assert [x.work for x in replica_loads([stray, not_done(0.0, 0)], 3)] == [0, 0, 0]


def test_imbalance_edge_cases() -> None:
    assert imbalance([]) is None
    assert imbalance([ReplicaLoad(1, 10, 10), ReplicaLoad()]) is None  # an idle replica
    assert imbalance([ReplicaLoad(1, 10, 10), ReplicaLoad(2, 5, 15)]) == 1.0


# --------------------------------------------------------------------------- ideal prefix


BLOCK = 16  # tokens
BLOCK_BYTES = BLOCK * BYTES_PER_TOKEN


def text(tag: str, tokens: int) -> bytes:
    """Distinct, token-aligned bytes: ``tokens`` tokens starting with ``tag``."""
    out = (tag * (tokens * BYTES_PER_TOKEN))[: tokens * BYTES_PER_TOKEN].encode()
    assert len(out) == tokens * BYTES_PER_TOKEN
    return out


def test_ideal_identical_prompts_hit_all_but_the_last_partial_block() -> None:
    p = text("a", 40)  # 2 full blocks + 8 tokens
    # First: nothing cached. Second: the 2 full blocks (32 tokens) hit.
    assert ideal_prefix_hit_rate([(p, b""), (p, b"")]) == pytest.approx(32 / 80)
    # A prompt of exactly 3 blocks: its last block is never a hit (one token is computed).
    q = text("b", 48)
    assert ideal_prefix_hit_rate([(q, b""), (q, b"")]) == pytest.approx(32 / 96)
    # Three identical prompts: both repeats hit.
    assert ideal_prefix_hit_rate([(p, b"")] * 3) == pytest.approx(64 / 120)


def test_ideal_follow_up_hits_the_previous_reply() -> None:
    prompt = text("a", 40)
    reply = text("r", 24)  # prompt + reply = 64 tokens = 4 full blocks cached
    follow = prompt + reply + text("q", 16)  # 80 tokens; limit (80 - 1) // 16 = 4 blocks
    rate = ideal_prefix_hit_rate([(prompt, reply), (follow, b"")])
    assert rate == pytest.approx(64 / (40 + 80))
    # Without the reply cached only the prompt's 2 full blocks match.
    assert ideal_prefix_hit_rate([(prompt, b""), (follow, b"")]) == pytest.approx(32 / 120)


def test_ideal_unaligned_prompt_is_padded_before_the_reply() -> None:
    prompt = text("a", 40)[:-1]  # 159 bytes → 40 tokens, padded with one NUL byte
    reply = text("r", 24)
    follow = prompt + b"\0" + reply + text("q", 16)
    assert ideal_prefix_hit_rate([(prompt, reply), (follow, b"")]) == pytest.approx(64 / 120)


def test_ideal_unrelated_prompts_miss() -> None:
    prompts = [(text(t, 64), text("r", 32)) for t in "abcdef"]
    assert ideal_prefix_hit_rate(prompts) == 0.0
    assert ideal_prefix_hit_rate([]) == 0.0


def test_ideal_shared_prefix_then_divergence() -> None:
    system = text("s", 2 * BLOCK)  # 2 shared blocks
    a = system + text("a", 20)
    b = system + text("b", 20)  # 52 tokens: 3 full blocks, only the 2 shared ones match
    assert ideal_prefix_hit_rate([(a, b""), (b, b"")]) == pytest.approx(32 / 104)
    assert len(system) == 2 * BLOCK_BYTES


def test_goodput_counts_completions_in_the_window_that_met_their_slos() -> None:
    slo = spec(ttft_ms=500, tpot_ms=50)
    records = [
        done(0.0, 0.25, 1.0, 11, 10, 0, 0, slo),  # TPOT 75 ms: misses
        done(0.5, 0.625, 1.125, 11, 10, 0, 0, slo),  # TTFT 125 ms, TPOT 50 ms: meets
        done(1.0, 1.75, 2.0, 2, 10, 0, 0, slo),  # TTFT 750 ms: misses
        done(2.0, 2.125, 2.5, 2, 10, 0, 0),  # no SLO, but finishes after the window
    ]
    m = summarize(records)
    # Window [0, 2] s: one good completion.
    assert m["goodput_rps"] == pytest.approx(1 / 2.0, abs=EXACT)


def test_cost_per_million_tokens_busy_and_fleet() -> None:
    records = [
        done(0.0, 0.5, 1.0, 100, 10, 0, 0),
        done(1.0, 1.5, 2.0, 300, 10, 0, 1),
    ]
    # Endpoint 0 costs 3.6 $/h and was busy 1,000 s; endpoint 1 7.2 $/h, busy 500 s, of
    # a run of 2,000 s.
    costs = cost_summary(records, [3.6, 7.2], [1000.0, 500.0], 2000.0)
    assert costs["cost_per_1m_output_tokens"] == pytest.approx((1.0 + 1.0) / 400 * 1e6)
    # Fleet: 10.8 $/h over the arrival window [0, 1] s, over the tokens emitted within
    # it: the first request's 100 (the second's first token comes at 1.5 s).
    assert costs["fleet_cost_per_1m_output_tokens"] == pytest.approx(10.8 / 3600 / 100 * 1e6)
    assert costs["busy_fraction"] == pytest.approx(1500.0 / (2 * 2000.0))
    assert (
        cost_summary([not_done(0.0, 429)], [1.0], [0.0], 1.0)["cost_per_1m_output_tokens"] is None
    )


def test_busy_fraction_counts_the_whole_span_of_a_cut_run() -> None:
    """A run cut at its horizon: its engines kept working on a request that never
    completed, after the last completion (the busy fraction read over 100 % when its
    denominator was the last completion)."""
    records = [done(0.0, 0.5, 1.0, 100, 10, 0, 0), not_done(0.5, 0)]
    costs = cost_summary(records, [1.0], [3.0], 4.0)  # busy 3 s of a 4 s horizon
    assert costs["busy_fraction"] == pytest.approx(0.75)


def test_by_accelerator_groups_endpoints_of_a_class() -> None:
    records = [
        done(0.0, 0.25, 1.0, 10, 10, 0, 0),
        done(0.0, 0.5, 1.0, 10, 10, 0, 1),
        done(0.0, 0.75, 1.0, 10, 10, 0, 2),
        not_done(0.5, 429),
    ]
    classes = by_accelerator(
        records, ["h100", "a100", "a100"], [4.0, 2.0, 2.0], [1.0, 1.0, 1.0], 1.0
    )
    assert set(classes) == {"h100", "a100"}
    assert (classes["a100"]["requests"], classes["a100"]["endpoints"]) == (2, 2)
    assert classes["h100"]["ttft_s"]["p90"] == pytest.approx(0.25)
    assert classes["a100"]["cost_per_1m_output_tokens"] == pytest.approx(4.0 / 3600 / 20 * 1e6)
    # Unpriced (or no busy times, as over HTTP): the breakdown without costs.
    plain = by_accelerator(records, ["h100", "a100", "a100"], [4.0, None, 2.0], [1.0] * 3, 1.0)
    assert "cost_per_1m_output_tokens" not in plain["a100"]
    assert (
        "cost_per_1m_output_tokens"
        not in by_accelerator(records, ["h", "a", "a"], (), (), 1.0)["a"]
    )
    assert by_accelerator(records, ["h100"] * 3, [1.0] * 3, [1.0] * 3, 1.0) == {}
