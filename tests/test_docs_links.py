"""README.md's links resolve (mkdocs --strict checks docs/, but not the README), and the way in reads
as a path: README -> getting started -> which method, without sending a newcomer through the long
reference pages (models, results) first."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LINK = re.compile(r"\]\(([^)\s]+)\)")


def slug(heading: str) -> str:
    """GitHub's and mkdocs' anchor for a heading: lower case, punctuation dropped, spaces to '-'."""
    text = re.sub(r"[`*_]", "", heading.strip().lower())
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    text = re.sub(r"^```.*?^```", "", path.read_text(encoding="utf-8"), flags=re.S | re.M)
    return {slug(m.group(1)) for m in re.finditer(r"^#{1,6}\s+(.*)$", text, re.M)}


def relative_links(path: Path) -> list[str]:
    text = re.sub(r"^```.*?^```", "", path.read_text(encoding="utf-8"), flags=re.S | re.M)
    return [u for u in LINK.findall(text) if not re.match(r"[a-z]+:", u)]


def broken_links(path: Path) -> list[str]:
    broken = []
    for url in relative_links(path):
        target, _, anchor = url.partition("#")
        file = (path.parent / target).resolve() if target else path
        if not file.exists():
            broken.append(f"{url}: no such file")
        elif anchor and file.suffix == ".md" and anchor not in anchors(file):
            broken.append(f"{url}: no heading with anchor #{anchor} in {file.name}")
    return broken


def test_slug_matches_the_renderers():
    assert slug("The main job on Gemma 3 (`bash scripts/main.sh`)") == "the-main-job-on-gemma-3-bash-scriptsmainsh"
    assert slug("Mixture of experts: experts as units") == "mixture-of-experts-experts-as-units"


def test_a_broken_link_is_found(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("# Title\n\n[ok](page.md#title) [gone](missing.md) [bad anchor](page.md#nothing)\n")
    assert len(broken_links(page)) == 2


@pytest.mark.parametrize("name", ["README.md", "docs/getting-started.md", "docs/which-method.md", "docs/index.md"])
def test_links_of_the_way_in_resolve(name):
    assert broken_links(ROOT / name) == []


def test_the_way_in_is_a_path_that_skips_the_reference_pages():
    readme = relative_links(ROOT / "README.md")
    start = relative_links(ROOT / "docs/getting-started.md")
    assert "docs/getting-started.md" in readme and "docs/which-method.md" in readme
    assert any(u.startswith("which-method.md") for u in start)
    # before its first result the README sends no one to the long reference pages as a whole; a link to
    # one of their sections, citing where a number was measured, is fine
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    opening = text[: text.index("## Ten lines")]
    for url in LINK.findall(opening):
        assert url.split("#")[0] not in ("docs/models.md", "docs/results.md") or "#" in url, url
