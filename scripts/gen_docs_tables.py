"""The docs' generated parts, derived from the registries and the package's modules at build time.

A generated part is a block between two markers in a docs page, empty in the source:

    <!-- BEGIN GENERATED: NAME (scripts/gen_docs_tables.py) -->
    <!-- END GENERATED: NAME -->

The docs build fills every block (``scripts/mkdocs_hooks.py``, declared under ``hooks:`` in
``mkdocs.yml``), so a new localizer, experiment, metric or module shows up in the site with no
generator to rerun and nothing generated to commit. ``python scripts/gen_docs_tables.py NAME``
prints one part; ``--list`` names them. ``tests/test_docs_tables.py`` checks the parts and that
the sources hold no stale copy.
"""

from __future__ import annotations

import argparse
import ast
import html
import importlib.util
import inspect
import pkgutil
import re
import sys
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PKG = "capinterp"

#: The longest first paragraph a module's docstring may have: it is the module's row in the tables.
MAX_SUMMARY = 200

_ROLE = re.compile(r":(?:py:)?(?:func|class|mod|meth|data|attr|exc|obj|const|type):`(?P<tilde>~?)(?P<target>[^`]+)`")


def _markdown(text: str) -> str:
    """A docstring paragraph as one line of a markdown table cell (roles as code, pipes escaped)."""

    def role(m: re.Match[str]) -> str:
        shown = m.group("target")
        return f"`{shown.rsplit('.', 1)[-1] if m.group('tilde') else shown}`"

    text = _ROLE.sub(role, " ".join(text.split()))
    return text.replace("``", "`").replace("|", "\\|")


def _first_line(obj: object) -> str:
    doc = inspect.getdoc(obj) or ""
    return _markdown(doc.split("\n\n")[0])


def summary(path: Path) -> str:
    """The first paragraph of a module's docstring (read from its source, nothing imported)."""
    doc = ast.get_docstring(ast.parse(path.read_text(), str(path))) or ""
    return " ".join(doc.split("\n\n")[0].split())


# ---------------------------------------------------------------------------------- localizers
def localizers_table(root: Path = ROOT) -> str:
    from capinterp import localizers

    rows = [
        "| name | class | `unit_kind` | `scope` | `per_query` | `checkpointable` | what it does |",
        "|---|---|---|---|---|---|---|",
    ]
    for name in localizers.available():
        cls = localizers.get(name)
        path = f"{cls.__module__}.{cls.__qualname__}"
        caps = cls.capabilities()
        rows.append(
            f"| `{name}` | [`{cls.__name__}`][{path}] | `{caps['unit_kind']}` | `{caps['scope']}` | "
            f"{caps['per_query']} | {caps['checkpointable']} | {_first_line(cls)} |"
        )
    return "\n".join(rows)


_DIRECTIVE = re.compile(r"^::: (\S+)", re.M)


def localizer_api(root: Path = ROOT) -> str:
    """One mkdocstrings ``:::`` entry per module of ``capinterp.localizers`` that no other page renders."""
    elsewhere = set()
    for page in (root / "docs").rglob("*.md"):
        if page != root / "docs/api/localizers.md":
            elsewhere.update(_DIRECTIVE.findall(page.read_text()))
    names = sorted(m.name for m in pkgutil.iter_modules([str(root / PKG / "localizers")]))
    names.sort(key=lambda n: n != "base")  # the contract first
    return "\n\n".join(f"::: {PKG}.localizers.{n}" for n in names if f"{PKG}.localizers.{n}" not in elsewhere)


# --------------------------------------------------------------------------------- experiments
def experiments_table(root: Path = ROOT) -> str:
    from capinterp.experiments import EXPERIMENTS

    rows = ["| # | name | what it reproduces |", "|---|---|---|"]
    for i, (name, (title, _)) in enumerate(EXPERIMENTS.items(), 1):
        rows.append(f"| {i} | `{name}` | {title.replace('|', chr(92) + '|')} |")
    return "\n".join(rows)


def metrics_table(root: Path = ROOT) -> str:
    from capinterp.experiments.scoring import TASK_METRICS
    from capinterp.units.metrics import SET_METRICS

    rows = ["| registry | name | function | definition |", "|---|---|---|---|"]
    for name, fn in SET_METRICS.items():
        path = f"{fn.__module__}.{fn.__qualname__}"
        rows.append(f"| `SET_METRICS` | `{name}` | [`{fn.__name__}`][{path}] | {_first_line(fn)} |")
    for name in TASK_METRICS:
        rows.append(f"| `TASK_METRICS` | `{name}` | | a task score of the experiments' tables |")
    return "\n".join(rows)


