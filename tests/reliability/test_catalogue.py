"""The catalogue's rows and docs/reliability.md agree."""

from __future__ import annotations

import re
from pathlib import Path

from cases import CURRENT, HARDENED, VALID, VALID_HARDENED


def test_the_catalogue_documents_every_row() -> None:
    """docs/reliability.md lists every row of the tables (and no row that is gone)."""
    doc = (Path(__file__).parents[2] / "docs" / "reliability.md").read_text()
    ids = [c.id for c in (*CURRENT, *HARDENED)] + [r.id for r in (*VALID, *VALID_HARDENED)]
    assert len(set(ids)) == len(ids), "row ids must be unique"
    missing = [i for i in ids if f"| `{i}` |" not in doc]
    assert not missing, f"rows not in docs/reliability.md: {missing}"
    documented = set(re.findall(r"^\| [^|]+ \| `([a-z0-9_/.-]+)` \|", doc, re.MULTILINE))
    assert documented <= set(ids), f"documented rows that do not exist: {documented - set(ids)}"
