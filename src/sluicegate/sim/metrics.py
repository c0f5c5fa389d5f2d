"""The simulator's ``/metrics``: vLLM 0.32's names, types, labels and buckets.

Gauges and counters are read from the engine when scraped; histograms are observed as
requests progress. Every time is in simulated seconds. ``vllm:lora_requests_info`` is
exported only when LoRA is enabled, as vLLM does; the legacy ``vllm:gpu_cache_usage_perc``
only when asked for (it is absent from vLLM 0.32).

Rendering every histogram costs milliseconds of CPU (prometheus_client formats each bucket
line); a gateway scraping four replicas every 50 ms would spend a third of a core on it. So
the histograms' text may be reused for up to ``histogram_max_age_s`` wall seconds, while
the gauges and counters a gateway routes on are always read live.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable, Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from sluicegate.instruments import Histogram, HistogramSeries
from sluicegate.sim.engine import Engine, SeqStatus, Sequence, StepResult

_TOKEN_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000)
_TTFT_BUCKETS = (
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
    160.0,
    640.0,
    2560.0,
)
_ITL_BUCKETS = (
    0.01,
    0.025,
    0.05,
    0.075,
    0.1,
    0.15,
    0.2,
    0.3,
    0.4,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
)
_REQUEST_TIME_BUCKETS = (
    0.3,
    0.5,
    0.8,
    1.0,
    1.5,
    2.0,
    2.5,
    5.0,
    10.0,
    15.0,
    20.0,
    30.0,
    40.0,
    50.0,
    60.0,
    120.0,
    240.0,
    480.0,
    960.0,
    1920.0,
    7680.0,
)
_ITERATION_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
_PREEMPTION_BUCKETS = (1, 2, 3, 4, 5, 10, 20)
_N_BUCKETS = (1, 2, 5, 10, 20)

_FINISH_REASONS = ("stop", "length", "abort", "error", "repetition")
_LABELS = ("engine", "model_name")


class EngineMetrics:
    """Prometheus metrics of one simulated engine, in its own registry."""

    def __init__(
        self,
        engine: Engine,
        model_name: str,
        engine_index: str = "0",
        lora_enabled: bool = False,
        legacy_names: bool = False,
        histogram_max_age_s: float = 0.0,
    ) -> None:
        self.engine = engine
        self.model_name = model_name
        self.engine_index = engine_index
        self.lora_enabled = lora_enabled
        self.legacy_names = legacy_names
        self.registry = CollectorRegistry(auto_describe=False)
        """The histograms."""
        self._live = CollectorRegistry(auto_describe=False)
        """Gauges and counters read from the engine at scrape time."""
        self.histogram_max_age_s = histogram_max_age_s
        self._histogram_text = b""
        self._histogram_at = -math.inf
        self._last_token_time: dict[str, float] = {}
        labels = (engine_index, model_name)

        def histogram(name: str, doc: str, buckets: Iterable[float]) -> HistogramSeries:
            h = Histogram(name, doc, _LABELS, buckets=tuple(buckets), registry=self.registry)
            return h.labels(*labels)

        self.ttft = histogram(
            "vllm:time_to_first_token_seconds",
            "Histogram of time to first token in seconds.",
            _TTFT_BUCKETS,
        )
        self.itl = histogram(
            "vllm:inter_token_latency_seconds",
            "Histogram of inter-token latency in seconds.",
            _ITL_BUCKETS,
        )
        self.tpot = histogram(
            "vllm:request_time_per_output_token_seconds",
            "Histogram of time_per_output_token_seconds per request.",
            _ITL_BUCKETS,
        )
        self.e2e = histogram(
            "vllm:e2e_request_latency_seconds",
            "Histogram of e2e request latency in seconds.",
            _REQUEST_TIME_BUCKETS,
        )
        self.queue_time = histogram(
            "vllm:request_queue_time_seconds",
            "Histogram of time spent in WAITING phase for request.",
            _REQUEST_TIME_BUCKETS,
        )
        self.inference_time = histogram(
            "vllm:request_inference_time_seconds",
            "Histogram of time spent in RUNNING phase for request.",
            _REQUEST_TIME_BUCKETS,
        )
        self.prefill_time = histogram(
            "vllm:request_prefill_time_seconds",
            "Histogram of time spent in PREFILL phase for request.",
            _REQUEST_TIME_BUCKETS,
        )
        self.decode_time = histogram(
            "vllm:request_decode_time_seconds",
            "Histogram of time spent in DECODE phase for request.",
            _REQUEST_TIME_BUCKETS,
        )
        self.prompt_tokens = histogram(
            "vllm:request_prompt_tokens", "Number of prefill tokens processed.", _TOKEN_BUCKETS
        )
        self.generation_tokens = histogram(
            "vllm:request_generation_tokens",
            "Number of generation tokens processed.",
            _TOKEN_BUCKETS,
        )
        self.iteration_tokens = histogram(
            "vllm:iteration_tokens_total",
            "Histogram of number of tokens per engine_step.",
            _ITERATION_BUCKETS,
        )
        self.max_generation_tokens = histogram(
            "vllm:request_max_num_generation_tokens",
            "Histogram of maximum number of requested generation tokens.",
            _TOKEN_BUCKETS,
        )
        self.params_n = histogram(
            "vllm:request_params_n", "Histogram of the n request parameter.", _N_BUCKETS
        )
        self.params_max_tokens = histogram(
            "vllm:request_params_max_tokens",
            "Histogram of the max_tokens request parameter.",
            _TOKEN_BUCKETS,
        )
        self.num_preemptions = histogram(
            "vllm:request_num_preemptions",
            "Histogram of the number of times a request was preempted.",
            _PREEMPTION_BUCKETS,
        )
        self.prefill_kv_computed = histogram(
            "vllm:request_prefill_kv_computed_tokens",
            "Histogram of new KV tokens computed during prefill (excluding cached tokens).",
            _TOKEN_BUCKETS,
        )
        self._live.register(_EngineStateCollector(self))

    def observe_step(self, result: StepResult) -> None:
        """Record one engine iteration's tokens and per-token latencies."""
        if result.batched_tokens:
            self.iteration_tokens.observe(result.batched_tokens)
        last = self._last_token_time
        for seq in result.emitted:
            if seq.status is SeqStatus.ABORTED:
                # Aborted while its step ran (the client left): already forgotten.
                continue
            previous = last.get(seq.request_id)
            if previous is not None:
                self.itl.observe(seq.last_token_time - previous)
            else:
                self.ttft.observe(seq.first_token_time - seq.arrival)
            last[seq.request_id] = seq.last_token_time
        for seq in result.finished:
            self.observe_finished(seq)

    def observe_finished(self, seq: Sequence, max_tokens: int | None = None) -> None:
        """Record a request that finished (normally or not) at ``seq.finish_time``."""
        self._last_token_time.pop(seq.request_id, None)
        if seq.first_token_time < 0:
            return
        scheduled = seq.first_scheduled
        self.e2e.observe(seq.finish_time - seq.arrival)
        self.queue_time.observe(scheduled - seq.arrival)
        self.inference_time.observe(seq.finish_time - scheduled)
        self.prefill_time.observe(seq.first_token_time - scheduled)
        decode = seq.finish_time - seq.first_token_time
        self.decode_time.observe(decode)
        if seq.num_output > 1:
            self.tpot.observe(decode / (seq.num_output - 1))
        self.prompt_tokens.observe(seq.prompt_tokens)
        self.generation_tokens.observe(seq.num_output)
        self.max_generation_tokens.observe(seq.max_output_tokens)
        self.params_max_tokens.observe(max_tokens or seq.max_output_tokens)
        self.params_n.observe(1)
        self.num_preemptions.observe(seq.num_preemptions)
        self.prefill_kv_computed.observe(seq.prompt_tokens - max(0, seq.num_cached_prompt_tokens))

    def forget(self, request_id: str) -> None:
        """Drop per-request state of an aborted request."""
        self._last_token_time.pop(request_id, None)

    def render(self) -> bytes:
        """The Prometheus text exposition of every metric (histograms at most
        ``histogram_max_age_s`` wall seconds old)."""
        now = time.monotonic()
        if now - self._histogram_at >= self.histogram_max_age_s:
            self._histogram_text = generate_latest(self.registry)
            self._histogram_at = now
        return generate_latest(self._live) + self._histogram_text


