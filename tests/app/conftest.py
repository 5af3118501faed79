"""Fixtures shared by the command-line tests."""

from __future__ import annotations

import pytest

import capinterp.core.model as core_model
from capinterp.app import main_job


@pytest.fixture
def no_load(monkeypatch):
    """Loading a model is an error: a command that fails under it failed before loading."""

    def boom(*a, **k):
        raise AssertionError("the model was loaded before the arguments were checked")

    monkeypatch.setattr(core_model, "load_model", boom)
    monkeypatch.setattr(main_job, "load_model", boom)
