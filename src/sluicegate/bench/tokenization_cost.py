"""What precise prefix routing costs on the request path (event ingestion:
:mod:`sluicegate.bench.kv_ingestion_cost`; the report: :mod:`sluicegate.bench.tokenization_report`).

- **Decisions with tokenization**: a director with the ``precise-prefix`` preset, 10
  endpoints whose KV-event views are synced and which hold 1/10 … 10/10 of each prompt,
  and the pool's tokenizer ``source: local`` — cl100k_base (``sluicegate bench
  tokenizer``'s offline copy, a 100k-token byte-level BPE with Llama 3's pre-tokenizer
  pattern) and a chat template. Timed: ``parse_request`` + ``Director.route`` (render,
  tokenize as far as the decision needs, key the blocks, look them up, score, pick) +
  release, one at a time on an event loop; the tokenizer's worker finishing each prompt
  after dispatch is drained between decisions and timed apart.
- **Tokenization alone** of a 100k-token prompt (the whole of it, as the worker does):
  cold, and when its first 95 % was the previous turn.

Wall-clock costs in µs (ms where marked); ``time.perf_counter_ns`` around each decision.
"""

from __future__ import annotations

import asyncio
import random
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson

from sluicegate.api.loader import build_config
from sluicegate.api.tokenizer import TokenizerSettings
from sluicegate.builtins import default_registry
from sluicegate.clock import MonotonicClock
from sluicegate.datalayer.datastore import Datastore, EndpointSpec
from sluicegate.datalayer.endpoint import EngineMetrics, ServedModels
from sluicegate.datalayer.kvevents import (
    KV_EVENTS_SERVICE,
    BlockStored,
    EndpointStream,
    KVEventsService,
    KVEventSubscribers,
    PreciseIndex,
    View,
)
from sluicegate.framework import LLMRequest, PluginContext
from sluicegate.requestcontrol.director import Director
from sluicegate.requestcontrol.models import ModelTable
from sluicegate.requestcontrol.parse import parse_request
from sluicegate.scheduling.config import build_scheduler, load_preset
from sluicegate.tokenization.base import TOKENIZER_SERVICE, TokenizerService
from sluicegate.tokenization.local import LocalTokenizer

if TYPE_CHECKING:
    from tokenizers import Encoding

    from sluicegate.tokenization.progressive import Progress

MODEL = "bench-model"
BLOCK = 16
ENDPOINTS = 10
# a ChatML-style template (Qwen's shape): role headers, the content, an end marker
TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
_WORDS = (
    "the of and to in is that for it as was with be by on not he this are or his from at "
    "which but have an they you were her she there been one all we their can has more will "
    "model server cache token prefix request latency gateway route block event index "
    "Kubernetes vLLM GPU H100 throughput p99 0.5ms 1,024 2026 (see below): don't we'll"
).split()


@dataclass(frozen=True, slots=True)
class Timing:
    """Wall-clock p50, p90 and mean, and the p50 of the thread's CPU time (what the
    decision itself costs, whatever else the machine runs)."""

    p50: float
    p90: float
    mean: float
    n: int
    cpu_p50: float
    bpe_p50: float
    """p50 of the thread CPU time spent inside the tokenizers library's ``encode``."""
    after_p50: float = 0.0
    """p50 of the worker's CPU time finishing the prompt after dispatch (off the
    request path)."""


