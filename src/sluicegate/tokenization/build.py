"""Building the pools' tokenizers from the configuration (at start and every reload)."""

from __future__ import annotations

from collections.abc import Mapping

from sluicegate.api.loader import Config, ConfigError
from sluicegate.api.tokenizer import TokenizerSettings
from sluicegate.tokenization.base import PoolTokenizer, TokenizerLoadError
from sluicegate.tokenization.local import LocalTokenizer
from sluicegate.tokenization.remote import ServerTokenizer


def build_tokenizer(settings: TokenizerSettings) -> PoolTokenizer | None:
    """The tokenizer ``settings`` describe (None for ``builtin``); raises
    TokenizerLoadError."""
    if settings.source == "local":
        return LocalTokenizer.load(settings)
    if settings.source == "server":
        return ServerTokenizer(settings)
    return None


def build_tokenizers(
    config: Config, previous: Mapping[str, PoolTokenizer] | None = None
) -> dict[str, PoolTokenizer]:
    """Per pool whose ``spec.tokenizer`` is not ``builtin``, its tokenizer. A pool whose
    settings and files (their mtime and size) did not change keeps its tokenizer from
    ``previous`` (and its cache). Raises
    ConfigError listing every pool whose tokenizer cannot be loaded."""
    out: dict[str, PoolTokenizer] = {}
    problems: list[str] = []
    for name, pool in config.pools.items():
        settings = pool.spec.tokenizer
        if settings.source == "builtin":
            continue
        old = (previous or {}).get(name)
        if old is not None and old.settings == settings and old.files_unchanged():
            out[name] = old
            continue
        try:
            built = build_tokenizer(settings)
        except TokenizerLoadError as exc:
            problems.append(f"InferencePool {name}: spec.tokenizer: {exc}")
            continue
        if built is not None:
            out[name] = built
    if problems:
        raise ConfigError(problems)
    return out


__all__ = ["build_tokenizer", "build_tokenizers"]
