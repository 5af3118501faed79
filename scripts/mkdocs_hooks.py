"""mkdocs hooks (``hooks:`` in ``mkdocs.yml``): the parts of the site derived from the package.

- ``on_config``: the Localizers section of the nav lists every page in ``docs/localizers/``; a page
  the nav does not name yet is added, titled by its first heading (the part before a colon).
- ``on_page_markdown``: every generated block of a page is filled from the registries and the
  modules (``scripts/gen_docs_tables.py``): the localizer registry, the API entries of the
  localizer modules, the experiments, the metrics, and the architecture's layer and module tables.

So a new localizer is one module plus one docs page: nothing else to edit, nothing to regenerate.
Docs only, not part of the installed package.
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SECTION_DIR = "localizers"


def _gen() -> Any:
    spec = importlib.util.spec_from_file_location("_gen_docs_tables", ROOT / "scripts" / "gen_docs_tables.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


GEN = _gen()


def _pages(entries: list[Any]) -> set[str]:
    found: set[str] = set()
    for entry in entries:
        value = next(iter(entry.values())) if isinstance(entry, dict) else entry
        if isinstance(value, list):
            found |= _pages(value)
        elif isinstance(value, str):
            found.add(value)
    return found


def nav_title(page: Path) -> str:
    """A page's first heading, up to a colon: ``# KN: knowledge neurons`` -> ``KN``."""
    m = re.search(r"^# (.+)$", page.read_text(), re.M)
    return (m.group(1) if m else page.stem).split(": ")[0].strip()


def localizer_section(nav: list[Any], docs_dir: Path) -> list[Any]:
    """The nav section that holds ``localizers/index.md``, with every page of that folder in it.

    A page the nav does not name yet goes after the section's last page of the folder, titled by
    :func:`nav_title`; the section's other entries and their order stay as ``mkdocs.yml`` has them.
    """
    folder = {f"{SECTION_DIR}/{p.name}": p for p in sorted((docs_dir / SECTION_DIR).glob("*.md"))}
    for entry in nav:
        value = next(iter(entry.values())) if isinstance(entry, dict) else None
        if isinstance(value, list) and f"{SECTION_DIR}/index.md" in _pages(value):
            listed = _pages(nav)
            at = 1 + max(i for i, e in enumerate(value) if _pages([e]) & folder.keys())
            value[at:at] = [{nav_title(p): name} for name, p in folder.items() if name not in listed]
            return value
    raise ValueError(f"mkdocs.yml's nav has no section with {SECTION_DIR}/index.md")


def on_config(config: Any) -> Any:
    if config.get("nav"):
        localizer_section(config["nav"], Path(config["docs_dir"]))
    return config


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    return GEN.fill(markdown, ROOT)
