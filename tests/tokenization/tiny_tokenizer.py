"""A tiny byte-level BPE tokenizer with a chat template, trained in the test: the shape of
Llama 3's and Qwen's (a regex ``Split`` pre-tokenizer, then byte-level BPE; special
tokens; a post-processor that puts a BOS before a completion's text)."""

from __future__ import annotations

import json
import random
from pathlib import Path

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers

# Llama 3's pre-tokenizer pattern (its tokenizer.json), as cl100k_base's
SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
    r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
SPECIAL = ["<unk>", "<s>", "</s>", "<|system|>", "<|user|>", "<|assistant|>"]
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{% if message['role'] not in ['system', 'user', 'assistant', 'tool'] %}"
    "{{ raise_exception('unknown role ' + message['role']) }}{% endif %}"
    "<|{{ message['role'] }}|>\n"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for part in message['content'] %}{{ part['text'] }}{% endfor %}{% endif %}"
    "{% if message.tool_calls %}{{ message.tool_calls | tojson }}{% endif %}"
    "{{ eos_token }}\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)
_SYLLABLES = "ka lo mi ne ru sa ti vo ze pa qu de fi go ha ji ly mo nu ox pre tra sol".split()


def corpus(lines: int = 2000, seed: int = 7) -> list[str]:
    rng = random.Random(seed)
    words = ["".join(rng.choice(_SYLLABLES) for _ in range(rng.randint(1, 3))) for _ in range(400)]
    words += "the a of to and in is it you that was for on are with as I don't we'll".split()
    out = []
    for _ in range(lines):
        sentence = " ".join(rng.choice(words) for _ in range(rng.randint(4, 20)))
        out.append(f"{sentence.capitalize()}{rng.choice('.?!,;:')} {rng.randint(0, 99999)}\n")
    return out


def build(out: Path, vocab_size: int = 1024) -> Path:
    """Write ``tokenizer.json`` and ``tokenizer_config.json`` into ``out``; returns ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(SPLIT), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus(), trainer=trainer)
    bos = tok.token_to_id("<s>")
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", bos)]
    )
    tok.save(str(out / "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": "<s>",
        "eos_token": {"content": "</s>", "lstrip": False, "rstrip": False},
        "unk_token": "<unk>",
        "chat_template": CHAT_TEMPLATE,
    }
    (out / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
    return out
