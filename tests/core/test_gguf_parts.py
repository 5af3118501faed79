"""Joining a GGUF split over chunk packages: order, hash check, missing chunks, stale files."""

from __future__ import annotations

import hashlib

import pytest

from capinterp.core.gguf_parts import join_parts, part_files

CHUNKS = [b"GGUF head ", b"middle ", b"tail"]
MODULES = [f"capinterp_test_chunk_{i}" for i in range(3)]


@pytest.fixture
def chunks(tmp_path, monkeypatch):
    """Three importable chunk packages ``<module>/data/partNN.bin`` on sys.path."""
    root = tmp_path / "site"
    for i, (mod, data) in enumerate(zip(MODULES, CHUNKS)):
        (root / mod / "data").mkdir(parents=True)
        (root / mod / "__init__.py").write_text("")
        (root / mod / "data" / f"part{i + 1:02d}.bin").write_bytes(data)
    monkeypatch.syspath_prepend(str(root))
    return root


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def test_chunks_are_joined_in_order(chunks, tmp_path):
    target = tmp_path / "out" / "model.gguf"
    assert join_parts(MODULES, target, _sha(b"".join(CHUNKS)), "pip install x") == target
    assert target.read_bytes() == b"GGUF head middle tail"
    assert [p.name for p in part_files(MODULES, "x")] == ["part01.bin", "part02.bin", "part03.bin"]


def test_a_wrong_hash_is_refused_and_nothing_is_left(chunks, tmp_path):
    target = tmp_path / "out" / "model.gguf"
    with pytest.raises(ValueError, match="SHA-256.*reinstall them: pip install x"):
        join_parts(MODULES, target, _sha(b"something else"), "pip install x")
    assert not target.exists()
    assert list(target.parent.iterdir()) == []  # no temporary file left behind


def test_a_missing_chunk_package_names_the_install_command(chunks, tmp_path):
    with pytest.raises(FileNotFoundError, match="capinterp_test_chunk_missing.*install them with: pip install x"):
        join_parts([*MODULES, "capinterp_test_chunk_missing"], tmp_path / "m.gguf", "0" * 64, "pip install x")


def test_a_good_file_is_reused_and_a_stale_one_rebuilt(chunks, tmp_path):
    want = b"".join(CHUNKS)
    target = tmp_path / "model.gguf"
    target.write_bytes(want)
    before = target.stat().st_mtime_ns
    join_parts(MODULES, target, _sha(want), "x")
    assert target.stat().st_mtime_ns == before
    target.write_bytes(b"GGUF half written")  # an interrupted copy from an older run
    join_parts(MODULES, target, _sha(want), "x")
    assert target.read_bytes() == want
