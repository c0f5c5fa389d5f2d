"""A model's Hugging Face tokenizer, loaded once, and which text of a request it encodes.

:meth:`ModelTokenizer.load` reads the ``tokenizer.json`` (``tokenizers`` library),
``tokenizer_config.json`` beside it when present (special tokens, chat template), and the
chat template (a given file, else ``chat_template.jinja`` beside the tokenizer, else the
config's) compiled in transformers' sandboxed environment
(:mod:`sluicegate.model_tokenizer.chat`). A file that cannot be read or a template that
does not compile is a :class:`~sluicegate.model_tokenizer.TokenizerLoadError` then —
never an error when a prompt is encoded.

Per request, as vLLM 0.32 builds prompts (tag v0.32.0; :meth:`ModelTokenizer.prompt`):

- chat (``/v1/chat/completions``): the messages rendered with the template
  (``add_generation_prompt`` default true), the text tokenized **without** special
  tokens — ``ChatCompletionRequest.add_special_tokens`` defaults to false
  (``vllm/entrypoints/openai/chat_completion/protocol.py``), the template writes the
  BOS itself; transformers' ``apply_chat_template`` does the same;
- completion (``/v1/completions``): a text prompt tokenized **with** special tokens
  (``CompletionRequest.add_special_tokens`` defaults to true,
  ``vllm/entrypoints/openai/completion/protocol.py``: e.g. Llama's BOS); a prompt of
  token ids is taken as it is; of a list of prompts (a batch) the first is used.

A body's own ``add_special_tokens`` is honoured. The text is encoded without the
tokenizer's post-processor (:meth:`ModelTokenizer.encode`) and the special tokens are
added around those content ids (:meth:`ModelTokenizer.around`), so one cache of content
ids (:meth:`ModelTokenizer.prefix_cache`) serves both routes.
"""

from __future__ import annotations

import json
import logging
from array import array
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TypeAlias

import jinja2
from tokenizers import Encoding, Tokenizer

from sluicegate.model_tokenizer import TokenizerLoadError, given_token_ids
from sluicegate.model_tokenizer.chat import ChatTemplate, UnrenderableError, template_source
from sluicegate.model_tokenizer.prefix_cache import CHUNK_BYTES, PrefixTokenCache

log = logging.getLogger(__name__)

Prompt: TypeAlias = "tuple[str, bool] | array[int]"
"""What a request's prompt is encoded from: its text and whether the special tokens go
around it, or the token ids a completion gave."""

_GIL_FREE_CHARS = 4096
"""Texts at least this long are encoded with ``encode_batch``, which releases the GIL
(``encode`` holds it) — so another thread, the event loop, runs meanwhile."""

SELF_CHECK_TEXT = (
    "<|system|>You are a careful assistant.\n  Answer briefly; don't ramble!\n"
    "<|user|>What's 12345 + 678?\tShow the steps:   first add units, then tens.\n\n"
    "<|assistant|>Sure — naïve sums: 12345 + 678 = 13023.\r\n"
)
"""The sample the load-time checks encode (special-token look-alikes, runs of spaces,
tabs, CRLF, non-ASCII)."""


