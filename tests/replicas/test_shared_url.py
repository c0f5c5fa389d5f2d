"""The Redis URL is checked when the configuration is read, and no error or log line ever
quotes it (it may hold a password)."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from sluicegate.api.settings import SharedStateSettings, redacted_url, redis_url_problem

SECRET = "sec"


@pytest.mark.parametrize(
    "url",
    [
        "redis://:sec#ret@127.0.0.1:6379/0",  # '#' ends the authority: port 'sec'
        "redis://:sec/ret@127.0.0.1:6379/0",
        "redis://:sec?ret@127.0.0.1:6379/0",
        "redis://user:sec@[::1:6379/0",  # unbalanced bracket
        "redis://:sec@127.0.0.1:6379/zero",  # not a database number
        "redis://:sec@:6379/0",  # no host
        "http://:sec@127.0.0.1:6379/0",
        "unix://:sec@",
    ],
)
def test_a_bad_url_is_refused_without_quoting_it(url: str) -> None:
    with pytest.raises(ValidationError) as err:
        SharedStateSettings.model_validate({"redis": {"url": url}})
    text = str(err.value)
    assert "url" in text
    assert SECRET not in text
    # What the loader reports (api/loader.py prints each error's location and msg).
    assert all(SECRET not in e["msg"] for e in err.value.errors())
    assert SECRET not in redacted_url(url)  # never raises either


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("redis://:p%23w@127.0.0.1:6379/0", "redis://127.0.0.1:6379/0"),
        ("rediss://user:pw@cache.example:6380/2", "rediss://cache.example:6380/2"),
        ("redis://:pw@[::1]:6379/0", "redis://[::1]:6379/0"),
        ("redis://[fe80::1]/0", "redis://[fe80::1]/0"),
        ("unix:///run/redis.sock", "unix:///run/redis.sock"),
    ],
)
def test_a_good_url_passes_and_logs_without_credentials(url: str, shown: str) -> None:
    assert redis_url_problem(url) is None
    SharedStateSettings.model_validate({"redis": {"url": url}})
    assert redacted_url(url) == shown
