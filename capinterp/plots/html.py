"""Writing figures as HTML, offline: plotly.js embedded in each page, or one shared copy beside them.

plotly.js is about 4.6 MB; embedded (``plotlyjs="embed"``, plotly's default) every page carries
its own copy and opens anywhere on its own. ``plotlyjs="directory"`` writes plotly's bundled
``plotly.min.js`` once into the page's folder and the page loads it from there (a relative
``<script src="plotly.min.js">``): pages of a few kB, still no network, but the folder must be
kept (or copied) whole.

circuitsvis token views (:mod:`capinterp.plots.tokens`) print as HTML that loads their script from a
CDN; :func:`write_view` writes the copy that inlines it, which opens offline.

Every page is written by :func:`capinterp.core.atomic.write_atomic`: a temporary file in the same
folder, then a rename over the destination. An interrupted or failed write (a full disk) never leaves a half page, and
a symbolic link at the destination is replaced by the page, never followed (the file it points to
stays untouched).
"""

from __future__ import annotations

import html
import os
from pathlib import Path
from typing import Any

from capinterp.core.atomic import write_atomic

__all__ = [
    "BUNDLE",
    "PLOTLYJS",
    "check_plotlyjs",
    "include_option",
    "write_html",
    "write_plotlyjs",
    "write_view",
]

PLOTLYJS = ("embed", "directory")
BUNDLE = "plotly.min.js"


def check_plotlyjs(plotlyjs: str) -> str:
    """``plotlyjs`` itself when it is one of :data:`PLOTLYJS`, else ValueError."""
    if plotlyjs not in PLOTLYJS:
        raise ValueError(f"plotlyjs must be one of {PLOTLYJS}, got {plotlyjs!r}")
    return plotlyjs


def write_plotlyjs(folder: str | os.PathLike) -> Path:
    """Write plotly's bundled ``plotly.min.js`` into ``folder`` (once: an existing copy of the same
    size is kept) and return its path."""
    from plotly.offline import get_plotlyjs

    path = Path(folder) / BUNDLE
    js = get_plotlyjs().encode()
    if not (path.is_file() and not path.is_symlink() and path.stat().st_size == len(js)):
        write_atomic(path, js)
    return path


def include_option(plotlyjs: str) -> Any:
    """plotly's ``include_plotlyjs`` value for ``plotlyjs``: True (embed) or ``"directory"``."""
    return True if check_plotlyjs(plotlyjs) == "embed" else "directory"


def write_html(fig: Any, path: str | os.PathLike, *, plotlyjs: str = "embed") -> Path:
    """Write plotly figure ``fig`` to ``path`` as a full HTML page; ``plotlyjs="directory"`` also
    writes the shared ``plotly.min.js`` beside it (see the module docstring). Atomic
    (:func:`capinterp.core.atomic.write_atomic`)."""
    path = Path(path)
    option = include_option(plotlyjs)
    if option == "directory":
        write_plotlyjs(path.parent)
    return write_atomic(path, fig.to_html(include_plotlyjs=option, full_html=True))


def write_view(view: Any, path: str | os.PathLike, *, title: str = "capinterp view") -> Path:
    """Write a circuitsvis view (``neuron_activations_view``, ``attention_view``) to ``path`` as a
    full HTML page with its script inlined (``view.local_src``), so it opens without a network
    (``str(view)`` would load the script from a CDN)."""
    body = getattr(view, "local_src", None)
    if not isinstance(body, str):
        raise TypeError(f"expected a circuitsvis view (with .local_src), got {type(view).__name__}")
    path = Path(path)
    page = (
        "<!doctype html><html><head><meta charset='utf-8'>"
        f"<title>{html.escape(title)}</title></head><body>\n{body}\n</body></html>\n"
    )
    return write_atomic(path, page)
