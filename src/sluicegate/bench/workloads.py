"""Workloads: what requests are sent, and when.

A workload hands the runner its first requests with their arrival times (seconds from the
start) and, each time a request completes, any follow-ups it triggers — the next turn of a
conversation, or the next request of a closed-loop client. The same workload object drives
the discrete-event simulation and the HTTP runner, so both send identical requests.

Arrival processes: Poisson at a rate (open loop), fixed concurrency (closed loop), multi-
turn sessions with think time, and trace replay. Request contents come from ShareGPT,
synthetic shared-prefix groups, or heterogeneous short/long mixes; any of them can be
spread over LoRA adapters and priority classes.
"""

from __future__ import annotations

import csv
import math
import random
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol

from sluicegate.bench import sharegpt
from sluicegate.sim.text import VOCAB
from sluicegate.tokens import BYTES_PER_TOKEN, count_tokens

RequestKind = Literal["completions", "chat"]


@dataclass(slots=True)
class RequestSpec:
    """One request to send. Token counts are built-in tokens."""

    kind: RequestKind
    model: str
    max_tokens: int
    prompt: str = ""
    messages: list[dict[str, Any]] = field(default_factory=list)
    ignore_eos: bool = True
    stream: bool = True
    headers: dict[str, str] = field(default_factory=dict)
    klass: str = "default"
    """Class label for per-class results (priority class, model, length bucket...)."""
    slo_ttft_ms: float | None = None
    slo_tpot_ms: float | None = None
    session: int = -1
    turn: int = 0

    def body(self) -> dict[str, Any]:
        """The JSON body, as an OpenAI-style client would send it."""
        body: dict[str, Any] = {
            "model": self.model,
            "max_tokens": self.max_tokens,
            "ignore_eos": self.ignore_eos,
            "stream": self.stream,
        }
        if self.stream:
            body["stream_options"] = {"include_usage": True}
        if self.kind == "chat":
            body["messages"] = self.messages
        else:
            body["prompt"] = self.prompt
        return body

    def all_headers(self) -> dict[str, str]:
        headers = dict(self.headers)
        if self.slo_ttft_ms is not None:
            headers["x-slo-ttft-ms"] = f"{self.slo_ttft_ms:g}"
        if self.slo_tpot_ms is not None:
            headers["x-slo-tpot-ms"] = f"{self.slo_tpot_ms:g}"
        return headers


Timed = tuple[float, RequestSpec]


class Workload(Protocol):
    """Requests to send: the first ones, then follow-ups as requests complete."""

    def initial(self) -> Iterator[Timed]:
        """(arrival time in s, request) pairs, in time order."""
        ...

    def follow_up(self, spec: RequestSpec, now: float, reply: str | None) -> list[Timed]:
        """Requests triggered by ``spec`` ending at ``now``: with its ``reply`` text, or
        ``None`` when it failed (shed, rejected)."""
        ...


# ------------------------------------------------------------------------ arrival processes


def poisson_times(rate: float, duration: float, rng: random.Random) -> Iterator[float]:
    """Arrival times of a Poisson process of ``rate`` per second over ``duration`` s."""
    t = 0.0
    while True:
        t += rng.expovariate(rate)
        if t >= duration:
            return
        yield t


@dataclass(slots=True)
class OpenLoop:
    """Poisson arrivals at ``rate`` req/s for ``duration`` s; contents from ``make``."""

    rate: float
    duration: float
    make: Callable[[int, random.Random], RequestSpec]
    seed: int = 0

    def initial(self) -> Iterator[Timed]:
        rng = random.Random(self.seed)
        content_rng = random.Random(self.seed + 1)
        for i, t in enumerate(poisson_times(self.rate, self.duration, rng)):
            yield t, self.make(i, content_rng)

    def follow_up(self, spec: RequestSpec, now: float, reply: str | None) -> list[Timed]:
        return []


