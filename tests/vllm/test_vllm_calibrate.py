"""``sluicegate sim calibrate`` against a real vLLM server on CPU (run with
``scripts/test-vllm``): the profile it fits predicts the server's own mean TTFT and
inter-token latency within 20 % on a held-out request mix.

The held-out mix (prompt lengths and batch shapes the probes never sent, arriving
staggered so prefills and decodes overlap) is sent to the server and replayed, with the same
arrival times, on the simulator's engine with the fitted profile. Measured: the deltas of
vLLM's ``vllm:time_to_first_token_seconds`` and ``vllm:inter_token_latency_seconds``
histograms around the mix (means over its requests and tokens), the mix sent twice and the
two means averaged.
"""

from __future__ import annotations

import asyncio
import os
import random
from collections.abc import Iterator

import aiohttp
import pytest
from vllm_harness import MODEL_NAME, PYTHON_ENV, VllmServer, ensure_model

from sluicegate.sim.calibrate import CalibrateOptions, calibrate
from sluicegate.sim.calibrate.client import ITL, TTFT, Target
from sluicegate.sim.calibrate.probes import Prober
from sluicegate.sim.engine import Engine, new_sequence
from sluicegate.sim.profiles import EngineProfile

VLLM_PYTHON = os.environ.get(PYTHON_ENV, "")
if not VLLM_PYTHON:
    pytest.skip(f"needs {PYTHON_ENV}; run with scripts/test-vllm", allow_module_level=True)
# A timing check: it needs a machine doing nothing else (on the shared 2-core machine at
# load average 10–15 the server stalls for tens of ms at a time and the check fails; see
# docs/simulator.md), so it runs only when asked for:
#   SLUICEGATE_VLLM_CALIBRATE=1 scripts/test-vllm -k calibrated -s
if os.environ.get("SLUICEGATE_VLLM_CALIBRATE") != "1":
    pytest.skip("set SLUICEGATE_VLLM_CALIBRATE=1 on a quiet machine", allow_module_level=True)

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(900)]

MAX_NUM_SEQS = 16
MAX_NUM_BATCHED_TOKENS = 2048
# (arrival s, prompt tokens, output tokens): lengths unlike the probes', overlapping.
HELD_OUT = [
    (0.00, 300, 40),
    (0.05, 700, 32),
    (0.10, 90, 48),
    (0.30, 1100, 24),
    (0.35, 250, 40),
    (0.40, 60, 40),
    (0.60, 450, 32),
    (0.65, 900, 24),
    (0.90, 150, 48),
    (0.95, 600, 32),
    (1.00, 40, 40),
    (1.20, 1300, 24),
]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[VllmServer]:
    work = tmp_path_factory.mktemp("vllm-calibrate")
    model = ensure_model(VLLM_PYTHON, work / MODEL_NAME)
    s = VllmServer(
        VLLM_PYTHON,
        model,
        work / "vllm.log",
        extra_args=[
            "--max-num-seqs",
            str(MAX_NUM_SEQS),
            "--max-num-batched-tokens",
            str(MAX_NUM_BATCHED_TOKENS),
        ],
        env={
            "VLLM_HOST_IP": "127.0.0.1",
            "VLLM_CPU_KVCACHE_SPACE": "1",
            "VLLM_CPU_OMP_THREADS_BIND": "0",
            "OMP_NUM_THREADS": "1",
        },
    )
    s.start()
    try:
        import time

        s.wait_healthy(time.monotonic() + 300)
        yield s
    finally:
        s.stop()


