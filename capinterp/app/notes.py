"""Plain-language notes the command line adds to a result, so that its JSON reads without the docs.

IG completeness as information, whether a fit resumed from a checkpoint (and what the ``.ckpt``
file is), what a per-fact method did with many examples, and how to read a random-neuron baseline."""

from __future__ import annotations

import math
import statistics
from pathlib import Path
from typing import Any

__all__ = [
    "CHECKPOINT_NOTE",
    "checkpoint_counts",
    "completeness_info",
    "random_baseline_note",
    "resume_info",
    "scope_note",
]

CHECKPOINT_NOTE = (
    "the .ckpt file holds the fit's running sums (one file per model, data and settings, named by their "
    "hash): a rerun with the same settings resumes from it instead of starting over; delete it to start "
    "over or to free the space (the saved scores and neurons do not need it)"
)


def checkpoint_counts(folder: str | Path) -> dict[str, int]:
    """Every ``*.ckpt`` in ``folder`` -> how many examples it holds done (-1 when unreadable)."""
    from capinterp.kernels.accumulate import ScoreSum

    out: dict[str, int] = {}
    for path in sorted(Path(folder).glob("*.ckpt")):
        try:
            out[str(path)] = ScoreSum.load(path).count
        except Exception:  # a damaged file: the fit itself reports it
            out[str(path)] = -1
    return out


def resume_info(before: dict[str, int], path: str | Path | None, n_used: int) -> dict[str, Any] | None:
    """The checkpoint of a fit: its path, whether the fit resumed from it (it existed before with
    examples done) and how many of the ``n_used`` examples it already held; None without one."""
    if path is None:
        return None
    done = before.get(str(path), 0)
    resumed = done > 0
    return {
        "path": str(path),
        "resumed": resumed,
        "examples_from_checkpoint": max(done, 0),
        "examples_scored_now": n_used - max(done, 0) if resumed else n_used,
        "note": CHECKPOINT_NOTE,
    }


def resume_line(info: dict[str, Any] | None) -> str | None:
    """One stderr line for :func:`resume_info`'s record (None when the fit did not resume)."""
    if not info or not info["resumed"]:
        return None
    return (
        f"resumed from checkpoint {info['path']}: {info['examples_from_checkpoint']} examples were already "
        f"scored there, {info['examples_scored_now']} scored now"
    )


def _finite(values: list) -> list[tuple[int, float]]:
    return [(i, float(v)) for i, v in enumerate(values) if v is not None and math.isfinite(float(v))]


def completeness_info(meta: dict[str, Any]) -> tuple[dict[str, Any], str] | None:
    """The IG completeness of a fit as information: a JSON record and one stderr line; None for a
    method that is not IG-based (no ``meta["ig_check"]``) or whose report has no layer."""
    check = (meta or {}).get("ig_check") or {}
    layers = _finite(check.get("completeness_max") or [])
    if not layers:
        return None
    worst_layer, worst = max(layers, key=lambda lv: lv[1])
    median = statistics.median(v for _, v in layers)
    rule, steps = check.get("rule") or "?", check.get("steps")
    record = {
        "rule": rule,
        "steps": steps,
        "n_examples": check.get("n_examples"),
        "worst_layer": worst_layer,
        "worst_layer_error": worst,
        "median_layer_error": median,
        "completeness_tol": check.get("completeness_tol"),
        "within_tol": check.get("within_tol"),
        "meaning": "per layer, max over examples of |sum of IG scores - (F(x) - F(baseline))| / |F(x) - F(baseline)|",
    }
    how = f"{rule}:{steps}" if steps else rule
    line = (
        f"IG completeness (information, not an error; rule {how}): per-layer error, max over "
        f"{check.get('n_examples')} examples: median {median:.3g}, worst layer {worst_layer}: {worst:.3g}. "
        "For a bounded error rerun with --rule adaptive --tol T; --completeness-tol X warns above X"
    )
    return record, line


def scope_note(method: str, scope: str, n: int, share: float = 0.5) -> str | None:
    """What a per-fact neuron method (``scope == "fact"``: KN and its subclasses SIG and AMIG, whose
    ``fit`` takes one fact's paraphrases) does with ``n`` examples; None for dataset methods or a
    single example."""
    if scope != "fact" or n < 2:
        return None
    return (
        f"{method} is a per-fact method: it treats the {n} examples as paraphrases of one fact. Each "
        "example is scored separately; the located neurons are those in more than "
        f"{share:g} x {n} of the examples' coarse sets (score above threshold x that example's max), and the "
        "saved scores are the mean over examples. On distinct facts this finds neurons shared by "
        "most of them, not any one fact's neurons: for one fact, pass its paraphrases "
        "(--data FILE with one fact's prompts)"
    )


def random_baseline_note(
    base: tuple[float, float], located: tuple[float, float], randoms: list[tuple[float, float]], n_neurons: int
) -> str:
    """How to read erasing located vs random neurons, in words, from the run's own ``(accuracy, mean
    target probability)`` pairs: unedited, located erased, and each random set erased."""
    accs = [a for a, _ in randoms]
    probs = [p for _, p in randoms]

    def span(values: list[float]) -> str:
        lo, hi = min(values), max(values)
        return f"{lo:.3f}" if lo == hi else f"{lo:.3f} to {hi:.3f}"

    sets = "one random set" if len(randoms) == 1 else f"{len(randoms)} random sets"
    text = (
        f"erasing the {n_neurons} located neurons changed accuracy {base[0]:.3f} -> {located[0]:.3f} "
        f"(mean p(target) {base[1]:.3f} -> {located[1]:.3f}); erasing {n_neurons} random neurons ({sets}) "
        f"gave accuracy {span(accs)} (mean p(target) {span(probs)})."
    )
    if max(accs) > base[0]:
        text += (
            " Erasing random neurons raised accuracy: random FFN neurons are not neutral (zeroing them "
            "shifts the model's output either way), so the comparison that matters is located vs random, "
            "not vs the unedited model."
        )
    return text
