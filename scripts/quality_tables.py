"""The localization-quality page's tables, printed from finished `capinterp reproduce` runs.

    python scripts/quality_tables.py patching_agreement gemma3=RUN_A smollm2=RUN_B
    python scripts/quality_tables.py faithfulness gemma3=RUN_A smollm2=RUN_B

Each RUN is a ``--out`` folder; its ``experiments/NAME/table.csv`` is read (a model whose run has
not finished that experiment is reported and left out). One markdown row per row key, the models
side by side, every number with its 95 % interval in brackets; then each run's ``info`` sizes.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import pandas as pd

#: per experiment: the columns a row is keyed on, and (header, value column, interval columns) to show
LAYOUT: dict[str, tuple[list[str], list[tuple[str, str, tuple[str, str] | None]]]] = {
    "patching_agreement": (
        ["task", "component", "method", "ablation"],
        [
            ("Pearson [95 % CI]", "pearson", ("pearson_lo", "pearson_hi")),
            ("Spearman [95 % CI]", "spearman", ("spearman_lo", "spearman_hi")),
            ("units", "n_units", None),
        ],
    ),
    "faithfulness": (
        ["task", "method", "unit"],
        [
            ("CPR [95 % CI]", "cpr", ("cpr_lo", "cpr_hi")),
            ("random CPR", "random_cpr_mean", ("random_cpr_p05", "random_cpr_p95")),
            ("ablated area [95 % CI]", "ablated_area", ("ablated_area_lo", "ablated_area_hi")),
            ("random ablated", "random_ablated_area_mean", ("random_ablated_area_p05", "random_ablated_area_p95")),
            ("CMD [95 % CI]", "cmd", ("cmd_lo", "cmd_hi")),
        ],
    ),
}
NAMES = {"gemma3": "Gemma 3", "smollm2": "SmolLM2", "qwen2": "Qwen2"}


def cell(row: pd.Series, value: str, interval: tuple[str, str] | None) -> str:
    """One number, with its interval (``[lo, hi]``, or ``(lo to hi)`` for a random band)."""
    v = row.get(value)
    if v is None or pd.isna(v):
        return ""
    if interval is None:
        return f"{int(v)}" if float(v).is_integer() else f"{v:.2f}"
    lo, hi = (row.get(c) for c in interval)
    if lo is None or pd.isna(lo):
        return f"{v:.2f}"
    return f"{v:.2f} ({lo:.2f} to {hi:.2f})" if value.startswith("random") else f"{v:.2f} [{lo:.2f}, {hi:.2f}]"


def table(name: str, runs: dict[str, Path]) -> str:
    """The markdown table of experiment ``name`` over the finished ``runs`` (model -> run folder)."""
    keys, shown = LAYOUT[name]
    frames = {}
    for model, folder in runs.items():
        csv = folder / "experiments" / name / "table.csv"
        if csv.is_file():
            frames[model] = pd.read_csv(csv).set_index(keys)
        else:
            print(f"{model}: {csv} not found (the run has not finished {name}); left out", file=sys.stderr)
    if not frames:
        raise SystemExit(f"no run has a finished {name} table")
    order = list(dict.fromkeys(k for f in frames.values() for k in f.index))
    head = [*keys, *(f"{NAMES.get(m, m)} {h}" for m in frames for h, _, _ in shown)]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for key in order:
        cells = [str(k).replace("|", "\\|") for k in key]
        for frame in frames.values():
            row = frame.loc[key] if key in frame.index else None
            if isinstance(row, pd.DataFrame):
                row = row.iloc[0]
            cells += [cell(row, v, ci) if row is not None else "" for _, v, ci in shown]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def sizes(name: str, runs: dict[str, Path]) -> str:
    """Each finished run's ``info`` sizes for ``name`` (facts, problems, draws, ...), one line per model."""
    out = []
    for model, folder in runs.items():
        res = folder / "results.json"
        if not res.is_file():
            continue
        info = json.loads(res.read_text()).get("experiments", {}).get(name, {}).get("info", {})
        keep = {k: v for k, v in info.items() if k not in ("notes",)}
        if keep:
            out.append(f"{NAMES.get(model, model)}: {json.dumps(keep, sort_keys=True)}")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("experiment", choices=sorted(LAYOUT))
    ap.add_argument("runs", nargs="+", help="MODEL=RUN_FOLDER (a reproduce --out folder), in column order")
    args = ap.parse_args(argv)
    runs = {}
    for spec in args.runs:
        model, sep, folder = spec.partition("=")
        if not sep or not folder:
            ap.error(f"expected MODEL=RUN_FOLDER, got {spec!r}")
        runs[model] = Path(folder)
    print(table(args.experiment, runs))
    info = sizes(args.experiment, runs)
    if info:
        print("\n" + info)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
