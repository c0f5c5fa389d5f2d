"""Load-time checks of a local tokenizer, and the helpers they share with it: whether a
prompt cut before a space still gives the whole encoding's first ids (on a sample), and
the files' stamps a reload compares. (The checks a model tokenizer needs wherever it is
used — its special tokens, continuing cached encodings — are in
:mod:`sluicegate.model_tokenizer.model`.)"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from tokenizers import Encoding

from sluicegate.api.tokenizer import TokenizerSettings
from sluicegate.model_tokenizer.model import SELF_CHECK_TEXT


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


def cuts_exactly(encode: Callable[[str], Encoding]) -> bool:
    """Whether encoding a prefix cut by :func:`safe_cut` gives the whole encoding's first
    ids, on a sample (checked once, at load)."""
    text = SELF_CHECK_TEXT * 8
    whole = encode(text).ids
    for chars in (40, 97, 230, 511, 800):
        cut = safe_cut(text, chars)
        part = encode(text[:cut]).ids
        if cut <= 0 or part != whole[: len(part)]:
            return False
    return True


__all__ = ["cuts_exactly", "safe_cut", "stamp"]
