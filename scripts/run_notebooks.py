"""Execute the notebooks in place, keeping their (small) outputs: python scripts/run_notebooks.py [NAMES...]

CI does not rewrite notebooks; it runs them with ``pytest --nbmake notebooks/`` (scripts/test.sh).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient

HERE = Path(__file__).resolve().parent.parent / "notebooks"


def run(path: Path, timeout: int = 600) -> float:
    nb = nbformat.read(path, as_version=4)
    t0 = time.time()
    NotebookClient(nb, timeout=timeout, kernel_name="python3", resources={"metadata": {"path": str(HERE)}}).execute()
    nbformat.write(nb, path)
    return time.time() - t0


if __name__ == "__main__":
    names = sys.argv[1:] or sorted(p.name for p in HERE.glob("*.ipynb"))
    for name in names:
        p = HERE / name if not name.endswith(".ipynb") or "/" not in name else Path(name)
        print(f"{p.name}: {run(p):.0f} s, {p.stat().st_size / 1024:.0f} KB", flush=True)