def replay(profile: EngineProfile, mix: list[tuple[float, int, int]]) -> tuple[float, float]:
    """(mean TTFT s, mean inter-token latency s) of ``mix`` on the simulator's engine."""
    engine = Engine(profile)
    rng = random.Random(0)
    pending = [
        new_sequence(
            f"r{i}",
            rng.randbytes(4 * prompt),
            arrival=at,
            max_tokens=out,
            ignore_eos=True,
            max_model_len=profile.max_model_len,
            model=profile.model_name,
        )
        for i, (at, prompt, out) in enumerate(mix)
    ]
    seqs = list(pending)
    now = 0.0
    while pending or engine.has_work():
        while pending and pending[0].arrival <= now:
            engine.add(pending.pop(0))
        result = engine.step(now) if engine.has_work() else None
        if result is None or result.idle:
            now = pending[0].arrival
            continue
        now += result.duration
    ttft = sum(s.first_token_time - s.arrival for s in seqs) / len(seqs)
    decode = sum(s.finish_time - s.first_token_time for s in seqs)
    return ttft, decode / sum(s.max_output_tokens - 1 for s in seqs)


async def run_mix(url: str, model: str, mix: list[tuple[float, int, int]]) -> tuple[float, float]:
    """(mean TTFT s, mean inter-token latency s) of ``mix`` by the server's histograms."""
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as http:
        target = Target(http, url, 120.0)
        prober = Prober(target, model, seed=1)
        before = await target.scrape()
        loop = asyncio.get_running_loop()
        t0 = loop.time()

        async def one(at: float, prompt: int, out: int) -> None:
            await asyncio.sleep(max(0.0, t0 + at - loop.time()))
            # not streamed: the server's histograms time it, and streams would load the
            # API server (which shares the CPU with the engine) with work the probes lacked
            await target.complete(model, prober.prompt(prompt), out, stream=False)

        await asyncio.gather(*(one(*r) for r in mix))
        await asyncio.sleep(1.0)
        after = await target.scrape()
    assert before is not None
    assert after is not None
    ttft, itl = before.delta(after, TTFT), before.delta(after, ITL)
    assert ttft is not None
    assert itl is not None
    assert ttft[1] == len(mix)
    return ttft[0] / ttft[1], itl[0] / itl[1]


async def test_calibrated_profile_predicts_held_out_ttft_and_itl(server: VllmServer) -> None:
    result = await calibrate(
        CalibrateOptions(
            target=server.url,
            base="tiny",
            max_num_seqs=MAX_NUM_SEQS,
            max_num_batched_tokens=MAX_NUM_BATCHED_TOKENS,
            batch_sizes=(1, 4, 16),
            # four passes: the shared CPU stalls the server for tens of ms at a time, and the
            # median over passes keeps one stalled pass from setting a point
            passes=4,
            budget_s=300,
        )
    )
    print("\n" + result.table())
    print(f"KV: {result.kv_source}; fixed: {result.fit.fixed}; notes: {result.notes}")
    profile = result.fit.profile
    assert profile.block_size == 128  # vLLM's CPU block size, read from cache_config_info
    # Sent twice (fresh prompts each time): the goal is against their mean, and the two
    # show how much the server's own timings move between identical mixes.
    first = await run_mix(server.url, MODEL_NAME, HELD_OUT)
    second = await run_mix(server.url, MODEL_NAME, HELD_OUT)
    measured = ((first[0] + second[0]) / 2, (first[1] + second[1]) / 2)
    predicted = replay(profile, HELD_OUT)
    print(
        f"held-out mix, twice: TTFT {first[0] * 1e3:.2f} and {second[0] * 1e3:.2f} ms, "
        f"ITL {first[1] * 1e3:.3f} and {second[1] * 1e3:.3f} ms"
    )
    print(
        f"held-out mix: TTFT measured {measured[0] * 1e3:.2f} ms, predicted "
        f"{predicted[0] * 1e3:.2f} ms; ITL measured {measured[1] * 1e3:.3f} ms, predicted "
        f"{predicted[1] * 1e3:.3f} ms"
    )
    assert abs(predicted[0] - measured[0]) <= 0.2 * measured[0]
    assert abs(predicted[1] - measured[1]) <= 0.2 * measured[1]
