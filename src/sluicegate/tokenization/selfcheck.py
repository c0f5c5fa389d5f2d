"""Load-time checks of a local tokenizer, and the helpers they share with it: the
special tokens its post-processor adds, whether a cached encoding may be continued or a
prompt cut before a space and still give the whole encoding's ids (on a sample), and
the files' stamps a reload compares."""

from __future__ import annotations

from array import array
from collections.abc import Callable
from pathlib import Path

from tokenizers import Encoding, Tokenizer

from sluicegate.api.tokenizer import TokenizerSettings
from sluicegate.tokenization.base import TokenizerLoadError
from sluicegate.tokenization.prefix_cache import CHUNK_BYTES, PrefixTokenCache

_SELF_CHECK_TEXT = (
    "<|system|>You are a careful assistant.\n  Answer briefly; don't ramble!\n"
    "<|user|>What's 12345 + 678?\tShow the steps:   first add units, then tens.\n\n"
    "<|assistant|>Sure — naïve sums: 12345 + 678 = 13023.\r\n"
)


def safe_cut(text: str, chars: int) -> int:
    """The last index ≤ ``chars`` of a space preceded by a non-space (0: none found
    within a bounded search, e.g. a text of spaces)."""
    at = text.rfind(" ", 0, chars + 1)
    for _ in range(256):
        if at <= 0 or not text[at - 1].isspace():
            return max(at, 0)
        at = text.rfind(" ", 0, at - 1)
    return 0


def stamp(settings: TokenizerSettings) -> tuple[tuple[int, int] | None, ...]:
    """(mtime_ns, size) of each file a local tokenizer is read from (None: absent)."""
    assert settings.path is not None
    path = Path(settings.path)
    directory = path if path.is_dir() else path.parent
    files = [
        directory / "tokenizer.json" if path.is_dir() else path,
        directory / "tokenizer_config.json",
        directory / "chat_template.jinja",
    ]
    if settings.chat_template is not None:
        files.append(Path(settings.chat_template))
    out: list[tuple[int, int] | None] = []
    for file in files:
        try:
            st = file.stat()
        except OSError:
            out.append(None)
            continue
        out.append((st.st_mtime_ns, st.st_size))
    return tuple(out)


def special_around(full: Tokenizer, content: Tokenizer) -> tuple[list[int], list[int]]:
    """The ids the post-processor puts before and after a text's ids (e.g. Llama's BOS),
    found by encoding a sample both ways."""
    sample = "Hello world"
    inner = content.encode(sample, add_special_tokens=False).ids
    outer = full.encode(sample, add_special_tokens=True).ids
    for start in range(len(outer) - len(inner) + 1):
        if outer[start : start + len(inner)] == inner:
            return outer[:start], outer[start + len(inner) :]
    raise TokenizerLoadError(
        "the tokenizer's post-processor changes the text's own tokens; not supported"
    )


def continues_exactly(encode: Callable[[str], Encoding]) -> bool:
    """Whether continuing a cached encoding at a safe point reproduces the whole encoding,
    on a sample long enough for several chunks (checked once, at load)."""
    text = _SELF_CHECK_TEXT * (4 * CHUNK_BYTES // len(_SELF_CHECK_TEXT) + 2)
    whole = array("I", encode(text).ids)
    for cut in (CHUNK_BYTES + 7, 2 * CHUNK_BYTES + 100, 3 * CHUNK_BYTES + 333):
        probe = PrefixTokenCache(encode, 1 << 26, 8)
        probe.encode(text[:cut])
        if probe.encode(text) != whole or probe.counters.prefix_hits != 1:
            return False
    return True


def cuts_exactly(encode: Callable[[str], Encoding]) -> bool:
    """Whether encoding a prefix cut by :func:`safe_cut` gives the whole encoding's first
    ids, on a sample (checked once, at load)."""
    text = _SELF_CHECK_TEXT * 8
    whole = encode(text).ids
    for chars in (40, 97, 230, 511, 800):
        cut = safe_cut(text, chars)
        part = encode(text[:cut]).ids
        if cut <= 0 or part != whole[: len(part)]:
            return False
    return True


__all__ = ["continues_exactly", "cuts_exactly", "safe_cut", "special_around", "stamp"]
