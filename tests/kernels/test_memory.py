"""batch_size="auto" and out-of-memory retries: the same work is redone with a smaller batch,
nothing is lost or counted twice, and the scores equal a run that never ran out of memory."""

import pytest
import torch

from capinterp.arch.model import load_model
from capinterp.data import arithmetic
from capinterp.kernels import memory
from capinterp.localizers.cnl import CNL
from capinterp.localizers.dcsn import DCSN


@pytest.fixture(scope="module")
def tiny():
    return load_model("tiny", threads=1)


@pytest.fixture(scope="module")
def ds():
    return arithmetic(ops="+", n=6, seed=0)


class TightCNL(CNL):
    """CNL on a device that 'holds' at most 4 IG rows per batch."""

    def _score_chunk(self, items):
        if self.batch_size_ > 4:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return super()._score_chunk(items)


class TightDCSN(DCSN):
    """DCSN on a device that 'holds' at most 2 prompts per forward."""

    calls: list[int]

    def _score_chunk(self, items):
        self.calls.append(len(items))
        if len(items) > 2:
            raise RuntimeError("[enforce fail at alloc_cpu.cpp:117] DefaultCPUAllocator: can't allocate memory")
        return super()._score_chunk(items)


def test_auto_batch_size_is_the_largest_power_of_two_that_fits(monkeypatch):
    monkeypatch.setattr(memory, "free_bytes", lambda device: 1000)
    assert memory.auto_batch_size("cpu", 10) == 32  # half of 1000 B holds 50 rows of 10 B
    assert memory.auto_batch_size("cpu", 10_000) == 1
    assert memory.auto_batch_size("cpu", 1, cap=64) == 64
    with pytest.raises(ValueError, match="row_bytes"):
        memory.auto_batch_size("cpu", 0)
    assert memory.free_bytes("cpu") > 0


def test_out_of_memory_halves_the_ig_batch_and_loses_nothing(tiny, ds):
    ref = CNL(tiny, steps=6, batch_size=4, progress=False).fit(ds)
    tight = TightCNL(tiny, steps=6, batch_size=64, progress=False).fit(ds)
    assert tight.batch_size_ == 4 and tight.oom_retries_ == 4 and tight.batch_size == 64
    assert tight.sums_.done == set(range(len(ds)))
    torch.testing.assert_close(tight.scores_[:], ref.scores_[:], rtol=1e-5, atol=1e-7)
    assert tight.neurons_.keys() == ref.neurons_.keys()


def test_out_of_memory_splits_a_dcsn_chunk(tiny, ds):
    ref = DCSN(tiny, batch_size=2, progress=False).fit(ds)
    tight = TightDCSN(tiny, batch_size=6, progress=False)
    tight.calls = []
    tight.fit(ds)
    assert tight.calls[0] == 6 and max(tight.calls[1:]) <= 3
    torch.testing.assert_close(tight.scores_[:], ref.scores_[:], rtol=1e-5, atol=1e-7)


def test_other_errors_are_not_retried(tiny, ds):
    class Broken(DCSN):
        def _score_chunk(self, items):
            raise RuntimeError("shape mismatch")

    with pytest.raises(RuntimeError, match="shape mismatch"):
        Broken(tiny, progress=False).fit(ds)


def test_batch_size_auto_fits_and_matches(tiny, ds):
    auto = DCSN(tiny, batch_size="auto", progress=False).fit(ds)
    assert auto.batch_size == "auto" and auto.batch_size_ >= 1
    assert auto.get_params()["batch_size"] == "auto"
    ref = DCSN(tiny, batch_size=6, progress=False).fit(ds)
    torch.testing.assert_close(auto.scores_[:], ref.scores_[:], rtol=1e-5, atol=1e-7)
    cnl = CNL(tiny, steps=4, batch_size="auto", progress=False).fit(ds)
    assert cnl.batch_size_ >= 1
    with pytest.raises(ValueError, match="batch_size must be an integer >= 1"):
        DCSN(tiny, batch_size="big")
