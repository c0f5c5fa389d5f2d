"""Chat templates: loading a model's Jinja chat template and rendering requests with it
as vLLM renders them.

vLLM 0.32 renders chat messages through transformers' ``apply_chat_template``
(``vllm/renderers/hf.py`` ``safe_apply_chat_template`` at tag v0.32.0), whose Jinja
environment (transformers 5.19 ``src/transformers/utils/chat_template_utils.py``
``_compile_jinja_template``) is an ``ImmutableSandboxedEnvironment`` with
``trim_blocks`` and ``lstrip_blocks``, the ``loopcontrols`` extension, a ``tojson``
filter that does not escape HTML (``json.dumps`` with ``ensure_ascii=False``), and the
globals ``raise_exception`` and ``strftime_now``; the template sees ``messages``,
``tools``, ``documents``, ``add_generation_prompt``, the tokenizer's special tokens
(``bos_token``, ``eos_token`` …, as text) and the request's ``chat_template_kwargs``.
This module builds the same environment (the ``{% generation %}`` tag of
transformers' assistant-mask extension renders its body unchanged here: only masks
depend on it).

Messages are prepared as vLLM's ``vllm/renderers/chat_utils.py`` (v0.32.0) prepares
them: text content parts joined with ``"\\n"`` (content format ``string``) or kept as
``[{"type": "text", "text": …}]`` (``openai``), ``content: null`` as empty, tool-call
``arguments`` given as JSON text parsed into objects, and only the fields vLLM keeps
(``role``, ``content``, ``name``, ``tool_calls``, ``tool_call_id``, ``reasoning``).
Anything this module does not render as vLLM would — non-text content parts (images,
audio), a ``developer`` message for a template that does not know the role — raises
:class:`UnrenderableError`, and the request is routed approximately.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import datetime
from pathlib import Path
from typing import Literal

import jinja2
import jinja2.ext
import jinja2.nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment

ContentFormat = Literal["string", "openai"]

SPECIAL_TOKEN_NAMES = (
    "bos_token",
    "eos_token",
    "unk_token",
    "sep_token",
    "pad_token",
    "cls_token",
    "mask_token",
)
"""transformers' ``SPECIAL_TOKENS_ATTRIBUTES``: the special tokens a template sees."""

_RESERVED = frozenset({"messages", "tools", "documents", "add_generation_prompt"})


class UnrenderableError(ValueError):
    """The request cannot be rendered as the server would (the template raised, or the
    messages hold what this renderer does not handle)."""


class TemplateRejectedError(UnrenderableError):
    """The chat template itself raised on the messages (the ``template`` fallback; any
    other :class:`UnrenderableError` is ``unsupported``)."""


