"""MetricsParser: each engine type's Prometheus scrape → EngineMetrics.

Metric names per engine type as GIE maps them:
https://github.com/kubernetes-sigs/gateway-api-inference-extension/blob/1748e829/pkg/epp/framework/plugins/datalayer/extractor/metrics/factories.go
"""

from __future__ import annotations

import math
from collections.abc import Callable

import pytest

from sluicegate.datalayer.endpoint import EngineMetrics
from sluicegate.datalayer.parsers import ENGINES, MetricsParseError, MetricsParser

Gauges = Callable[..., str]


def vllm(text: str, at: float = 5.0) -> EngineMetrics:
    return MetricsParser("vllm").parse(text, at)


# --------------------------------------------------------------------------- vLLM, real scrape


def test_real_vllm_scrape(vllm_scrape: str) -> None:
    m = vllm(vllm_scrape, at=12.5)
    assert m == EngineMetrics(
        scraped_at=12.5,
        waiting=0,
        running=0,
        kv_usage=0.0,
        block_size=128,
        num_gpu_blocks=8192,
        prefix_cache_queries=18.0,
        prefix_cache_hits=0.0,
        generation_tokens=24.0,
    )
    assert m.max_loras == 0
    assert m.running_loras == frozenset()


def test_real_vllm_scrape_with_load(vllm_scrape: str) -> None:
    text = (
        vllm_scrape.replace(
            'vllm:num_requests_running{engine="0",model_name="tiny-llama"} 0.0',
            'vllm:num_requests_running{engine="0",model_name="tiny-llama"} 7.0',
        )
        .replace(
            'vllm:num_requests_waiting{engine="0",model_name="tiny-llama"} 0.0',
            'vllm:num_requests_waiting{engine="0",model_name="tiny-llama"} 3.0',
        )
        .replace(
            'vllm:kv_cache_usage_perc{engine="0",model_name="tiny-llama"} 0.0',
            'vllm:kv_cache_usage_perc{engine="0",model_name="tiny-llama"} 0.625',
        )
        .replace(
            'vllm:prefix_cache_hits_total{engine="0",model_name="tiny-llama"} 0.0',
            'vllm:prefix_cache_hits_total{engine="0",model_name="tiny-llama"} 9.0',
        )
    )
    assert text != vllm_scrape
    m = vllm(text)
    assert (m.waiting, m.running, m.kv_usage) == (3, 7, 0.625)
    assert (m.prefix_cache_queries, m.prefix_cache_hits) == (18.0, 9.0)
    # waiting_by_reason shares the waiting gauge's name as a prefix; it must not be added.
    assert "vllm:num_requests_waiting_by_reason" in text


def test_real_scrape_has_no_legacy_name(vllm_scrape: str) -> None:
    assert "gpu_cache_usage_perc" not in vllm_scrape  # absent in vLLM 0.32 (renamed in 0.9)
    assert "vllm:kv_cache_usage_perc" in vllm_scrape


# --------------------------------------------------------------------------- vLLM, variants


def test_legacy_gpu_cache_usage_fallback() -> None:
    text = (
        "vllm:num_requests_waiting 1\n"
        "vllm:num_requests_running 2\n"
        "vllm:gpu_cache_usage_perc 0.4\n"
        "vllm:gpu_prefix_cache_queries_total 100\n"
        "vllm:gpu_prefix_cache_hits_total 40\n"
    )
    m = vllm(text)
    assert (m.waiting, m.running, m.kv_usage) == (1, 2, 0.4)
    assert (m.prefix_cache_queries, m.prefix_cache_hits) == (100.0, 40.0)


def test_legacy_gauge_alone_is_enough() -> None:
    assert vllm("vllm:gpu_cache_usage_perc 0.25\n").kv_usage == 0.25


def test_new_name_wins_over_legacy() -> None:
    text = "vllm:kv_cache_usage_perc 0.7\nvllm:gpu_cache_usage_perc 0.1\n"
    assert vllm(text).kv_usage == 0.7
    text = "vllm:prefix_cache_queries_total 5\nvllm:gpu_prefix_cache_queries_total 50\n" + text
    assert vllm(text).prefix_cache_queries == 5.0


