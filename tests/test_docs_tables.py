"""The docs tables of localizers, experiments and metrics match the registries (scripts/gen_docs_tables.py)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def gen():
    spec = importlib.util.spec_from_file_location("gen_docs_tables", ROOT / "scripts" / "gen_docs_tables.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_committed_docs_tables_are_up_to_date(gen):
    stale = [str(p.relative_to(ROOT)) for p, (old, new) in gen.render().items() if old != new]
    assert not stale, f"run `python scripts/gen_docs_tables.py`: out of date: {stale}"


def test_tables_list_every_registered_name(gen):
    from capinterp import localizers
    from capinterp.experiments import EXPERIMENTS
    from capinterp.units.metrics import SET_METRICS

    for make, names in (
        (gen.localizers_table, localizers.available()),
        (gen.experiments_table, list(EXPERIMENTS)),
        (gen.metrics_table, list(SET_METRICS)),
    ):
        table = make()
        assert all(f"| `{n}` |" in table for n in names)
        assert len(table.splitlines()) >= len(names) + 2


def test_a_stale_table_is_found_and_rewritten(gen, tmp_path):
    for page in {p for p, _ in gen.TABLES.values()}:
        (tmp_path / page).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / page).write_text((ROOT / page).read_text())
    page = tmp_path / "docs/localizers/index.md"
    page.write_text(page.read_text().replace("| `kn` | [`KN`]", "| `kn_old` | [`KN`]"))
    pages = gen.render(tmp_path)
    old, new = pages[page]
    assert old != new and "kn_old" in old and "kn_old" not in new
    assert new == (ROOT / "docs/localizers/index.md").read_text()


def test_every_test_file_the_docs_name_exists():
    """A doc that cites a test as evidence names a file that is there (tests move between folders)."""
    import re

    docs = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    cited = {m for p in docs for m in re.findall(r"\btests/[\w/]+\.py\b", p.read_text())}
    assert cited, "no test cited in the docs: the pattern is wrong"
    missing = sorted(c for c in cited if not (ROOT / c).is_file())
    assert not missing, f"docs cite test files that do not exist: {missing}"
