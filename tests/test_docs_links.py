"""Every relative link in the README and docs/ points at a file of the repository."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", ROOT / "CHANGELOG.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


def links(page: Path) -> list[str]:
    return [t for t in LINK.findall(page.read_text()) if "://" not in t]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_relative_links_resolve(page):
    missing = [t for t in links(page) if not (page.parent / t).exists()]
    assert missing == []


def test_the_link_check_sees_links(tmp_path):
    page = tmp_path / "p.md"
    page.write_text("see [a](docs/a.md), [b](https://x.org) and [c](c.md#part)")
    assert links(page) == ["docs/a.md", "c.md"]
