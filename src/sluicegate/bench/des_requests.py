"""How the discrete-event run (:mod:`sluicegate.bench.des`) turns what the gateway sends into
what an engine runs, and an engine's state into what the gateway scrapes.

- :func:`engine_sequence`: the sequence the simulated model server creates from a request
  body, exactly as the simulator's HTTP API would (``sim/api.py``), with the context limit
  of the engine it lands on;
- :func:`retarget`: a body with its ``model`` rewritten (the oracle's what-if for an
  adapter the director resolved);
- :func:`servable_tokens`: the longest prefix any engine holds in its cache, in tokens
  (what an oracle knowing every cache could have reused);
- :func:`engine_metrics`: the metrics snapshot a scrape of an engine returns.
"""

from __future__ import annotations

from collections.abc import Sequence as Seq

import orjson

from sluicegate.datalayer.endpoint import EngineMetrics
from sluicegate.sim.api import ApiError, parse_generate
from sluicegate.sim.engine import Engine, Sequence, new_sequence
from sluicegate.tokens import block_hashes


def engine_sequence(
    body: bytes,
    chat: bool,
    target: str,
    request_id: str,
    now: float,
    engine: Engine,
    model: str,
    seed: int,
) -> Sequence:
    """The sequence ``engine`` creates from ``body`` (a chat or completions request for
    ``target``, arriving at ``now`` in simulated seconds); ``target`` other than the base
    ``model`` runs as that LoRA adapter.

    Raises :class:`~sluicegate.sim.api.ApiError` for a body the server would refuse, or a
    prompt plus its output budget over the engine's context (``max_model_len``, capped by
    its KV capacity in tokens)."""
    params = parse_generate(body, chat, engine.prompt_tokens)
    lora = target if target != model else None
    limit = min(engine.profile.max_model_len, engine.profile.kv_capacity_tokens)
    seq = new_sequence(
        request_id,
        params.prompt,
        arrival=now,
        max_tokens=params.max_tokens,
        ignore_eos=params.ignore_eos,
        max_model_len=limit,
        model=model,
        lora=lora,
        cache_salt=params.cache_salt,
        seed=seed,
    )
    if seq.prompt_tokens + seq.max_output_tokens > limit:
        raise ApiError(400, "request exceeds the model's context length")
    return seq


def retarget(raw: bytes, model: str) -> bytes:
    """``raw`` (a JSON request body) asking for ``model``."""
    payload = orjson.loads(raw)
    payload["model"] = model
    return orjson.dumps(payload)


def servable_tokens(seq: Sequence, engines: Seq[Engine], block_size: int) -> int:
    """The longest cached prefix of ``seq`` on any of ``engines`` now, in tokens; counted as
    the engines count a hit (whole blocks of ``block_size`` tokens, never the prompt's last
    token). Engines with another block size cannot share the hashes and are skipped."""
    hashes = block_hashes(seq.prompt, block_size, seq.hash_seed)
    limit = (seq.prompt_tokens - 1) // block_size
    best = 0
    for engine in engines:
        if engine.profile.block_size == block_size:
            best = max(best, len(engine.pool.longest_cached_prefix(hashes, limit)))
    return best * block_size


def engine_metrics(engine: Engine, now: float, lora: bool) -> EngineMetrics:
    """What a scrape of ``engine`` at ``now`` (simulated seconds) reads; the LoRA fields
    are filled only when the pool serves adapters (``lora``)."""
    p = engine.profile
    return EngineMetrics(
        scraped_at=now,
        waiting=len(engine.waiting),
        running=len(engine.running),
        kv_usage=engine.pool.usage,
        running_loras=frozenset(engine.running_loras()) if lora else frozenset(),
        waiting_loras=frozenset(engine.waiting_loras()) if lora else frozenset(),
        max_loras=p.max_loras if lora else 0,
        block_size=p.block_size,
        num_gpu_blocks=p.num_gpu_blocks,
        prefix_cache_queries=engine.counters.prefix_cache_queries,
        prefix_cache_hits=engine.counters.prefix_cache_hits,
    )


__all__ = ["engine_metrics", "engine_sequence", "retarget", "servable_tokens"]
