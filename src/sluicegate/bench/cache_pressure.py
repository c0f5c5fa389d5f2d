"""The ``cache-pressure`` workload: many tenants' long system prompts, Zipf-popular, under
multi-turn chats whose working set exceeds the fleet's KV cache several times.

Each tenant has one system prompt (built-in tokens, length uniform in ``system_tokens``).
Sessions start as a Poisson process; a session belongs to tenant *k* (rank 1 … T) with
probability ∝ k^−``zipf_s`` and runs ``turns`` turns (uniform), each a user message of
``user_tokens`` (uniform) tokens answered in ``output_tokens`` (uniform, ``ignore_eos``)
tokens; the next turn is sent an exponential think time (mean ``think_s``) after the
reply, with the whole history — system prompt, earlier turns and the replies the model
actually generated — as a chat client sends it.

Requests go out as **completions of the rendered conversation** (the client applies the
chat template, the simulator's :func:`~sluicegate.sim.text.render_chat`) unless
``as_chat``: the precise producer keys a prompt's built-in token ids, and it renders chat
messages with the server's template only once the request-path tokenizer (a separate
slice of issue 17) is wired into it; until then a chat request's blocks never match the
server's events. The bytes the engines see are the same either way.

What a cache has to hold to serve it all: every tenant's system prompt plus each live
session's own history. :meth:`TenantChats.working_set_tokens` states it; the scenario
sizes the fleet so that this is 2–4 × the fleet's KV cache (see
``docs/benchmarks/cache-pressure/README.md``). Everything is fixed by the seed.
"""

from __future__ import annotations

import bisect
import itertools
import random
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from sluicegate.bench.workloads import RequestSpec, Timed, poisson_times, random_text
from sluicegate.sim.text import render_chat


@dataclass(frozen=True, slots=True)
class _Plan:
    tenant: int
    turns: int


@dataclass
class TenantChats:
    """Multi-turn chats of ``tenants`` tenants with Zipf popularity (see the module)."""

    rate: float
    """Sessions started per second."""
    duration: float
    model: str
    seed: int = 0
    tenants: int = 300
    zipf_s: float = 1.0
    system_tokens: tuple[int, int] = (2000, 5000)
    turns: tuple[int, int] = (2, 5)
    user_tokens: tuple[int, int] = (100, 300)
    output_tokens: tuple[int, int] = (100, 200)
    think_s: float = 3.0
    as_chat: bool = False
    """Send ``/v1/chat/completions`` requests instead of rendered completions."""
    _systems: list[str] = field(init=False, repr=False)
    _cumulative: list[float] = field(init=False, repr=False)
    _plans: dict[int, _Plan] = field(init=False, repr=False, default_factory=dict)

    def __post_init__(self) -> None:
        if self.tenants < 1 or self.rate <= 0 or self.duration <= 0 or self.zipf_s < 0:
            raise ValueError("tenants ≥ 1, rate > 0, duration > 0 and zipf_s ≥ 0 required")
        rng = random.Random(f"tenants:{self.seed}")
        self._systems = [
            f"[tenant {k}] " + random_text(rng, rng.randint(*self.system_tokens))
            for k in range(self.tenants)
        ]
        weights = [(k + 1) ** -self.zipf_s for k in range(self.tenants)]
        self._cumulative = list(itertools.accumulate(weights))

    def tenant_share(self, tenant: int) -> float:
        """The share of sessions tenant ``tenant`` (0-based rank) starts."""
        low = self._cumulative[tenant - 1] if tenant else 0.0
        return (self._cumulative[tenant] - low) / self._cumulative[-1]

    def system_prompt_tokens(self) -> int:
        """Built-in tokens of all system prompts together."""
        return sum(len(s.encode()) // 4 for s in self._systems)

    def working_set_tokens(self, live_sessions: float) -> int:
        """Tokens a cache would need to hold every system prompt and the histories of
        ``live_sessions`` sessions at once (a history at its mean length: half the mean
        number of turns of user and reply tokens)."""
        mean_turns = sum(self.turns) / 2
        per_turn = sum(self.user_tokens) / 2 + sum(self.output_tokens) / 2
        return int(self.system_prompt_tokens() + live_sessions * mean_turns / 2 * per_turn)

    def initial(self) -> Iterator[Timed]:
        rng = random.Random(f"sessions:{self.seed}")
        for session, t in enumerate(poisson_times(self.rate, self.duration, rng)):
            pick = rng.random() * self._cumulative[-1]
            tenant = min(bisect.bisect_left(self._cumulative, pick), self.tenants - 1)
            self._plans[session] = _Plan(tenant, rng.randint(*self.turns))
            yield t, self._turn(session, 0, [])

    def follow_up(self, spec: RequestSpec, now: float, reply: str | None) -> list[Timed]:
        plan = self._plans.get(spec.session)
        nxt = spec.turn + 1
        if plan is None or reply is None or nxt >= plan.turns:
            self._plans.pop(spec.session, None)  # over (or its user gave up)
            return []
        history = [*spec.messages, {"role": "assistant", "content": reply}]
        think = random.Random(f"think:{self.seed}:{spec.session}:{nxt}").expovariate(
            1 / self.think_s
        )
        return [(now + think, self._turn(spec.session, nxt, history))]

    def _turn(self, session: int, turn: int, history: list[dict[str, Any]]) -> RequestSpec:
        plan = self._plans[session]
        rng = random.Random(f"turn:{self.seed}:{session}:{turn}")
        if not history:
            history = [{"role": "system", "content": self._systems[plan.tenant]}]
        user = random_text(rng, rng.randint(*self.user_tokens))
        messages = [*history, {"role": "user", "content": user}]
        return RequestSpec(
            "chat" if self.as_chat else "completions",
            self.model,
            rng.randint(*self.output_tokens),
            prompt="" if self.as_chat else render_chat(messages).decode(),
            messages=messages,
            session=session,
            turn=turn,
        )


__all__ = ["TenantChats"]
