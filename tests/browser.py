"""Open a page in headless Chromium, offline: a screenshot, the page's DOM and its console messages.

Used by tests/plots/test_browser.py. Chromium is Debian's ``chromium`` package (scripts/test.sh
installs it on CI); ``CAPINTERP_CHROMIUM`` names another binary. No network is used: every flag that
would reach out (updates, sync, QUIC, background fetches) is off, and pages are opened from files.
The screenshot is read with :func:`read_png` (zlib and numpy; Pillow is not a dependency).
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import struct
import subprocess
import tempfile
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

SIZE = (1400, 1000)
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--enable-unsafe-swiftshader",  # software WebGL (circuitsvis' views), for these local, trusted pages
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-extensions",
    "--disable-default-apps",
    "--hide-scrollbars",
    "--enable-logging=stderr",
    "--v=0",
    "--virtual-time-budget=5000",  # let the page's scripts run to the end before the capture
]
_CONSOLE = re.compile(r':CONSOLE[^\]]*\] "(.*)", source: (.*)$', re.M)
# What the software GL driver says about its own speed is no message of the page.
_DRIVER = re.compile(r"^\[\.WebGL-[^\]]*\]GL Driver Message \([^)]*, Performance,")


def chromium() -> str | None:
    """The Chromium binary: ``$CAPINTERP_CHROMIUM``, else ``chromium`` / ``chromium-browser`` on PATH."""
    named = os.environ.get("CAPINTERP_CHROMIUM")
    if named:
        return named
    return shutil.which("chromium") or shutil.which("chromium-browser")


@dataclass
class Page:
    """What Chromium saw: the screenshot's pixels ``[H, W, 3]`` uint8, the DOM after the scripts ran,
    and every console message (``"message" (source)``)."""

    pixels: np.ndarray
    dom: str
    console: list[str]

    def ink(self, threshold: int = 245) -> float:
        """Share of pixels that are not (near) white."""
        return float((self.pixels.min(axis=-1) < threshold).mean())

    def ink_rows(self, threshold: int = 245) -> np.ndarray:
        """Per screenshot row, whether any pixel in it is not (near) white."""
        return (self.pixels.min(axis=-1) < threshold).any(axis=1)


def _run(binary: str, args: list[str], profile: str, timeout: float, tries: int = 2) -> subprocess.CompletedProcess:
    """Chromium on ``args``; a run that hangs (it happens on a loaded machine) is killed with its
    child processes and tried again, up to ``tries`` times."""
    cmd = [binary, *FLAGS, f"--user-data-dir={profile}", f"--window-size={SIZE[0]},{SIZE[1]}", *args]
    for attempt in range(tries):
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
        try:
            out, err = proc.communicate(timeout=timeout)
            return subprocess.CompletedProcess(cmd, proc.returncode, out, err)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)  # its own session: the browser and its renderers only
            proc.communicate()
            if attempt == tries - 1:
                raise
    raise AssertionError("unreachable")


def open_page(page: str | os.PathLike, screenshot: str | os.PathLike, *, timeout: float = 90.0) -> Page:
    """Screenshot ``page`` (a local HTML file) at 1400 x 1000 into ``screenshot`` and dump its DOM (one run)."""
    binary = chromium()
    if binary is None:
        raise FileNotFoundError("chromium not found (apt-get install chromium, or set CAPINTERP_CHROMIUM)")
    url = Path(page).resolve().as_uri()
    shot = Path(screenshot).resolve()
    shot.parent.mkdir(parents=True, exist_ok=True)
    shot.unlink(missing_ok=True)
    with tempfile.TemporaryDirectory(prefix="capinterp-chromium-") as profile:
        run = _run(binary, [f"--screenshot={shot}", "--dump-dom", url], profile, timeout)
    if not shot.is_file():
        raise RuntimeError(f"chromium wrote no screenshot of {page} (exit {run.returncode}):\n{run.stderr[-3000:]}")
    console = [f"{m} ({src})" for m, src in _CONSOLE.findall(run.stderr) if not _DRIVER.match(m)]
    return Page(read_png(shot), run.stdout, console)


def read_png(path: str | os.PathLike) -> np.ndarray:
    """An 8-bit RGB / RGBA PNG (no interlacing) as ``[H, W, 3]`` uint8 (alpha dropped)."""
    data = Path(path).read_bytes()
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        raise ValueError(f"{path} is not a PNG")
    pos, idat, header = 8, [], None
    while pos < len(data):
        (n,) = struct.unpack(">I", data[pos : pos + 4])
        kind, body = data[pos + 4 : pos + 8], data[pos + 8 : pos + 8 + n]
        if kind == b"IHDR":
            header = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            idat.append(body)
        pos += 12 + n
    if header is None:
        raise ValueError(f"{path}: no IHDR chunk")
    w, h, depth, colour, _, _, interlace = header
    channels = {2: 3, 6: 4}.get(colour)
    if depth != 8 or channels is None or interlace:
        raise ValueError(f"{path}: only 8-bit RGB/RGBA non-interlaced PNGs are read (got {header})")
    raw = np.frombuffer(zlib.decompress(b"".join(idat)), np.uint8).reshape(h, 1 + w * channels)
    out = np.zeros((h, w * channels), np.uint8)
    prev = np.zeros(w * channels, np.uint8)
    for y in range(h):
        out[y] = prev = _unfilter(int(raw[y, 0]), raw[y, 1:], prev, channels)
    return out.reshape(h, w, channels)[..., :3]


def _unfilter(kind: int, line: np.ndarray, up: np.ndarray, bpp: int) -> np.ndarray:
    if kind == 0:
        return line
    if kind == 2:
        return line + up  # uint8 wraps: mod 256
    if kind == 1:  # Sub: a running sum per channel
        return (np.cumsum(line.reshape(-1, bpp).astype(np.int64), axis=0) % 256).astype(np.uint8).reshape(-1)
    cur = bytearray(line.tobytes())
    u = up.tobytes()
    n = len(cur)
    if kind == 3:  # Average
        for i in range(n):
            left = cur[i - bpp] if i >= bpp else 0
            cur[i] = (cur[i] + ((left + u[i]) >> 1)) & 255
    elif kind == 4:  # Paeth
        for i in range(n):
            if i >= bpp:
                a, c = cur[i - bpp], u[i - bpp]
            else:
                a = c = 0
            b = u[i]
            p = a + b - c
            pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
            pred = a if pa <= pb and pa <= pc else (b if pb <= pc else c)
            cur[i] = (cur[i] + pred) & 255
    else:
        raise ValueError(f"unknown PNG filter {kind}")
    return np.frombuffer(bytes(cur), np.uint8)
