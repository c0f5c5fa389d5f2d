"""Chat/prompt rendering and generated text (``sluicegate.sim.text``)."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sluicegate.sim.text import (
    VOCAB,
    PromptError,
    find_stop,
    message_text,
    output_bytes,
    output_token,
    render_chat,
    render_prompt,
    token_logprobs,
)
from sluicegate.tokens import BYTES_PER_TOKEN, count_bytes_tokens

_roles = st.sampled_from(["system", "user", "assistant", "tool", "développeur"])
_messages = st.lists(
    st.fixed_dictionaries({"role": _roles, "content": st.text(max_size=40)}),
    min_size=1,
    max_size=6,
)


def _layout(messages: list[dict[str, str]]) -> list[tuple[int, int]]:
    """(header start, body start) byte offsets of each message, computed independently."""
    out = []
    pos = 0
    for message in messages:
        header_start = pos
        pos += len(f"<|{message['role']}|>\n".encode())
        pos += -pos % BYTES_PER_TOKEN
        out.append((header_start, pos))
        pos += len(message["content"].encode()) + 1  # body and its newline
    return out


@settings(max_examples=100, deadline=None)
@given(_messages)
def test_render_chat_starts_every_body_on_a_token_boundary(messages: list[dict[str, str]]) -> None:
    rendered = render_chat(messages, add_generation_prompt=False)
    layout = _layout(messages)
    for message, (header_start, start) in zip(messages, layout, strict=True):
        assert start % BYTES_PER_TOKEN == 0
        header = f"<|{message['role']}|>\n".encode()
        assert rendered[header_start : header_start + len(header)] == header
        # Only spaces, fewer than a token's worth, pad the header up to the body.
        pad = rendered[header_start + len(header) : start]
        assert pad == b" " * len(pad)
        assert len(pad) < BYTES_PER_TOKEN
        body = message["content"].encode()
        assert rendered[start : start + len(body) + 1] == body + b"\n"
    _, last_start = layout[-1]
    assert len(rendered) == last_start + len(messages[-1]["content"].encode()) + 1


@settings(max_examples=100, deadline=None)
@given(_messages)
def test_generation_prompt_ends_on_a_token_boundary(messages: list[dict[str, str]]) -> None:
    rendered = render_chat(messages)
    assert len(rendered) % BYTES_PER_TOKEN == 0
    assert rendered.rstrip(b" ").endswith(b"<|assistant|>\n")
    without = render_chat(messages, add_generation_prompt=False)
    assert rendered.startswith(without)


@settings(max_examples=50, deadline=None)
@given(_messages, st.integers(0, 2**64 - 1), st.integers(1, 40))
def test_answer_in_history_rerenders_to_prompt_plus_generated_tokens(
    messages: list[dict[str, str]], seed: int, n_out: int
) -> None:
    """A follow-up turn's bytes start with the previous prompt and the generated tokens."""
    prompt = render_chat(messages)
    generated = output_bytes(seed, 0, n_out)
    answer = {"role": "assistant", "content": generated.decode()}
    follow_up = render_chat([*messages, answer, {"role": "user", "content": "?"}])
    assert follow_up.startswith(prompt + generated)
    assert count_bytes_tokens(prompt + generated) == count_bytes_tokens(prompt) + n_out


def test_content_as_text_parts_equals_content_string() -> None:
    as_string = [{"role": "user", "content": "Hello, wörld! How are you?"}]
    as_parts = [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "Hello, "},
                {"type": "text", "text": "wörld! "},
                {"type": "text", "text": "How are you?"},
            ],
        }
    ]
    assert render_chat(as_parts) == render_chat(as_string)
    assert message_text(as_parts[0]["content"]) == as_string[0]["content"]


def test_missing_or_null_content_renders_as_empty() -> None:
    assert render_chat([{"role": "assistant"}]) == render_chat(
        [{"role": "assistant", "content": ""}]
    )
    assert message_text(None) == ""
    assert message_text([]) == ""


@pytest.mark.parametrize(
    "content",
    [
        [{"type": "image_url", "image_url": {"url": "http://x/y.png"}}],
        [{"type": "image_url", "image_url": {"url": "http://x/y.png"}, "text": "a caption"}],
        [{"type": "text", "text": "hi"}, {"type": "input_audio", "input_audio": {}}],
        [{"text": "no type"}],
        ["a bare string part"],
        [{"type": "text", "text": 42}],
        [{"type": "text"}],
        42,
        {"type": "text", "text": "not in a list"},
    ],
)
def test_unsupported_content_raises_prompt_error(content: object) -> None:
    with pytest.raises(PromptError):
        render_chat([{"role": "user", "content": content}])


@pytest.mark.parametrize(
    "messages",
    [
        [],
        ["just a string"],
        [None],
        [{"content": "no role"}],
        [{"role": "", "content": "empty role"}],
        [{"role": 3, "content": "role not a string"}],
        [{"role": "user", "content": "ok"}, "then junk"],
    ],
)
def test_malformed_messages_raise_prompt_error(messages: list[object]) -> None:
    with pytest.raises(PromptError):
        render_chat(messages)


