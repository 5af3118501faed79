"""Interchangeable localizers, registered by name: ``capinterp.localizers.get("cnl")``.

Every module of this package is imported here, found with :mod:`pkgutil`, so a new localizer is
one file: ``capinterp/localizers/<name>.py`` with a ``@register("<name>")`` class is registered on
``import capinterp`` and its class is exported from this namespace (``__all__`` lists the registry's
API, :class:`QueryLocalization`, and every class a module of the package registers). Static type
checkers see the modules' own names: import a class from its module
(``from capinterp.localizers.cnl import CNL``) or from the package root (``ci.CNL``).
"""

import importlib as _importlib
import pkgutil as _pkgutil

from capinterp.localizers import base as _base
from capinterp.localizers.base import Localizer, available, get, register
from capinterp.localizers.query_localization import QueryLocalization


def _import_modules() -> list[str]:
    """Import every module of the package; the names of the localizer classes they register, sorted."""
    found: list[str] = []
    for info in _pkgutil.iter_modules(__path__, f"{__name__}."):
        module = _importlib.import_module(info.name)
        for attr in getattr(module, "__all__", ()):
            obj = getattr(module, attr)
            registered = isinstance(obj, type) and _base._REGISTRY.get(getattr(obj, "name", "")) is obj
            if registered and obj.__module__ == module.__name__:
                globals()[attr] = obj
                found.append(attr)
    return sorted(found)


__all__ = ["Localizer", "QueryLocalization", "available", "get", "register", *_import_modules()]
