"""The mock pool of the throughput runs: nginx answering as four idle vLLM replicas.

A router's requests/s is only its own when the replicas behind it cost next to nothing:
one nginx process (core ``OTHER_CPU``, foreground, configuration in the work folder)
answers every ``/v1/completions`` with ``return 200`` of a fixed body — a completion JSON
on the ``json`` replicas, a stream of ``MAX_TOKENS`` SSE events + ``[DONE]`` (one write)
on the ``sse`` replicas — and serves a static ``/metrics`` (the lines of a real vLLM 0.32
scrape a gateway reads), ``/v1/models``, ``/version`` and ``/health``.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import orjson

from sluicegate.bench.gateway.settings import MAX_TOKENS, MODEL, OTHER_CPU, SIM_REPLICAS
from sluicegate.bench.processes import Processes, free_port_block, wait_ready

MOCK_METRICS = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="tiny-llama"} 0.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="tiny-llama"} 0.0
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="tiny-llama"} 0.0
# HELP vllm:prefix_cache_queries_total Prefix cache queries, in terms of number of queried tokens.
# TYPE vllm:prefix_cache_queries_total counter
vllm:prefix_cache_queries_total{engine="0",model_name="tiny-llama"} 0.0
# HELP vllm:prefix_cache_hits_total Prefix cache hits, in terms of number of cached tokens.
# TYPE vllm:prefix_cache_hits_total counter
vllm:prefix_cache_hits_total{engine="0",model_name="tiny-llama"} 0.0
# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="16",cache_dtype="auto",enable_prefix_caching="True",\
engine="0",gpu_memory_utilization="0.92",num_gpu_blocks="8192"} 1.0
"""
"""What a mock replica's ``/metrics`` says: an idle vLLM 0.32 server (the lines the gateway
reads, copied from a real scrape)."""


def _mock_completion() -> bytes:
    return orjson.dumps(
        {
            "id": "cmpl-mock",
            "object": "text_completion",
            "created": 1_700_000_000,
            "model": MODEL,
            "choices": [
                {
                    "index": 0,
                    "text": " the quick brown fox jumps over the lazy dog again and again",
                    "logprobs": None,
                    "finish_reason": "length",
                    "stop_reason": None,
                }
            ],
            "usage": {"prompt_tokens": 256, "total_tokens": 272, "completion_tokens": 16},
        }
    )


def _mock_stream() -> bytes:
    words = "the quick brown fox jumps over the lazy dog and then it runs far away home".split()
    events = []
    for i, word in enumerate(words[:MAX_TOKENS]):
        chunk = {
            "id": "cmpl-mock",
            "object": "text_completion",
            "created": 1_700_000_000,
            "model": MODEL,
            "choices": [
                {
                    "index": 0,
                    "text": " " + word,
                    "logprobs": None,
                    "finish_reason": "length" if i == MAX_TOKENS - 1 else None,
                    "stop_reason": None,
                }
            ],
        }
        events.append(b"data: " + orjson.dumps(chunk) + b"\n\n")
    return b"".join(events) + b"data: [DONE]\n\n"


def _nginx_string(data: bytes) -> str:
    """``data`` as a single-quoted nginx string (no variables: ``$`` is not allowed)."""
    text = data.decode()
    if "$" in text:
        raise ValueError("nginx strings cannot hold '$' here")
    escaped = text.replace("\\", "\\\\").replace("'", "\\'").replace("\n", "\\n")
    return f"'{escaped}'"


def nginx_config(workdir: Path, json_ports: Sequence[int], sse_ports: Sequence[int]) -> str:
    """An nginx configuration of mock vLLM replicas on 127.0.0.1: ``json_ports`` answer
    completions with one JSON body, ``sse_ports`` with one SSE stream; all serve static
    ``/metrics``, ``/v1/models`` and ``/health``. One process, in the foreground."""
    models = orjson.dumps(
        {
            "object": "list",
            "data": [
                {
                    "id": MODEL,
                    "object": "model",
                    "created": 1_700_000_000,
                    "owned_by": "vllm",
                    "root": MODEL,
                    "parent": None,
                    "max_model_len": 4096,
                }
            ],
        }
    )
    common = f"""
        location = /metrics {{
            default_type "text/plain; version=0.0.4; charset=utf-8";
            return 200 {_nginx_string(MOCK_METRICS.encode())};
        }}
        location = /v1/models {{
            default_type application/json;
            return 200 {_nginx_string(models)};
        }}
        location = /health {{ return 200; }}
        location = /version {{
            default_type application/json;
            return 200 '{{"version": "0.32.0"}}';
        }}
        location / {{ return 404; }}
"""

    def server(port: int, body: bytes, content_type: str) -> str:
        return f"""
    server {{
        listen 127.0.0.1:{port} reuseport backlog=4096;
        location = /v1/completions {{
            default_type {content_type};
            return 200 {_nginx_string(body)};
        }}
        {common}
    }}"""

    servers = [server(p, _mock_completion(), "application/json") for p in json_ports]
    servers += [server(p, _mock_stream(), "text/event-stream") for p in sse_ports]
    tmp = workdir / "nginx-tmp"
    tmp.mkdir(exist_ok=True)
    return f"""
daemon off;
master_process off;
worker_processes 1;
pid {workdir}/nginx.pid;
error_log {workdir}/nginx-error.log warn;
events {{
    worker_connections 8192;
    multi_accept on;
}}
http {{
    access_log off;
    server_tokens off;
    keepalive_requests 10000000;
    keepalive_timeout 300s;
    client_body_buffer_size 64k;
    client_max_body_size 16m;
    client_body_temp_path {tmp}/body;
    proxy_temp_path {tmp}/proxy;
    fastcgi_temp_path {tmp}/fastcgi;
    uwsgi_temp_path {tmp}/uwsgi;
    scgi_temp_path {tmp}/scgi;
    {"".join(servers)}
}}
"""


@dataclass(frozen=True, slots=True)
class MockPool:
    """Mock replicas: base URLs answering JSON, and ones answering SSE."""

    json_urls: tuple[str, ...]
    sse_urls: tuple[str, ...]


def start_mock(procs: Processes, workdir: Path) -> MockPool:
    """Start nginx (core ``OTHER_CPU``) with ``SIM_REPLICAS`` JSON and SSE replicas each."""
    nginx = shutil.which("nginx") or "/usr/sbin/nginx"
    if not os.path.exists(nginx):
        raise RuntimeError("nginx is not installed (scripts/bench-setup installs it)")
    base = free_port_block(2 * SIM_REPLICAS)
    json_ports = list(range(base, base + SIM_REPLICAS))
    sse_ports = list(range(base + SIM_REPLICAS, base + 2 * SIM_REPLICAS))
    conf = workdir / "nginx.conf"
    conf.write_text(nginx_config(workdir, json_ports, sse_ports))
    cmd = [nginx, "-p", str(workdir), "-e", str(workdir / "nginx-error.log"), "-c", str(conf)]
    procs.start("nginx", cmd, OTHER_CPU)
    pool = MockPool(
        tuple(f"http://127.0.0.1:{p}" for p in json_ports),
        tuple(f"http://127.0.0.1:{p}" for p in sse_ports),
    )
    for url in (*pool.json_urls, *pool.sse_urls):
        wait_ready(procs, "nginx", f"{url}/health", 10.0)
    return pool
