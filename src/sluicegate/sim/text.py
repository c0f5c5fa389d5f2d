"""Prompt rendering and generated text for the simulator.

The engine sees a request as UTF-8 bytes cut into 4-byte tokens (``sluicegate.tokens``).
Chat messages are rendered with a small template whose message bodies start on a token
boundary, so a conversation's history re-tokenises to exactly the tokens the engine
computed for it, generated tokens included, and a follow-up turn hits the prefix cache the
way it would on vLLM.

Generated tokens are 4-byte ASCII pieces drawn deterministically from a fixed vocabulary
by (sequence seed, token index), so any token can be recomputed at any time.
"""

from __future__ import annotations

from collections.abc import Sequence

from sluicegate.tokens import BYTES_PER_TOKEN

_WORDS = (
    "the and for are but not you all any can had her was one our out day get has him his how "
    "man new now old see two way who boy did its let put say she too use act add age ago air "
    "arm art ask bad bag bed big bit box bus buy car cat cup cut dog dry ear eat egg end eye "
    "far few fit fly fun gas god gun hat hit hot ice job key kid lab law lay leg lie lot low "
    "map may mix mom net nor odd off oil own pay per pen pop raw red rid row run sad sea set "
    "sit six sky son sum sun tax tea ten tie tip toe top toy try van war wet win yes yet able "
    "area away back band bank base bear beat best bill bird blue boat body bone book born "
    "both call calm camp card care case cash cell city club coat code cold come cook cool "
    "copy cost crew dark data date dead deal dear deep door down draw drop duty each east "
    "easy edge else even ever face fact fail fair fall farm fast fear feel file fill film "
    "find fine fire firm fish five flat flow food foot form four free from fuel full fund "
    "gain game gate gift girl give glad goal gold good gray grow hair half hall hand hang "
    "hard head hear heat help here hero high hill hold hole home hope host hour huge idea "
    "iron item join jump just keep kind king know lack lake land last late lead left less "
    "life lift like line list live load loan lock long look lord lose loss love luck made "
    "mail main make male many mark mass meal mean meet mind miss mode more most move much "
    "must name near neck need news next nice nine none nose note once only open pace page "
    "pain pair park part pass past path pick plan play plot poem poet pole pool poor port "
    "post pull pure push race rain rank rate read real rest rice rich ride ring rise risk "
    "road rock role roll roof room root rose rule safe sale salt same sand save seat seed "
    "seek seem self sell send ship shop shot show shut sick side sign sing site size skin "
    "slow snow soft soil some song soon sort soul spot star stay step stop such suit sure "
    "take talk tall task team tell term test text than that them then they thin this thus "
    "time tiny tone tool tour town tree trip true tune turn type unit upon used user vast "
    "very view vote wait wake walk wall want warm wash wave weak wear week well west what "
    "when wide wife wild will wind wine wing wire wise wish with wood word work yard year "
    "zero zone "
).split()


def _build_vocab() -> tuple[bytes, ...]:
    pieces: list[bytes] = []
    for word in _WORDS:
        piece = (" " + word)[-BYTES_PER_TOKEN:].rjust(BYTES_PER_TOKEN)
        pieces.append(piece.encode())
    unique = tuple(dict.fromkeys(pieces))
    return unique[:256]


VOCAB: tuple[bytes, ...] = _build_vocab()
"""Generated-token vocabulary: 4-byte ASCII pieces (a space and a word, or a 4-letter word)."""

_MASK64 = (1 << 64) - 1
# Fibonacci hashing of (seed, index) picks a vocabulary entry from the top 8 bits.
_GOLDEN = 0x9E3779B97F4A7C15
_MIX = 0xBF58476D1CE4E5B9


def output_token(seed: int, index: int) -> bytes:
    """The ``index``-th generated token (4 bytes) of the sequence with ``seed``."""
    return VOCAB[((((seed ^ (index * _GOLDEN)) & _MASK64) * _MIX) & _MASK64) >> 56]


def output_bytes(seed: int, start: int, end: int) -> bytes:
    """Generated tokens ``start``..``end-1`` of the sequence with ``seed``, concatenated."""
    vocab, golden, mix, mask = VOCAB, _GOLDEN, _MIX, _MASK64
    return b"".join(
        [vocab[((((seed ^ (i * golden)) & mask) * mix) & mask) >> 56] for i in range(start, end)]
    )


class PromptError(ValueError):
    """A prompt or message list the simulator cannot render."""


def message_text(content: object) -> str:
    """Text of a chat message ``content``: a string or a list of ``{"type": "text"}`` parts."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts: list[str] = []
        for part in content:
            if not isinstance(part, dict):
                raise PromptError("content parts must be objects")
            kind = part.get("type")
            if kind != "text":
                raise PromptError(f"content part type {kind!r} is not supported (text only)")
            text = part.get("text")
            if not isinstance(text, str):
                raise PromptError("a text content part needs a string 'text'")
            parts.append(text)
        return "".join(parts)
    raise PromptError("message content must be a string or a list of content parts")


def _pad_to_token(buf: bytearray) -> None:
    buf.extend(b" " * (-len(buf) % BYTES_PER_TOKEN))


def render_chat(messages: Sequence[object], add_generation_prompt: bool = True) -> bytes:
    """Render chat ``messages`` to prompt bytes.

    Each message is ``<|role|>\\n`` padded to a token boundary, its text, and ``\\n``; the
    generation prompt ``<|assistant|>\\n`` is padded the same way, so generated text starts
    on a token boundary and re-renders to the same tokens in the next turn.
    """
    if not messages:
        raise PromptError("messages must be a non-empty list")
    buf = bytearray()
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            raise PromptError(f"messages[{i}] must be an object")
        role = message.get("role")
        if not isinstance(role, str) or not role:
            raise PromptError(f"messages[{i}].role must be a non-empty string")
        buf += f"<|{role}|>\n".encode()
        _pad_to_token(buf)
        buf += message_text(message.get("content")).encode()
        buf += b"\n"
    if add_generation_prompt:
        buf += b"<|assistant|>\n"
        _pad_to_token(buf)
    return bytes(buf)


def render_prompt(prompt: object) -> bytes:
    """Prompt bytes of a completions ``prompt``: a string, one-string list, or token ids."""
    if isinstance(prompt, str):
        return prompt.encode()
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        return prompt[0].encode()
    if (
        isinstance(prompt, list)
        and prompt
        and all(isinstance(t, int) and not isinstance(t, bool) and 0 <= t < 2**32 for t in prompt)
    ):
        return b"".join(int(t).to_bytes(BYTES_PER_TOKEN, "little") for t in prompt)
    if isinstance(prompt, list) and len(prompt) > 1 and all(isinstance(p, str) for p in prompt):
        raise PromptError("batched prompts (a list of several strings) are not supported")
    raise PromptError("prompt must be a string, a list with one string, or a list of token ids")
