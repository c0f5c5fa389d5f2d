"""A profile's ``tokenizer``: the simulator (its HTTP API and the discrete-event lab) sizes
text prompts in the model's tokens, as vLLM does; without one, built-in 4-byte tokens."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
from tokenizers import Tokenizer, models, pre_tokenizers, processors, trainers

from sluicegate.bench.des_requests import engine_sequence
from sluicegate.model_tokenizer import TokenizerLoadError
from sluicegate.sim.api import parse_generate
from sluicegate.sim.engine import Engine
from sluicegate.sim.profile_file import ProfileFileError, dump_profile, load_profile_file
from sluicegate.sim.profiles import get_profile
from sluicegate.sim.prompt_tokens import PromptTokens, pack
from sluicegate.tokens import count_bytes_tokens

TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}\n"
    "{% endfor %}{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)
WORDS = "the quick brown fox jumps over lazy dogs while seven wizards quietly box".split()


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small word-piece-ish BPE (about 2 characters per token on its own words)."""
    out = tmp_path_factory.mktemp("tok")
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    trainer = trainers.BpeTrainer(
        vocab_size=60, special_tokens=["<unk>", "<s>", "<|user|>", "<|assistant|>"]
    )
    tok.train_from_iterator([" ".join(WORDS)] * 50, trainer=trainer)
    bos = tok.token_to_id("<s>")
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", special_tokens=[("<s>", bos)]
    )
    tok.save(str(out / "tokenizer.json"))
    config = {"bos_token": "<s>", "unk_token": "<unk>", "chat_template": TEMPLATE}
    (out / "tokenizer_config.json").write_text(json.dumps(config))
    return out


def _ids(tokenizer_dir: Path, text: str, special: bool = True) -> list[int]:
    tok = Tokenizer.from_file(str(tokenizer_dir / "tokenizer.json"))
    return list(tok.encode(text, add_special_tokens=special).ids)


