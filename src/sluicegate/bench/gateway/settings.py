"""What the gateway benchmark runs: the pool, the cores, the requests, how long.

One place for the shape every measurement shares, so that the latency runs, the
throughput runs and the report (which prints these values) cannot disagree: the model
and simulator profile of the pool, which core the router under test gets
(``GATEWAY_CPU``) and which everything else shares (``OTHER_CPU``), the presets and
vllm-router policies compared, the request shape (~``PROMPT_BYTES`` B prompts, shared
prefixes or none, ``MAX_TOKENS`` tokens with ``ignore_eos``), and :class:`Settings`, the
durations and repeats (:meth:`Settings.quick` for a smoke run).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

import orjson

ROOT = Path(__file__).resolve().parents[4]
"""The repository (for ``.venv-bench/``)."""

MODEL = "tiny-llama"
SIM_PROFILE = "tiny"
SIM_REPLICAS = 4
SIM_PROCESSES = 1
"""Processes the simulated replicas run in (1 or ``SIM_REPLICAS``)."""
SIM_TIME_SCALE = 1.0
"""Wall seconds per simulated second of the latency pool (tiny: ~2 ms steps)."""
MAX_TOKENS = 16
PROMPT_BYTES = 1024
PREFIXES = 8
PREFIX_BYTES = 768
BODY_VARIANTS = 256
GATEWAY_CPU = 1
"""The core the router under test gets; everything else runs on core 0."""
OTHER_CPU = 0
GATEWAY_POLICIES = ("default", "round-robin")
ROUTER_POLICIES = ("cache_aware", "round_robin")
OVERHEAD_METRIC = "sluicegate_gateway_overhead_seconds"
DIRECT_SCRAPED = "direct, scraped"
"""The latency baseline: straight to the replicas while an idle gateway scrapes them (as
the gateways under test do), so both sides see the same scrape load."""
LATENCY_TARGETS = ("direct", DIRECT_SCRAPED, *GATEWAY_POLICIES)
"""Straight to the replicas; the same with an idle gateway scraping them; through the
gateway with each preset."""

_WORDS = (
    "river stone lantern orbit copper meadow signal harbor velvet ember quartz willow "
    "canyon pixel thunder marble falcon garden silver anchor prism cobalt tundra beacon "
    "saffron glacier nimbus orchard ripple summit tangle voyage"
).split()


@dataclass(frozen=True, slots=True)
class Settings:
    """How long and how often; every duration in seconds."""

    rates: tuple[int, ...] = (200, 500)
    """Offered load of the latency runs, requests/s."""
    latency_s: float = 10.0
    latency_warmup_s: float = 2.0
    throughput_s: int = 10
    throughput_warmup_s: int = 2
    connections: int = 64
    """wrk connections for the throughput runs."""
    latency_repeats: int = 5
    """Rounds of the latency runs (every target once per round); tables show medians."""
    repeats: int = 3
    """Runs of every throughput measurement; tables show the best run."""
    streaming_throughput: bool = True
    """Also measure requests/s with streamed answers (SSE mock), not just JSON ones."""
    profile_s: int = 10
    """py-spy sampling of the gateway under wrk load (0 = no profile)."""

    @classmethod
    def quick(cls) -> Settings:
        """A smoke run well under a minute: short runs, once each, JSON throughput only."""
        return cls(
            latency_s=1.5,
            latency_warmup_s=0.5,
            throughput_s=2,
            throughput_warmup_s=1,
            latency_repeats=1,
            repeats=1,
            streaming_throughput=False,
            profile_s=0,
        )


# --------------------------------------------------------------------------- requests


def prompts(count: int, shared_prefixes: int = PREFIXES, seed: int = 0) -> list[str]:
    """``count`` prompts of ~``PROMPT_BYTES`` bytes. With ``shared_prefixes`` > 0, each is
    one of that many shared ``PREFIX_BYTES``-byte prefixes followed by a suffix of its own;
    with 0, every prompt differs from its first bytes on (no prefix is shared)."""
    rng = random.Random(seed)

    def text(size: int) -> str:
        out: list[str] = []
        length = 0
        while length < size:
            word = rng.choice(_WORDS)
            out.append(word)
            length += len(word) + 1
        return " ".join(out)[:size]

    if shared_prefixes <= 0:
        return [f"#{seed}.{i} " + text(PROMPT_BYTES - 12) for i in range(count)]
    heads = [f"[{p}] " + text(PREFIX_BYTES - 4) for p in range(shared_prefixes)]
    return [
        heads[i % shared_prefixes] + f" #{i} " + text(PROMPT_BYTES - PREFIX_BYTES - 8)
        for i in range(count)
    ]


def completion_body(prompt: str, stream: bool) -> bytes:
    """A ``/v1/completions`` body: ``MAX_TOKENS`` tokens, ignoring EOS."""
    return orjson.dumps(
        {
            "model": MODEL,
            "prompt": prompt,
            "max_tokens": MAX_TOKENS,
            "ignore_eos": True,
            "stream": stream,
        }
    )
