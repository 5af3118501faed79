"""Rewrite the docs tables generated from the registries (localizers, experiments, metrics).

Each table lives between two markers in a docs page:

    <!-- BEGIN GENERATED: NAME (scripts/gen_docs_tables.py) -->
    ...
    <!-- END GENERATED: NAME -->

Run ``python scripts/gen_docs_tables.py`` after adding a localizer, an experiment or a metric;
``--check`` exits 1 (listing the stale pages) instead of writing. ``tests/test_docs_tables.py``
fails when the committed pages are out of date.
"""

from __future__ import annotations

import argparse
import inspect
import re
import sys
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _first_line(obj: object) -> str:
    doc = inspect.getdoc(obj) or ""
    first = doc.split("\n\n")[0].replace("\n", " ").strip()
    return first.replace("``", "`").replace("|", "\\|")


def localizers_table() -> str:
    from capinterp import localizers

    rows = [
        "| name | class | `unit_kind` | `scope` | `per_query` | `checkpointable` | what it does |",
        "|---|---|---|---|---|---|---|",
    ]
    for name in localizers.available():
        cls = localizers.get(name)
        path = f"{cls.__module__}.{cls.__qualname__}"
        caps = cls.capabilities()
        rows.append(
            f"| `{name}` | [`{cls.__name__}`][{path}] | `{caps['unit_kind']}` | `{caps['scope']}` | "
            f"{caps['per_query']} | {caps['checkpointable']} | {_first_line(cls)} |"
        )
    return "\n".join(rows)


def experiments_table() -> str:
    from capinterp.experiments import EXPERIMENTS

    rows = ["| # | name | what it reproduces |", "|---|---|---|"]
    for i, (name, (title, _)) in enumerate(EXPERIMENTS.items(), 1):
        rows.append(f"| {i} | `{name}` | {title.replace('|', chr(92) + '|')} |")
    return "\n".join(rows)


def metrics_table() -> str:
    from capinterp.experiments.scoring import TASK_METRICS
    from capinterp.units.metrics import SET_METRICS

    rows = ["| registry | name | function | definition |", "|---|---|---|---|"]
    for name, fn in SET_METRICS.items():
        path = f"{fn.__module__}.{fn.__qualname__}"
        rows.append(f"| `SET_METRICS` | `{name}` | [`{fn.__name__}`][{path}] | {_first_line(fn)} |")
    for name in TASK_METRICS:
        rows.append(f"| `TASK_METRICS` | `{name}` | | a task score of the experiments' tables |")
    return "\n".join(rows)


#: table name -> (docs page, generator)
TABLES: dict[str, tuple[str, Callable[[], str]]] = {
    "localizers": ("docs/localizers/index.md", localizers_table),
    "experiments": ("docs/cli.md", experiments_table),
    "metrics": ("docs/metrics.md", metrics_table),
}


def _block(name: str) -> re.Pattern[str]:
    return re.compile(
        rf"(<!-- BEGIN GENERATED: {name} \(scripts/gen_docs_tables.py\) -->\n)(.*?)(<!-- END GENERATED: {name} -->)",
        re.S,
    )


def render(root: Path = ROOT) -> dict[Path, tuple[str, str]]:
    """Every page's (current text, text with fresh tables)."""
    pages: dict[Path, tuple[str, str]] = {}
    for name, (page, make) in TABLES.items():
        path = root / page
        old, new = pages.get(path, (path.read_text(), path.read_text()))
        if not _block(name).search(new):
            raise ValueError(f"{page} has no markers for the generated table {name!r}")
        table = make()
        new = _block(name).sub(lambda m, t=table: m.group(1) + t + "\n" + m.group(3), new)
        pages[path] = (old, new)
    return pages


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="exit 1 when a page is out of date; write nothing")
    args = parser.parse_args(argv)
    stale = {p: new for p, (old, new) in render().items() if old != new}
    if args.check:
        for p in stale:
            print(f"out of date: {p.relative_to(ROOT)} (run python scripts/gen_docs_tables.py)", file=sys.stderr)
        return 1 if stale else 0
    for p, new in stale.items():
        p.write_text(new)
        print(f"rewrote {p.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