def test_completion_prompts_are_sized_in_the_model_tokens(tokenizer_dir: Path) -> None:
    tokens = PromptTokens.load(str(tokenizer_dir))
    text = " ".join(WORDS * 3)
    body = orjson.dumps({"model": "m", "prompt": text, "max_tokens": 4})
    ids = _ids(tokenizer_dir, text)  # with the BOS, as vLLM encodes a completion
    sized = parse_generate(body, False, tokens)
    assert sized.prompt == pack(ids)
    assert count_bytes_tokens(sized.prompt) == len(ids)
    # Built-in: 4 bytes per token, fewer tokens than this small vocabulary makes.
    assert count_bytes_tokens(parse_generate(body, False).prompt) == -(-len(text) // 4)
    assert len(ids) > -(-len(text) // 4)
    # A prompt of token ids is taken as it is, either way.
    given = orjson.dumps({"model": "m", "prompt": [5, 6, 7]})
    assert parse_generate(given, False, tokens).prompt == parse_generate(given, False).prompt


def test_chat_prompts_render_the_models_template(tokenizer_dir: Path) -> None:
    tokens = PromptTokens.load(str(tokenizer_dir))
    messages = [{"role": "user", "content": "the lazy fox"}]
    body = orjson.dumps({"model": "m", "messages": messages})
    rendered = "<s><|user|>\nthe lazy fox\n<|assistant|>\n"
    # the template writes the BOS; chat text is encoded without special tokens (vLLM)
    assert parse_generate(body, True, tokens).prompt == pack(
        _ids(tokenizer_dir, rendered, special=False)
    )


def test_the_simulator_and_the_gateway_apply_the_same_prompt_rules(tokenizer_dir: Path) -> None:
    """One implementation of vLLM's rules (``sluicegate.model_tokenizer``): a simulated
    server sizes a prompt in exactly the ids the gateway's ``source: local`` tokenizer
    routes it by, and both give up on the same prompts."""
    from sluicegate.api.tokenizer import TokenizerSettings
    from sluicegate.framework import LLMRequest
    from sluicegate.tokenization.local import LocalTokenizer

    sim = PromptTokens.load(str(tokenizer_dir))
    gateway = LocalTokenizer.load(TokenizerSettings(source="local", path=str(tokenizer_dir)))
    text = " ".join(WORDS * 2)
    bodies: list[tuple[dict[str, object], bool]] = [
        ({"prompt": text}, False),
        ({"prompt": text, "add_special_tokens": False}, False),
        ({"prompt": [text, "seven wizards"]}, False),
        ({"prompt": [3, 4, 5]}, False),
        ({"messages": [{"role": "user", "content": text}]}, True),
        ({"messages": [{"role": "user", "content": text}], "add_special_tokens": True}, True),
        ({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, True),
        ({"prompt": {"not": "a prompt"}}, False),
    ]
    given_up = 0
    for body, chat in bodies:
        request = LLMRequest(
            request_id="r",
            model="m",
            target_model="m",
            prompt=b"",
            prompt_tokens=0,
            arrival=0.0,
            kind="chat" if chat else "completions",
            body=body,
        )
        ids = gateway.token_ids(request)
        assert sim.encode(body, chat) == (None if ids is None else pack(ids)), body
        given_up += ids is None
    assert given_up == 2


def test_engines_of_a_profile_with_a_tokenizer_share_blocks_by_token_ids(
    tokenizer_dir: Path,
) -> None:
    profile = replace(get_profile("tiny"), tokenizer=str(tokenizer_dir))
    engine = Engine(profile)
    assert engine.prompt_tokens is not None
    assert engine.fork().prompt_tokens is engine.prompt_tokens
    head = " ".join(WORDS * 40)

    def seq(question: str, rid: str) -> object:
        body = orjson.dumps({"model": "m", "prompt": f"{head} {question}", "max_tokens": 2})
        return engine_sequence(body, False, "m", rid, 0.0, engine, "m", 0)

    a, b = seq("quick dogs", "a"), seq("seven wizards box", "b")
    assert a.prompt_tokens == len(_ids(tokenizer_dir, f"{head} quick dogs"))
    engine.add(a)
    engine.add(b)
    shared = len(_ids(tokenizer_dir, head)) // profile.block_size
    assert shared >= 2
    assert a.hashes[:shared] == b.hashes[:shared]
    # Without the tokenizer the same prompt is counted in built-in tokens.
    plain = engine_sequence(
        orjson.dumps({"model": "m", "prompt": f"{head} quick dogs", "max_tokens": 2}),
        False,
        "m",
        "c",
        0.0,
        Engine(get_profile("tiny")),
        "m",
        0,
    )
    assert plain.prompt_tokens == -(-len(f"{head} quick dogs") // 4) < a.prompt_tokens


async def test_a_simulated_server_counts_in_the_model_tokens(
    tokenizer_dir: Path, sim_cluster: Any
) -> None:
    """Over HTTP: ``/tokenize`` and the usage of a completion agree with the tokenizer."""
    cluster = await sim_cluster(
        replicas=1, profile=replace(get_profile("tiny"), tokenizer=str(tokenizer_dir))
    )
    url = cluster.replicas[0].url
    text = " ".join(WORDS * 5)
    ids = _ids(tokenizer_dir, text)
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as http:
        async with http.post(url + "/tokenize", json={"prompt": text}) as r:
            assert (await r.json())["tokens"] == ids
        body = {"model": "tiny-llama", "prompt": text, "max_tokens": 2}
        async with http.post(url + "/v1/completions", json=body) as r:
            assert r.status == 200
            assert (await r.json())["usage"]["prompt_tokens"] == len(ids)


def test_profile_file_tokenizer_paths(tokenizer_dir: Path, tmp_path: Path) -> None:
    profile = replace(get_profile("tiny"), tokenizer="tok/tokenizer.json")
    (tmp_path / "tok").mkdir()
    (tmp_path / "tok" / "tokenizer.json").write_bytes(
        (tokenizer_dir / "tokenizer.json").read_bytes()
    )
    path = tmp_path / "p.yaml"
    path.write_text(dump_profile(profile))
    # relative to the file's folder, whatever the working directory
    loaded = load_profile_file(path)
    assert loaded.tokenizer == str(tmp_path / "tok" / "tokenizer.json")
    assert Engine(loaded).prompt_tokens is not None
    path.write_text(dump_profile(replace(profile, tokenizer="missing.json")))
    with pytest.raises(ProfileFileError, match=r"tokenizer: .*missing\.json does not exist"):
        load_profile_file(path)
    (tmp_path / "bad.json").write_text("{}")
    path.write_text(dump_profile(replace(profile, tokenizer="bad.json")))
    with pytest.raises(ProfileFileError, match=r"tokenizer: cannot load tokenizer"):
        load_profile_file(path)
    # the default stays the built-in tokenizer
    assert get_profile("tiny").tokenizer is None
    assert Engine(get_profile("tiny")).prompt_tokens is None


def test_a_file_that_is_no_tokenizer_is_a_load_error(tmp_path: Path) -> None:
    bad = tmp_path / "tokenizer.json"
    bad.write_text("{}")
    with pytest.raises(TokenizerLoadError):
        PromptTokens.load(str(bad))


def test_calibrate_writes_a_tokenizer_path_that_loads_through_a_symlinked_folder(
    tokenizer_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``sim calibrate --tokenizer tok --out link/p.yaml`` with ``link`` a symlink to a
    folder elsewhere: the path written into the profile is relative to the folder the
    file really is in (``..`` from there is where the system resolves it)."""
    from sluicegate.cli.sim_calibrate import _relative_to

    # the tokenizer itself a link into a blob folder, as in a Hugging Face cache
    (tmp_path / "blobs").mkdir()
    (tmp_path / "blobs" / "3f2a").write_bytes((tokenizer_dir / "tokenizer.json").read_bytes())
    (tmp_path / "tok").mkdir()
    (tmp_path / "tok" / "tokenizer.json").symlink_to(Path("..") / "blobs" / "3f2a")
    real = tmp_path / "deep" / "profiles"
    real.mkdir(parents=True)
    (tmp_path / "link").symlink_to(real)
    monkeypatch.chdir(tmp_path)
    written = _relative_to("tok/tokenizer.json", Path("link"))
    out = Path("link") / "p.yaml"
    out.write_text(dump_profile(replace(get_profile("tiny"), tokenizer=written)))
    loaded = load_profile_file(out)
    assert loaded.tokenizer is not None
    assert Path(loaded.tokenizer).resolve() == (tmp_path / "tok" / "tokenizer.json").resolve()
    assert Path(loaded.tokenizer).name == "tokenizer.json"  # the link, not its blob


def test_the_engines_of_one_run_load_the_tokenizer_once(
    tokenizer_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A large vocabulary's tokenizer costs seconds and tens of MB per load: the lab's
    engines, a cluster's replicas and a restarted replica share one load per path."""
    from sluicegate.bench.des import ClusterSimulation
    from sluicegate.bench.des_spec import ClusterSpec
    from sluicegate.bench.policies import policy_config
    from sluicegate.sim.server import ReplicaOptions, SimCluster

    loads: list[str] = []
    real_load = PromptTokens.load.__func__  # type: ignore[attr-defined]

    def counting(cls: type[PromptTokens], path: str) -> PromptTokens:
        loads.append(path)
        return real_load(cls, path)  # type: ignore[no-any-return]

    monkeypatch.setattr(PromptTokens, "load", classmethod(counting))
    profile = replace(get_profile("tiny"), tokenizer=str(tokenizer_dir))
    picker, predictor = policy_config("round-robin")
    sim = ClusterSimulation(ClusterSpec(profile, 4, picker, model="m", predictor=predictor))
    assert len(loads) == 1
    assert all(e.prompt_tokens is sim.engines[0].prompt_tokens for e in sim.engines)
    loads.clear()
    cluster = SimCluster(ReplicaOptions(profile=profile), 3)
    assert len(loads) == 1
    first = cluster.replicas[0].engine.prompt_tokens
    assert first is not None
    assert all(r.engine.prompt_tokens is first for r in cluster.replicas)
    cluster.replicas[1].driver.reset(False)  # a restarted server
    assert cluster.replicas[1].engine.prompt_tokens is first
    assert len(loads) == 1


def test_each_new_prefix_cache_is_a_new_empty_one(tokenizer_dir: Path) -> None:
    """``new_prefix_cache`` is a factory: each call (the simulator's, the gateway's
    ``local`` tokenizer's) gets its own cache, sharing no entries."""
    tokens = PromptTokens.load(str(tokenizer_dir))
    text = " ".join(WORDS * 3)
    first = tokens.model.new_prefix_cache(1 << 20, 8)
    second = tokens.model.new_prefix_cache(1 << 20, 8)
    assert len({id(first), id(second), id(tokens.cache)}) == 3
    assert list(first.encode(text)) == _ids(tokenizer_dir, text, special=False)
    assert (len(first), len(second), len(tokens.cache)) == (1, 0, 0)
