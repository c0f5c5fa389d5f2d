"""The engine model: one vLLM instance as a clock-free state machine.

``Engine.step(now)`` runs one iteration the way vLLM's v1 scheduler does:

1. Running sequences first, in order, within the token budget
   (``max_num_batched_tokens``): one token for a decoding sequence, the next prefill chunk
   for a sequence still prefilling. A sequence that cannot get the KV blocks it needs
   preempts the newest running sequence (recompute: its blocks are released, it goes back
   to the front of the waiting queue) until it fits or preempts itself.
2. If nothing was preempted, waiting sequences in FCFS order while budget and
   ``max_num_seqs`` allow: each reuses its longest cached prefix (automatic prefix caching),
   then prefills what is left, chunked. At most ``max_loras`` distinct LoRA adapters run at
   once; a sequence whose adapter does not fit is skipped and keeps its place.
3. A sequence whose every known token is computed samples one token. Sequences reaching
   their output length finish and release their blocks.

The iteration's duration comes from the profile's step-time function. The caller owns
time: results of a step taken at ``now`` become visible at ``now + duration``.

A request itself (:class:`Sequence`, :func:`new_sequence`) is defined in
:mod:`sluicegate.sim.sequence` and the hashing and registering of its prefix-cache blocks
in :mod:`sluicegate.sim.prefix_blocks`; this module re-exports the public names.
"""

from __future__ import annotations

import bisect
import math
from collections import OrderedDict, deque
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from sluicegate.sim.kvcache import BlockPool
from sluicegate.sim.prefix_blocks import extend_hashes, register_blocks
from sluicegate.sim.profiles import EngineProfile
from sluicegate.sim.prompt_tokens import PromptTokens, load_prompt_tokens
from sluicegate.sim.sequence import (
    SeqStatus,
    Sequence,
    fork_sequence,
    natural_output_length,
    new_sequence,
)
from sluicegate.tokens import block_hashes

if TYPE_CHECKING:
    from sluicegate.sim.kvevents import KVEventLog


@dataclass(slots=True)
class StepResult:
    """What one iteration did. ``duration`` is in seconds."""

    duration: float = 0.0
    batched_tokens: int = 0
    emitted: list[Sequence] = field(default_factory=list)
    """Sequences that produced a token (their first or a later one)."""
    finished: list[Sequence] = field(default_factory=list)
    preempted: list[Sequence] = field(default_factory=list)
    loaded_loras: list[str] = field(default_factory=list)

    @property
    def idle(self) -> bool:
        """Nothing ran and nothing will become schedulable by itself: wait for a request
        to arrive or leave. (A step that only waits for an arriving request to reach the
        engine — ``request_overhead_ms`` — has no tokens but a duration.)"""
        return self.batched_tokens == 0 and self.duration == 0.0


@dataclass(slots=True)
class EngineCounters:
    """Cumulative counters in the units vLLM reports them (tokens, requests)."""

    prefix_cache_queries: int = 0
    prefix_cache_hits: int = 0
    prompt_tokens: int = 0
    prompt_tokens_computed: int = 0
    prompt_tokens_cached: int = 0
    generation_tokens: int = 0
    preemptions: int = 0
    steps: int = 0
    busy_s: float = 0.0
    """Simulated seconds spent in iterations (the engine's busy time)."""
    finished_by_reason: dict[str, int] = field(default_factory=dict)


