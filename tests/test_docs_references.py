"""What users read never points outside the repository: no development-checkout paths (the shared
folder beside the repository, its design and algorithm notes, its numbered paper files). Papers are
cited by title and arXiv id; data folders are named through ``CAPINTERP_DATA``.

Scanned: README.md, docs/ (markdown and mkdocs pages), the package (docstrings, comments and the
CLI's help texts are all source text), notebooks (every cell), benchmarks/ and scripts/*.py.
scripts/test.sh is not scanned: it looks for an optional sibling data folder for CI on purpose.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# Each pattern is written so that this file does not match itself.
FORBIDDEN = {
    "numbered paper file": re.compile(r"\bpapers/\d{3}"),
    "shared folder beside the repository": re.compile(r"\.\./" + "shared"),
    "design notes": re.compile(r"\bDESIGN" + r"\.md"),
    "algorithm notes": re.compile(r"\bALGORITHMS" + r"\.md"),
}


def scanned_files() -> list[Path]:
    files = [ROOT / "README.md"]
    files += sorted((ROOT / "docs").rglob("*.md"))
    files += sorted((ROOT / "capinterp").rglob("*.py"))
    files += sorted((ROOT / "notebooks").glob("*.ipynb"))
    files += sorted((ROOT / "benchmarks").rglob("*.py"))
    files += sorted((ROOT / "scripts").glob("*.py"))
    return [f for f in files if f.is_file()]


def offending_lines(text: str) -> list[str]:
    """``"line N: <label>: <line>"`` for every line of ``text`` matching a forbidden pattern."""
    found = []
    for n, line in enumerate(text.splitlines(), 1):
        for label, pattern in FORBIDDEN.items():
            if pattern.search(line):
                found.append(f"line {n}: {label}: {line.strip()[:160]}")
    return found


def test_the_patterns_catch_what_they_are_for():
    bad = "\n".join(
        [
            "see papers/" + "001 Sec. 3",
            "--data ../" + "shared/data",
            "as DESIGN" + ".md measured",
            "ALGORITHMS" + ".md 5.1",
        ]
    )
    assert len(offending_lines(bad)) == 4
    good = "Huang et al., Capability Localization (ICLR 2025, arXiv 2502.20992); --data $CAPINTERP_DATA\n"
    assert offending_lines(good) == []


def test_scanned_files_cover_the_user_facing_tree():
    names = {f.relative_to(ROOT).as_posix() for f in scanned_files()}
    assert "README.md" in names
    assert "docs/getting-started.md" in names
    assert any(n.startswith("notebooks/") for n in names)
    assert any(n.startswith("capinterp/app/") for n in names)
    assert "scripts/test.sh" not in names


@pytest.mark.parametrize("path", scanned_files(), ids=lambda p: p.relative_to(ROOT).as_posix())
def test_no_reference_outside_the_repository(path):
    found = offending_lines(path.read_text(encoding="utf-8"))
    assert not found, (
        f"{path.relative_to(ROOT)} points outside the repository (cite papers by title and arXiv id, "
        "name data folders through CAPINTERP_DATA):\n" + "\n".join(found)
    )