@dataclass(slots=True)
class ClosedLoop:
    """``concurrency`` clients each sending a request as soon as (``think_s`` after) the
    previous one completes, until ``duration`` s."""

    concurrency: int
    duration: float
    make: Callable[[int, random.Random], RequestSpec]
    think_s: float = 0.0
    seed: int = 0
    _count: int = 0
    _rng: random.Random = field(default_factory=random.Random)

    def initial(self) -> Iterator[Timed]:
        self._rng = random.Random(self.seed + 1)
        for i in range(self.concurrency):
            self._count += 1
            yield 0.0, self.make(i, self._rng)

    def follow_up(self, spec: RequestSpec, now: float, reply: str | None) -> list[Timed]:
        # A refused request is retried after a second, as clients honour Retry-After.
        at = now + self.think_s + (1.0 if reply is None else 0.0)
        if at >= self.duration:
            return []
        self._count += 1
        return [(at, self.make(self._count, self._rng))]


@dataclass(slots=True)
class TraceReplay:
    """Arrivals and lengths from a CSV trace (``arrived_at,num_prefill_tokens,
    num_decode_tokens`` — the format of public serving traces), prompts synthesised."""

    rows: list[tuple[float, int, int]]
    model: str
    speedup: float = 1.0
    seed: int = 0

    @classmethod
    def from_csv(cls, path: str | Path, model: str, speedup: float = 1.0) -> TraceReplay:
        rows = []
        with open(path, newline="") as f:
            for row in csv.DictReader(f):
                rows.append(
                    (
                        float(row["arrived_at"]),
                        int(float(row["num_prefill_tokens"])),
                        int(float(row["num_decode_tokens"])),
                    )
                )
        rows.sort()
        return cls(rows, model, speedup)

    def initial(self) -> Iterator[Timed]:
        rng = random.Random(self.seed)
        start = self.rows[0][0] if self.rows else 0.0
        for i, (at, prompt_tokens, output_tokens) in enumerate(self.rows):
            head = f"request {i}: "
            text = head + random_text(rng, max(1, prompt_tokens - count_tokens(head)))
            yield (
                (at - start) / self.speedup,
                RequestSpec("completions", self.model, max(1, output_tokens), prompt=text),
            )

    def follow_up(self, spec: RequestSpec, now: float, reply: str | None) -> list[Timed]:
        return []