def test_lora_info_newest_series_wins(gauges: Gauges) -> None:
    text = gauges() + (
        'vllm:lora_requests_info{max_lora="4",running_lora_adapters="old",'
        'waiting_lora_adapters=""} 1.7e9\n'
        'vllm:lora_requests_info{max_lora="4",running_lora_adapters="sql-lora, chat-lora",'
        'waiting_lora_adapters="math-lora"} 1.7000000050e9\n'
        'vllm:lora_requests_info{max_lora="4",running_lora_adapters="older",'
        'waiting_lora_adapters="x"} 1.6e9\n'
    )
    m = vllm(text)
    assert m.running_loras == frozenset({"sql-lora", "chat-lora"})
    assert m.waiting_loras == frozenset({"math-lora"})
    assert m.max_loras == 4


def test_lora_info_empty_lists_and_missing_max(gauges: Gauges) -> None:
    text = (
        gauges() + 'vllm:lora_requests_info{running_lora_adapters=",",waiting_lora_adapters=""} 1\n'
    )
    m = vllm(text)
    assert m.running_loras == frozenset()
    assert m.waiting_loras == frozenset()
    assert m.max_loras == 0


def test_data_parallel_ranks() -> None:
    text = (
        'vllm:num_requests_waiting{engine="0",model_name="m"} 2\n'
        'vllm:num_requests_waiting{engine="1",model_name="m"} 5\n'
        'vllm:num_requests_running{engine="0",model_name="m"} 8\n'
        'vllm:num_requests_running{engine="1",model_name="m"} 3\n'
        'vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.3\n'
        'vllm:kv_cache_usage_perc{engine="1",model_name="m"} 0.9\n'
        'vllm:prefix_cache_queries_total{engine="0",model_name="m"} 10\n'
        'vllm:prefix_cache_queries_total{engine="1",model_name="m"} 30\n'
        'vllm:cache_config_info{block_size="16",engine="0",num_gpu_blocks="1000"} 1\n'
        'vllm:cache_config_info{block_size="16",engine="1",num_gpu_blocks="1000"} 1\n'
    )
    m = vllm(text)
    assert (m.waiting, m.running) == (7, 11)  # summed
    assert m.kv_usage == 0.9  # the fullest rank
    assert m.prefix_cache_queries == 40.0
    assert (m.block_size, m.num_gpu_blocks) == (16, 1000)


def test_values_are_clamped() -> None:
    m = vllm(
        "vllm:num_requests_waiting -3\nvllm:num_requests_running -1\nvllm:kv_cache_usage_perc 1.7\n"
    )
    assert (m.waiting, m.running, m.kv_usage) == (0, 0, 1.0)
    assert vllm("vllm:kv_cache_usage_perc -0.2\n").kv_usage == 0.0


def test_fractional_counts_truncate() -> None:
    assert vllm("vllm:num_requests_waiting 2.9\n").waiting == 2


def test_cache_config_with_unparsable_labels(gauges: Gauges) -> None:
    text = gauges() + 'vllm:cache_config_info{block_size="None",num_gpu_blocks="lots"} 1\n'
    m = vllm(text)
    assert (m.block_size, m.num_gpu_blocks) == (None, None)


def test_escaped_label_values(gauges: Gauges) -> None:
    text = gauges() + (
        'vllm:lora_requests_info{max_lora="2",running_lora_adapters="a\\"b,c\\\\d",'
        'waiting_lora_adapters="e\\nf"} 1\n'
    )
    m = vllm(text)
    assert m.running_loras == frozenset({'a"b', "c\\d"})
    assert m.waiting_loras == frozenset({"e\nf"})


def test_braces_and_spaces_inside_label_values_and_timestamps(gauges: Gauges) -> None:
    text = gauges() + (
        'vllm:lora_requests_info{max_lora="2",running_lora_adapters="a} b, c{",'
        'waiting_lora_adapters=""} 1 1700000000000\n'
    )
    m = vllm(text)
    assert m.running_loras == frozenset({"a} b", "c{"})
    assert m.max_loras == 2


def test_the_series_cache_stays_bounded(gauges: Gauges) -> None:
    parser = MetricsParser("vllm")
    for i in range(3 * MetricsParser.MAX_CACHED_SERIES):
        # Adapter sets change: every scrape has a new lora_requests_info series.
        text = gauges() + (
            f'vllm:lora_requests_info{{max_lora="2",running_lora_adapters="a{i}",'
            'waiting_lora_adapters=""} 1\n'
        )
        assert parser.parse(text, 1.0).running_loras == frozenset({f"a{i}"})
        assert len(parser._series) <= MetricsParser.MAX_CACHED_SERIES


