"""Public namespaces show their API only: every public name in ``dir()`` is in ``__all__`` or a submodule,
every name in ``__all__`` exists, and every public module declares ``__all__``."""

from __future__ import annotations

import importlib
import pkgutil
import types
from pathlib import Path

import pytest

import capinterp as ci

PUBLIC = [
    "capinterp",
    "capinterp.app",
    "capinterp.circuits",
    "capinterp.core",
    "capinterp.arch",
    "capinterp.data",
    "capinterp.experiments",
    "capinterp.interventions",
    "capinterp.kernels",
    "capinterp.localizers",
    "capinterp.plots",
    "capinterp.testing",
    "capinterp.units",
    "capinterp.units.metrics",
]


@pytest.mark.parametrize("name", PUBLIC)
def test_public_namespace_leaks_nothing(name):
    mod = importlib.import_module(name)
    assert hasattr(mod, "__all__"), f"{name} has no __all__"
    missing = [n for n in mod.__all__ if not hasattr(mod, n)]
    assert not missing, f"{name}.__all__ names what it lacks: {missing}"

    def submodule(n: str) -> bool:
        v = getattr(mod, n)
        return isinstance(v, types.ModuleType) and v.__name__ == f"{name}.{n}"

    leaked = [n for n in dir(mod) if not n.startswith("_") and n not in mod.__all__ and not submodule(n)]
    assert not leaked, f"dir({name}) shows names outside __all__: {leaked}"


def test_metrics_namespace_is_the_metrics():
    assert {"overlap", "iou", "SET_METRICS"} <= set(dir(ci.metrics))
    assert not {"torch", "np", "pd", "Float", "Bool", "functools"} & set(dir(ci.metrics))


def test_former_aliases_are_gone():
    assert not hasattr(ci, "plotting")  # one name: ci.plots
    assert not hasattr(ci, "results")  # neuron results live in ci.units with the other located units
    assert not (Path(ci.__file__).parent / "results").exists()  # no alias package left behind
    with pytest.raises(ValueError, match="unknown localizer 'kc'"):
        ci.localizers.get("kc")


def test_every_package_declares_all():
    lacking = [
        info.name
        for info in pkgutil.walk_packages(ci.__path__, "capinterp.")
        if info.ispkg and not hasattr(importlib.import_module(info.name), "__all__")
    ]
    assert not lacking, lacking


def test_every_public_module_declares_all():
    """Every module not named with a leading underscore lists its public names, and they exist."""
    lacking, missing = [], []
    for info in pkgutil.walk_packages(ci.__path__, "capinterp."):
        if any(part.startswith("_") for part in info.name.split(".")):
            continue
        mod = importlib.import_module(info.name)
        if not hasattr(mod, "__all__"):
            lacking.append(info.name)
        else:
            missing += [f"{info.name}.{n}" for n in mod.__all__ if not hasattr(mod, n)]
    assert not lacking, f"modules without __all__: {lacking}"
    assert not missing, f"__all__ names what the module lacks: {missing}"
