"""capinterp.core.atomic: crash-safe replacement, the overwrite rule, links replaced not followed, long names."""

from __future__ import annotations

import os

import pytest

from capinterp.core import atomic
from capinterp.core.atomic import atomic_path, write_atomic


def test_crash_mid_write_keeps_the_old_file_and_no_temporary(tmp_path, monkeypatch):
    p = tmp_path / "out.json"
    p.write_text("old")

    def boom(*a, **k):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(atomic.os, "replace", boom)
    with pytest.raises(OSError, match="No space"):
        write_atomic(p, "new")
    assert p.read_text() == "old"
    assert sorted(x.name for x in tmp_path.iterdir()) == ["out.json"]


def test_exception_inside_the_block_leaves_nothing(tmp_path):
    p = tmp_path / "page.html"
    with pytest.raises(RuntimeError), atomic_path(p) as tmp:
        tmp.write_text("half")
        raise RuntimeError("killed")
    assert list(tmp_path.iterdir()) == []


def test_link_is_replaced_not_followed(tmp_path):
    target = tmp_path / "precious.txt"
    target.write_text("keep me")
    link = tmp_path / "out.txt"
    link.symlink_to(target)
    write_atomic(link, "new")
    assert target.read_text() == "keep me"
    assert not link.is_symlink() and link.read_text() == "new"


def test_overwrite_rule(tmp_path):
    p = tmp_path / "a"
    p.write_text("x")
    with pytest.raises(FileExistsError):
        write_atomic(p, "y", overwrite_ok=False)
    dangling = tmp_path / "dangling"
    dangling.symlink_to(tmp_path / "nowhere")
    with pytest.raises(FileExistsError):
        write_atomic(dangling, "y", overwrite_ok=False)

    def refuse(path):
        raise ValueError(f"{path} is not ours")

    with pytest.raises(ValueError, match="not ours"):
        write_atomic(p, "y", overwrite_ok=refuse)
    assert p.read_text() == "x"
    with pytest.raises(IsADirectoryError):
        write_atomic(tmp_path, "y")


def test_longest_legal_name_works_and_a_longer_one_is_refused_first(tmp_path):
    name = "n" * 251 + ".txt"  # 255 bytes
    write_atomic(tmp_path / name, "ok")
    assert (tmp_path / name).read_text() == "ok"
    with pytest.raises(ValueError, match="256 bytes"):
        write_atomic(tmp_path / ("n" * 252 + ".txt"), "ok")


def test_mode_follows_the_umask(tmp_path):
    p = write_atomic(tmp_path / "f", b"\x00")
    assert os.stat(p).st_mode & 0o777 == 0o666 & ~atomic._UMASK
