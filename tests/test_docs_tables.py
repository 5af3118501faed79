"""The docs' derived parts (scripts/gen_docs_tables.py, filled at build time by scripts/mkdocs_hooks.py)
follow the registries and the package's modules, and the sources hold no stale copy of them."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml
from script_module import load_script

ROOT = Path(__file__).resolve().parents[1]


def _load(name: str):
    return load_script(name)


@pytest.fixture(scope="module")
def gen():
    return _load("gen_docs_tables")


@pytest.fixture(scope="module")
def hooks():
    return _load("mkdocs_hooks")


def _package_modules() -> list[str]:
    names = []
    for path in (ROOT / "capinterp").rglob("*.py"):
        parts = path.relative_to(ROOT).with_suffix("").parts
        if "__pycache__" not in parts:
            names.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return sorted(names)


def test_sources_hold_empty_blocks_only(gen):
    """Every generated block is in its page once and empty: the build fills it, nothing committed goes stale."""
    assert not gen.stale(), f"generated blocks missing or not empty (the build fills them): {gen.stale()}"
    for page in (ROOT / "docs").rglob("*.md"):
        names = [m.group("name") for m in gen.BLOCK.finditer(page.read_text())]
        assert set(names) <= set(gen.TABLES), f"{page}: unknown generated blocks {names}"


def test_fill_writes_every_block_and_refuses_unknown_ones(gen):
    for name, (page, make) in gen.TABLES.items():
        text = (ROOT / page).read_text()
        filled = gen.fill(text)
        assert make(ROOT) in filled and len(filled) > len(text), name
    with pytest.raises(ValueError, match="unknown generated block 'nope'"):
        gen.fill("<!-- BEGIN GENERATED: nope (scripts/gen_docs_tables.py) -->\n<!-- END GENERATED: nope -->")


def test_tables_list_every_registered_name(gen):
    from capinterp import localizers
    from capinterp.experiments import EXPERIMENTS
    from capinterp.units.metrics import SET_METRICS

    for make, names in (
        (gen.localizers_table, localizers.available()),
        (gen.experiments_table, list(EXPERIMENTS)),
        (gen.metrics_table, list(SET_METRICS)),
    ):
        table = make(ROOT)
        assert all(f"| `{n}` |" in table for n in names)
        assert len(table.splitlines()) == len(names) + 2 + (make is gen.metrics_table) * 2


def test_localizer_api_renders_every_localizer_module_once(gen):
    """Each module of capinterp.localizers has one `:::` entry somewhere in the docs, the API page's generated."""
    from capinterp import localizers

    api = gen.localizer_api(ROOT)
    modules = {cls.__module__ for cls in map(localizers.get, localizers.available())}
    everywhere = [m for p in (ROOT / "docs").rglob("*.md") for m in gen._DIRECTIVE.findall(gen.fill(p.read_text()))]
    package = [m for m in _package_modules() if m.startswith("capinterp.localizers.")]
    assert modules <= set(package)
    assert sorted(m for m in everywhere if m in package) == sorted(package)
    assert api.startswith("::: capinterp.localizers.base") and "query_localization" not in api  # on its own page


def test_every_module_has_a_one_row_summary(gen):
    """A module's row in the architecture tables is the first paragraph of its docstring: there and short."""
    bad = {}
    for name in _package_modules():
        path = ROOT / Path(*name.split("."))
        path = path / "__init__.py" if path.is_dir() else path.with_suffix(".py")
        row = gen.summary(path)
        if not row or len(row) > gen.MAX_SUMMARY:
            bad[name] = len(row)
    assert not bad, f"modules without a first docstring paragraph of 1-{gen.MAX_SUMMARY} characters: {bad}"


def test_module_tables_list_every_module_in_layer_order(gen):
    from test_architecture import LAYERS

    tables = gen.modules_tables(ROOT)
    shown = re.findall(r'identifier="([\w.]+)"', tables)
    layer_pkgs = {f"capinterp.{name}" for name in LAYERS if (ROOT / "capinterp" / name).is_dir()}
    assert sorted(shown) == sorted(m for m in _package_modules() if m not in layer_pkgs)
    order = [m.split(".")[1] if m.count(".") > 1 else "" for m in shown]
    ranks = [(-1 if not o else LAYERS.index(o)) for o in order]
    assert ranks == sorted(ranks), "module tables out of layer order"
    headings = re.findall(r"^### `(\w+)`$", tables, re.M)
    assert headings == [name for name in LAYERS if (ROOT / "capinterp" / name).is_dir()]
    layers = re.findall(r'identifier="capinterp\.(\w+)"', gen.layers_table(ROOT))
    assert layers == headings[::-1]  # top first


def test_summary_becomes_one_table_cell(gen):
    cell = gen._markdown("A |x| role :class:`~capinterp.units.base.UnitSet`,\n  :mod:`capinterp.core` and ``code``.")
    assert cell == r"A \|x\| role `UnitSet`, `capinterp.core` and `code`."


def test_nav_lists_every_localizer_page(hooks, tmp_path):
    """The hook adds a page of docs/localizers/ the nav does not name, titled by its heading, and keeps the rest."""
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text().split("\nnav:")[0].split("\nhooks:")[0])
    assert config["docs_dir"] == "docs"
    nav = yaml.safe_load("nav:" + (ROOT / "mkdocs.yml").read_text().split("\nnav:")[1])["nav"]
    section = hooks.localizer_section(nav, ROOT / "docs")
    listed = {next(iter(e.values())) for e in section}
    assert {f"localizers/{p.name}" for p in (ROOT / "docs/localizers").glob("*.md")} <= listed

    docs = tmp_path / "docs"
    (docs / "localizers").mkdir(parents=True)
    for name, text in {
        "index.md": "# Localizers\n",
        "kn.md": "# KN: knowledge neurons\n",
        "toy.md": "# Toy: x\n",
    }.items():
        (docs / "localizers" / name).write_text(text)
    nav = [
        {"Home": "index.md"},
        {"Localizers": [{"Overview": "localizers/index.md"}, {"KN!": "localizers/kn.md"}, {"QL": "ql.md"}]},
    ]
    section = hooks.localizer_section(nav, docs)
    assert section == [
        {"Overview": "localizers/index.md"},
        {"KN!": "localizers/kn.md"},
        {"Toy": "localizers/toy.md"},
        {"QL": "ql.md"},
    ]
    with pytest.raises(ValueError, match="no section"):
        hooks.localizer_section([{"Home": "index.md"}], docs)


def test_every_test_file_the_docs_name_exists():
    """A doc that cites a test as evidence names a file that is there (tests move between folders)."""
    docs = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    cited = {m for p in docs for m in re.findall(r"\btests/[\w/]+\.py\b", p.read_text())}
    assert cited, "no test cited in the docs: the pattern is wrong"
    missing = sorted(c for c in cited if not (ROOT / c).is_file())
    assert not missing, f"docs cite test files that do not exist: {missing}"
