"""``source: local``: loading, chat rendering as transformers renders it, special tokens as
vLLM adds them, and the requests it routes approximately."""

from __future__ import annotations

import json
import shutil
import subprocess
from array import array
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError
from tokenizers import Tokenizer

from sluicegate.api.loader import ConfigError, parse_config
from sluicegate.api.tokenizer import TokenizerSettings
from sluicegate.framework import LLMRequest
from sluicegate.tokenization.base import TokenizerLoadError
from sluicegate.tokenization.build import build_tokenizers
from sluicegate.tokenization.local import LocalTokenizer

VLLM_PYTHON = Path("/work/main/.venv-vllm/bin/python")

CHAT: dict[str, Any] = {
    "model": "m",
    "messages": [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": [{"type": "text", "text": "Kalo mine"}, "ru sa?"]},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"x": 1}'}}
            ],
        },
        {"role": "user", "content": "Don't 1234 — naïve?"},
    ],
}


def request(kind: str, body: dict[str, Any]) -> LLMRequest:
    return LLMRequest("r", "m", "m", b"", 0, 0.0, kind=kind, body=body)


def local(path: Path, **settings: Any) -> LocalTokenizer:
    return LocalTokenizer.load(TokenizerSettings(source="local", path=str(path), **settings))


def reference(tiny_dir: Path) -> Tokenizer:
    tok = Tokenizer.from_file(str(tiny_dir / "tokenizer.json"))
    tok.no_truncation()
    return tok


def test_chat_is_rendered_and_encoded_without_special_tokens(tiny_dir: Path) -> None:
    tok = local(tiny_dir)
    ids = tok.token_ids(request("chat", CHAT))
    assert tok.template is not None
    text = tok.template.render(CHAT)
    assert text == (
        "<s><|system|>\nYou are terse.</s>\n"
        "<|user|>\nKalo mineru sa?</s>\n"  # the template loops over parts: openai format
        '<|assistant|>\n[{"id": "c1", "type": "function", "function": {"name": "f", '
        '"arguments": {"x": 1}}}]</s>\n'
        "<|user|>\nDon't 1234 — naïve?</s>\n<|assistant|>\n"
    )
    assert ids == array("I", reference(tiny_dir).encode(text, add_special_tokens=False).ids)
    assert tok.counters.tokenized == 1
    assert tok.template.content_format == "openai"
    joined = local(tiny_dir, content_format="string")
    assert joined.template is not None
    assert "<|user|>\nKalo mine\nru sa?</s>" in joined.template.render(CHAT)  # vLLM joins


def test_completion_gets_the_bos_unless_told_not_to(tiny_dir: Path) -> None:
    tok = local(tiny_dir)
    ref = reference(tiny_dir)
    prompt = "Kalo mine ru sa, 42 times."
    ids = tok.token_ids(request("completions", {"prompt": prompt}))
    assert ids == array("I", ref.encode(prompt, add_special_tokens=True).ids)
    assert ids is not None
    assert ids[0] == ref.token_to_id("<s>")
    bare = tok.token_ids(request("completions", {"prompt": [prompt], "add_special_tokens": False}))
    assert bare == array("I", ref.encode(prompt, add_special_tokens=False).ids)
    given = tok.token_ids(request("completions", {"prompt": [5, 6, 7]}))
    assert given == array("I", [5, 6, 7])


def test_requests_it_cannot_render_are_counted_not_raised(tiny_dir: Path) -> None:
    tok = local(tiny_dir)
    bad_role = {"messages": [{"role": "narrator", "content": "x"}]}
    assert tok.token_ids(request("chat", bad_role)) is None
    image = {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]}
    assert tok.token_ids(request("chat", image)) is None
    assert tok.token_ids(request("other", {"input": "x"})) is None
    continued = {"messages": CHAT["messages"], "continue_final_message": True}
    assert tok.token_ids(request("chat", continued)) is None
    fallbacks = tok.counters.fallbacks
    assert (fallbacks["template"], fallbacks["unsupported"], fallbacks["kind"]) == (1, 2, 1)
    assert tok.counters.tokenized == 0


def test_chat_template_file_overrides_the_config(tiny_dir: Path, tmp_path: Path) -> None:
    template = tmp_path / "t.jinja"
    template.write_text("{% for m in messages %}[{{ m.role }}] {{ m.content }}\n{% endfor %}")
    tok = local(tiny_dir / "tokenizer.json", chat_template=str(template))
    assert tok.template is not None
    assert tok.template.render({"messages": [{"role": "user", "content": "hi"}]}) == "[user] hi\n"


