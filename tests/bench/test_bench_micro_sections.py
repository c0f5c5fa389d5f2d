"""A report written as a section of another report's file, and kept when that file is
written again (``bench micro tokenization`` inside ``scheduling.md``)."""

from __future__ import annotations

from sluicegate.bench.micro import merge_report


def test_a_section_is_appended_replaced_and_kept() -> None:
    page = merge_report(None, "scheduling", "# Scheduling\n\nold table\n")
    page = merge_report(page, "tokenization", "## Tokenization\n\nfirst\n")
    assert page.startswith("# Scheduling\n\nold table\n\n<!-- bench micro tokenization: begin")
    assert "first" in page
    page = merge_report(page, "tokenization", "## Tokenization\n\nsecond\n")
    assert "first" not in page
    assert page.count("## Tokenization") == 1
    page = merge_report(page, "scheduling", "# Scheduling\n\nnew table\n")
    assert "old table" not in page
    assert "new table" in page
    assert "second" in page  # the section survives the host report's rewrite
    assert page.count("bench micro tokenization: begin") == 1
