"""What the simulator's KV-cache events cost its engine loop (``sluicegate bench micro
sim-kv-events``, a section of ``docs/benchmarks/sim.md``).

A churn of shared-prefix requests (512-token prompts over 8 prefixes, 32 output tokens, 64
running at a time) runs through one engine of the ``tiny`` profile with 1,024 blocks, so
blocks are stored and evicted all along: once with events off, once with every step's
events logged, encoded and sent on a real PUB socket to a connected SUB socket. Wall
seconds of the loop alone (no HTTP); the best of ``repeats`` of each, because the shared
machine's load only ever adds time.
"""

from __future__ import annotations

import asyncio
import os
import time
from dataclasses import dataclass, replace

import zmq

from sluicegate.kv_wire import WireStoredMap
from sluicegate.sim.engine import Engine, new_sequence
from sluicegate.sim.faults import Faults
from sluicegate.sim.kvevents import KVEventLog, KVEventsConfig
from sluicegate.sim.kvpublisher import KVEventPublisher
from sluicegate.sim.profiles import get_profile

MODEL = "tiny-llama"
PREFIXES = 8
RUNNING = 64
PROMPT_BYTES = 2048
"""512 tokens of the built-in tokenizer (4 bytes a token): 448 shared, the rest the
request's own."""

LOOPBACK = KVEventsConfig(
    enable_kv_cache_events=True, publisher="zmq", endpoint="tcp://127.0.0.1:0"
)


@dataclass(frozen=True, slots=True)
class Churn:
    """One churn: wall seconds, and with events on the batches published and the blocks
    their ``BlockStored`` events carried (0 with events off)."""

    seconds: float
    batches: int
    stored_blocks: int


def churn_prompt(i: int) -> bytes:
    """Request ``i``'s prompt: prefix ``i % 8`` (448 tokens), then its own tail."""
    prefix = f"system prompt {i % PREFIXES:03d} " * 100
    return (prefix[: 448 * 4] + f" question {i} ").encode().ljust(PROMPT_BYTES, b"y")


def churn(engine: Engine, publisher: KVEventPublisher | None, requests: int) -> Churn:
    """Run ``requests`` requests through ``engine`` on its own virtual clock, publishing
    each step's events through ``publisher`` when given (``engine`` logs events then)."""
    started = time.perf_counter()
    batches = stored = submitted = 0
    now = 0.0
    log = engine.kv_events
    while submitted < requests or engine.has_work():
        while submitted < requests and engine.num_requests < RUNNING:
            seq = new_sequence(
                f"q{submitted}",
                churn_prompt(submitted),
                arrival=now,
                max_tokens=32,
                ignore_eos=True,
                max_model_len=4096,
                model=MODEL,
            )
            engine.add(seq)
            submitted += 1
        now += engine.step(now).duration
        if publisher is not None and log is not None and log.events:
            events = log.take()
            stored += sum(len(e.block_hashes) for e in events if isinstance(e, WireStoredMap))
            publisher.publish(events)
            batches += 1
    return Churn(time.perf_counter() - started, batches, stored)


def churn_engine() -> Engine:
    """The engine a churn runs on: ``tiny`` with 1,024 blocks (so the churn evicts)."""
    return Engine(replace(get_profile("tiny"), num_gpu_blocks=1024))


async def measure(repeats: int, requests: int) -> tuple[list[Churn], list[Churn]]:
    """``repeats`` churns with events off and as many with them on (a subscriber
    connected); must run inside an event loop (the publisher's sockets)."""
    off: list[Churn] = []
    on: list[Churn] = []
    for _ in range(repeats):
        off.append(churn(churn_engine(), None, requests))
        engine = churn_engine()
        engine.log_kv_events(KVEventLog())
        publisher = KVEventPublisher(LOOPBACK, 0, Faults())
        ctx = zmq.Context()
        sub = ctx.socket(zmq.SUB)
        sub.setsockopt(zmq.RCVHWM, 0)
        sub.setsockopt(zmq.SUBSCRIBE, b"")
        sub.connect(publisher.pub_address)
        await asyncio.sleep(0.2)  # the subscription reaches the PUB socket
        try:
            on.append(churn(engine, publisher, requests))
        finally:
            sub.close(linger=0)
            ctx.term()
            await publisher.close()
    return off, on


def report(quick: bool, machine: str) -> str:
    """The Markdown section (best and worst of the repeats, ms; µs per stored block)."""
    requests = 100 if quick else 400
    load = os.getloadavg()[0]
    off, on = asyncio.run(measure(3 if quick else 5, requests))
    best_off = min(c.seconds for c in off)
    best_on = min(c.seconds for c in on)
    worst_off = max(c.seconds for c in off)
    worst_on = max(c.seconds for c in on)
    stored = on[0].stored_blocks
    per_block = (best_on - best_off) / stored * 1e6 if stored else float("nan")
    return "\n".join(
        [
            "## KV-cache events on the engine loop",
            "",
            f"A churn of {requests} requests (512-token prompts over {PREFIXES} shared "
            "prefixes, 32 output tokens, 64 at a time) through one `tiny` engine with 1,024 "
            "blocks, events off and on (logged, msgpack-encoded, sent on a PUB socket to a "
            f"connected subscriber): {on[0].batches:,} batches, {stored:,} blocks stored. "
            f"Best [worst] of {len(on)} runs, ms of wall time; load average {load:.1f}.",
            "",
            "| events off | events on | extra | extra per stored block |",
            "|---|---|---|---|",
            f"| {best_off * 1e3:.0f} [{worst_off * 1e3:.0f}] | "
            f"{best_on * 1e3:.0f} [{worst_on * 1e3:.0f}] | {best_on / best_off - 1:+.0%} | "
            f"{per_block:.1f} µs |",
            "",
            "```",
            "sluicegate bench micro sim-kv-events --out docs/benchmarks/sim.md",
            "```",
            "",
            f"Machine: {machine}.",
            "",
        ]
    )


__all__ = ["Churn", "churn", "churn_engine", "churn_prompt", "measure", "report"]
