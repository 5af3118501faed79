"""Every method on every model family, checked against plain transformers.

Each module of this package defines ``CHECKS: dict[str, Check]``: a method name (a column of
the family matrix in docs/models.md) -> a function of a family name (a key of
:data:`capinterp.arch.tiny.TINY_FAMILIES`) that builds the family's tiny random model, runs
the method through capinterp, and compares it with a reference written on the plain
transformers model (never capinterp's own path). A check returns nothing when the method
agrees, raises ``AssertionError`` when it does not, and lets
:class:`~capinterp.arch.family.UnsupportedFamily` through when capinterp refuses the family
(the matrix then shows the reason). ``tests/families/test_matrix.py`` runs every pair;
``scripts/gen_family_table.py`` writes the table.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable

from capinterp.arch.tiny import TINY_FAMILIES

__all__ = ["FAMILIES", "Check", "all_checks", "run_check"]

Check = Callable[[str], None]
FAMILIES: tuple[str, ...] = tuple(TINY_FAMILIES)


def all_checks() -> dict[str, Check]:
    """Method name -> check, from every module of this package, in module then definition order."""
    found: dict[str, Check] = {}
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        if info.name.startswith("_"):
            continue
        mod = importlib.import_module(f"{__name__}.{info.name}")
        for name, fn in getattr(mod, "CHECKS", {}).items():
            if name in found:
                raise RuntimeError(f"two family checks are called {name!r} (second in {mod.__name__})")
            found[name] = fn
    return found


def run_check(method: str, family: str) -> str:
    """``"Y"`` when the check passes, ``"refused: <reason>"`` when capinterp refuses the family.

    A failing check raises (``AssertionError`` or the method's own error): a wrong number never
    becomes a table cell.
    """
    from capinterp.arch.family import UnsupportedFamily

    try:
        all_checks()[method](family)
    except UnsupportedFamily as err:
        return f"refused: {err}"
    return "Y"