def _timing(
    samples: list[float], cpu: list[float], bpe: list[float], after: list[float] | None = None
) -> Timing:
    samples = sorted(samples)
    return Timing(
        samples[len(samples) // 2],
        samples[int(len(samples) * 0.9)],
        statistics.fmean(samples),
        len(samples),
        sorted(cpu)[len(cpu) // 2],
        sorted(bpe)[len(bpe) // 2],
        sorted(after)[len(after) // 2] if after else 0.0,
    )


class BPEClock:
    """Wraps a local tokenizer's encode to add up the thread CPU time spent in it (ns)."""

    def __init__(self, tok: LocalTokenizer) -> None:
        self.ns = 0
        inner = tok.cache.encode_fn

        def timed(text: str) -> Encoding:
            c0 = time.thread_time_ns()
            try:
                return inner(text)
            finally:
                self.ns += time.thread_time_ns() - c0

        # the request path's encodes (the worker finishing prompts keeps the original)
        tok.cache.encode_fn = timed
        tok._encode = timed  # type: ignore[method-assign]

    def take(self, unit: float) -> float:
        ns, self.ns = self.ns, 0
        return ns / unit


def _timed(run: Callable[[], object], wall: list[float], cpu: list[float], unit: float) -> None:
    """Run once; append its wall and thread-CPU time in ``unit`` ns."""
    c0, t0 = time.thread_time_ns(), time.perf_counter_ns()
    run()
    t1, c1 = time.perf_counter_ns(), time.thread_time_ns()
    wall.append((t1 - t0) / unit)
    cpu.append((c1 - c0) / unit)


def prose(rng: random.Random, chars: int) -> str:
    """English-like text with punctuation, digits and paragraphs, ``chars`` long."""
    out: list[str] = []
    n = 0
    while n < chars:
        sentence = " ".join(rng.choice(_WORDS) for _ in range(rng.randint(6, 24)))
        piece = sentence.capitalize() + rng.choice([". ", ". ", "? ", "!\n\n", ".\n"])
        out.append(piece)
        n += len(piece)
    return "".join(out)[:chars]


def load_tokenizer(directory: Path) -> LocalTokenizer:
    """cl100k_base (written into ``directory``) with :data:`TEMPLATE`."""
    from sluicegate.bench.tokenizer import write_tokenizer_dir

    write_tokenizer_dir(directory)
    template = directory / "chat_template.jinja"
    template.write_text(TEMPLATE, encoding="utf-8")
    return LocalTokenizer.load(
        TokenizerSettings(source="local", path=str(directory), chat_template=str(template))
    )


def _director(tok: LocalTokenizer) -> tuple[Director, KVEventsService]:
    clock = MonotonicClock()
    names = [f"ep-{i}" for i in range(ENDPOINTS)]
    config = build_config(
        [
            {
                "apiVersion": "inference.networking.k8s.io/v1",
                "kind": "InferencePool",
                "metadata": {"name": "bench"},
                "spec": {
                    "targetPorts": [{"number": 8000}],
                    "endpoints": [{"address": f"10.0.0.{i + 1}:8000"} for i in range(ENDPOINTS)],
                },
            }
        ]
    )
    datastore = Datastore()
    datastore.set_endpoints(
        "bench", [EndpointSpec(n, f"10.0.0.{i + 1}", 8000) for i, n in enumerate(names)]
    )
    now = clock.now()
    for e in datastore.all_endpoints():
        e.metrics = EngineMetrics(scraped_at=now + 3600, block_size=BLOCK, num_gpu_blocks=200_000)
        e.models = ServedModels(frozenset({MODEL}), frozenset(), now)
    subs = KVEventSubscribers(PreciseIndex(default_capacity=200_000), clock=clock)
    for n in names:
        subs.streams[n] = EndpointStream(view=View.SYNCED)
    kv = KVEventsService({"bench": subs})
    services = {KV_EVENTS_SERVICE: kv, TOKENIZER_SERVICE: TokenizerService({"bench": tok})}
    built = build_scheduler(
        load_preset("precise-prefix"),
        PluginContext(clock, 0, services=services),
        default_registry(),
    )
    return Director(datastore, built, ModelTable(config), clock, staleness_s=7200.0), kv


def _hold(kv: KVEventsService, tok: LocalTokenizer, body: dict[str, Any]) -> None:
    """Endpoint i holds the first (i+1)/10 of the prompt's blocks, as events would say."""
    request = LLMRequest("h", MODEL, MODEL, b"", 0, 0.0, kind="chat", body=body)
    ids = tok.token_ids(request)
    assert ids is not None
    blocks = len(ids) // BLOCK
    index = kv.pools["bench"].index
    for i in range(ENDPOINTS):
        n = blocks * (i + 1) // ENDPOINTS
        hashes = tuple(random.getrandbits(63) for _ in range(n))
        index.store(f"ep-{i}", BlockStored(hashes, None, list(ids[: n * BLOCK]), BLOCK))


Bodies = Callable[[int], tuple[dict[str, Any] | None, dict[str, Any]]]
"""Per iteration: an untimed body sent first (or None), and the timed one."""


def _chat(system: str, turns: list[str]) -> dict[str, Any]:
    messages = [{"role": "system", "content": system}]
    for i, text in enumerate(turns):
        messages.append({"role": "user" if i % 2 == 0 else "assistant", "content": text})
    return {"model": MODEL, "messages": messages, "max_tokens": 128}


def decisions(
    tok: LocalTokenizer,
    bodies: Bodies,
    n: int,
    bpe: BPEClock,
    hold_warm: bool = False,
    back_to_back: bool = False,
) -> Timing:
    """Time ``n`` decisions; ``bodies(i)`` gives an untimed warm-up body (or None) and the
    timed one. With ``hold_warm`` the endpoints hold 1/10 … 10/10 of each warm-up body
    (the previous turn, as its server's events would say). Decisions run on an event
    loop, as in the gateway: the rest of a prompt goes to the tokenizer's worker once the
    decision's callback returns; the worker is drained between decisions and its CPU time
    reported apart. ``back_to_back``: the prompts' rest is finished only after the last
    decision, so the decisions run one after the other with the CPU's caches warm (the
    worker's encodes between them evict the BPE's tables: measured, the next small encode
    takes 2–3× longer)."""
    return asyncio.run(_decisions(tok, bodies, n, bpe, hold_warm, back_to_back))


async def _decisions(
    tok: LocalTokenizer,
    bodies: Bodies,
    n: int,
    bpe: BPEClock,
    hold_warm: bool,
    back_to_back: bool,
) -> Timing:
    director, kv = _director(tok)
    headers: dict[str, str] = {}
    samples: list[float] = []
    cpu: list[float] = []
    in_bpe: list[float] = []
    after: list[float] = []
    deferred = tok.deferred
    held: list[Progress] = []
    submit = deferred.submit
    if back_to_back:
        deferred.submit = lambda progress, done=None: held.append(progress)  # type: ignore[method-assign]
    dispatches = []
    for i in range(n):
        warm, body = bodies(i)
        if warm is not None:
            director.route(parse_request("chat", orjson.dumps(warm), headers), f"w{i}").finish(0.0)
            await asyncio.sleep(0)  # the handler yields: the worker gets the rest
            deferred.drain()
            if hold_warm:
                _hold(kv, tok, warm)
        if i == 0:
            _hold(kv, tok, body)
        bpe.take(1.0)
        raw = orjson.dumps(body)

        def decide(raw: bytes = raw, i: int = i) -> None:
            dispatches.append(director.route(parse_request("chat", raw, headers), str(i)))

        _timed(decide, samples, cpu, 1000.0)
        in_bpe.append(bpe.take(1000.0))
        worker = deferred.counters.seconds
        dispatches.pop().finish(0.0)
        await asyncio.sleep(0)
        deferred.drain()
        after.append((deferred.counters.seconds - worker) * 1e6)
    deferred.submit = submit  # type: ignore[method-assign]
    for progress in held:
        worker = deferred.counters.seconds
        submit(progress)
        await asyncio.sleep(0)  # on a loop the worker gets it once this step returns
        deferred.drain()
        after.append((deferred.counters.seconds - worker) * 1e6)
    del after[: len(after) - n]
    return _timing(samples, cpu, in_bpe, after)


def decision_rows(tok: LocalTokenizer, quick: bool, bpe: BPEClock) -> list[tuple[str, Timing]]:
    rng = random.Random(0)
    n = 40 if quick else 300
    shared = prose(rng, 12 * 1024)
    rows: list[tuple[str, Timing]] = []

    def cold(i: int) -> tuple[None, dict[str, Any]]:
        return None, _chat(prose(rng, 12 * 1024), [prose(rng, 4 * 1024)])

    def shared_system(i: int) -> tuple[None, dict[str, Any]]:
        return None, _chat(shared, [prose(rng, 4 * 1024)])

    def next_turn(i: int) -> tuple[dict[str, Any], dict[str, Any]]:
        turns = [prose(rng, 1024), prose(rng, 512)]
        before = _chat(prose(rng, 13 * 1024), turns)
        after = dict(before, messages=[*before["messages"], _user(prose(rng, 1536))])
        return before, after

    rows.append(("16 KB chat, never seen (cold)", decisions(tok, cold, n, bpe)))
    rows.append(
        (
            "same, back to back (the rest finished after the run)",
            decisions(tok, cold, n, bpe, back_to_back=True),
        )
    )
    rows.append(
        ("16 KB chat, 12 KB system prompt seen before", decisions(tok, shared_system, n, bpe))
    )
    rows.append(
        (
            "16 KB chat, previous turn (14.5 KB) seen and held",
            decisions(tok, next_turn, n, bpe, hold_warm=True),
        )
    )
    return rows


def _user(text: str) -> dict[str, str]:
    return {"role": "user", "content": text}


def long_rows(tok: LocalTokenizer, quick: bool, bpe: BPEClock) -> list[tuple[str, Timing]]:
    """100k-token prompts: cold tokenization; tokenization and decision with 95 % seen."""
    rng = random.Random(1)
    reps = 3 if quick else 10
    chars_per_token = 4.6  # of this text under cl100k: a prompt of ~100k tokens
    size = int(100_000 * chars_per_token)
    cold: tuple[list[float], list[float], list[float]] = ([], [], [])
    tokens = 0
    for _ in range(reps):
        body = _chat(prose(rng, size), [])
        request = LLMRequest("c", MODEL, MODEL, b"", 0, 0.0, kind="chat", body=body)
        bpe.take(1.0)
        _timed(partial(tok.token_ids, request), cold[0], cold[1], 1e6)
        cold[2].append(bpe.take(1e6))
        ids = tok.token_ids(request)  # now a whole hit
        tokens = len(ids) if ids is not None else 0
    base = prose(rng, int(size * 0.95))
    seen = _chat(base, [prose(rng, size - len(base))])
    tok.token_ids(LLMRequest("s", MODEL, MODEL, b"", 0, 0.0, kind="chat", body=seen))
    warm: tuple[list[float], list[float], list[float]] = ([], [], [])
    bodies: list[dict[str, Any]] = []
    for i in range(reps):
        body = _chat(base, [prose(rng, size - len(base))])
        bodies.append(body)
        request = LLMRequest(str(i), MODEL, MODEL, b"", 0, 0.0, kind="chat", body=body)
        bpe.take(1.0)
        _timed(partial(tok.token_ids, request), warm[0], warm[1], 1e6)
        warm[2].append(bpe.take(1e6))

    def next_turn(i: int) -> tuple[dict[str, Any], dict[str, Any]]:
        return bodies[i % len(bodies)], _chat(base, [prose(rng, size - len(base))])

    d = decisions(tok, next_turn, reps, bpe)
    ms = Timing(
        d.p50 / 1e3,
        d.p90 / 1e3,
        d.mean / 1e3,
        d.n,
        d.cpu_p50 / 1e3,
        d.bpe_p50 / 1e3,
        d.after_p50 / 1e3,
    )
    return [
        (f"{tokens:,}-token chat, cold: tokenization (ms)", _timing(*cold)),
        ("same size, first 95 % seen: tokenization (ms)", _timing(*warm)),
        ("same size, first 95 % seen: whole decision (ms)", ms),
    ]


__all__ = [
    "BLOCK",
    "ENDPOINTS",
    "BPEClock",
    "Timing",
    "decision_rows",
    "load_tokenizer",
    "long_rows",
    "prose",
]