# ------------------------------------------------------------------------------ architecture
def layers(root: Path = ROOT) -> list[str]:
    """The package's layers, lowest first: ``LAYERS`` of ``tests/test_architecture.py``."""
    spec = importlib.util.spec_from_file_location("_capinterp_layers", root / "tests/test_architecture.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return [name for name in mod.LAYERS if (root / PKG / name).is_dir()]


def modules(root: Path = ROOT) -> dict[str, list[tuple[str, Path]]]:
    """Every module of the package by layer (``""``: the package root): (dotted name, file)."""
    by_layer: dict[str, list[tuple[str, Path]]] = {"": [], **{name: [] for name in layers(root)}}
    for path in sorted((root / PKG).rglob("*.py")):
        parts = path.relative_to(root).with_suffix("").parts
        if any(p.startswith(".") or p == "__pycache__" for p in parts):
            continue
        dotted = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        layer = parts[1] if len(parts) > 2 else ""
        if layer not in by_layer:
            raise ValueError(f"{path.relative_to(root)} is in no layer of tests/test_architecture.py's LAYERS")
        by_layer[layer].append((dotted, path))
    return by_layer


def _link(dotted: str, shown: str) -> str:
    """An optional cross-reference: a link where an API page renders the module, plain code elsewhere."""
    shown = html.escape(shown).replace("_", "&#95;")  # no markdown emphasis inside the raw HTML
    return f'<autoref identifier="{html.escape(dotted)}" optional><code>{shown}</code></autoref>'


def layers_table(root: Path = ROOT) -> str:
    rows = ["| layer | what it holds |", "|---|---|"]
    for name in reversed(layers(root)):
        rows.append(f"| {_link(f'{PKG}.{name}', name)} | {_markdown(summary(root / PKG / name / '__init__.py'))} |")
    return "\n".join(rows)


def modules_tables(root: Path = ROOT) -> str:
    """One table per layer, lowest first: each module and the first paragraph of its docstring."""
    out = []
    for layer, mods in modules(root).items():
        title = f"`{layer}`" if layer else "The package root"
        out += [f"### {title}", "", "| module | what it is |", "|---|---|"]
        for dotted, path in mods:
            if layer and dotted == f"{PKG}.{layer}":
                continue  # the layer's own __init__: its row is in the layers table
            shown = str(path.relative_to(root / PKG / layer))
            shown = shown.removesuffix("/__init__.py") + "/" if shown.endswith("/__init__.py") else shown
            out.append(f"| {_link(dotted, shown)} | {_markdown(summary(path))} |")
        out.append("")
    return "\n".join(out).rstrip()


# ------------------------------------------------------------------------------------ filling
#: block name -> (the page that holds it, generator)
TABLES: dict[str, tuple[str, Callable[[Path], str]]] = {
    "localizers": ("docs/localizers/index.md", localizers_table),
    "localizer-api": ("docs/api/localizers.md", localizer_api),
    "experiments": ("docs/cli.md", experiments_table),
    "metrics": ("docs/metrics.md", metrics_table),
    "layers": ("docs/architecture.md", layers_table),
    "modules": ("docs/architecture.md", modules_tables),
}

BLOCK = re.compile(
    r"(?P<begin><!-- BEGIN GENERATED: (?P<name>[\w-]+) \(scripts/gen_docs_tables\.py\) -->\n)"
    r"(?P<body>.*?)(?P<end><!-- END GENERATED: (?P=name) -->)",
    re.S,
)


def fill(markdown: str, root: Path = ROOT) -> str:
    """``markdown`` with every generated block filled in (an unknown block name is an error)."""

    def make(m: re.Match[str]) -> str:
        name = m.group("name")
        if name not in TABLES:
            raise ValueError(f"unknown generated block {name!r}; known: {', '.join(TABLES)}")
        return m.group("begin") + TABLES[name][1](root) + "\n" + m.group("end")

    return BLOCK.sub(make, markdown)


def stale(root: Path = ROOT) -> list[str]:
    """Sources whose generated blocks are missing or not empty (a committed copy would go stale)."""
    bad = []
    for name, (page, _) in TABLES.items():
        blocks = [m for m in BLOCK.finditer((root / page).read_text()) if m.group("name") == name]
        if len(blocks) != 1 or blocks[0].group("body").strip():
            bad.append(f"{page}: {name}")
    return bad


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("name", nargs="?", choices=sorted(TABLES), help="print this generated part")
    parser.add_argument("--list", action="store_true", help="name every generated part and its page")
    args = parser.parse_args(argv)
    if args.list or args.name is None:
        for name, (page, _) in TABLES.items():
            print(f"{name}\t{page}")
        return 0
    print(TABLES[args.name][1](ROOT))
    return 0


if __name__ == "__main__":
    sys.exit(main())
