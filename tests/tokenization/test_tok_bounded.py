"""Long prompts: only a bounded prefix is encoded (its ids equal the whole encoding's
first ids), and the encode runs in a worker thread, off the event loop."""

from __future__ import annotations

import asyncio
import random
import threading
from pathlib import Path

from tiny_tokenizer import corpus
from tokenizers import Tokenizer

from sluicegate.api.tokenizer import TokenizerSettings
from sluicegate.framework import LLMRequest
from sluicegate.tokenization.local import CHARS_PER_TOKEN, THREAD_PROMPT_BYTES, LocalTokenizer


def local(path: Path) -> LocalTokenizer:
    return LocalTokenizer.load(TokenizerSettings(source="local", path=str(path)))


def texts(seed: int, n: int) -> list[str]:
    """Texts with runs of spaces, newlines, tabs, punctuation, digits and special tokens
    (the places a cut could go wrong)."""
    rng = random.Random(seed)
    pieces = [*corpus(300, seed), "  ", "   ", "\n\n", "\t", " \n ", "!!", "...", "1234567",
              "<|user|>", "<|assistant|>", "</s>", "naïve — ", "don't "]  # fmt: skip
    return ["".join(rng.choice(pieces) for _ in range(rng.randint(50, 400))) for _ in range(n)]


def test_a_bounded_prefix_gives_the_whole_encodings_first_ids(tiny_dir: Path) -> None:
    tok = local(tiny_dir)
    assert tok.cut_prefixes
    ref = Tokenizer.from_file(str(tiny_dir / "tokenizer.json"))
    ref.no_truncation()
    rng = random.Random(3)
    bounded = 0
    for text in texts(11, 60):
        for special in (False, True):
            whole = ref.encode(text, add_special_tokens=special).ids
            limit = rng.randint(1, max(1, len(whole) // 2))
            got = tok.text_ids(text, special, limit)
            assert list(got[:limit]) == whole[:limit]
            assert len(got) >= limit
            bounded += len(got) < len(whole)
    assert bounded > 60  # most were cut short: the bound did bound


def test_a_huge_prompt_encodes_about_the_limit_not_the_whole(tiny_dir: Path) -> None:
    tok = local(tiny_dir)
    text = " ".join(corpus(8000, 5))  # ~ 0.5 MB
    limit = 2000
    ids = tok.text_ids(text, False, limit)
    ref = Tokenizer.from_file(str(tiny_dir / "tokenizer.json"))
    assert list(ids[:limit]) == ref.encode(text, add_special_tokens=False).ids[:limit]
    assert tok.cache.counters.tokens_encoded < 2 * CHARS_PER_TOKEN * limit
    assert len(text) > 20 * CHARS_PER_TOKEN * limit


async def test_a_long_prompt_is_encoded_off_the_event_loop(tiny_dir: Path) -> None:
    tok = local(tiny_dir)
    prompt = " ".join(corpus(6000, 9))
    request = LLMRequest(
        "r", "m", "m", prompt.encode(), 0, 0.0, kind="completions", body={"prompt": prompt}
    )
    assert tok.wants_fetch(request)
    assert len(prompt) > THREAD_PROMPT_BYTES
    threads: list[int] = []
    encode = tok._encode

    def spy(text: str):  # type: ignore[no-untyped-def]
        threads.append(threading.get_ident())
        return encode(text)

    tok._encode = spy  # type: ignore[method-assign]
    tok.cache.encode_fn = spy
    ticks = 0
    done = False

    async def ticker() -> None:
        nonlocal ticks
        while not done:
            ticks += 1
            await asyncio.sleep(0)

    task = asyncio.create_task(ticker())
    ids = await tok.fetch(request, [], 0)  # the whole prompt: seconds of encoding
    done = True
    await task
    assert ids is not None
    assert len(ids) > 100_000
    assert threads
    assert threading.get_ident() not in threads
    # the loop kept running: at least one tick per 1,000 tokens encoded meanwhile (a
    # blocked loop gets none until the encode returns)
    assert ticks > len(ids) // 1000
