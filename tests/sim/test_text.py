"""Chat/prompt rendering and generated text (``sluicegate.sim.text``)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sluicegate.sim.text import (
    VOCAB,
    PromptError,
    message_text,
    output_bytes,
    output_token,
    render_chat,
    render_prompt,
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