class Engine:
    """A simulated vLLM engine for one model (and its LoRA adapters)."""

    def __init__(
        self,
        profile: EngineProfile,
        enable_prefix_caching: bool = True,
        prompt_tokens: PromptTokens | None = None,
    ) -> None:
        """``prompt_tokens``: the profile's ``tokenizer`` already loaded (engines of one
        run share one load, :func:`~sluicegate.sim.prompt_tokens.load_shared`); None:
        loaded here when the profile names one."""
        self.profile = profile
        self.enable_prefix_caching = enable_prefix_caching
        self.pool = BlockPool(profile.num_gpu_blocks)
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.arriving: list[Sequence] = []
        """Added but not yet schedulable (``profile.request_overhead_ms``), in order of
        the time they reach the scheduler."""
        self.counters = EngineCounters()
        self.num_deferred = 0
        """Waiting sequences skipped in the last step for LoRA capacity."""
        self._gpu_loras: OrderedDict[str, None] = OrderedDict()
        self._by_id: dict[str, Sequence] = {}
        self.kv_events: KVEventLog | None = None
        """What the KV cache did this step, when KV events are on (see :meth:`log_kv_events`)."""
        if prompt_tokens is None:
            prompt_tokens = load_prompt_tokens(profile.tokenizer)
        self.prompt_tokens = prompt_tokens
        """The model tokenizer sizing text prompts for this engine (the profile's
        ``tokenizer``; None: built-in tokens). Used where requests become sequences."""

    def log_kv_events(self, events: KVEventLog | None) -> None:
        """Log every prefix-cache store, eviction and clear into ``events`` (None: stop)."""
        self.kv_events = events
        self.pool.kv_events = events

    def reset_prefix_cache(self) -> None:
        """vLLM's ``reset_prefix_cache``: every cached block is forgotten (and logged)."""
        self.pool.clear_cache()

    # ------------------------------------------------------------------ requests

    def add(self, seq: Sequence) -> None:
        """Queue ``seq``; its prompt plus output must fit ``max_model_len`` and the KV cache."""
        if seq.request_id in self._by_id:
            raise ValueError(f"duplicate request id {seq.request_id!r}")
        total = seq.prompt_tokens + seq.max_output_tokens
        limit = min(self.profile.max_model_len, self.profile.kv_capacity_tokens)
        if seq.prompt_tokens == 0:
            raise ValueError("empty prompt")
        if total > limit:
            raise ValueError(f"{total} tokens exceed the engine limit of {limit}")
        if self.enable_prefix_caching:
            seq.hashes = block_hashes(seq.prompt, self.profile.block_size, seq.hash_seed)
        seq.status = SeqStatus.WAITING
        if self.profile.request_overhead_ms > 0:
            bisect.insort(self.arriving, seq, key=self._ready_at)
        else:
            self.waiting.append(seq)
        self._by_id[seq.request_id] = seq

    def _ready_at(self, seq: Sequence) -> float:
        """When an added ``seq`` reaches the scheduler (seconds)."""
        return seq.arrival + self.profile.request_overhead_ms / 1000.0

    def _admit_arrived(self, now: float) -> None:
        """Move the arriving sequences that have reached the scheduler by ``now`` to the
        waiting queue (the 1 ns slack absorbs float rounding of ``now``)."""
        arriving = self.arriving
        n = 0
        while n < len(arriving) and self._ready_at(arriving[n]) <= now + 1e-9:
            self.waiting.append(arriving[n])
            n += 1
        del arriving[:n]

    def abort(self, request_id: str, now: float) -> Sequence | None:
        """Remove a request wherever it is; returns it, or None if unknown or finished."""
        seq = self._by_id.pop(request_id, None)
        if seq is None:
            return None
        if seq.status is SeqStatus.WAITING:
            arriving = [s for s in self.arriving if s is not seq]
            if len(arriving) < len(self.arriving):
                self.arriving = arriving
            else:
                self.waiting.remove(seq)
        elif seq.status is SeqStatus.RUNNING:
            self.running.remove(seq)
        self.pool.release(seq.blocks)
        seq.blocks = []
        seq.status = SeqStatus.ABORTED
        seq.finish_time = now
        self._count_finish("abort")
        return seq

    def fork(self) -> Engine:
        """An independent copy of the engine's state, for what-if simulations (e.g. the
        benchmark lab's oracle): stepping the copy leaves this engine untouched."""
        twin = Engine.__new__(Engine)
        twin.profile = self.profile
        twin.enable_prefix_caching = self.enable_prefix_caching
        twin.pool = self.pool.fork()
        twin.kv_events = None
        twin.prompt_tokens = self.prompt_tokens
        twin.counters = replace(
            self.counters, finished_by_reason=dict(self.counters.finished_by_reason)
        )
        twin.num_deferred = self.num_deferred
        twin._gpu_loras = self._gpu_loras.copy()
        every = (*self.running, *self.waiting, *self.arriving)
        copies = {id(s): fork_sequence(s) for s in every}
        twin.running = [copies[id(s)] for s in self.running]
        twin.waiting = deque(copies[id(s)] for s in self.waiting)
        twin.arriving = [copies[id(s)] for s in self.arriving]
        twin._by_id = {s.request_id: s for s in copies.values()}
        return twin

    def get(self, request_id: str) -> Sequence | None:
        return self._by_id.get(request_id)

    def has_work(self) -> bool:
        return bool(self.running or self.waiting or self.arriving)

    @property
    def num_requests(self) -> int:
        return len(self.running) + len(self.waiting)

    def running_loras(self) -> list[str]:
        return sorted({s.lora for s in self.running if s.lora})

    def waiting_loras(self) -> list[str]:
        return sorted({s.lora for s in self.waiting if s.lora})

    # ------------------------------------------------------------------ stepping

    def step(self, now: float) -> StepResult:
        """Run one iteration starting at ``now`` (seconds)."""
        p = self.profile
        budget = p.max_num_batched_tokens
        result = StepResult()
        scheduled: list[tuple[Sequence, int]] = []
        if self.arriving:
            self._admit_arrived(now)

        running = self.running
        bs = p.block_size
        i = 0
        # The hot loop: runs once per running sequence per step, so attribute reads and
        # calls are kept to what each sequence needs.
        while i < len(running):
            seq = running[i]
            k = seq.prompt_tokens + seq.num_output - seq.num_computed
            if k > budget:
                k = budget
            if k <= 0:
                i += 1
                continue
            if seq.num_computed + k <= len(seq.blocks) * bs or self._reserve(seq, k):
                scheduled.append((seq, k))
                budget -= k
                i += 1
                continue
            # Out of blocks: preempt from the back until this sequence fits.
            fitted = False
            while running:
                victim = running.pop()
                self._preempt(victim)
                result.preempted.append(victim)
                if victim is seq:
                    break
                if self._reserve(seq, k):
                    scheduled.append((seq, k))
                    budget -= k
                    i += 1
                    fitted = True
                    break
            if not fitted:
                break

        if not result.preempted:
            self._schedule_waiting(now, budget, scheduled, result)

        if not scheduled:
            if self.arriving and not result.preempted:
                # Nothing to run until the next arriving request reaches the scheduler.
                result.duration = max(1e-9, self._ready_at(self.arriving[0]) - now)
            return result

        # Execute: account time, then advance every scheduled sequence.
        batched = 0
        prefill_seqs = 0
        decode_seqs = 0
        decode_ctx = 0
        prefill_flops = 0.0
        with_lora = False
        for seq, k in scheduled:
            batched += k
            if seq.lora:
                with_lora = True
            if k == 1 and seq.num_computed > 0:
                decode_seqs += 1
                decode_ctx += seq.num_computed + 1
            else:
                prefill_seqs += 1
                prefill_flops += p.prefill_attention_flops(k, seq.num_computed)
        step_ms = p.step_ms(
            batched, decode_seqs, decode_ctx, prefill_flops, with_lora, prefill_seqs
        )
        step_ms += p.lora_load_ms * len(result.loaded_loras)
        duration = step_ms / 1000.0
        done_at = now + duration
        result.duration = duration
        result.batched_tokens = batched
        self.counters.steps += 1
        self.counters.busy_s += duration

        counters = self.counters
        caching = self.enable_prefix_caching
        for seq, k in scheduled:
            was_prefilling = seq.num_computed < seq.prompt_tokens
            computed = seq.num_computed = seq.num_computed + k
            if caching and computed // bs > seq.num_registered:
                register_blocks(seq, computed // bs, self.pool, bs, self.kv_events)
            if computed < seq.prompt_tokens + seq.num_output:
                continue
            # Every known token is computed: sample one.
            if was_prefilling and seq.num_output == 0:
                counters.prompt_tokens += seq.prompt_tokens
            seq.num_output += 1
            counters.generation_tokens += 1
            if seq.first_token_time < 0:
                seq.first_token_time = done_at
            seq.last_token_time = done_at
            result.emitted.append(seq)
            if seq.num_output >= seq.max_output_tokens:
                self._finish(seq, done_at)
                result.finished.append(seq)
        if result.finished:
            self.running = [s for s in self.running if s.status is SeqStatus.RUNNING]
        return result

    # ------------------------------------------------------------------ internals

    def _schedule_waiting(
        self,
        now: float,
        budget: int,
        scheduled: list[tuple[Sequence, int]],
        result: StepResult,
    ) -> None:
        p = self.profile
        waiting = self.waiting
        skipped: list[Sequence] = []
        active_loras = {s.lora for s in self.running if s.lora}
        while waiting and budget > 0 and len(self.running) < p.max_num_seqs:
            seq = waiting[0]
            if seq.lora and seq.lora not in active_loras and len(active_loras) >= p.max_loras:
                skipped.append(waiting.popleft())
                continue
            hit_blocks = self._cached_prefix(seq)
            computed = len(hit_blocks) * p.block_size
            k = min(seq.num_tokens - computed, budget)
            needed = math.ceil((computed + k) / p.block_size) - len(hit_blocks)
            if self.pool.free_after_touch(hit_blocks) < needed:
                break
            waiting.popleft()
            self.pool.touch(hit_blocks)
            seq.blocks = hit_blocks + self.pool.allocate(needed)
            seq.num_computed = computed
            seq.num_registered = len(hit_blocks)
            seq.status = SeqStatus.RUNNING
            if self.enable_prefix_caching:
                self.counters.prefix_cache_queries += seq.num_tokens
                self.counters.prefix_cache_hits += computed
            if seq.first_scheduled < 0:
                seq.first_scheduled = now
            if seq.num_cached_prompt_tokens < 0:
                cached = min(computed, seq.prompt_tokens)
                seq.num_cached_prompt_tokens = cached
                self.counters.prompt_tokens_cached += cached
                self.counters.prompt_tokens_computed += seq.prompt_tokens - cached
            if seq.lora:
                if seq.lora not in active_loras:
                    active_loras.add(seq.lora)
                self._activate_lora(seq.lora, result)
            self.running.append(seq)
            scheduled.append((seq, k))
            budget -= k
        self.num_deferred = len(skipped)
        if skipped:
            waiting.extendleft(reversed(skipped))

    def _cached_prefix(self, seq: Sequence) -> list[int]:
        if not self.enable_prefix_caching:
            return []
        # At least one token must be computed, so the last token never counts as a hit.
        limit = (seq.num_tokens - 1) // self.profile.block_size
        extend_hashes(seq, limit, self.profile.block_size)
        return self.pool.longest_cached_prefix(seq.hashes, limit)

    def _reserve(self, seq: Sequence, k: int) -> bool:
        """Make sure ``seq`` has blocks for ``k`` more tokens; False if the pool is short."""
        needed = math.ceil((seq.num_computed + k) / self.profile.block_size) - len(seq.blocks)
        if needed <= 0:
            return True
        if needed > self.pool.num_free:
            return False
        seq.blocks.extend(self.pool.allocate(needed))
        return True

    def _preempt(self, seq: Sequence) -> None:
        self.pool.release(seq.blocks)
        seq.blocks = []
        seq.num_computed = 0
        seq.num_registered = 0
        seq.num_preemptions += 1
        seq.status = SeqStatus.WAITING
        self.counters.preemptions += 1
        self.waiting.appendleft(seq)

    def _finish(self, seq: Sequence, now: float) -> None:
        self.pool.release(seq.blocks)
        seq.blocks = []
        seq.status = SeqStatus.FINISHED
        seq.finish_time = now
        self._by_id.pop(seq.request_id, None)
        self._count_finish(seq.finish_reason)

    def _count_finish(self, reason: str) -> None:
        by_reason = self.counters.finished_by_reason
        by_reason[reason] = by_reason.get(reason, 0) + 1

    def _activate_lora(self, name: str, result: StepResult) -> None:
        gpu = self._gpu_loras
        if name in gpu:
            gpu.move_to_end(name)
            return
        if len(gpu) >= self.profile.max_loras:
            in_use = {s.lora for s in self.running if s.lora}
            for resident in list(gpu):
                if resident not in in_use:
                    del gpu[resident]
                    break
        gpu[name] = None
        result.loaded_loras.append(name)


__all__ = [
    "Engine",
    "EngineCounters",
    "SeqStatus",
    "Sequence",
    "StepResult",
    "natural_output_length",
    "new_sequence",
]
