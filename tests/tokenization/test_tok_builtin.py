"""The built-in tokenizer on the request path gives the ids the simulator computes: a chat
request's messages rendered with the simulator's template (not the serialised messages
the approximate producer hashes), a completion's prompt bytes as they are."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from sluicegate.framework import LLMRequest
from sluicegate.requestcontrol.parse import RequestKind, parse_request
from sluicegate.sim.api import parse_generate
from sluicegate.tokenization.builtin import builtin_token_ids
from sluicegate.tokens import token_id_array, token_ids

CHAT: dict[str, Any] = {
    "model": "tiny",
    "messages": [
        {"role": "system", "content": "You are terse. Réponds en français si on te parle ainsi."},
        {
            "role": "user",
            "content": [{"type": "text", "text": "Hi "}, {"type": "text", "text": "👋"}],
        },
        {"role": "assistant", "content": " the cat sat"},
        {"role": "tool", "content": None, "tool_call_id": "x"},
        {"role": "developer", "content": "odd length!"},
        {"role": "user", "content": "and now?"},
    ],
}


def gateway_request(kind: RequestKind, body: dict[str, Any]) -> LLMRequest:
    """The request as the director builds it from a parsed body."""
    parsed = parse_request(kind, orjson.dumps(body), {})
    return LLMRequest(
        "r",
        parsed.model,
        parsed.model,
        parsed.prompt,
        parsed.prompt_tokens,
        0.0,
        kind=parsed.kind,
        body=parsed.body,
    )


def engine_ids(kind: RequestKind, body: dict[str, Any]) -> list[int]:
    """The prompt ids the simulator's engine counts, caches and publishes."""
    return token_ids(parse_generate(orjson.dumps(body), kind == "chat").prompt)


def test_chat_ids_are_the_engines() -> None:
    ids = builtin_token_ids(gateway_request("chat", CHAT))
    assert ids is not None
    assert ids.tolist() == engine_ids("chat", CHAT)
    # not the serialised messages (what the bug keyed chat blocks by)
    assert ids != token_id_array(gateway_request("chat", CHAT).prompt)


@pytest.mark.parametrize("turns", [1, 2, 5])
def test_a_follow_up_turn_extends_the_previous_turns_ids(turns: int) -> None:
    """With the reply in the history, a turn's ids start with all of the previous turn's."""
    messages: list[dict[str, Any]] = [{"role": "system", "content": "s" * 37}]
    previous: list[int] = []
    for t in range(turns):
        messages.append({"role": "user", "content": f"question {t} " * (t + 3)})
        body = {"model": "tiny", "messages": messages}
        ids = builtin_token_ids(gateway_request("chat", body))
        assert ids is not None
        assert ids.tolist() == engine_ids("chat", body)
        # the generation prompt is the reply's message header, padded alike: the whole
        # previous prompt is a prefix (so its cached blocks match)
        assert ids.tolist()[: len(previous)] == previous
        previous = ids.tolist()
        messages.append({"role": "assistant", "content": " and the"})


def test_the_limit_keeps_the_first_ids() -> None:
    whole = builtin_token_ids(gateway_request("chat", CHAT))
    assert whole is not None
    assert builtin_token_ids(gateway_request("chat", CHAT), 5) == whole[:5]


def test_completions_keep_their_prompt_bytes() -> None:
    for prompt in ("Once upon a time, odd", [1, 2, 70000]):
        body = {"model": "tiny", "prompt": prompt}
        request = gateway_request("completions", body)
        ids = builtin_token_ids(request)
        assert ids == token_id_array(request.prompt)
        assert ids is not None
        assert ids.tolist() == engine_ids("completions", body)


def test_a_chat_the_template_cannot_render_is_none() -> None:
    image = {"type": "image_url", "image_url": {"url": "data:,"}}
    body = {"model": "tiny", "messages": [{"role": "user", "content": [image]}]}
    assert builtin_token_ids(gateway_request("chat", body)) is None


def test_a_request_without_a_body_uses_its_prompt() -> None:
    request = LLMRequest("r", "m", "m", b"abcdefg", 2, 0.0)
    assert builtin_token_ids(request) == token_id_array(b"abcdefg")


async def test_the_simulators_tokenize_route_agrees(sim_cluster: Any) -> None:
    import aiohttp

    cluster = await sim_cluster(replicas=1)
    async with (
        aiohttp.ClientSession() as session,
        session.post(f"{cluster.replicas[0].url}/tokenize", json=CHAT) as reply,
    ):
        assert reply.status == 200
        tokens = (await reply.json())["tokens"]
    ids = builtin_token_ids(gateway_request("chat", CHAT))
    assert ids is not None
    assert tokens == ids.tolist()
