"""A chat template runs in the sandbox: reaching for Python internals fails the render
(the ``template`` fallback, counted), never executes code, never raises to the caller."""

from __future__ import annotations

from pathlib import Path

import pytest

from sluicegate.api.tokenizer import TokenizerSettings
from sluicegate.framework import LLMRequest
from sluicegate.tokenization.local import LocalTokenizer

BODY = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


def with_template(tiny_dir: Path, tmp_path: Path, source: str) -> LocalTokenizer:
    template = tmp_path / "t.jinja"
    template.write_text(source)
    settings = TokenizerSettings(source="local", path=str(tiny_dir), chat_template=str(template))
    return LocalTokenizer.load(settings)


@pytest.mark.parametrize(
    "escape",
    [
        "{{ ''.__class__.__mro__ }}",
        "{{ ''.__class__.__mro__[1].__subclasses__() }}",
        "{{ raise_exception.__globals__['os'].system('touch {marker}') }}",
        "{{ cycler.__init__.__globals__.os.popen('touch {marker}').read() }}",
        "{{ namespace.__init__.__globals__['__builtins__']['exec']('open(\"{marker}\", \"w\")') }}",
        "{% set x = [].append.__self__.__class__ %}{{ x.__subclasses__() }}",
    ],
)
def test_escapes_are_the_template_fallback(tiny_dir: Path, tmp_path: Path, escape: str) -> None:
    marker = tmp_path / "executed"
    source = "{% for m in messages %}{{ m.content }}{% endfor %}" + escape.replace(
        "{marker}", str(marker)
    )
    tok = with_template(tiny_dir, tmp_path, source)
    request = LLMRequest("r", "m", "m", b"", 0, 0.0, kind="chat", body=BODY)
    assert tok.token_ids(request) is None
    assert tok.counters.fallbacks["template"] == 1
    assert not marker.exists()
