"""Shared pieces of the side-by-side peer benchmarks (``bench_vs_captum.py``, ``bench_vs_kn.py``,
``bench_vs_tl_eap.py``): prompts, module lookup, agreement measures and the printed table.

The peers are the ``peers`` extra of pyproject.toml, installed pinned and ``--no-deps`` by
scripts/setup.sh; :func:`require` says how to get one that is missing before any model loads.
"""

from __future__ import annotations

import importlib
import os
import sys
import time
from collections.abc import Callable
from typing import Any

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from capinterp.core.example import Example

#: Short single-token-answer facts (a subject for EAP's swap corruption).
FACTS = [
    Example("The Eiffel Tower is located in the city of", " Paris", {"subject": "The Eiffel Tower"}),
    Example("The Colosseum is located in the city of", " Rome", {"subject": "The Colosseum"}),
    Example("The Brandenburg Gate is located in the city of", " Berlin", {"subject": "The Brandenburg Gate"}),
    Example("The Space Needle is located in the city of", " Seattle", {"subject": "The Space Needle"}),
]


def require(module: str, hint: str) -> Any:
    """Import an optional peer or exit with a clear message (before any long work)."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise SystemExit(f"{module} is not installed ({e}); {hint}") from None


def hf_module(hf: torch.nn.Module, layer: int, suffix: str) -> torch.nn.Module:
    """The module named ``...layers.{layer}.{suffix}`` (or GPT-2's ``...h.{layer}.{suffix}``) of an HF model."""
    for name, mod in hf.named_modules():  # first match: TransformerBridge's wrapper, not its inner module
        name = "." + name.replace("_original_component.", "")
        if any(name.endswith(f".{stem}.{layer}.{suffix}") for stem in ("layers", "h")):
            return mod
    raise ValueError(f"no module '*layers.{layer}.{suffix}' in {type(hf).__name__}")


def spearman(a: torch.Tensor, b: torch.Tensor) -> float:
    """Rank correlation of two flat score vectors (ties broken by position)."""

    def ranks(x: torch.Tensor) -> torch.Tensor:
        r = torch.empty(x.numel(), dtype=torch.float64)
        r[x.flatten().argsort()] = torch.arange(x.numel(), dtype=torch.float64)
        return r - r.mean()

    x, y = ranks(a), ranks(b)
    return float(x @ y / (x.norm() * y.norm()))


def agreement(ours: torch.Tensor, theirs: torch.Tensor) -> dict[str, float]:
    """max |diff|, max |diff| / max |theirs| and Spearman over all scores compared."""
    ours, theirs = ours.double().flatten(), theirs.double().flatten()
    if ours.shape != theirs.shape:
        raise ValueError(f"score shapes differ: {tuple(ours.shape)} vs {tuple(theirs.shape)}")
    diff = (ours - theirs).abs().max().item()
    return {"max_abs": diff, "rel": diff / max(theirs.abs().max().item(), 1e-30), "spearman": spearman(ours, theirs)}


def timed(fn: Callable[[], Any]) -> tuple[Any, float]:
    t = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t


def report(peer: str, what: str, agree: dict[str, float], t_ours: float, t_peer: float) -> str:
    """The printed table: agreement, both times and their ratio (peer / capinterp)."""
    rows = [
        f"peer: {peer}",
        f"compared: {what}",
        f"agreement: max |diff| {agree['max_abs']:.2e} (relative to max |score| {agree['rel']:.2e}), "
        f"Spearman {agree['spearman']:.6f}",
        f"{'':20s}{'seconds':>10s}",
        f"{'capinterp':20s}{t_ours:10.2f}",
        f"{peer.split()[0]:20s}{t_peer:10.2f}",
        f"ratio (peer / capinterp): {t_peer / t_ours:.1f}x; load average {os.getloadavg()[0]:.1f}",
    ]
    return "\n".join(rows)


def compare_ig(
    model: Any, n: int, steps: int, layers: list[int] | None, rule: str, peer: Callable[..., torch.Tensor]
) -> tuple[dict[str, float], float, float]:
    """(agreement, capinterp seconds, peer seconds): capinterp's KN scores (``ig_scores``, fast route, the
    last prompt token, ``rule``) against ``peer(model, enc, steps, layers)`` ([len(layers), d_mlp]) over the
    first ``n`` facts, prompt by prompt, parameters frozen for the peer as capinterp freezes them."""
    from capinterp.core.tokens import encode
    from capinterp.kernels.ig import frozen_params, ig_scores
    from capinterp.kernels.ig_config import IGConfig

    layers = list(range(int(model.cfg.n_layers))) if layers is None else layers
    encs = encode(model, FACTS[:n])
    cfg = IGConfig(steps=steps, rule=rule, positions="last_prompt", invariance="off")
    ig_scores(model, encs[0], cfg.replace(steps=2), layers=layers[:1])  # warm-up, both sides
    with frozen_params(model):
        peer(model, encs[0], 2, layers[:1])
    ours, theirs, t_ours, t_peer = [], [], 0.0, 0.0
    for enc in encs:
        out, t = timed(lambda: ig_scores(model, enc, cfg, layers=layers)[0, layers])
        ours.append(out)
        t_ours += t
        with frozen_params(model):
            out, t = timed(lambda: peer(model, enc, steps, layers))
        theirs.append(out)
        t_peer += t
    return agreement(torch.stack(ours), torch.stack(theirs)), t_ours, t_peer


def ig_main(
    argv: list[str] | None, doc: str | None, *, module: str, hint: str, min_steps: int, compare: Callable, names: tuple
) -> int:
    """The command line of an IG peer benchmark: ``--model --threads --n --steps --layers --device``, then
    ``compare(model, n, steps, layers)`` and the printed :func:`report` (``names``: peer, what is compared)."""
    import argparse

    from capinterp.arch.model import load_model

    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--n", type=int, default=2, help=f"facts (1..{len(FACTS)})")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--layers", type=int, default=None, help="the first k layers (default all)")
    ap.add_argument("--device", default=None)
    args = ap.parse_args(argv)
    if not 1 <= args.n <= len(FACTS) or args.steps < min_steps or args.threads < 1:
        ap.error(f"--n must be in 1..{len(FACTS)}, --steps >= {min_steps}, --threads >= 1")
    require(module, hint)
    torch.set_num_threads(args.threads)
    model = load_model(args.model, device=args.device, threads=args.threads)
    n_layers = int(model.cfg.n_layers)
    layers = list(range(min(args.layers or n_layers, n_layers)))
    agree, t_ours, t_peer = compare(model, args.n, args.steps, layers)
    print(
        f"model {args.model}: {n_layers} layers x {model.cfg.d_mlp} neurons; {args.n} facts, layers 0..{layers[-1]}, "
        f"steps {args.steps}, threads {torch.get_num_threads()}"
    )
    print(report(*names, agree, t_ours, t_peer))
    return 0
