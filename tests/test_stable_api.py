"""The stable API stated in docs/api/stable.md is exactly what the public namespaces export.

A name joins or leaves the stable API by an edit of that page and of the namespace's ``__all__``
together; this test fails when one changes without the other, and when a stated name does not
resolve.
"""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

PAGE = Path(__file__).resolve().parents[1] / "docs" / "api" / "stable.md"


def _stated() -> dict[str, list[str]]:
    """``{namespace: [names]}`` from the page: a ``## Namespace `name` `` heading, then its names in backticks."""
    stated: dict[str, list[str]] = {}
    current = None
    for line in PAGE.read_text().splitlines():
        heading = re.fullmatch(r"## Namespace `(capinterp(?:\.\w+)*)`", line)
        if heading:
            current = heading.group(1)
            stated[current] = []
        elif line.startswith("#"):
            current = None
        elif current and line.startswith("Names:"):
            stated[current] += re.findall(r"`([\w.]+)`", line)
    return stated


STATED = _stated()


def test_page_states_every_public_namespace():
    assert "capinterp" in STATED and len(STATED) >= 10, sorted(STATED)


@pytest.mark.parametrize("namespace", sorted(STATED))
def test_stated_names_are_the_namespace_exports(namespace):
    module = importlib.import_module(namespace)
    exported = sorted(getattr(module, "__all__", []))
    stated = sorted(STATED[namespace])
    assert stated == exported, (
        f"docs/api/stable.md and {namespace}.__all__ differ: only on the page {sorted(set(stated) - set(exported))}, "
        f"only in __all__ {sorted(set(exported) - set(stated))}"
    )
    for name in stated:
        assert hasattr(module, name), f"{namespace}.{name} is stated stable but does not resolve"
