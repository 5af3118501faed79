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
import time
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


class Session:
    """One headless Chromium for many pages, driven over the DevTools protocol on a pipe
    (``--remote-debugging-pipe``): each page gets a fresh tab, with the same window size, the same
    virtual-time budget and the same offline flags as :func:`open_page`, without paying Chromium's
    start-up (seconds on a loaded machine) once per page. Use as a context manager."""

    def __init__(self, *, timeout: float = 90.0) -> None:
        binary = chromium()
        if binary is None:
            raise FileNotFoundError("chromium not found (apt-get install chromium, or set CAPINTERP_CHROMIUM)")
        self.timeout = timeout
        self._profile = tempfile.mkdtemp(prefix="capinterp-chromium-")
        to_child, self._send = os.pipe()  # Chromium reads commands on its fd 3 ...
        self._recv, from_child = os.pipe()  # ... and writes answers and events on its fd 4
        to_child, from_child = (_above_4(fd) for fd in (to_child, from_child))  # not 3 or 4 themselves
        flags = [f for f in FLAGS if not f.startswith("--virtual-time-budget")] + ["--remote-debugging-pipe"]
        cmd = [binary, *flags, f"--user-data-dir={self._profile}", f"--window-size={SIZE[0]},{SIZE[1]}"]
        shell = f'exec "$@" 3<&{to_child} 4>&{from_child} {to_child}<&- {from_child}>&-'
        self._proc = subprocess.Popen(
            ["bash", "-c", shell, "bash", *cmd, "about:blank"],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            pass_fds=(to_child, from_child),
            start_new_session=True,
        )
        os.close(to_child)
        os.close(from_child)
        self._buf, self._next_id, self._events = b"", 0, []

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        for fd in (self._send, self._recv):
            try:
                os.close(fd)
            except OSError:
                pass
        if self._proc.poll() is None:
            os.killpg(self._proc.pid, signal.SIGKILL)  # its own session: the browser and its renderers only
        self._proc.wait()
        shutil.rmtree(self._profile, ignore_errors=True)

    def _message(self, deadline: float) -> dict:
        import json
        import select

        while b"\0" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self._recv], [], [], left)[0]:
                raise TimeoutError(f"chromium did not answer within {self.timeout} s")
            chunk = os.read(self._recv, 1 << 20)
            if not chunk:
                raise RuntimeError(f"chromium closed its DevTools pipe (exit {self._proc.poll()})")
            self._buf += chunk
        raw, self._buf = self._buf.split(b"\0", 1)
        return json.loads(raw)

    def _call(self, method: str, params: dict | None = None, session: str | None = None) -> dict:
        import json

        self._next_id += 1
        msg: dict = {"id": self._next_id, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        os.write(self._send, json.dumps(msg).encode() + b"\0")
        deadline = time.monotonic() + self.timeout
        while True:
            got = self._message(deadline)
            if got.get("id") == self._next_id:
                if "error" in got:
                    raise RuntimeError(f"chromium refused {method}: {got['error']}")
                return got.get("result", {})
            if "method" in got:
                self._events.append(got)

    def _wait_event(self, method: str, session: str) -> None:
        deadline = time.monotonic() + self.timeout
        while not any(e["method"] == method and e.get("sessionId") == session for e in self._events):
            self._events.append(self._message(deadline))

    def open(self, page: str | os.PathLike, screenshot: str | os.PathLike) -> Page:
        """What :func:`open_page` returns for ``page``, from a new tab of this browser, its viewport
        1400 x 1000 exactly; the DOM leaves out the text of the page's scripts."""
        import base64

        url = Path(page).resolve().as_uri()
        shot = Path(screenshot).resolve()
        shot.parent.mkdir(parents=True, exist_ok=True)
        shot.unlink(missing_ok=True)
        target = self._call("Target.createTarget", {"url": "about:blank"})["targetId"]
        sid = self._call("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        try:
            for domain in ("Page", "Runtime", "Log"):
                self._call(f"{domain}.enable", session=sid)
            metrics = {"width": SIZE[0], "height": SIZE[1], "deviceScaleFactor": 1, "mobile": False}
            self._call("Emulation.setDeviceMetricsOverride", metrics, sid)
            self._call("Emulation.setVirtualTimePolicy", {"policy": "pause"}, sid)
            self._call("Page.navigate", {"url": url}, sid)
            budget = {"policy": "pauseIfNetworkFetchesPending", "budget": 5000}  # as --virtual-time-budget=5000
            self._call("Emulation.setVirtualTimePolicy", budget, sid)
            self._wait_event("Emulation.virtualTimeBudgetExpired", sid)
            png = self._call("Page.captureScreenshot", {"format": "png"}, sid)["data"]
            shot.write_bytes(base64.b64decode(png))
            dom = self._call("Runtime.evaluate", {"expression": _RENDERED_DOM, "returnByValue": True}, sid)
            dom = dom["result"]["value"]
            mine = [e for e in self._events if e.get("sessionId") == sid]
            self._events = [e for e in self._events if e.get("sessionId") != sid]
        finally:
            self._call("Target.closeTarget", {"targetId": target})
        lines = [m for m in map(_console_line, mine) if m is not None and not _DRIVER.match(m[0])]
        console = [f"{m} ({src})" for m, src in lines]
        return Page(read_png(shot), dom, console)


# The DOM after the scripts ran, their own text left out (plotly.js alone is megabytes of it, and a
# string a script holds, such as "main-svg", is no proof that the page drew it).
_RENDERED_DOM = """(() => { const c = document.documentElement.cloneNode(true);
  c.querySelectorAll('script').forEach(s => { s.textContent = ''; }); return c.outerHTML; })()"""


def _above_4(fd: int) -> int:
    """``fd`` moved to a descriptor number above 4 (closing ``fd``)."""
    import fcntl

    high = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 10)
    os.close(fd)
    return high


def _console_line(event: dict) -> tuple[str, str] | None:
    """A DevTools event as a console message and its source; None for events that are none."""
    p = event.get("params", {})
    if event["method"] == "Runtime.consoleAPICalled":
        text = " ".join(str(a.get("value", a.get("description", ""))) for a in p.get("args", []))
        frames = (p.get("stackTrace") or {}).get("callFrames") or [{}]
        return text, frames[0].get("url", "")
    if event["method"] == "Runtime.exceptionThrown":
        d = p.get("exceptionDetails", {})
        return d.get("exception", {}).get("description") or d.get("text", ""), d.get("url", "")
    if event["method"] == "Log.entryAdded" and p.get("entry", {}).get("level") in ("warning", "error"):
        return p["entry"].get("text", ""), p["entry"].get("url", "")
    return None
