"""The runtime builds the pools' tokenizers from the configuration: errors before anything
starts, reloads that keep unchanged tokenizers, metrics, and a chat request routed on the
model's own token ids end to end through the director."""

from __future__ import annotations

import asyncio
import logging
import threading
from pathlib import Path
from typing import Any

import orjson
import pytest
from prometheus_client import generate_latest

from sluicegate.api.loader import Config, ConfigError, build_config
from sluicegate.requestcontrol.parse import parse_request
from sluicegate.runtime import Runtime
from sluicegate.scheduling.config import load_preset
from sluicegate.tokenization.local import LocalTokenizer
from sluicegate.tokenization.remote import ServerTokenizer


def config(tokenizer: dict[str, Any]) -> Config:
    """One pool with KV events and ``tokenizer``, scheduled by the precise-prefix preset."""
    built = build_config(documents(tokenizer))
    built.picker = load_preset("precise-prefix")
    return built


def documents(tokenizer: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        {
            "apiVersion": "inference.networking.k8s.io/v1",
            "kind": "InferencePool",
            "metadata": {"name": "p"},
            "spec": {
                "endpoints": [{"address": "127.0.0.1:9"}],
                "kvEvents": {"port": 5557},
                "tokenizer": tokenizer,
            },
        }
    ]


def test_a_bad_tokenizer_fails_the_configuration(tmp_path: Path) -> None:
    cfg = config({"source": "local", "path": str(tmp_path / "none")})
    with pytest.raises(ConfigError, match=r"InferencePool p: spec\.tokenizer"):
        Runtime(cfg)


async def test_reloads_keep_or_swap_tokenizers(tiny_dir: Path, tmp_path: Path) -> None:
    runtime = Runtime(config({"source": "local", "path": str(tiny_dir)}))
    first = runtime.tokenizers.service.pools["p"]
    assert isinstance(first, LocalTokenizer)
    runtime.apply_config(config({"source": "local", "path": str(tiny_dir)}))
    assert runtime.tokenizers.service.pools["p"] is first
    bad = config({"source": "local", "path": str(tmp_path / "none")})
    with pytest.raises(ConfigError):
        runtime.apply_config(bad)
    assert runtime.tokenizers.service.pools["p"] is first  # nothing changed
    runtime.apply_config(config({"source": "server"}))
    assert isinstance(runtime.tokenizers.service.pools["p"], ServerTokenizer)
    assert runtime.built.fetchers  # the producer now prefetches /tokenize
    runtime.apply_config(config({}))
    assert runtime.tokenizers.service.pools == {}
    assert not runtime.built.fetchers
    await runtime.stop()


async def test_a_chat_request_is_tokenized_and_counted(tiny_dir: Path) -> None:
    runtime = Runtime(config({"source": "local", "path": str(tiny_dir)}))
    body = {"model": "m", "messages": [{"role": "user", "content": "Kalo mine ru sa " * 100}]}
    parsed = parse_request("chat", orjson.dumps(body), {})
    admitted = runtime.director.admit(parsed, "r1")
    assert admitted.request.kind == "chat"
    assert admitted.request.body is parsed.body
    tok = runtime.tokenizers.service.pools["p"]
    assert tok.token_ids(admitted.request) is not None
    text = generate_latest(runtime.metrics.registry).decode()
    assert (
        'sluicegate_tokenizer_requests_total{pool="p",result="tokenized",source="local"} 1.0'
        in text
    )
    assert 'sluicegate_tokenizer_cache_lookups_total{pool="p",result="miss"} 1.0' in text
    await runtime.stop()


async def test_the_prefetch_pass_runs_only_for_requests_that_fetch(tiny_dir: Path) -> None:
    runtime = Runtime(config({"source": "local", "path": str(tiny_dir)}))
    assert runtime.built.fetchers  # long prompts are tokenized in the prefetch
    tok = runtime.tokenizers.service.pools["p"]
    small = {"model": "m", "messages": [{"role": "user", "content": "Kalo mine ru sa " * 10}]}
    admitted = runtime.director.admit(parse_request("chat", orjson.dumps(small), {}), "r1")
    assert await runtime.director.prefetch(admitted) is None  # nothing runs twice
    assert tok.counters.tokenized == 0
    large = {"model": "m", "messages": [{"role": "user", "content": "Kalo mine ru sa " * 1000}]}
    admitted = runtime.director.admit(parse_request("chat", orjson.dumps(large), {}), "r2")
    assert await runtime.director.prefetch(admitted) is not None
    await runtime.stop()


async def test_a_dropped_tokenizer_is_closed_and_a_failure_logged(
    tiny_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    runtime = Runtime(config({"source": "server"}))
    old = runtime.tokenizers.service.pools["p"]
    closed: list[bool] = []

    async def failing_close() -> None:
        closed.append(True)
        raise OSError("socket already gone")

    old.close = failing_close  # type: ignore[method-assign]
    runtime.apply_config(config({"source": "local", "path": str(tiny_dir)}))
    assert len(runtime.tokenizers._closing) == 1  # held until it finishes
    with caplog.at_level(logging.WARNING, logger="sluicegate.runtime.tokenization"):
        await asyncio.wait(set(runtime.tokenizers._closing))
        await asyncio.sleep(0)  # the done callback
    assert closed == [True]
    assert not runtime.tokenizers._closing
    assert "closing a replaced tokenizer failed: socket already gone" in caplog.text
    await runtime.stop()


async def test_a_reload_loads_tokenizers_in_a_worker_thread(tiny_dir: Path) -> None:
    runtime = Runtime(config({}))
    host = runtime.tokenizers
    prepare = host.prepare
    threads: list[int] = []

    def spy(cfg: Config) -> dict[str, Any]:
        threads.append(threading.get_ident())
        return prepare(cfg)

    host.prepare = spy  # type: ignore[method-assign]
    await runtime.reload(config({"source": "local", "path": str(tiny_dir)}))
    assert threads
    assert threading.get_ident() not in threads
    assert isinstance(host.service.pools["p"], LocalTokenizer)  # applied
    assert runtime.built.fetchers
    await runtime.stop()