class _EngineStateCollector(Collector):
    """Gauges and counters read from the engine at scrape time."""

    def __init__(self, metrics: EngineMetrics) -> None:
        self._m = metrics
        self._created = time.time()

    def collect(self) -> Iterator[Metric]:
        m = self._m
        engine = m.engine
        c = engine.counters
        labels = [m.engine_index, m.model_name]
        names = list(_LABELS)

        def gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
            g = GaugeMetricFamily(name, doc, labels=names)
            g.add_metric(labels, value)
            return g

        def counter(name: str, doc: str, value: float) -> CounterMetricFamily:
            f = CounterMetricFamily(name, doc, labels=names)
            f.add_metric(labels, value, created=self._created)
            return f

        yield gauge(
            "vllm:num_requests_running",
            "Number of requests in model execution batches.",
            len(engine.running),
        )
        yield gauge(
            "vllm:num_requests_waiting",
            "Number of requests waiting to be processed.",
            len(engine.waiting),
        )
        by_reason = GaugeMetricFamily(
            "vllm:num_requests_waiting_by_reason",
            "Number of waiting requests by reason.",
            labels=[*names, "reason"],
        )
        deferred = min(engine.num_deferred, len(engine.waiting))
        by_reason.add_metric([*labels, "capacity"], len(engine.waiting) - deferred)
        by_reason.add_metric([*labels, "deferred"], deferred)
        yield by_reason
        sleep = GaugeMetricFamily(
            "vllm:engine_sleep_state", "Engine sleep state.", labels=[*names, "sleep_state"]
        )
        for state, value in (("awake", 1), ("weights_offloaded", 0), ("discard_all", 0)):
            sleep.add_metric([*labels, state], value)
        yield sleep
        usage = engine.pool.usage
        yield gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", usage)
        if m.legacy_names:
            yield gauge(
                "vllm:gpu_cache_usage_perc", "GPU KV-cache usage. 1 means 100 percent usage.", usage
            )
        yield counter(
            "vllm:prefix_cache_queries",
            "Prefix cache queries, in terms of number of queried tokens.",
            c.prefix_cache_queries,
        )
        yield counter(
            "vllm:prefix_cache_hits",
            "Prefix cache hits, in terms of number of cached tokens.",
            c.prefix_cache_hits,
        )
        yield counter(
            "vllm:num_preemptions",
            "Cumulative number of preemption from the engine.",
            c.preemptions,
        )
        yield counter("vllm:prompt_tokens", "Number of prefill tokens processed.", c.prompt_tokens)
        by_source = CounterMetricFamily(
            "vllm:prompt_tokens_by_source",
            "Number of prompt tokens by source.",
            labels=[*names, "source"],
        )
        by_source.add_metric(
            [*labels, "local_compute"], c.prompt_tokens_computed, created=self._created
        )
        by_source.add_metric(
            [*labels, "local_cache_hit"], c.prompt_tokens_cached, created=self._created
        )
        by_source.add_metric([*labels, "external_kv_transfer"], 0, created=self._created)
        yield by_source
        yield counter(
            "vllm:prompt_tokens_cached",
            "Number of cached prompt tokens (local + external).",
            c.prompt_tokens_cached,
        )
        yield counter(
            "vllm:generation_tokens", "Number of generation tokens processed.", c.generation_tokens
        )
        success = CounterMetricFamily(
            "vllm:request_success",
            "Count of successfully processed requests.",
            labels=["engine", "finished_reason", "model_name"],
        )
        for reason in _FINISH_REASONS:
            success.add_metric(
                [m.engine_index, reason, m.model_name],
                c.finished_by_reason.get(reason, 0),
                created=self._created,
            )
        yield success
        yield self._cache_config_info()
        if m.lora_enabled:
            yield self._lora_requests_info()

    def _cache_config_info(self) -> GaugeMetricFamily:
        p = self._m.engine.profile
        block_size = str(p.block_size)
        # Every CacheConfig field vLLM 0.32 exports, with vLLM's defaults where the
        # simulator has no counterpart (reference scrape: vllm-0.32-metrics.txt).
        info = {
            "_block_size_resolved": "True",
            "block_size": block_size,
            "cache_dtype": "auto",
            "cache_hit_alignment_tokens": "None",
            "effective_attention_block_size": block_size,
            "enable_mamba_shared_prefix_checkpoint": "False",
            "enable_prefix_caching": str(self._m.engine.enable_prefix_caching),
            "engine": self._m.engine_index,
            "gpu_memory_utilization": str(p.gpu_memory_utilization),
            "hash_block_size": "None",
            "is_attention_free": "False",
            "kv_cache_dtype_skip_layers": "[]",
            "kv_cache_layout": "None",
            "kv_cache_max_concurrency": str(round(p.kv_capacity_tokens / p.max_model_len, 2)),
            "kv_cache_memory_bytes": str(p.kv_capacity_tokens * p.kv_bytes_per_token),
            "kv_cache_size_tokens": str(p.kv_capacity_tokens),
            "kv_offloading_backend": "native",
            "kv_offloading_size": "None",
            "kv_sharing_fast_prefill": "False",
            "mamba_block_size": "None",
            "mamba_cache_dtype": "auto",
            "mamba_cache_mode": "none",
            "mamba_page_size_padded": "None",
            "mamba_ssm_cache_dtype": "float32",
            "num_cpu_blocks": "None",
            "num_gpu_blocks": str(p.num_gpu_blocks),
            "num_gpu_blocks_override": "None",
            "prefix_cache_retention_interval": "0",
            "prefix_caching_hash_algo": "xxhash",
            "prefix_match_unit": "None",
            "replayssm_buffer_len": "16",
            "skip_page_size_padded": "None",
            "sliding_window": "None",
            "swa_bounded_replay": "True",
            "use_kda_recoverssm": "False",
            "use_replayssm": "False",
            "user_specified_block_size": "False",
        }
        g = GaugeMetricFamily(
            "vllm:cache_config_info", "Information of the LLMEngine CacheConfig", labels=list(info)
        )
        g.add_metric(list(info.values()), 1.0)
        return g

    def _lora_requests_info(self) -> GaugeMetricFamily:
        engine = self._m.engine
        g = GaugeMetricFamily(
            "vllm:lora_requests_info",
            "Running stats on lora requests.",
            labels=["max_lora", "running_lora_adapters", "waiting_lora_adapters"],
        )
        g.add_metric(
            [
                str(engine.profile.max_loras),
                ",".join(engine.running_loras()),
                ",".join(engine.waiting_loras()),
            ],
            time.time(),
        )
        return g
