import pytest
import torch

from capinterp.data import Example
from capinterp.kernels.accumulate import ScoreSum, dataset_fingerprint, key_digest, keyed_path


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


def test_checkpoint_that_is_a_directory_says_so(tmp_path):
    with pytest.raises(ValueError, match="is a directory") as err:
        ScoreSum.load(tmp_path)
    assert "corrupted" not in str(err.value) and "No such device" not in str(err.value)
    with pytest.raises(ValueError, match="is a directory"):
        ScoreSum.resume(tmp_path, (2, 2), {"m": 1})


def test_checkpoint_directory_is_refused_by_a_localizer_before_scoring(tiny, tmp_path):
    import capinterp as ci

    with pytest.raises(ValueError, match="is a directory"):
        ci.DCSN(tiny, checkpoint=tmp_path, progress=False).fit([("1+1=", "2")])


def test_keyed_path_names_a_checkpoint_by_its_computation():
    a = {"method": "cnl", "params": {"steps": 20, "rule": "right"}, "data": "d1"}
    same = {"data": "d1", "params": {"rule": "right", "steps": 20}, "method": "cnl"}  # other order
    other = {**a, "params": {"steps": 50, "rule": "right"}}
    assert keyed_path("o/cnl-{key}.ckpt", a) == keyed_path("o/cnl-{key}.ckpt", same) == f"o/cnl-{key_digest(a)}.ckpt"
    assert keyed_path("o/cnl-{key}.ckpt", other) != keyed_path("o/cnl-{key}.ckpt", a)
    assert keyed_path("o/plain.ckpt", a) == "o/plain.ckpt" and keyed_path(None, a) is None
    assert key_digest({"k": (1, 2)}) == key_digest({"k": [1, 2]})


def test_mismatched_checkpoint_names_only_what_differs(tmp_path):
    key = {"method": "cnl", "params": {"steps": 20, "sigma": 6.0}, "model": "m" * 16, "data": "a" * 16}
    p = tmp_path / "c.ckpt"
    ScoreSum((2, 2), key).save(p)
    with pytest.raises(ValueError) as err:
        ScoreSum.resume(p, (2, 2), {**key, "params": {"steps": 50, "sigma": 6.0}, "data": "b" * 16})
    msg = str(err.value)
    assert "params.steps (20 -> 50)" in msg and "data (another dataset)" in msg and "sigma" not in msg
    assert len(msg) < 300


def test_concurrent_saves_to_one_path_never_collide(tmp_path):
    """Two writers of one checkpoint (two processes on one --out) use temp files of their own."""
    import threading

    p = tmp_path / "c.ckpt"
    errors: list[BaseException] = []

    def writer(value: float) -> None:
        s = ScoreSum((64, 64), {"m": 1})
        s.add(0, torch.full((64, 64), value))
        try:
            for _ in range(30):
                s.save(p)
        except BaseException as e:  # pragma: no cover - the failure this test guards against
            errors.append(e)

    threads = [threading.Thread(target=writer, args=(v,)) for v in (1.0, 2.0)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert ScoreSum.load(p).sum[0, 0].item() in (1.0, 2.0)
    assert [f.name for f in tmp_path.iterdir()] == ["c.ckpt"]  # no temp file left behind
