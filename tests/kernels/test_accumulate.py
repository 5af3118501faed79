import pytest
import torch

from capinterp.data import Example
from capinterp.kernels.accumulate import ScoreSum, dataset_fingerprint


def test_merge_of_shards_is_exact():
    rows = [torch.randn(3, 5) for _ in range(6)]
    whole = ScoreSum((3, 5), {"m": 1})
    a, b = ScoreSum((3, 5), {"m": 1}), ScoreSum((3, 5), {"m": 1})
    for i, r in enumerate(rows):
        whole.add(i, r)
        (a if i % 2 else b).add(i, r)
    merged = a.merge(b)
    assert merged.count == 6
    torch.testing.assert_close(merged.mean(), whole.mean(), rtol=0, atol=1e-7)
    with pytest.raises(ValueError, match="overlap"):
        merged.merge(a)
    with pytest.raises(ValueError, match="different computations"):
        a.merge(ScoreSum((3, 5), {"m": 2}))


def test_checkpoint_round_trip_and_key_check(tmp_path):
    s = ScoreSum((2, 4), {"method": "x", "params": {"k": (1, 2)}})
    s.add(3, torch.ones(2, 4))
    p = tmp_path / "c.ckpt"
    s.save(p)
    r = ScoreSum.resume(p, (2, 4), {"method": "x", "params": {"k": (1, 2)}})
    assert r.done == {3} and torch.equal(r.sum, s.sum)
    with pytest.raises(ValueError, match="different computation"):
        ScoreSum.resume(p, (2, 4), {"method": "y"})
    with pytest.raises(ValueError, match="shape"):
        ScoreSum.resume(p, (3, 4), {"method": "x", "params": {"k": (1, 2)}})


def test_corrupted_checkpoint_is_a_clear_error(tmp_path):
    p = tmp_path / "bad.ckpt"
    p.write_bytes(b"\x00garbage" * 10)
    with pytest.raises(ValueError, match="not a valid capinterp checkpoint"):
        ScoreSum.load(p)


def test_add_checks_and_empty_mean():
    s = ScoreSum((2, 2))
    with pytest.raises(ValueError, match="no example"):
        s.mean()
    s.add(0, torch.zeros(2, 2))
    with pytest.raises(ValueError, match="already added"):
        s.add(0, torch.zeros(2, 2))
    with pytest.raises(ValueError, match="do not fit"):
        s.add(1, torch.zeros(3, 2))


def test_dataset_fingerprint_depends_on_order_and_text():
    a = [Example("1+1=", "2"), Example("2+2=", "4")]
    assert dataset_fingerprint(a) == dataset_fingerprint(list(a))
    assert dataset_fingerprint(a) != dataset_fingerprint(a[::-1])
    assert dataset_fingerprint(a) != dataset_fingerprint([Example("1+1=", "3"), a[1]])
