"""The profile's per-request costs: ``step_ms_per_seq`` (per sequence in an iteration) and
``request_overhead_ms`` (from arrival until the engine can schedule it, outside the
iterations)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from sluicegate.sim.engine import Engine, Sequence, StepResult, new_sequence
from sluicegate.sim.profiles import PROFILES, get_profile


def _seq(rid: str, tokens: int, at: float, out: int = 3) -> Sequence:
    return new_sequence(
        rid,
        bytes(range(1, 5)) * tokens,
        arrival=at,
        max_tokens=out,
        ignore_eos=True,
        max_model_len=4096,
        model="m",
    )


def _run(engine: Engine, now: float) -> list[StepResult]:
    results = []
    while engine.has_work():
        result = engine.step(now)
        assert not result.idle, "work left but the engine would wait for an arrival"
        results.append(result)
        now += result.duration
    return results


def test_step_ms_per_seq_adds_per_scheduled_sequence() -> None:
    base = get_profile("tiny")
    profile = replace(base, step_ms_per_seq=0.25)
    plain = base.step_ms(40, 4, 400, 1e6, prefill_seqs=2)
    assert profile.step_ms(40, 4, 400, 1e6, prefill_seqs=2) == pytest.approx(plain + 6 * 0.25)
    assert profile.prefill_ms(64) == pytest.approx(base.prefill_ms(64) + 0.25)
    assert profile.decode_ms(8, 100) == pytest.approx(base.decode_ms(8, 100) + 8 * 0.25)
    # the engine counts the sequences it batches
    a, b = Engine(base), Engine(profile)
    for e in (a, b):
        e.add(_seq("x", 32, 0.0))
        e.add(_seq("y", 16, 0.0))
    assert b.step(0.0).duration == pytest.approx(a.step(0.0).duration + 2 * 0.25e-3)


def test_request_overhead_delays_scheduling_without_engine_time() -> None:
    base = get_profile("tiny")
    profile = replace(base, request_overhead_ms=4.0)
    engine = Engine(profile)
    seq = _seq("x", 64, 1.0)
    engine.add(seq)
    assert engine.has_work()
    assert engine.num_requests == 0  # not in the engine's queues yet (as vLLM reports it)
    wait = engine.step(1.0)
    assert not wait.idle
    assert (wait.batched_tokens, wait.emitted) == (0, [])
    assert wait.duration == pytest.approx(0.004)
    assert engine.counters.steps == 0
    assert engine.counters.busy_s == 0.0
    _run(engine, 1.0 + wait.duration)
    # Time to first token counts the overhead; the prefill (scheduled to first token) not.
    assert seq.first_token_time - seq.arrival == pytest.approx(0.004 + base.prefill_ms(64) / 1e3)
    assert seq.first_scheduled == pytest.approx(1.004)


def test_arriving_requests_are_forked_and_aborted() -> None:
    engine = Engine(replace(get_profile("tiny"), request_overhead_ms=2.0))
    engine.add(_seq("late", 16, 0.5))
    engine.add(_seq("early", 16, 0.0))
    assert [s.request_id for s in engine.arriving] == ["early", "late"]
    twin = engine.fork()
    assert [s.request_id for s in twin.arriving] == ["early", "late"]
    assert twin.arriving[0] is not engine.arriving[0]
    late_twin = twin.arriving[1]
    aborted = engine.abort("late", 0.1)
    assert aborted is not None
    assert [s.request_id for s in engine.arriving] == ["early"]
    assert len(twin.arriving) == 2  # the fork is independent
    _run(engine, 0.0)
    assert not engine.has_work()
    _run(twin, 0.0)
    assert late_twin.finished
    assert late_twin.first_scheduled == pytest.approx(0.502)


@pytest.mark.parametrize("name", sorted(PROFILES))
def test_built_in_profiles_keep_the_timing_they_had(name: str) -> None:
    """The new terms are off in every built-in profile: no per-sequence cost, no wait
    before scheduling, built-in tokens; a request is schedulable the moment it is added
    and an iteration lasts what the four-term step time says."""
    profile = PROFILES[name]
    assert (profile.step_ms_per_seq, profile.request_overhead_ms) == (0.0, 0.0)
    assert profile.tokenizer is None
    engine = Engine(profile)
    assert engine.prompt_tokens is None
    seq = _seq("x", 64, 2.0)
    engine.add(seq)
    assert (engine.arriving, list(engine.waiting)) == ([], [seq])
    first = engine.step(2.0)
    assert seq.first_scheduled == 2.0
    flops = profile.prefill_attention_flops(64, 0)
    assert first.duration * 1e3 == pytest.approx(
        profile.linear_ops(64)
        + flops / profile.attention_flops_per_s * 1e3
        + profile.step_overhead_ms
    )
    assert engine.step(2.0 + first.duration).duration == pytest.approx(
        profile.decode_ms(1, 65) / 1e3
    )