class ModelTokenizer:
    """A model's tokenizer, its configuration and chat template (see the module docstring)."""

    def __init__(
        self,
        tokenizer: Tokenizer,
        config: dict[str, object],
        template: ChatTemplate | None,
        where: str = "tokenizer",
    ) -> None:
        self.where = where
        """The file it was loaded from (for messages)."""
        self.config = config
        """``tokenizer_config.json`` (empty without one)."""
        self.template = template
        """None: the tokenizer has no chat template (vLLM refuses chat requests then)."""
        # Content is encoded without the post-processor (no special tokens, and offsets
        # untrimmed); the special tokens a completion gets are added around it.
        content = Tokenizer.from_str(tokenizer.to_str())
        content.post_processor = None
        content.no_truncation()
        content.no_padding()
        tokenizer.no_truncation()
        tokenizer.no_padding()
        self.content = content
        """The tokenizer without its post-processor (what :meth:`encode` uses)."""
        self.prefix_ids, self.suffix_ids = special_around(tokenizer, content)
        """The ids the post-processor puts before and after a text's (e.g. Llama's BOS)."""

    @classmethod
    def load(
        cls, path: str | Path, chat_template: str | None = None, content_format: str = "auto"
    ) -> ModelTokenizer:
        """Read and compile the tokenizer at ``path`` (a ``tokenizer.json`` or its folder)
        and its chat template (``chat_template``: a template file instead of the
        tokenizer's own; ``content_format``: ``auto``, ``string`` or ``openai``, vLLM's
        ``--chat-template-content-format``); raises TokenizerLoadError."""
        path = Path(path)
        file = path / "tokenizer.json" if path.is_dir() else path
        directory = file.parent
        try:
            tokenizer = Tokenizer.from_file(str(file))
        except Exception as exc:  # missing, unreadable, or not a tokenizer.json
            raise TokenizerLoadError(f"cannot load tokenizer {file}: {exc}") from None
        config: dict[str, object] = {}
        config_file = directory / "tokenizer_config.json"
        if config_file.is_file():
            try:
                loaded = json.loads(config_file.read_text(encoding="utf-8"))
            except (OSError, ValueError) as exc:
                raise TokenizerLoadError(f"cannot read {config_file}: {exc}") from None
            if not isinstance(loaded, dict):
                raise TokenizerLoadError(f"{config_file}: not a JSON object")
            config = loaded
        if chat_template is not None:
            try:
                source: str | None = Path(chat_template).read_text(encoding="utf-8")
            except OSError as exc:
                raise TokenizerLoadError(
                    f"cannot read chatTemplate {chat_template}: {exc}"
                ) from None
            where = chat_template
        else:
            try:
                source = template_source(config, directory)
            except OSError as exc:
                raise TokenizerLoadError(f"cannot read the chat template: {exc}") from None
            where = str(directory)
        template = None
        if source is not None:
            try:
                template = ChatTemplate(source, config, content_format)
            except jinja2.TemplateSyntaxError as exc:
                raise TokenizerLoadError(
                    f"chat template of {where}: line {exc.lineno}: {exc.message}"
                ) from None
        else:
            log.warning(
                "tokenizer %s has no chat template: chat requests route approximately", file
            )
        return cls(tokenizer, config, template, str(file))

    def encode(self, text: str) -> Encoding:
        """``text``'s content encoding (no special tokens)."""
        if len(text) >= _GIL_FREE_CHARS:
            return self.content.encode_batch([text], add_special_tokens=False)[0]
        return self.content.encode(text, add_special_tokens=False)

    def around(self, ids: array[int], add_special_tokens: bool, whole: bool = True) -> array[int]:
        """Content ``ids`` with the special tokens around them when asked (those after the
        text only when ``whole``: the ids are the whole text's, not a prefix's)."""
        prefix = self.prefix_ids if add_special_tokens else []
        suffix = self.suffix_ids if add_special_tokens and whole else []
        if prefix or suffix:
            out = array("I", prefix)
            out.extend(ids)
            out.extend(suffix)
            return out
        return ids

    def prompt(self, body: Mapping[str, object], chat: bool) -> Prompt:
        """What request ``body`` (chat ``messages`` if ``chat``, else a completion
        ``prompt``) is encoded from; raises
        :class:`~sluicegate.model_tokenizer.chat.UnrenderableError` (its subclass
        ``TemplateRejectedError`` when the template itself raised) when the server's
        prompt cannot be reproduced."""
        special = body.get("add_special_tokens")
        if chat:
            if self.template is None:
                raise UnrenderableError("the tokenizer has no chat template")
            return self.template.render(body), special is True
        given = given_token_ids(body)
        if given is not None:
            return given
        prompt = body.get("prompt")
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], str):
            prompt = prompt[0]  # a batch: sized by its first prompt
        if isinstance(prompt, str):
            return prompt, special is not False
        raise UnrenderableError("the prompt is neither text nor token ids")

    def new_prefix_cache(self, max_bytes: int, max_entries: int) -> PrefixTokenCache:
        """A new, empty cache of :meth:`encode`'s ids of texts seen (one per caller: each
        call makes another), bounded to ``max_bytes`` and ``max_entries``; continuing
        cached encodings only when that reproduces the whole encoding for this tokenizer
        (:func:`continues_exactly`, warned otherwise)."""
        cache = PrefixTokenCache(self.encode, max_bytes, max_entries)
        if not continues_exactly(self.encode):
            log.warning(
                "tokenizer %s: cutting an encoding at a word start does not reproduce the "
                "whole encoding; only exact repeats are cached",
                self.where,
            )
            cache.continuation = False
        return cache


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
    text = SELF_CHECK_TEXT * (4 * CHUNK_BYTES // len(SELF_CHECK_TEXT) + 2)
    whole = array("I", encode(text).ids)
    for cut in (CHUNK_BYTES + 7, 2 * CHUNK_BYTES + 100, 3 * CHUNK_BYTES + 333):
        probe = PrefixTokenCache(encode, 1 << 26, 8)
        probe.encode(text[:cut])
        if probe.encode(text) != whole or probe.counters.prefix_hits != 1:
            return False
    return True


__all__ = [
    "SELF_CHECK_TEXT",
    "ModelTokenizer",
    "Prompt",
    "continues_exactly",
    "special_around",
]