def test_help_and_type_lines_are_ignored() -> None:
    text = (
        "# HELP vllm:num_requests_waiting Number of requests waiting.\n"
        "# TYPE vllm:num_requests_waiting gauge\n"
        'vllm:num_requests_waiting{engine="0"} 4.0\n'
        "# TYPE vllm:prefix_cache_queries counter\n"
        'vllm:prefix_cache_queries_total{engine="0"} 12.0\n'
        'vllm:prefix_cache_queries_created{engine="0"} 1.79e9\n'
    )
    m = vllm(text)
    assert m.waiting == 4
    assert m.prefix_cache_queries == 12.0


# --------------------------------------------------------------------------- other engines


def test_sglang() -> None:
    text = (
        "# TYPE sglang:num_queue_reqs gauge\n"
        'sglang:num_queue_reqs{model_name="qwen"} 6\n'
        'sglang:num_running_reqs{model_name="qwen"} 12\n'
        'sglang:token_usage{model_name="qwen"} 0.55\n'
        'sglang:cache_config_info{page_size="64",num_pages="2048"} 1\n'
        'vllm:num_requests_waiting{model_name="qwen"} 99\n'
    )
    m = MetricsParser("sglang").parse(text, 1.0)
    assert (m.waiting, m.running, m.kv_usage) == (6, 12, 0.55)
    assert (m.block_size, m.num_gpu_blocks) == (64, 2048)
    assert m.max_loras == 0


def test_trtllm_serve() -> None:
    text = (
        "trtllm_num_requests_waiting 3\n"
        "trtllm_num_requests_running 9\n"
        "trtllm_kv_cache_utilization 0.42\n"
        "trtllm_kv_cache_tokens_per_block 32\n"
        "trtllm_kv_cache_max_blocks 4096\n"
    )
    m = MetricsParser("trtllm-serve").parse(text, 1.0)
    assert (m.waiting, m.running, m.kv_usage) == (3, 9, 0.42)
    assert (m.block_size, m.num_gpu_blocks) == (32, 4096)


def test_triton_label_filtered() -> None:
    text = (
        'nv_trt_llm_request_metrics{model="ensemble",request_type="waiting",version="1"} 4\n'
        'nv_trt_llm_request_metrics{model="ensemble",request_type="scheduled",version="1"} 10\n'
        'nv_trt_llm_request_metrics{model="ensemble",request_type="context",version="1"} 2\n'
        'nv_trt_llm_request_metrics{model="ensemble",request_type="max",version="1"} 256\n'
        'nv_trt_llm_request_metrics{model="ensemble",request_type="active",version="1"} 14\n'
        'nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="fraction",model="ensemble"} 0.35\n'
        'nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="used",model="ensemble"} 700\n'
        'nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="free",model="ensemble"} 1300\n'
        'nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="max",model="ensemble"} 2000\n'
        'nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="tokens_per",model="ensemble"} 64\n'
    )
    m = MetricsParser("triton-tensorrt-llm").parse(text, 1.0)
    assert (m.waiting, m.running, m.kv_usage) == (4, 10, 0.35)
    assert (m.block_size, m.num_gpu_blocks) == (64, 2000)


def test_triton_without_matching_labels_reads_zero() -> None:
    text = 'nv_trt_llm_request_metrics{request_type="context"} 2\n'
    m = MetricsParser("triton-tensorrt-llm").parse(text, 1.0)
    assert (m.waiting, m.running, m.kv_usage) == (0, 0, 0.0)
    assert (m.block_size, m.num_gpu_blocks) == (None, None)


def test_every_engine_type_has_a_parser() -> None:
    assert set(ENGINES) == {"vllm", "sglang", "trtllm-serve", "triton-tensorrt-llm"}
    for engine in ENGINES:
        MetricsParser(engine)


def test_unknown_engine_type_rejected() -> None:
    with pytest.raises(ValueError, match=r"unknown engine type 'tgi'; known: sglang, "):
        MetricsParser("tgi")


# --------------------------------------------------------------------------- errors


def test_scrape_without_engine_metrics(vllm_scrape: str) -> None:
    with pytest.raises(MetricsParseError, match="none of the expected"):
        MetricsParser("sglang").parse(vllm_scrape, 0.0)
    with pytest.raises(MetricsParseError, match="none of the expected"):
        vllm("")
    with pytest.raises(MetricsParseError, match="none of the expected"):
        vllm("# HELP vllm:num_requests_waiting x\n# TYPE vllm:num_requests_waiting gauge\n")
    # Only non-load metrics (cache config, counters) are not a scrape of a live engine.
    with pytest.raises(MetricsParseError):
        vllm('vllm:cache_config_info{block_size="16"} 1\nvllm:prefix_cache_queries_total 3\n')