def test_prompt_error_is_a_value_error() -> None:
    assert issubclass(PromptError, ValueError)


# ---------------------------------------------------------------- render_prompt


def test_render_prompt_accepts_string_and_single_string_list() -> None:
    assert render_prompt("héllo") == "héllo".encode()
    assert render_prompt(["héllo"]) == "héllo".encode()
    assert render_prompt("") == b""


def test_render_prompt_token_ids_are_one_token_each() -> None:
    ids = [0, 1, 255, 65_536, 2**32 - 1]
    rendered = render_prompt(ids)
    assert len(rendered) == len(ids) * BYTES_PER_TOKEN
    assert count_bytes_tokens(rendered) == len(ids)
    assert rendered[:4] == (0).to_bytes(4, "little")
    assert rendered[-4:] == (2**32 - 1).to_bytes(4, "little")
    # Different ids give different prompts; a prefix of ids gives a prefix of bytes.
    assert render_prompt([1, 2]) != render_prompt([2, 1])
    assert rendered.startswith(render_prompt(ids[:3]))


@pytest.mark.parametrize(
    "prompt",
    [
        None,
        42,
        b"bytes",
        [],
        ["a", "b"],
        [1, "a"],
        [1.0, 2.0],
        [True, False],
        [-1],
        [2**32],
        [[1, 2]],
        {"prompt": "x"},
    ],
)
def test_render_prompt_rejects_other_shapes(prompt: object) -> None:
    with pytest.raises(PromptError):
        render_prompt(prompt)


# ---------------------------------------------------------------- generated tokens


def test_vocab_pieces_are_distinct_4_byte_ascii() -> None:
    assert len(VOCAB) == len(set(VOCAB)) > 100
    for piece in VOCAB:
        assert len(piece) == BYTES_PER_TOKEN
        assert piece.isascii()


def test_output_tokens_are_deterministic_and_seed_dependent() -> None:
    a = output_bytes(123, 0, 50)
    assert a == output_bytes(123, 0, 50)
    assert a == b"".join(output_token(123, i) for i in range(50))
    assert output_bytes(123, 10, 20) == a[40:80]
    assert a != output_bytes(124, 0, 50)
    assert len({a[i : i + 4] for i in range(0, 200, 4)}) > 10


# ---------------------------------------------------------------------------- stop conditions


def _naive_stop(
    seed: int,
    planned: int,
    stop: list[str],
    stop_ids: list[int],
    include: bool,
    min_tokens: int,
) -> tuple[int, int, str | int] | None:
    """vLLM's stop checker run token by token: after each token, a stop token id ends the
    output; else each stop string (in list order) is looked for in the newly added text."""
    text = b""
    for i in range(planned):
        piece = output_token(seed, i)
        text += piece
        if i + 1 < min_tokens:
            continue
        tid = int.from_bytes(piece, "little")
        if tid in stop_ids:
            return i + 1, len(text), tid
        for s in stop:
            needle = s.encode()
            at = text.find(needle, max(0, len(text) - len(piece) - len(needle) + 1))
            if at >= 0:
                return i + 1, at + len(needle) if include else at, s
    return None


_stop_words = st.lists(
    st.sampled_from([p.decode() for p in VOCAB[:40]] + ["e", "an", " t", "he ", "xyz", "o"]),
    max_size=3,
)


@settings(max_examples=200, deadline=None)
@given(
    st.integers(0, 2**64 - 1),
    st.integers(1, 60),
    _stop_words,
    st.lists(st.sampled_from([int.from_bytes(p, "little") for p in VOCAB[:30]] + [5]), max_size=2),
    st.booleans(),
    st.integers(0, 10),
)
def test_find_stop_matches_a_token_by_token_checker(
    seed: int,
    planned: int,
    stop: list[str],
    stop_ids: list[int],
    include: bool,
    min_tokens: int,
) -> None:
    hit = find_stop(seed, planned, stop, stop_ids, include, min_tokens)
    expected = _naive_stop(seed, planned, stop, stop_ids, include, min_tokens)
    got = None if hit is None else (hit.tokens, hit.text_bytes, hit.reason)
    assert got == expected


@settings(max_examples=100, deadline=None)
@given(st.integers(0, 2**64 - 1), st.integers(0, 500), st.integers(0, 20))
def test_token_logprobs_are_a_distribution(seed: int, index: int, k: int) -> None:
    lp = token_logprobs(seed, index, k)
    assert lp.piece == output_token(seed, index)
    assert len(lp.top) == k
    values = [v for _, v in lp.top]
    assert values == sorted(values, reverse=True)
    assert all(v <= 0 for v in values)
    assert sum(math.exp(v) for v in values) <= 1 + 1e-9
    assert len({p for p, _ in lp.top}) == k
    if lp.rank <= k:
        assert lp.top[lp.rank - 1] == (lp.piece, lp.logprob)
    else:
        assert lp.piece not in {p for p, _ in lp.top}
        assert not values or lp.logprob < values[-1]