class _Generation(jinja2.ext.Extension):
    """``{% generation %}…{% endgeneration %}``: transformers marks assistant text with it
    for its token masks; the text renders unchanged."""

    tags = {"generation"}  # noqa: RUF012 - jinja2's Extension declares it so

    def parse(self, parser: jinja2.parser.Parser) -> jinja2.nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.Scope(body, lineno=lineno)


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _tojson(
    value: object,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


def environment() -> ImmutableSandboxedEnvironment:
    """The Jinja environment transformers renders chat templates in."""
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[_Generation, jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env


def _token_text(value: object) -> str | None:
    """A special token as ``tokenizer_config.json`` writes it: text, or an AddedToken
    object with ``content``."""
    if isinstance(value, str):
        return value
    if isinstance(value, dict):
        content = value.get("content")
        return content if isinstance(content, str) else None
    return None


def template_source(config: Mapping[str, object], directory: Path | None) -> str | None:
    """The chat template of a tokenizer: ``chat_template.jinja`` beside it (how
    transformers saves it since 4.43), else ``tokenizer_config.json``'s ``chat_template``
    (text, or a list of named templates: the one named ``default``)."""
    if directory is not None:
        file = directory / "chat_template.jinja"
        if file.is_file():
            return file.read_text(encoding="utf-8")
    value = config.get("chat_template")
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        for item in value:
            if isinstance(item, dict) and item.get("name") == "default":
                template = item.get("template")
                return template if isinstance(template, str) else None
    return None


class ChatTemplate:
    """A compiled chat template and the special tokens it is rendered with."""

    def __init__(self, source: str, config: Mapping[str, object], content_format: str) -> None:
        """Compile ``source``; raises ``jinja2.TemplateSyntaxError`` when it is not valid.
        ``config`` is ``tokenizer_config.json``; ``content_format`` is ``string``,
        ``openai`` or ``auto`` (detected from the template, as vLLM does)."""
        env = environment()
        self.source = source
        self.template = env.from_string(source)
        # the template's globals flattened once: a render then builds its context from one
        # dict (``shared``) instead of reading the globals' ChainMap key by key (measured:
        # 8.5 → 4 µs a render of a 5-message chat, warm)
        self._globals = dict(self.template.globals)
        self.content_format: ContentFormat = (
            _detect_format(env.parse(source))
            if content_format == "auto"
            else ("openai" if content_format == "openai" else "string")
        )
        self.knows_developer = '"developer"' in source or "'developer'" in source
        self.special: dict[str, str] = {}
        for name in SPECIAL_TOKEN_NAMES:
            text = _token_text(config.get(name))
            if text is not None:
                self.special[name] = text

    def render(self, body: Mapping[str, object]) -> str:
        """The prompt text of a chat request body; raises :class:`UnrenderableError`."""
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise UnrenderableError("no messages")
        conversation = [self._message(m) for m in messages]
        add_generation_prompt = body.get("add_generation_prompt", True)
        continue_final = body.get("continue_final_message", False)
        if continue_final:
            # transformers trims the final message's end; not rendered here.
            raise UnrenderableError("continue_final_message is not rendered by the gateway")
        kwargs: dict[str, object] = dict(self.special)
        extra = body.get("chat_template_kwargs")
        if isinstance(extra, dict):
            kwargs.update({k: v for k, v in extra.items() if k not in _RESERVED})
        if body.get("chat_template") is not None:
            raise UnrenderableError("the request brings its own chat_template")
        tools = body.get("tools")
        context = self._globals | kwargs
        context["messages"] = conversation
        context["tools"] = tools if isinstance(tools, list) else None
        context["documents"] = None
        context["add_generation_prompt"] = bool(add_generation_prompt)
        template = self.template
        try:  # what Template.render does, with the context passed as it is
            return "".join(template.root_render_func(template.new_context(context, shared=True)))
        except Exception as exc:  # a template rejects input by raising anything
            raise TemplateRejectedError(f"the chat template rejected the messages: {exc}") from None

    def _message(self, message: object) -> dict[str, object]:
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise UnrenderableError("a message without a role")
        role = message["role"]
        if role == "developer" and not self.knows_developer:
            raise UnrenderableError("a developer message for a template without that role")
        out: dict[str, object] = {"role": role, "content": self._content(message.get("content"))}
        name = message.get("name")
        if isinstance(name, str):
            out["name"] = name
        if role == "assistant":
            calls = message.get("tool_calls")
            if isinstance(calls, list) and calls:
                out["tool_calls"] = [_tool_call(c) for c in calls]
            reasoning = message.get("reasoning")
            if reasoning is not None:
                out["reasoning"] = out["reasoning_content"] = reasoning
        elif role == "tool" and "tool_call_id" in message:
            out["tool_call_id"] = message["tool_call_id"]
        return out

    def _content(self, content: object) -> object:
        if isinstance(content, str) and self.content_format == "string":
            return content
        texts = content_texts(content)
        if self.content_format == "string":
            return "\n".join(texts)
        return [{"type": "text", "text": t} for t in texts]


def content_texts(content: object) -> list[str]:
    """A message content's text parts (a string is one); raises
    :class:`UnrenderableError` for anything else (images, audio, files …: the server
    would fetch or decode them, which the gateway does not)."""
    if content is None:
        return []
    if isinstance(content, str):
        return [content]
    if not isinstance(content, list):
        raise UnrenderableError("message content must be text or a list of parts")
    texts: list[str] = []
    for part in content:
        if isinstance(part, str):
            texts.append(part)
        elif isinstance(part, dict) and part.get("type") == "text":
            text = part.get("text")
            if not isinstance(text, str):
                raise UnrenderableError("a text part without text")
            texts.append(text)
        else:
            raise UnrenderableError("non-text content parts are not rendered by the gateway")
    return texts


def _tool_call(call: object) -> object:
    """A tool call with its ``arguments`` JSON text parsed (vLLM's
    ``_postprocess_messages``: invalid or non-object JSON becomes ``{}``)."""
    if not isinstance(call, dict):
        raise UnrenderableError("assistant tool_calls entries must be objects")
    function = call.get("function")
    if call.get("type", "function") != "function" or not isinstance(function, dict):
        raise UnrenderableError("only function tool calls are rendered")
    arguments = function.get("arguments")
    parsed: object = {}
    if isinstance(arguments, dict):
        parsed = arguments
    elif isinstance(arguments, str) and arguments:
        try:
            parsed = json.loads(arguments)
        except json.JSONDecodeError:
            parsed = {}
        if not isinstance(parsed, dict):
            parsed = {}
    return {**call, "function": {**function, "arguments": parsed}}


def _detect_format(ast: jinja2.nodes.Template) -> ContentFormat:
    """``openai`` when the template loops over a message's content (``for part in
    message['content']``, ``for part in message.content``, or over a variable named
    ``content``), else ``string`` — the common cases of vLLM's ``_detect_content_format``
    (``vllm/renderers/hf.py`` at v0.32.0; its macro-parameter tracking is not
    reproduced: set ``contentFormat`` for such templates)."""
    for loop in ast.find_all(jinja2.nodes.For):
        if _is_content(loop.iter):
            return "openai"
    return "string"


def _is_content(node: jinja2.nodes.Node) -> bool:
    if isinstance(node, jinja2.nodes.Name):
        return node.name == "content"
    if isinstance(node, jinja2.nodes.Getattr):
        return node.attr == "content"
    if isinstance(node, jinja2.nodes.Getitem):
        arg = node.arg
        return isinstance(arg, jinja2.nodes.Const) and arg.value == "content"
    if isinstance(node, jinja2.nodes.Filter | jinja2.nodes.Test):
        inner = node.node
        return inner is not None and _is_content(inner)
    return False


__all__ = [
    "ChatTemplate",
    "ContentFormat",
    "TemplateRejectedError",
    "UnrenderableError",
    "content_texts",
    "environment",
    "template_source",
]
