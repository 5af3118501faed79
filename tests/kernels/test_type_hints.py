"""The jaxtyping annotations of the kernels resolve (issue 29): ``typing.get_type_hints`` on every
public function of every ``capinterp.kernels`` module."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import typing

import pytest

import capinterp.kernels


def _public_functions():
    for info in pkgutil.iter_modules(capinterp.kernels.__path__):
        mod = importlib.import_module(f"capinterp.kernels.{info.name}")
        for name, obj in vars(mod).items():
            if not name.startswith("_") and inspect.isfunction(obj) and obj.__module__ == mod.__name__:
                yield pytest.param(obj, id=f"{info.name}.{name}")


FUNCTIONS = list(_public_functions())


def test_functions_found():
    ids = {p.id for p in FUNCTIONS}
    assert {"ig.ig_alphas", "ig.objective_from_logits", "prefix.clean_suffix", "quadrature.quadrature"} <= ids


@pytest.mark.parametrize("fn", FUNCTIONS)
def test_type_hints_resolve(fn):
    typing.get_type_hints(fn)
