"""Griffe extension for the docs build: render the Sphinx roles of capinterp's docstrings.

capinterp's docstrings refer to other objects with Sphinx roles (``:func:`encode```,
``:class:`~capinterp.units.base.UnitSet```). Markdown has no such syntax, so without this extension
they would show up literally. For every docstring in the package this extension rewrites each
role into

* a link (an *optional* mkdocs-autorefs cross-reference) when the target resolves to an object of
  the package: relative names are looked up like Python names, from the object's own scope
  outwards (then through imports), dotted names component by component;
* plain inline code otherwise (objects outside the package, such as ``torch.Tensor``).

A leading ``~`` shows only the last component, as in Sphinx. The cross-references are optional:
a target that no API page renders (a private helper) becomes plain code instead of failing the
strict build, so only the links written in the documentation pages themselves are checked.

Used by ``mkdocs.yml`` (``plugins.mkdocstrings.handlers.python.options.extensions``); docs only,
not part of the installed package.
"""

from __future__ import annotations

import html
import re
from typing import Any

import griffe

ROLE = re.compile(r":(?:py:)?(?:func|class|mod|meth|data|attr|exc|obj|const|type):`(?P<target>[^`]+)`")


def _member(obj: Any, name: str) -> Any:
    """``obj.members[name]`` with aliases followed; None when absent or unresolvable."""
    try:
        m = obj.members.get(name)
        while m is not None and m.is_alias:
            m = m.final_target
        return m
    except (griffe.AliasResolutionError, griffe.CyclicAliasError, KeyError):
        return None


def _find(root: Any, path: str) -> str | None:
    """The canonical path of ``path`` (dotted, absolute) below ``root``, or None."""
    parts = path.split(".")
    if parts[0] != root.name:
        return None
    obj = root
    for part in parts[1:]:
        obj = _member(obj, part)
        if obj is None:
            return None
    return obj.path


def _resolve(obj: Any, root: Any, target: str) -> str | None:
    """Resolve a role target as seen from ``obj``'s docstring."""
    target = target.lstrip(".").removesuffix("()")
    if target.startswith(root.name + "."):
        return _find(root, target)
    head, _, rest = target.partition(".")
    scope = obj
    while scope is not None:
        try:
            base = scope.resolve(head)
        except (griffe.NameResolutionError, AttributeError, KeyError):
            base = None
        if base is not None:
            found = _find(root, f"{base}.{rest}" if rest else base)
            if found is not None:
                return found
        scope = scope.parent
    return None


def _render(match: re.Match, obj: Any, root: Any) -> str:
    raw = match["target"].strip()
    short = raw.startswith("~")
    target = raw.lstrip("~")
    shown = target.rsplit(".", 1)[-1] if short else target
    path = _resolve(obj, root, target)
    if path is None:
        return f"`{shown}`"
    return f'<autoref identifier="{html.escape(path)}" optional><code>{html.escape(shown)}</code></autoref>'


def _walk(obj: Any, root: Any, seen: set[int]) -> None:
    if id(obj) in seen or obj.is_alias:
        return
    seen.add(id(obj))
    if obj.docstring is not None and ":" in obj.docstring.value:
        obj.docstring.value = ROLE.sub(lambda m: _render(m, obj, root), obj.docstring.value)
    for member in list(obj.members.values()):
        _walk(member, root, seen)


class SphinxRoles(griffe.Extension):
    """Rewrite Sphinx roles in docstrings into optional cross-references or inline code."""

    def on_package(self, *, pkg: Any, **kwargs: Any) -> None:
        _walk(pkg, pkg, set())
