"""``source: server`` against the simulator's ``/tokenize`` (vLLM's request shape): the ids
are the ones the server computes for that chat or completion."""

from __future__ import annotations

from array import array
from typing import Any

from sluicegate.api.tokenizer import TokenizerSettings
from sluicegate.datalayer.endpoint import Endpoint
from sluicegate.framework import LLMRequest
from sluicegate.sim.text import render_chat
from sluicegate.tokenization.remote import ServerTokenizer
from sluicegate.tokens import token_id_array


def request(kind: str, body: dict[str, Any]) -> LLMRequest:
    return LLMRequest("r", "tiny", "tiny", b"", 0, 0.0, kind=kind, body=body)


async def test_ids_come_from_the_servers_tokenize(sim_cluster: Any) -> None:
    cluster = await sim_cluster(replicas=1)
    replica = cluster.replicas[0]
    host, port = replica.url.removeprefix("http://").rsplit(":", 1)
    endpoints = [Endpoint("sim-0", host, int(port))]
    tok = ServerTokenizer(TokenizerSettings(source="server", timeout=2.0))
    try:
        messages = [{"role": "user", "content": "Kalo mine ru sa, how are you?"}]
        chat = await tok.fetch(request("chat", {"model": "tiny", "messages": messages}), endpoints)
        assert chat == token_id_array(render_chat(messages))
        prompt = "Once upon a time"
        completion = await tok.fetch(request("completions", {"prompt": prompt}), endpoints)
        assert completion == token_id_array(prompt.encode())
        given = await tok.fetch(request("completions", {"prompt": [[7, 8, 9]]}), endpoints)
        assert given == array("I", [7, 8, 9])  # no call needed
        assert tok.counters.tokenized == 3
        await cluster.replicas[0].stop()
        assert await tok.fetch(request("completions", {"prompt": prompt}), endpoints) is None
        assert tok.counters.fallbacks["error"] + tok.counters.fallbacks["timeout"] == 1
    finally:
        await tok.close()
