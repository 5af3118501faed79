"""A new localizer is one file plus its docs page (issue #47's done test).

In a copy of the tree (the files git knows, tracked or not ignored), add
``capinterp/localizers/toy.py`` (a small real neuron localizer: mean |activation| at the last prompt
token over a dataset) and ``docs/localizers/toy.md``, edit nothing else, and check there that the
strict docs build puts the page in the nav, the module on the API page and the class in the registry
and module tables, and that the contract and property tests pick ``toy`` up and pass.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

import capinterp.localizers as localizers

ROOT = Path(__file__).resolve().parents[1]

TOY = '''"""Toy: neurons by their mean absolute activation at the last prompt token over a dataset."""

from __future__ import annotations

from typing import Any

import torch

from capinterp.core.protocol import Model
from capinterp.core.tokens import Encoded
from capinterp.localizers.base import register
from capinterp.localizers.dataset import DatasetNeuronLocalizer
from capinterp.localizers.dcsn import last_token_activations

__all__ = ["Toy"]


@register("toy")
class Toy(DatasetNeuronLocalizer):
    """Mean |activation| at the last prompt token, averaged over a dataset, then a sigma mask.

    Args:
        sigma: the mask keeps neurons more than ``sigma`` spreads from the mean score.
    """

    def __init__(self, model: Model, *, sigma: float = 6.0, **kwargs: Any) -> None:
        super().__init__(model, sigma=sigma, **kwargs)

    @torch.no_grad()
    def _score_chunk(self, items: list[Encoded]) -> torch.Tensor:
        acts, _ = last_token_activations(self.model, items)
        return acts.abs().float().cpu()
'''

TOY_PAGE = """# Toy: mean absolute activation

[`Toy`][capinterp.localizers.toy.Toy] scores every FFN neuron by its mean absolute activation at
the last prompt token over a dataset, then keeps the neurons `sigma` standard deviations away from
the mean score.

```python
loc = ci.localizers.get("toy")(model, sigma=6).fit(ds)
loc.neurons_
```
"""


def _copy_tree(dest: Path) -> Path:
    files = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout.split(b"\0")
    for name in filter(None, files):
        src = ROOT / os.fsdecode(name)
        if src.is_file():  # deleted but still in the index: not in the tree
            (dest / os.fsdecode(name)).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / os.fsdecode(name))
    return dest


def _run(cmd: list[str], cwd: Path, timeout: int) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(cwd), "CAPINTERP_THREADS": "1", "NO_MKDOCS_2_WARNING": "1"}
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def test_the_package_exports_what_its_modules_register():
    """``capinterp.localizers`` builds its names from its modules: every registered built-in, no helper."""
    registered = {
        localizers.get(n).__name__
        for n in localizers.available()
        if localizers.get(n).__module__.startswith("capinterp.localizers.")
    }
    assert registered <= set(localizers.__all__)
    assert {"Localizer", "QueryLocalization", "available", "get", "register"} <= set(localizers.__all__)
    assert not {"coarse_mask", "DatasetNeuronLocalizer", "Estimate"} & set(
        localizers.__all__
    )  # module helpers stay there
    for name in registered:
        assert getattr(localizers, name) is localizers.get(getattr(localizers, name).name)


@pytest.mark.slow
def test_a_new_localizer_is_one_file_plus_its_docs_page(tmp_path):
    tree = _copy_tree(tmp_path / "tree")
    assert not (tree / "capinterp/localizers/toy.py").exists()
    (tree / "capinterp/localizers/toy.py").write_text(TOY)
    (tree / "docs/localizers/toy.md").write_text(TOY_PAGE)

    found = _run(
        [sys.executable, "-c", "import capinterp as ci; print(ci.__file__, ci.localizers.Toy.name)"], tree, 300
    )
    assert found.returncode == 0, found.stderr
    assert found.stdout.split() == [str(tree / "capinterp/__init__.py"), "toy"]  # the copy's package, toy registered

    # (a) the strict docs build, then the toy where a reader looks for it
    site = tmp_path / "site"
    built = _run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)], tree, 1200)
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-5000:]
    home = (site / "index.html").read_text()
    assert re.search(r'href="localizers/toy/"[^>]*>\s*<span class="md-ellipsis">\s*Toy\s*<', home), "toy not in the nav"
    assert 'id="capinterp.localizers.toy.Toy"' in (site / "api/localizers/index.html").read_text()
    registry = (site / "localizers/index.html").read_text()
    assert re.search(
        r'<code>toy</code></td>\s*<td><a [^>]*href="\.\./api/localizers/#capinterp\.localizers\.toy\.Toy"', registry
    )
    arch = (site / "architecture/index.html").read_text()
    assert re.search(r"<code>toy\.py</code></a></td>\s*<td>Toy: neurons by their mean absolute activation", arch)
    assert "Toy" in (site / "localizers/toy/index.html").read_text()

    # (b) the contract and property tests take toy from the registry, and it passes them
    report = tmp_path / "junit.xml"
    tests = ["tests/localizers/test_localizer_contract.py", "tests/core/test_properties.py"]
    ran = _run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-k", "toy", f"--junitxml={report}", *tests],
        tree,
        1800,
    )
    cases = ET.parse(report).getroot().iter("testcase")
    by_file: dict[str, list[str]] = {t: [] for t in tests}
    for case in cases:
        outcome = next((c.tag for c in case if c.tag in ("failure", "error", "skipped")), "passed")
        path = case.get("classname", "").replace(".", "/") + ".py"
        by_file.setdefault(path, []).append(f"{case.get('name')}: {outcome}")
    assert ran.returncode == 0, ran.stdout[-5000:]
    for test_file in tests:
        toy = [c for c in by_file[test_file] if "toy" in c]
        assert toy, f"{test_file} ran no test for toy: it does not take its classes from the registry"
        assert all(c.endswith(": passed") for c in toy), toy
