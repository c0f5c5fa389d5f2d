"""Reading model servers' Prometheus metrics into :class:`EngineMetrics`.

Each engine type names the same few facts differently (as GIE maps them:
https://github.com/kubernetes-sigs/gateway-api-inference-extension/blob/1748e829/pkg/epp/framework/plugins/datalayer/extractor/metrics/factories.go).
A scrape is a few hundred lines, mostly histogram buckets the gateway does not read, and
it is parsed up to 20 times a second per endpoint; so the lines of the wanted metrics are
found with substring searches (``str.find`` runs in C), and each distinct series (name
and label set) goes through prometheus-client's parser (which handles label quoting and
escaping correctly) once: its labels are cached, and only the value is read on later
scrapes.

Data-parallel servers report one series per engine rank: waiting and running are summed,
KV usage is the highest rank's (the one that decides admission).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

from sluicegate.datalayer.endpoint import EngineMetrics


@dataclass(frozen=True, slots=True)
class MetricNames:
    """Where one engine type reports each fact. Lists are tried in order."""

    waiting: tuple[str, ...]
    running: tuple[str, ...]
    kv_usage: tuple[str, ...]
    lora_info: str | None = None
    cache_info: str | None = None
    cache_block_label: str = "block_size"
    cache_blocks_label: str = "num_gpu_blocks"
    block_size_gauge: str | None = None
    num_blocks_gauge: str | None = None
    block_size_label_filter: tuple[str, str] | None = None
    num_blocks_label_filter: tuple[str, str] | None = None
    prefix_queries: tuple[str, ...] = ()
    prefix_hits: tuple[str, ...] = ()
    generation_tokens: tuple[str, ...] = ()
    """The running total of generated tokens, to tell a frozen ``/metrics`` from an idle
    server (``EngineMetrics.generation_tokens``)."""
    waiting_label_filter: tuple[str, str] | None = None
    running_label_filter: tuple[str, str] | None = None
    kv_label_filter: tuple[str, str] | None = None


ENGINES: dict[str, MetricNames] = {
    "vllm": MetricNames(
        waiting=("vllm:num_requests_waiting",),
        running=("vllm:num_requests_running",),
        # vLLM renamed gpu_cache_usage_perc in 0.9; read the new name, fall back to the old.
        kv_usage=("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
        lora_info="vllm:lora_requests_info",
        cache_info="vllm:cache_config_info",
        prefix_queries=("vllm:prefix_cache_queries_total", "vllm:gpu_prefix_cache_queries_total"),
        prefix_hits=("vllm:prefix_cache_hits_total", "vllm:gpu_prefix_cache_hits_total"),
        generation_tokens=("vllm:generation_tokens_total",),
    ),
    "sglang": MetricNames(
        waiting=("sglang:num_queue_reqs",),
        running=("sglang:num_running_reqs",),
        kv_usage=("sglang:token_usage",),
        cache_info="sglang:cache_config_info",
        cache_block_label="page_size",
        cache_blocks_label="num_pages",
        generation_tokens=("sglang:generation_tokens_total",),
    ),
    "trtllm-serve": MetricNames(
        waiting=("trtllm_num_requests_waiting",),
        running=("trtllm_num_requests_running",),
        kv_usage=("trtllm_kv_cache_utilization",),
        block_size_gauge="trtllm_kv_cache_tokens_per_block",
        num_blocks_gauge="trtllm_kv_cache_max_blocks",
    ),
    "triton-tensorrt-llm": MetricNames(
        waiting=("nv_trt_llm_request_metrics",),
        running=("nv_trt_llm_request_metrics",),
        kv_usage=("nv_trt_llm_kv_cache_block_metrics",),
        waiting_label_filter=("request_type", "waiting"),
        running_label_filter=("request_type", "scheduled"),
        kv_label_filter=("kv_cache_block_type", "fraction"),
        block_size_gauge="nv_trt_llm_kv_cache_block_metrics",
        num_blocks_gauge="nv_trt_llm_kv_cache_block_metrics",
        block_size_label_filter=("kv_cache_block_type", "tokens_per"),
        num_blocks_label_filter=("kv_cache_block_type", "max"),
    ),
}


class MetricsParseError(ValueError):
    """The scrape is not valid exposition text, has none of the metrics the engine type
    should report, or reports load as NaN or infinity."""


class MetricsParser:
    """Parses one engine type's scrapes."""

    __slots__ = ("_load", "_names", "_needles", "_series", "_wanted", "engine_type")

    MAX_CACHED_SERIES = 1024
    """Distinct series whose parsed labels are kept (the cache restarts when full)."""

    def __init__(self, engine_type: str) -> None:
        self.engine_type = engine_type
        try:
            self._names = ENGINES[engine_type]
        except KeyError:
            known = ", ".join(sorted(ENGINES))
            raise ValueError(f"unknown engine type {engine_type!r}; known: {known}") from None
        n = self._names
        wanted = {
            *n.waiting,
            *n.running,
            *n.kv_usage,
            *n.prefix_queries,
            *n.prefix_hits,
            *n.generation_tokens,
        }
        for single in (n.lora_info, n.cache_info, n.block_size_gauge, n.num_blocks_gauge):
            if single:
                wanted.add(single)
        self._wanted = frozenset(wanted)
        self._needles = tuple(("\n" + name, len(name) + 1) for name in sorted(wanted))
        self._load = frozenset({*n.waiting, *n.running, *n.kv_usage})
        self._series: dict[str, tuple[str, dict[str, str]]] = {}
        """Parsed (name, labels) by the line's text up to its value."""

    def parse(self, text: str, scraped_at: float) -> EngineMetrics:
        """The facts in ``text`` (Prometheus exposition) stamped with ``scraped_at`` (s)."""
        n = self._names
        samples = self._samples(text)
        if not any(name in samples for name in (*n.waiting, *n.running, *n.kv_usage)):
            raise MetricsParseError("none of the expected engine metrics are present")
        waiting = _sum(samples, n.waiting, n.waiting_label_filter)
        running = _sum(samples, n.running, n.running_label_filter)
        kv = _max(samples, n.kv_usage, n.kv_label_filter)
        block_size, num_blocks = self._cache(samples)
        running_loras, waiting_loras, max_loras = self._loras(samples)
        return EngineMetrics(
            scraped_at=scraped_at,
            waiting=max(0, int(waiting)),
            running=max(0, int(running)),
            kv_usage=min(1.0, max(0.0, kv)),
            running_loras=running_loras,
            waiting_loras=waiting_loras,
            max_loras=max_loras,
            block_size=block_size,
            num_gpu_blocks=num_blocks,
            prefix_cache_queries=_sum(samples, n.prefix_queries, None),
            prefix_cache_hits=_sum(samples, n.prefix_hits, None),
            generation_tokens=(
                _sum(samples, n.generation_tokens, None)
                if any(name in samples for name in n.generation_tokens)
                else None
            ),
        )

    def _samples(self, text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
        out: dict[str, list[tuple[dict[str, str], float]]] = {}
        for line in self._lines(text):
            key, value = _split_sample(line)
            series = self._series.get(key)
            if series is None:
                series = self._parse_series(key)
            name, labels = series
            if name not in self._wanted:
                continue
            try:
                number = float(value)
            except ValueError:
                raise MetricsParseError(f"malformed exposition text: {line[:200]!r}") from None
            if not math.isfinite(number):
                # A load gauge we cannot read must not pass for an idle server.
                if name in self._load:
                    raise MetricsParseError(f"{name} is {number}")
                continue
            out.setdefault(name, []).append((labels, number))
        return out

    def _lines(self, text: str) -> list[str]:
        """The sample lines of the wanted metrics: the name, then labels or the value."""
        text = "\n" + text
        out = []
        for needle, skip in self._needles:
            start = text.find(needle)
            while start >= 0:
                end = text.find("\n", start + 1)
                if end < 0:
                    end = len(text)
                if text[start + skip : start + skip + 1] in ("{", " ", "\t"):
                    out.append(text[start + 1 : end].rstrip("\r"))
                start = text.find(needle, end)
        return out

    def _parse_series(self, key: str) -> tuple[str, dict[str, str]]:
        """Name and labels of the series ``key`` (a sample line up to its value)."""
        try:
            families = list(text_string_to_metric_families(key + " 0\n"))
        except ValueError as exc:
            raise MetricsParseError(f"malformed exposition text: {exc}") from None
        if len(families) != 1 or len(families[0].samples) != 1:
            raise MetricsParseError(f"malformed exposition text: {key[:200]!r}")
        sample = families[0].samples[0]
        if len(self._series) >= self.MAX_CACHED_SERIES:
            self._series.clear()
        series = self._series[key] = (sample.name, sample.labels)
        return series

    def _cache(
        self, samples: dict[str, list[tuple[dict[str, str], float]]]
    ) -> tuple[int | None, int | None]:
        n = self._names
        if n.cache_info and n.cache_info in samples:
            labels = samples[n.cache_info][0][0]
            return (
                _int_label(labels, n.cache_block_label),
                _int_label(labels, n.cache_blocks_label),
            )
        block = _matching(samples.get(n.block_size_gauge or "", ()), n.block_size_label_filter)
        blocks = _matching(samples.get(n.num_blocks_gauge or "", ()), n.num_blocks_label_filter)
        return (int(block[0]) if block else None, int(blocks[0]) if blocks else None)

    def _loras(
        self, samples: dict[str, list[tuple[dict[str, str], float]]]
    ) -> tuple[frozenset[str], frozenset[str], int]:
        n = self._names
        series = samples.get(n.lora_info or "")
        if not series:
            return frozenset(), frozenset(), 0
        # The value is the update time; the newest series is current.
        labels, _ = max(series, key=lambda s: s[1])
        max_loras = _int_label(labels, "max_lora") or 0
        return (
            _names(labels.get("running_lora_adapters", "")),
            _names(labels.get("waiting_lora_adapters", "")),
            max_loras,
        )


def _split_sample(line: str) -> tuple[str, str]:
    """``name{labels} value [timestamp]`` → (``name{labels}``, ``value``). The value and
    timestamp hold no ``}``, so the last one closes the label set."""
    close = line.rfind("}")
    if close >= 0:
        key, rest = line[: close + 1], line[close + 1 :]
    else:
        key, _, rest = line.partition(" ")
    fields = rest.split()
    if not 1 <= len(fields) <= 2 or (len(fields) == 2 and not _is_number(fields[1])):
        raise MetricsParseError(f"malformed exposition text: {line[:200]!r}")
    return key.rstrip(), fields[0]


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _matching(
    series: Iterable[tuple[dict[str, str], float]], label_filter: tuple[str, str] | None
) -> list[float]:
    if label_filter is None:
        return [v for _, v in series]
    key, value = label_filter
    return [v for labels, v in series if labels.get(key) == value]


def _sum(
    samples: dict[str, list[tuple[dict[str, str], float]]],
    names: tuple[str, ...],
    label_filter: tuple[str, str] | None,
) -> float:
    for name in names:
        if name in samples:
            return float(sum(_matching(samples[name], label_filter)))
    return 0.0


def _max(
    samples: dict[str, list[tuple[dict[str, str], float]]],
    names: tuple[str, ...],
    label_filter: tuple[str, str] | None,
) -> float:
    for name in names:
        if name in samples:
            values = _matching(samples[name], label_filter)
            if values:
                return float(max(values))
    return 0.0


def _int_label(labels: dict[str, str], key: str) -> int | None:
    raw = labels.get(key)
    if raw is None:
        return None
    try:
        return int(float(raw))
    except ValueError:
        return None


def _names(joined: str) -> frozenset[str]:
    return frozenset(name.strip() for name in joined.split(",") if name.strip())
