"""API keys: what a valid one looks like, and the three places ``sluicegate serve`` reads
them from (``--api-key``, ``--api-key-file``, ``$SLUICEGATE_API_KEYS``).

A key must be usable as an HTTP bearer token: RFC 6750's ``b64token`` (letters, digits,
``-._~+/``, then any number of ``=``; https://www.rfc-editor.org/rfc/rfc6750#section-2.1),
at least :data:`MIN_LENGTH` characters long. That rules out the mistakes that silently
weaken authentication: an empty key (an unset shell variable) would match a request
without an ``Authorization`` header, and a key with surrounding whitespace can never match
(the gateway strips the header's value).

Messages say which key is wrong (its source and position) and why, never the key itself:
they end up in terminals, logs and CI output.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from pathlib import Path

MIN_LENGTH = 16
"""Fewest characters a key may have (16 random base64 characters are 96 bits)."""

ENV_VAR = "SLUICEGATE_API_KEYS"
"""Environment variable read by ``sluicegate serve``: keys separated by commas or newlines."""

_B64TOKEN = re.compile(r"[A-Za-z0-9\-._~+/]+=*")
_ALLOWED = "letters, digits, - . _ ~ + / and trailing ="


class KeySourceError(ValueError):
    """A key source holds an invalid key or cannot be read; ``str()`` says which and why."""


def key_problem(key: str) -> str | None:
    """Why ``key`` cannot be an API key, or None if it can. Never quotes the key."""
    if not key:
        return "is empty (it would let requests without a key in)"
    if key != key.strip():
        return "has leading or trailing whitespace (it could never match)"
    if not _B64TOKEN.fullmatch(key):
        return f"has a character a bearer token cannot hold (allowed: {_ALLOWED})"
    if len(key) < MIN_LENGTH:
        return f"is {len(key)} characters long, fewer than the {MIN_LENGTH} a key needs"
    return None


def check_keys(keys: Sequence[str], name: str) -> list[str]:
    """Problems of ``keys``, each naming ``name[i]`` (the field and index)."""
    return [
        f"{name}[{i}] {problem}"
        for i, key in enumerate(keys)
        if (problem := key_problem(key)) is not None
    ]


def keys_from_file(path: str | Path) -> list[str]:
    """The keys of ``path``: one per line; blank lines and ``#`` comments are skipped.

    Raises :class:`KeySourceError` if the file cannot be read, holds an invalid key (the line
    number is given) or holds no key at all (an unmounted secret is a mistake, not a wish
    to run without authentication)."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else type(exc).__name__
        raise KeySourceError(f"--api-key-file {path}: cannot be read: {reason}") from None
    keys: list[str] = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        if problem := key_problem(line):
            raise KeySourceError(f"--api-key-file {path} line {number}: the key {problem}")
        keys.append(line)
    if not keys:
        raise KeySourceError(f"--api-key-file {path} holds no key (only blank lines or comments)")
    return keys


def keys_from_env(environ: Mapping[str, str]) -> list[str]:
    """The keys of ``$SLUICEGATE_API_KEYS`` (none if it is unset).

    Empty entries are skipped, so a trailing newline or comma is harmless, but a variable
    that is set and holds no key is refused: ``SLUICEGATE_API_KEYS=$KEY`` with ``$KEY``
    unset must not start an open gateway."""
    value = environ.get(ENV_VAR)
    if value is None:
        return []
    keys: list[str] = []
    for number, entry in enumerate(re.split(r"[,\n]", value), start=1):
        entry = entry.removesuffix("\r")  # the value came from a file with CRLF line ends
        if not entry:
            continue
        if problem := key_problem(entry):
            raise KeySourceError(f"{ENV_VAR} entry {number}: the key {problem}")
        keys.append(entry)
    if not keys:
        raise KeySourceError(f"{ENV_VAR} is set but holds no key")
    return keys


def collect_keys(
    flags: Sequence[str], files: Sequence[str], environ: Mapping[str, str]
) -> list[str]:
    """Every key given to ``serve``: ``--api-key`` values, then the ``--api-key-file``
    files in order, then ``$SLUICEGATE_API_KEYS``. Raises :class:`KeySourceError` at the first
    invalid one."""
    keys: list[str] = []
    for number, key in enumerate(flags, start=1):
        if problem := key_problem(key):
            raise KeySourceError(f"--api-key #{number}: the key {problem}")
        keys.append(key)
    for path in files:
        keys.extend(keys_from_file(path))
    keys.extend(keys_from_env(environ))
    return keys
