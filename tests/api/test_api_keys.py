"""API keys: the rules a key must follow, the three sources ``serve`` reads, and the
``apiKeys`` field of GatewayConfig. No message may contain the key it is about."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from pydantic import ValidationError

from sluicegate.api.keys import (
    ENV_VAR,
    MIN_LENGTH,
    KeySourceError,
    collect_keys,
    key_problem,
    keys_from_env,
    keys_from_file,
)
from sluicegate.api.loader import ConfigError, parse_config
from sluicegate.api.settings import GatewayConfig

GOOD = "sk-team-a_0123456789.~+/=="
OTHER = "Zm9vYmFyYmF6cXV4cXV1eA=="  # base64 of 16 bytes


def test_min_length_is_16() -> None:
    assert MIN_LENGTH == 16
    assert key_problem("a" * 16) is None
    assert key_problem("a" * 15) == "is 15 characters long, fewer than the 16 a key needs"


@pytest.mark.parametrize(
    ("key", "words"),
    [
        ("", "is empty"),
        (" " + GOOD, "whitespace"),
        (GOOD + "\t", "whitespace"),
        (GOOD + "\n", "whitespace"),
        ("abc def ghi jkl mno", "character"),
        ("0123456789abcdef,x", "character"),
        ("0123456789abcdef:x", "character"),
        ("0123456789abcdef=x", "character"),  # '=' only at the end
        ("=0123456789abcdef", "character"),
        ("0123456789abcdéf0", "character"),  # ASCII letters only
        ("short", "5 characters"),
    ],
)
def test_bad_keys_are_named_without_quoting_them(key: str, words: str) -> None:
    problem = key_problem(key)
    assert problem is not None
    assert words in problem
    if key.strip():
        assert key.strip() not in problem


@pytest.mark.parametrize("key", [GOOD, OTHER, "A" * 16, "0123456789abcdef====", "-._~+/" * 3])
def test_good_keys(key: str) -> None:
    assert key_problem(key) is None


def test_key_file(tmp_path: Path) -> None:
    path = tmp_path / "keys"
    path.write_text(f"# team A\n{GOOD}\n\n   \n  # indented comment\r\n{OTHER}\r\n")
    assert keys_from_file(path) == [GOOD, OTHER]


def test_key_file_with_a_bad_key_names_the_line(tmp_path: Path) -> None:
    path = tmp_path / "keys"
    path.write_text(f"{GOOD}\n# next one is short\ntiny-secret\n")
    with pytest.raises(KeySourceError) as info:
        keys_from_file(path)
    assert str(info.value) == (
        f"--api-key-file {path} line 3: the key is 11 characters long, fewer than the 16 a "
        "key needs"
    )
    assert "tiny-secret" not in str(info.value)
    path.write_text(f"{GOOD} \n")  # a trailing space would never match
    with pytest.raises(KeySourceError, match="line 1: the key has leading or trailing"):
        keys_from_file(path)


def test_key_file_missing_or_without_keys(tmp_path: Path) -> None:
    with pytest.raises(KeySourceError, match="cannot be read: No such file or directory"):
        keys_from_file(tmp_path / "absent")
    empty = tmp_path / "empty"
    empty.write_text("# the secret was not mounted\n\n")
    with pytest.raises(KeySourceError, match="holds no key"):
        keys_from_file(empty)
    binary = tmp_path / "binary"
    binary.write_bytes(b"\xff\xfe0123456789abcdef\n")
    with pytest.raises(KeySourceError, match="cannot be read: UnicodeDecodeError"):
        keys_from_file(binary)


def test_environment_variable() -> None:
    assert keys_from_env({}) == []
    assert keys_from_env({ENV_VAR: f"{GOOD},{OTHER}"}) == [GOOD, OTHER]
    assert keys_from_env({ENV_VAR: f"{GOOD}\n{OTHER}\n"}) == [GOOD, OTHER]  # a secret's \n
    assert keys_from_env({ENV_VAR: f"{GOOD}\r\n{OTHER},"}) == [GOOD, OTHER]
    with pytest.raises(KeySourceError, match=f"^{ENV_VAR} is set but holds no key$"):
        keys_from_env({ENV_VAR: ""})  # SLUICEGATE_API_KEYS=$UNSET
    with pytest.raises(KeySourceError, match="holds no key"):
        keys_from_env({ENV_VAR: ",\n"})
    with pytest.raises(KeySourceError) as info:
        keys_from_env({ENV_VAR: f"{GOOD}, {OTHER}"})
    assert str(info.value) == (
        f"{ENV_VAR} entry 2: the key has leading or trailing whitespace (it could never match)"
    )
    assert OTHER not in str(info.value)


def test_collect_keys_in_order_and_names_the_flag(tmp_path: Path) -> None:
    path = tmp_path / "keys"
    path.write_text(OTHER + "\n")
    third = "c" * 20
    assert collect_keys([GOOD], [str(path)], {ENV_VAR: third}) == [GOOD, OTHER, third]
    assert collect_keys([], [], {}) == []
    with pytest.raises(KeySourceError, match=r"^--api-key #2: the key is empty"):
        collect_keys([GOOD, ""], [], {})


def gateway_yaml(keys: object) -> str:
    doc = {"apiVersion": "sluicegate.dev/v1alpha1", "kind": "GatewayConfig"}
    return yaml.safe_dump({**doc, "spec": {"apiKeys": keys}})


def test_config_api_keys_validated_with_field_and_index() -> None:
    assert parse_config(gateway_yaml([GOOD, OTHER])).gateway.api_keys == [GOOD, OTHER]
    with pytest.raises(ConfigError) as info:
        parse_config(gateway_yaml([""]))
    (problem,) = info.value.problems
    assert problem.startswith("<config> document 1 (GatewayConfig): spec.apiKeys: ")
    assert "apiKeys[0] is empty" in problem
    with pytest.raises(ConfigError) as info:
        parse_config(gateway_yaml([GOOD, "sh0rt-secret", f" {OTHER}"]))
    (problem,) = info.value.problems
    assert "apiKeys[1] is 12 characters long" in problem
    assert "apiKeys[2] has leading or trailing whitespace" in problem
    assert "sh0rt-secret" not in problem
    assert OTHER not in problem
    assert GOOD not in problem


def test_validation_error_text_never_shows_the_keys() -> None:
    """``str(ValidationError)`` prints the input by default: not for these models."""
    with pytest.raises(ValidationError) as info:
        GatewayConfig.model_validate(
            {"apiVersion": "v", "kind": "GatewayConfig", "spec": {"apiKeys": [GOOD, "tiny-secret"]}}
        )
    assert "apiKeys[1]" in str(info.value)
    assert "tiny-secret" not in str(info.value)
    assert GOOD not in str(info.value)