@dataclass(slots=True)
class Sessions:
    """Multi-turn conversations: sessions start as a Poisson process; each turn is sent
    ``think_s`` after the previous reply, with the whole history (previous prompts and the
    replies the model actually generated) — as a chat client does."""

    conversations: Sequence[sharegpt.Conversation]
    rate: float
    duration: float
    model: str
    think_s: float = 1.0
    max_output_tokens: int = 1024
    seed: int = 0

    def _conversation(self, session: int) -> sharegpt.Conversation:
        # Sessions take conversations in an order fixed by the seed.
        n = len(self.conversations)
        return self.conversations[(session * 7919 + self.seed * 104_729) % n]

    def _turn(self, session: int, turn: int, history: list[dict[str, Any]]) -> RequestSpec:
        conv = self._conversation(session)
        user = conv.texts[2 * turn]
        answer_tokens = -(-len(conv.texts[2 * turn + 1].encode()) // BYTES_PER_TOKEN)
        messages = [*history, {"role": "user", "content": user}]
        return RequestSpec(
            "chat",
            self.model,
            max(1, min(self.max_output_tokens, answer_tokens)),
            messages=messages,
            session=session,
            turn=turn,
        )

    def initial(self) -> Iterator[Timed]:
        rng = random.Random(self.seed)
        for session, t in enumerate(poisson_times(self.rate, self.duration, rng)):
            yield t, self._turn(session, 0, [])

    def follow_up(self, spec: RequestSpec, now: float, reply: str | None) -> list[Timed]:
        conv = self._conversation(spec.session)
        nxt = spec.turn + 1
        if reply is None or 2 * nxt + 1 >= len(conv.texts):
            return []  # the conversation is over (or its user gave up)
        history = [*spec.messages, {"role": "assistant", "content": reply}]
        return [(now + self.think_s, self._turn(spec.session, nxt, history))]


# ------------------------------------------------------------------------ request contents


def random_text(rng: random.Random, tokens: int) -> str:
    """``tokens`` built-in tokens of word-like text."""
    return b"".join(rng.choices(VOCAB, k=tokens)).decode()


def sharegpt_first_turn(
    model: str, max_output_tokens: int = 2048
) -> Callable[[int, random.Random], RequestSpec]:
    """Completions of ShareGPT first turns (prompt → recorded answer length), in a random
    order fixed by the workload's seed."""
    pairs = sharegpt.first_turns()

    def make(i: int, rng: random.Random) -> RequestSpec:
        pair = pairs[rng.randrange(len(pairs))]
        return RequestSpec(
            "completions", model, min(max_output_tokens, pair.output_tokens), prompt=pair.prompt
        )

    return make


def shared_prefix(
    model: str,
    groups: int,
    prompts_per_group: int,
    system_tokens: int,
    question_tokens: int,
    output_tokens: int,
    seed: int = 0,
) -> Callable[[int, random.Random], RequestSpec]:
    """``groups`` long system prompts, each shared by ``prompts_per_group`` questions (the
    synthetic "shared prefix" workload of the llm-d benchmarks,
    https://github.com/llm-d/llm-d-benchmark/blob/8bc9f1dd/workload/profiles/inference-perf/shared_prefix_synthetic.yaml.in).
    Requests visit the groups × questions in a random order, repeating."""
    rng = random.Random(seed)
    systems = [random_text(rng, system_tokens) for _ in range(groups)]
    questions = [
        [random_text(rng, question_tokens) for _ in range(prompts_per_group)] for _ in range(groups)
    ]

    def make(i: int, r: random.Random) -> RequestSpec:
        g = r.randrange(groups)
        q = r.randrange(prompts_per_group)
        return RequestSpec(
            "completions",
            model,
            output_tokens,
            prompt=systems[g] + "\n" + questions[g][q],
        )

    return make


def length_mix(
    model: str,
    long_share: float,
    long_tokens: tuple[int, int],
    short: Callable[[int, random.Random], RequestSpec] | None = None,
    long_output_tokens: int = 256,
) -> Callable[[int, random.Random], RequestSpec]:
    """Short chat (ShareGPT first turns) mixed with long-document prompts of
    ``long_tokens`` (min, max) tokens, a ``long_share`` of them."""
    short_make = short or sharegpt_first_turn(model, max_output_tokens=1024)

    def make(i: int, rng: random.Random) -> RequestSpec:
        if rng.random() < long_share:
            n = rng.randint(*long_tokens)
            return RequestSpec(
                "completions",
                model,
                long_output_tokens,
                prompt=f"Summarise document {i}:\n" + random_text(rng, n),
                klass="long",
            )
        spec = short_make(i, rng)
        spec.klass = "short"
        return spec

    return make


@dataclass(frozen=True, slots=True)
class PriorityClass:
    name: str
    weight: float
    objective: str | None = None
    model: str | None = None
    """Public model to send instead of the base (e.g. one whose InferenceModel is Critical)."""


def with_classes(
    make: Callable[[int, random.Random], RequestSpec], classes: Sequence[PriorityClass]
) -> Callable[[int, random.Random], RequestSpec]:
    """Assign each request a class by weight: its objective header and/or model."""
    total = sum(c.weight for c in classes)

    def wrapped(i: int, rng: random.Random) -> RequestSpec:
        spec = make(i, rng)
        pick = rng.random() * total
        for c in classes:
            pick -= c.weight
            if pick <= 0:
                break
        spec.klass = c.name
        if c.objective:
            spec.headers["x-gateway-inference-objective"] = c.objective
        if c.model:
            spec.model = c.model
        return spec

    return wrapped


def with_slos(
    make: Callable[[int, random.Random], RequestSpec], ttft_ms: float, tpot_ms: float
) -> Callable[[int, random.Random], RequestSpec]:
    def wrapped(i: int, rng: random.Random) -> RequestSpec:
        spec = make(i, rng)
        spec.slo_ttft_ms, spec.slo_tpot_ms = ttft_ms, tpot_ms
        return spec

    return wrapped


def with_adapters(
    make: Callable[[int, random.Random], RequestSpec], adapters: Sequence[str], zipf_s: float = 1.1
) -> Callable[[int, random.Random], RequestSpec]:
    """Spread requests over LoRA ``adapters`` with Zipf(s) popularity."""
    weights = [1.0 / math.pow(rank + 1, zipf_s) for rank in range(len(adapters))]

    def wrapped(i: int, rng: random.Random) -> RequestSpec:
        spec = make(i, rng)
        spec.model = rng.choices(adapters, weights)[0]
        spec.klass = spec.model
        return spec

    return wrapped