def test_load_errors_are_clear(tiny_dir: Path, tmp_path: Path) -> None:
    with pytest.raises(TokenizerLoadError, match="cannot load tokenizer"):
        local(tmp_path / "missing")
    broken = tmp_path / "broken.jinja"
    broken.write_text("{% for m in messages %}{{ m.content }")
    with pytest.raises(TokenizerLoadError, match=r"chat template of .*broken.jinja: line 1"):
        local(tiny_dir, chat_template=str(broken))
    with pytest.raises(TokenizerLoadError, match="cannot read chatTemplate"):
        local(tiny_dir, chat_template=str(tmp_path / "nope.jinja"))
    with pytest.raises(ValidationError, match="needs a path"):
        TokenizerSettings(source="local")
    with pytest.raises(ValidationError, match="for source 'local'"):
        TokenizerSettings(source="server", path="x")


def test_configuration_errors_name_the_pool(tiny_dir: Path, tmp_path: Path) -> None:
    text = f"""
apiVersion: inference.networking.k8s.io/v1
kind: InferencePool
metadata: {{name: good}}
spec:
  endpoints: [{{address: "127.0.0.1:8000"}}]
  tokenizer: {{source: local, path: "{tiny_dir}", cacheBytes: 16Mi}}
---
apiVersion: inference.networking.k8s.io/v1
kind: InferencePool
metadata: {{name: bad}}
spec:
  endpoints: [{{address: "127.0.0.1:8001"}}]
  tokenizer: {{source: local, path: "{tmp_path / "none"}"}}
"""
    config = parse_config(text)
    assert config.pools["good"].spec.tokenizer.cache_bytes == 16 * 1024 * 1024
    with pytest.raises(ConfigError, match=r"InferencePool bad: spec\.tokenizer: cannot load"):
        build_tokenizers(config)
    good_only = parse_config(text.split("---")[0])
    first = build_tokenizers(good_only)
    again = build_tokenizers(good_only, first)
    assert again["good"] is first["good"]  # unchanged settings: kept, with its cache


def test_a_tokenizer_whose_files_changed_is_reloaded(tiny_dir: Path, tmp_path: Path) -> None:
    model = tmp_path / "model"
    shutil.copytree(tiny_dir, model)
    text = f"""
apiVersion: inference.networking.k8s.io/v1
kind: InferencePool
metadata: {{name: p}}
spec:
  endpoints: [{{address: "127.0.0.1:8000"}}]
  tokenizer: {{source: local, path: "{model}"}}
"""
    config = parse_config(text)
    first = build_tokenizers(config)
    assert build_tokenizers(config, first)["p"] is first["p"]
    template = model / "chat_template.jinja"  # a new template beside the tokenizer
    template.write_text("{% for m in messages %}{{ m.content }}{% endfor %}")
    second = build_tokenizers(config, first)
    assert second["p"] is not first["p"]
    tok = second["p"]
    assert isinstance(tok, LocalTokenizer)
    assert tok.template is not None
    assert tok.template.render({"messages": [{"role": "user", "content": "hi"}]}) == "hi"
    assert build_tokenizers(config, second)["p"] is tok
    config_file = model / "tokenizer_config.json"
    config_file.write_text(config_file.read_text() + " ")  # same mtime second, new size
    assert build_tokenizers(config, second)["p"] is not tok


@pytest.mark.skipif(not VLLM_PYTHON.exists(), reason="needs the vLLM environment's transformers")
def test_ids_equal_transformers_apply_chat_template(tiny_dir: Path) -> None:
    """transformers' own apply_chat_template (what vLLM calls) gives the same ids."""
    script = (
        "import json, sys\n"
        "from transformers import PreTrainedTokenizerFast\n"
        "d = sys.argv[1]\n"
        "t = PreTrainedTokenizerFast(tokenizer_file=d + '/tokenizer.json', bos_token='<s>',"
        " eos_token='</s>', unk_token='<unk>')\n"
        "t.chat_template = json.load(open(d + '/tokenizer_config.json'))['chat_template']\n"
        "msgs = json.loads(sys.argv[2])\n"
        "text = t.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)\n"
        "print(json.dumps(t(text, add_special_tokens=False)['input_ids']))\n"
    )
    messages = [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Kalo mine ru sa? Don't 1234 — naïve!\n\n  ok"},
        {"role": "assistant", "content": "Ti vo ze."},
        {"role": "user", "content": "And   then?"},
    ]
    done = subprocess.run(
        [str(VLLM_PYTHON), "-c", script, str(tiny_dir), json.dumps(messages)],
        capture_output=True,
        text=True,
        timeout=120,
        env={"PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"},
        check=True,
    )
    expected = json.loads(done.stdout.strip().splitlines()[-1])
    ids = local(tiny_dir).token_ids(request("chat", {"messages": messages}))
    assert ids == array("I", expected)
