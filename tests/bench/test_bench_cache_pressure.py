"""The cache-pressure workload: tenants, Zipf popularity, conversations that grow."""

from __future__ import annotations

import collections

import pytest

from sluicegate.bench.cache_pressure import TenantChats
from sluicegate.bench.scenarios import get_scenario
from sluicegate.sim.text import render_chat


def test_sessions_follow_the_zipf_popularity() -> None:
    w = TenantChats(rate=200.0, duration=20.0, model="m", seed=3, tenants=50, zipf_s=1.0)
    assert sum(w.tenant_share(k) for k in range(50)) == pytest.approx(1.0)
    assert w.tenant_share(0) == pytest.approx(2 * w.tenant_share(1))
    firsts = [spec for _, spec in w.initial()]
    counts = collections.Counter(spec.messages[0]["content"] for spec in firsts)
    top = counts.most_common(1)[0][1] / len(firsts)
    assert top == pytest.approx(w.tenant_share(0), abs=0.02)


def test_a_turn_extends_the_previous_prompt_with_the_reply() -> None:
    w = TenantChats(rate=1.0, duration=30.0, model="m", seed=1, turns=(3, 3))
    t0, first = next(iter(w.initial()))
    assert first.kind == "completions"
    assert first.messages[0]["role"] == "system"
    assert first.prompt == render_chat(first.messages).decode()
    ((t1, second),) = w.follow_up(first, t0 + 2.0, "the reply")
    assert t1 > t0 + 2.0
    assert second.turn == 1
    assert second.messages[: len(first.messages)] == first.messages
    assert second.messages[len(first.messages)] == {"role": "assistant", "content": "the reply"}
    # the previous prompt and the reply are a prefix of the next (what a cache can reuse)
    before = render_chat(first.messages).decode()
    assert second.prompt.startswith(before + "the reply")
    ((_, third),) = w.follow_up(second, t1 + 2.0, "again")
    assert w.follow_up(third, t1 + 9.0, "last") == []  # three turns
    assert w.follow_up(first, t0 + 1.0, None) == []  # a failed turn ends the session


def test_the_same_seed_gives_the_same_requests() -> None:
    def first_turns(seed: int) -> list[tuple[float, str]]:
        w = TenantChats(rate=5.0, duration=10.0, model="m", seed=seed)
        return [(t, spec.prompt) for t, spec in w.initial()]

    assert first_turns(4) == first_turns(4)
    assert first_turns(4) != first_turns(5)


def test_chat_requests_on_request() -> None:
    w = TenantChats(rate=5.0, duration=5.0, model="m", as_chat=True)
    _, spec = next(iter(w.initial()))
    assert spec.kind == "chat"
    assert spec.prompt == ""


def test_the_working_set_is_two_to_four_times_the_fleets_cache() -> None:
    scenario = get_scenario("cache-pressure")
    fleet = scenario.replicas * scenario.profile.kv_capacity_tokens
    w = TenantChats(rate=8.0, duration=120.0, model=scenario.model)
    assert 2 * fleet <= w.system_prompt_tokens() * 1.05  # the system prompts alone ≈ 2 ×
    # live sessions at 8 sessions/s: ~3.5 turns of ~5 s each (think time and service)
    assert 2 * fleet <= w.working_set_tokens(8.0 * 3.5 * 5.0) <= 4 * fleet


def test_bad_settings_are_refused() -> None:
    with pytest.raises(ValueError, match="tenants"):
        TenantChats(rate=0.0, duration=1.0, model="m")
