from __future__ import annotations

from pathlib import Path

import pytest
from tiny_tokenizer import build


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory with the tiny tokenizer's tokenizer.json and tokenizer_config.json."""
    return build(tmp_path_factory.mktemp("tiny-tokenizer"))