@pytest.mark.parametrize(
    "text",
    [
        "<html><body>502 Bad Gateway</body></html>",
        '{"error": "not found"}',
        "\x00\x01\x02\xff\xfe binary \x7f",
        'vllm:num_requests_waiting{engine="0" 3\n',  # unclosed labels
        "vllm:num_requests_waiting abc\n",
        "vllm:num_requests_waiting\n",
        'vllm:num_requests_waiting{="0"} 1\n',
        "vllm:num_requests_waiting 1 not-a-timestamp\n",
        'vllm:kv_cache_usage_perc{engine="0"} 0.5\nvllm:num_requests_running {{{\n',
    ],
)
def test_garbage_is_a_parse_error(text: str) -> None:
    with pytest.raises(MetricsParseError):
        vllm(text)


@pytest.mark.parametrize(
    "line",
    [
        "vllm:num_requests_waiting NaN",
        "vllm:num_requests_waiting +Inf",
        "vllm:num_requests_running -Inf",
        'vllm:num_requests_running{engine="1"} 1e400',
        "vllm:kv_cache_usage_perc NaN",
    ],
)
def test_non_finite_load_is_a_parse_error(gauges: Gauges, line: str) -> None:
    # NaN KV usage used to read as 0.0 (idle) and +Inf waiting raised OverflowError, which
    # the collector did not catch.
    with pytest.raises(MetricsParseError, match="vllm:"):
        vllm(gauges() + line + "\n")


def test_non_finite_side_metrics_are_dropped(gauges: Gauges) -> None:
    text = gauges(waiting=1) + (
        "vllm:prefix_cache_queries_total NaN\n"
        'vllm:lora_requests_info{max_lora="1",running_lora_adapters="a"} NaN\n'
    )
    m = vllm(text)
    assert m.waiting == 1
    assert m.prefix_cache_queries == 0.0
    assert m.running_loras == frozenset()
    text = "trtllm_num_requests_waiting 1\ntrtllm_kv_cache_tokens_per_block +Inf\n"
    assert MetricsParser("trtllm-serve").parse(text, 0.0).block_size is None


def test_parse_error_is_a_value_error() -> None:
    assert issubclass(MetricsParseError, ValueError)


# --------------------------------------------------------------------------- volume


def _histogram(name: str, buckets: int) -> list[str]:
    lines = [f"# HELP {name} A histogram.", f"# TYPE {name} histogram"]
    for i in range(buckets):
        lines.append(f'{name}_bucket{{engine="0",le="{2.0**i}",model_name="m"}} {i}')
    lines.append(f'{name}_bucket{{engine="0",le="+Inf",model_name="m"}} {buckets}')
    lines.append(f'{name}_count{{engine="0",model_name="m"}} {buckets}')
    lines.append(f'{name}_sum{{engine="0",model_name="m"}} 123.5')
    return lines


def test_histogram_lines_are_ignored(gauges: Gauges) -> None:
    lines: list[str] = []
    for i in range(20):
        lines += _histogram(f"vllm:request_latency_{i}_seconds", 25)
    # Histograms whose names start with a wanted gauge's name pass the prefix test and must
    # still be left out.
    lines += _histogram("vllm:num_requests_waiting_seconds", 10)
    lines += _histogram("vllm:kv_cache_usage_perc_hist", 10)
    text = "\n".join(lines) + "\n" + gauges(waiting=2, running=3, kv=0.5)
    assert len(text.splitlines()) >= 600
    m = vllm(text)
    assert m == vllm(gauges(waiting=2, running=3, kv=0.5))
    assert not math.isnan(m.kv_usage)


def test_real_scrape_histograms_ignored(vllm_scrape: str) -> None:
    assert len(vllm_scrape.splitlines()) > 600
    assert "_bucket{" in vllm_scrape
    core = "\n".join(
        line
        for line in vllm_scrape.splitlines()
        if line.startswith(
            (
                "vllm:num_requests_",
                "vllm:kv_cache_usage",
                "vllm:prefix_cache_",
                "vllm:cache_config",
                "vllm:generation_tokens_total",
            )
        )
    )
    assert vllm(core + "\n") == vllm(vllm_scrape)
