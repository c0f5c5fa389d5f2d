"""The simulator's ``/metrics`` against a real vLLM 0.32 scrape (``data/vllm-0.32-metrics.txt``).

Names, types, label names and histogram buckets must be vLLM's, so that a router scraping
the simulator would scrape vLLM the same way.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

from sluicegate.sim.engine import Engine, new_sequence
from sluicegate.sim.metrics import EngineMetrics
from sluicegate.sim.profiles import get_profile
from sluicegate.tokens import count_tokens

MODEL = "tiny-llama"
IGNORE_EOS = {"ignore_eos": True}
VLLM_SCRAPE = Path(__file__).parent / "data" / "vllm-0.32-metrics.txt"

# Emitted by the simulator but absent from the reference scrape: LoRA info (that server ran
# without LoRA) and the legacy KV gauge (only with legacy_metric_names=True).
NOT_IN_REFERENCE = {"vllm:lora_requests_info", "vllm:gpu_cache_usage_perc"}

# What a router reads (GIE's metric mapping and vLLM v0.32.0's vllm/v1/metrics/loggers.py),
# by parsed family name and type.
ROUTER_FAMILIES = {
    "vllm:num_requests_running": "gauge",
    "vllm:num_requests_waiting": "gauge",
    "vllm:kv_cache_usage_perc": "gauge",
    "vllm:cache_config_info": "gauge",
    "vllm:prefix_cache_queries": "counter",
    "vllm:prefix_cache_hits": "counter",
    "vllm:time_to_first_token_seconds": "histogram",
    "vllm:inter_token_latency_seconds": "histogram",
    "vllm:e2e_request_latency_seconds": "histogram",
    "vllm:prompt_tokens": "counter",
    "vllm:generation_tokens": "counter",
}


@pytest.fixture(scope="module")
def vllm() -> dict[str, Metric]:
    """The reference vLLM scrape's families by name."""
    text = VLLM_SCRAPE.read_text()
    return {family.name: family for family in text_string_to_metric_families(text)}


def label_names(family: Metric) -> set[str]:
    return {name for sample in family.samples for name in sample.labels}


def buckets(family: Metric) -> list[str]:
    return [s.labels["le"] for s in family.samples if s.name.endswith("_bucket")]


async def some_traffic(client: openai.AsyncOpenAI, model: str = MODEL) -> None:
    """A completion and a streamed chat, so every histogram has observations."""
    await client.completions.create(model=model, prompt="hello", max_tokens=3)
    stream = await client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": "hi"}],
        max_tokens=3,
        stream=True,
        extra_body=IGNORE_EOS,
    )
    async for _chunk in stream:
        pass


def assert_matches_reference(families: dict[str, Metric], vllm: dict[str, Metric]) -> None:
    emitted = {name for name in families if name.startswith("vllm:")}
    assert emitted, "no vllm: families"
    for name in sorted(emitted - NOT_IN_REFERENCE):
        assert name in vllm, f"{name} is not a vLLM 0.32 metric"
        assert families[name].type == vllm[name].type, name
        assert label_names(families[name]) == label_names(vllm[name]), name


async def test_every_family_matches_vllm(
    replica: Any, client: openai.AsyncOpenAI, scrape: Any, vllm: dict[str, Metric]
) -> None:
    await some_traffic(client)
    families = await scrape(replica)
    assert_matches_reference(families, vllm)
    # Without LoRA and legacy names neither extra family is exported.
    assert not NOT_IN_REFERENCE & set(families)


async def test_router_families_are_present(
    replica: Any, scrape: Any, vllm: dict[str, Metric]
) -> None:
    families = await scrape(replica)
    for name, kind in ROUTER_FAMILIES.items():
        assert name in families, name
        assert families[name].type == kind == vllm[name].type, name
    (info,) = families["vllm:cache_config_info"].samples
    assert info.value == 1.0
    assert info.labels["block_size"] == "16"
    assert info.labels["num_gpu_blocks"] == "512"
    assert info.labels["enable_prefix_caching"] == "True"
    assert families.value("vllm:num_requests_running", engine="0", model_name=MODEL) == 0


async def test_histogram_buckets_match_vllm(
    replica: Any, client: openai.AsyncOpenAI, scrape: Any, vllm: dict[str, Metric]
) -> None:
    await some_traffic(client)
    families = await scrape(replica)
    histograms = [f for f in families.values() if f.type == "histogram"]
    assert {f.name for f in histograms} >= {
        name for name, kind in ROUTER_FAMILIES.items() if kind == "histogram"
    }
    for family in histograms:
        assert buckets(family) == buckets(vllm[family.name]), family.name


async def test_exposition_content_type(replica: Any, http: aiohttp.ClientSession) -> None:
    async with http.get(replica.url + "/metrics") as response:
        assert response.status == 200
        assert response.headers["Content-Type"].startswith("text/plain; version=0.0.4")


async def test_lora_requests_info(
    sim_cluster: Any, openai_client: Any, scrape: Any, vllm: dict[str, Metric]
) -> None:
    cluster = await sim_cluster(replicas=1, time_scale=1.0, lora={"sql-lora": "/adapters/sql"})
    replica = cluster.replicas[0]
    client = openai_client(replica)
    await some_traffic(client, model="sql-lora")
    families = await scrape(replica)
    assert_matches_reference(families, vllm)

    info = families["vllm:lora_requests_info"]
    assert info.type == "gauge"
    assert label_names(info) == {"max_lora", "running_lora_adapters", "waiting_lora_adapters"}
    (idle,) = info.samples
    assert idle.labels == {
        "max_lora": "2",
        "running_lora_adapters": "",
        "waiting_lora_adapters": "",
    }
    assert idle.value > 1e9  # a Unix timestamp, as vLLM sets it

    stream = await client.completions.create(
        model="sql-lora", prompt="adapter", max_tokens=2000, stream=True, extra_body=IGNORE_EOS
    )
    await stream.__anext__()
    (busy,) = (await scrape(replica))["vllm:lora_requests_info"].samples
    assert busy.labels["running_lora_adapters"] == "sql-lora"
    await stream.close()


async def test_lora_requests_info_appears_when_an_adapter_is_loaded(
    replica: Any, http: aiohttp.ClientSession, scrape: Any
) -> None:
    assert "vllm:lora_requests_info" not in await scrape(replica)
    async with http.post(
        replica.url + "/v1/load_lora_adapter", json={"lora_name": "late", "lora_path": "/x"}
    ) as response:
        assert response.status == 200
    assert "vllm:lora_requests_info" in await scrape(replica)


async def test_legacy_gpu_cache_usage_perc(
    sim_cluster: Any, scrape: Any, vllm: dict[str, Metric]
) -> None:
    replica = (await sim_cluster(replicas=1, legacy_metric_names=True)).replicas[0]
    families = await scrape(replica)
    legacy = families["vllm:gpu_cache_usage_perc"]
    assert legacy.type == "gauge"
    assert label_names(legacy) == label_names(vllm["vllm:kv_cache_usage_perc"])
    assert families.value("vllm:gpu_cache_usage_perc") == families.value("vllm:kv_cache_usage_perc")
    assert_matches_reference(families, vllm)


async def test_values_move_under_load(sim_cluster: Any, openai_client: Any, scrape: Any) -> None:
    # The tiny profile runs at most 16 sequences; 24 requests of 100 tokens keep it busy
    # for a few hundred milliseconds at real speed, with 8 waiting.
    replica = (await sim_cluster(replicas=1, time_scale=1.0)).replicas[0]
    client = openai_client(replica)
    n, max_tokens = 24, 100
    prompts = [f"request number {i}: " + "tell me a story. " * (i + 1) for i in range(n)]
    tasks = [
        asyncio.create_task(
            client.completions.create(
                model=MODEL, prompt=prompt, max_tokens=max_tokens, extra_body=IGNORE_EOS
            )
        )
        for prompt in prompts
    ]
    running = waiting = kv_usage = 0.0
    while not all(task.done() for task in tasks):
        families = await scrape(replica)
        running = max(running, families.value("vllm:num_requests_running"))
        waiting = max(waiting, families.value("vllm:num_requests_waiting"))
        kv_usage = max(kv_usage, families.value("vllm:kv_cache_usage_perc"))
        await asyncio.sleep(0.01)
    results = await asyncio.gather(*tasks)
    assert 0 < running <= 16
    assert waiting > 0
    assert 0 < kv_usage <= 1

    after = await scrape(replica)
    assert after.value("vllm:num_requests_running") == 0
    assert after.value("vllm:num_requests_waiting") == 0
    assert after.value("vllm:kv_cache_usage_perc") == 0
    prompt_tokens = sum(count_tokens(p) for p in prompts)
    assert sum(r.usage.prompt_tokens for r in results if r.usage) == prompt_tokens
    assert after.value("vllm:prompt_tokens") == prompt_tokens
    assert after.value("vllm:generation_tokens") == n * max_tokens
    assert after.value("vllm:request_success", finished_reason="length") == n
    assert after.value("vllm:time_to_first_token_seconds", "_count") == n
    assert after.value("vllm:e2e_request_latency_seconds", "_count") == n
    assert after.value("vllm:inter_token_latency_seconds", "_count") == n * (max_tokens - 1)
    assert after.value("vllm:request_prompt_tokens", "_sum") == prompt_tokens
    assert after.value("vllm:request_queue_time_seconds", "_sum") > 0  # some waited
    assert after.value("vllm:time_to_first_token_seconds", "_sum") > 0


async def test_replicas_have_separate_metrics(
    sim_cluster: Any, openai_client: Any, scrape: Any
) -> None:
    first, second = (await sim_cluster(replicas=2)).replicas
    await openai_client(first).completions.create(
        model=MODEL, prompt="only the first", max_tokens=3, extra_body=IGNORE_EOS
    )
    assert (await scrape(first)).value("vllm:generation_tokens") == 3
    assert (await scrape(second)).value("vllm:generation_tokens") == 0


def _family_value(text: bytes, name: str, sample: str) -> float:
    for family in text_string_to_metric_families(text.decode()):
        for s in family.samples:
            if s.name == sample and family.name == name:
                return float(s.value)
    raise KeyError(sample)


def test_histograms_may_be_reused_but_gauges_are_live() -> None:
    engine = Engine(get_profile("tiny"))
    metrics = EngineMetrics(engine, MODEL, histogram_max_age_s=3600.0)
    first = metrics.render()
    engine.add(
        new_sequence(
            "r1",
            b"hello there",
            arrival=0.0,
            max_tokens=4,
            ignore_eos=True,
            max_model_len=2048,
            model=MODEL,
        )
    )
    now = 0.0
    while engine.has_work():
        result = engine.step(now)
        metrics.observe_step(result)
        now += result.duration
    second = metrics.render()
    ttft = "vllm:time_to_first_token_seconds"
    # The histogram text is the cached one; the counters moved.
    assert _family_value(second, ttft, ttft + "_count") == 0
    assert _family_value(second, "vllm:generation_tokens", "vllm:generation_tokens_total") == 4
    assert _family_value(first, "vllm:generation_tokens", "vllm:generation_tokens_total") == 0

    metrics.histogram_max_age_s = 0.0  # the default: rendered on every scrape
    assert _family_value(metrics.render(), ttft, ttft + "_count") == 1
