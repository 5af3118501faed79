"""capinterp's causal tracing against ROME's own ``experiments/causal_trace.py``, side by side.

    CAPINTERP_THREADS=1 .venv/bin/python benchmarks/bench_vs_rome.py --rome-dir ../peers/rome
    CAPINTERP_THREADS=1 .venv/bin/python benchmarks/bench_vs_rome.py --rome-dir ../peers/rome --model tiny \\
        --samples 3 --window 3                                     # a quick check

ROME (Meng et al., "Locating and Editing Factual Associations in GPT", arXiv:2202.05262) is not on
PyPI and is not shipped with capinterp: fetch its repository beside the project, never into it,
``git clone https://github.com/kmeng01/rome ../peers/rome``, and name it with ``--rome-dir``.
Without it the benchmark prints how to get it and exits 0.

Equal grids: the same weights (a plain transformers twin of capinterp's model, built from its state
dict, so ROME runs the stock HF forward with its own hooks), the same prompt token ids, the same
noise (ROME's: ``numpy.random.RandomState(1).randn(samples, subject tokens, d_model)`` times one
literal std, capinterp's rule ``3 x`` the std of the subject embeddings, handed to both), the same
window, the three kinds (ROME's ``kind=None`` is capinterp's ``"resid"``). ROME's
``calculate_hidden_flow`` runs unchanged; the only adapter is its ``layername`` for Llama-shaped
module names (``model.layers.{i}``, ``.mlp``, ``.self_attn``, ``model.embed_tokens``) and
``make_inputs`` on the model's device. capinterp: one :class:`capinterp.CausalTrace` fit, the default
(stair) route. Agreement: max |restored p difference| over every (token, layer) cell, relative to
the largest effect |p_restored - p_corrupt| of ROME's grid. The time ratio is measured in this run.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import importlib.util
import os
import sys
import time
import types
from typing import Any

import numpy as np
import torch

ROME_KIND = {"resid": None, "mlp": "mlp", "attn": "attn"}
HOW = (
    "ROME's repository is not here: fetch it beside the project (never into it), e.g. "
    "`git clone https://github.com/kmeng01/rome ../peers/rome`, then pass --rome-dir ../peers/rome"
)


@contextlib.contextmanager
def _stubbed(names: dict[str, types.ModuleType]):
    """Put ``names`` into ``sys.modules`` for the duration; restore what was there before."""
    saved = {n: sys.modules.get(n) for n in names}
    sys.modules.update(names)
    try:
        yield
    finally:
        for n, m in saved.items():
            if m is None:
                sys.modules.pop(n, None)
            else:
                sys.modules[n] = m


def _package(name: str, path: str | None = None, **attrs: Any) -> types.ModuleType:
    mod = types.ModuleType(name)
    mod.__path__ = [path] if path else []  # a package whose __init__ is not run
    mod.__dict__.update(attrs)
    return mod


def load_rome(rome_dir: str) -> types.ModuleType:
    """ROME's ``experiments/causal_trace.py`` as a module, its own code unchanged.

    Its imports that only the data sets, ROME editing and plotting need (``dsets``, ``util.globals``
    which reads ``globals.yml`` from the working directory, ``rome``'s ``__init__``, matplotlib) are
    stubbed while it loads; ``util.nethook`` and ``rome.tok_dataset`` are ROME's own files."""
    path = os.path.join(rome_dir, "experiments", "causal_trace.py")
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{path} does not exist. {HOW}")
    stubs = {
        "dsets": _package("dsets", KnownsDataset=None),
        "rome": _package("rome", os.path.join(rome_dir, "rome")),
        "util": _package("util", os.path.join(rome_dir, "util")),
        "util.globals": _package("util.globals", DATA_DIR=os.path.join(rome_dir, "data")),
    }
    if importlib.util.find_spec("matplotlib") is None:  # only plot_trace_heatmap uses it
        stubs["matplotlib"] = _package("matplotlib", pyplot=_package("matplotlib.pyplot"))
        stubs["matplotlib.pyplot"] = stubs["matplotlib"].pyplot
    extra = ["rome.tok_dataset", "util.nethook", "util.runningstats"]
    with _stubbed(stubs), _stubbed(dict.fromkeys(extra)):  # type: ignore[arg-type]
        for n in extra:
            sys.modules.pop(n, None)
        spec = importlib.util.spec_from_file_location("rome_causal_trace", path)
        assert spec is not None and spec.loader is not None
        ct = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(ct)
    _adapt(ct)
    return ct


def _adapt(ct: types.ModuleType) -> None:
    """ROME's ``layername`` for Llama-shaped HF models (theirs knows GPT-2 / GPT-J / NeoX names)."""
    rome_layername = ct.layername

    def layername(model, num, kind=None):
        if hasattr(model, "transformer") or not hasattr(getattr(model, "model", None), "layers"):
            return rome_layername(model, num, kind)
        if kind == "embed":
            return "model.embed_tokens"
        return f"model.layers.{num}" + {None: "", "mlp": ".mlp", "attn": ".self_attn"}[kind]

    ct.layername = layername


def hf_twin(model) -> torch.nn.Module:
    """A plain transformers model (no TransformerBridge wrappers) with ``model``'s weights, frozen, in
    eval mode, with transformers' default attention (sdpa): what ROME would load itself."""
    hf = model.original_model
    cfg = copy.deepcopy(hf.config)
    cfg._attn_implementation = "sdpa"
    dtype = next(hf.parameters()).dtype
    twin = type(hf)(cfg).to(dtype=dtype, device=model.cfg.device)
    want = set(twin.state_dict())  # the bridge's own aliases (``blocks.0.attn.q`` ...) are not wanted
    state = {k: v for k, v in ((k.replace("_original_component.", ""), v) for k, v in hf.state_dict().items())}
    missing, _ = twin.load_state_dict({k: v for k, v in state.items() if k in want}, strict=False)
    tied = {"lm_head.weight"} if getattr(cfg, "tie_word_embeddings", False) else set()
    if set(missing) - tied:
        raise ValueError(f"the twin does not match the model: {sorted(missing)} not found in its state dict")
    twin.requires_grad_(False)
    return twin.eval()


class _Tokens:
    """ROME's tokenizer calls answered with capinterp's prompt ids (so both trace the same tokens)."""

    def __init__(self, tok, ids: dict[str, list[int]]):
        self.tok, self.ids = tok, ids
        self.all_special_tokens, self.all_special_ids = tok.all_special_tokens, tok.all_special_ids

    def encode(self, text):
        return list(self.ids[text])

    def decode(self, ids):
        return self.tok.decode(ids)


def rome_noise(samples: int, n_subject: int, d_model: int, std: float) -> torch.Tensor:
    """ROME's noise: a fresh ``RandomState(1)`` per trace, ``std * randn(samples, n_subject, d_model)``."""
    return std * torch.from_numpy(np.random.RandomState(1).randn(samples, n_subject, d_model))


def facts_for(model, name: str, n: int) -> list:
    """The first ``n`` builtin facts the model knows (a random tiny model: traced on its own answers)."""
    from capinterp.data.facts import builtin_facts, facts_known_by

    facts = builtin_facts()
    if name.startswith("tiny"):
        return [f.__class__(f.prompt, "", {**f.meta, "target_from": "greedy"}) for f in facts][:n]
    return facts_known_by(model, facts)[:n]


def capinterp_trace(model, facts: list, kinds: list[str], samples: int, window: int, batch_size: int = 128):
    """capinterp's :class:`CausalTrace` (default stair route) with ROME's noise (its std: capinterp's
    ``noise=3.0`` rule), fitted on ``facts``."""
    from capinterp.localizers.causal_trace import CausalTrace

    L = int(model.cfg.n_layers)
    tr = CausalTrace(
        model,
        samples=samples,
        window=window,
        kinds=tuple(kinds),
        batch_size=batch_size,
        progress=False,
        top_k=min(3, L),
    )
    d = int(model.cfg.d_model)
    tr._noise = lambda n_subject: rome_noise(tr.samples, n_subject, d, tr.noise_std_ / tr._embed_gain).float()
    return tr.fit(facts)


def rome_trace(ct, twin, model, tr, facts: list, kinds: list[str], samples: int, window: int) -> list[dict]:
    """ROME's ``calculate_hidden_flow`` on the twin for every fact ``tr`` traced and every kind, with
    capinterp's token ids and noise std: one dict per fact, {kind: ROME's result}."""
    L, dev = int(model.cfg.n_layers), model.cfg.device
    make_inputs = ct.make_inputs
    ct.make_inputs = lambda tok, prompts, device=dev: make_inputs(tok, prompts, device=device)
    try:
        out = []
        for r in tr.per_prompt_:
            ex = facts[r["index"]]
            ids = tr._prepare(r["index"], ex)["ids"]
            mt = types.SimpleNamespace(model=twin, tokenizer=_Tokens(model.tokenizer, {ex.prompt: ids}), num_layers=L)
            out.append(
                {
                    k: ct.calculate_hidden_flow(
                        mt,
                        ex.prompt,
                        r["subject"],
                        samples=samples,
                        noise=tr.noise_std_,
                        window=window,
                        kind=ROME_KIND[k],
                    )
                    for k in kinds
                }
            )
        return out
    finally:
        ct.make_inputs = make_inputs


def agreement(tr, rome: list[dict]) -> dict[str, float]:
    """max |restored p difference| over every cell, the largest |effect| of ROME's grids, their ratio, and
    the largest |p_corrupt difference|; refuses grids of different tokens, subjects or answers."""
    diff = effect = low = 0.0
    for r, theirs in zip(tr.per_prompt_, rome, strict=True):
        for k, res in theirs.items():
            if tuple(res["subject_range"]) != tuple(r["subject_range"]) or res["answer"] != r["answer"]:
                raise ValueError(
                    f"{r['prompt']!r} ({k}): ROME traced {res['subject_range']} -> {res['answer']!r}, "
                    f"capinterp {r['subject_range']} -> {r['answer']!r}"
                )
            scores = res["scores"].double()
            diff = max(diff, (r["probs"][k].double() - scores).abs().max().item())
            effect = max(effect, (scores - res["low_score"]).abs().max().item())
            low = max(low, abs(r["p_corrupt"] - res["low_score"]))
    return {"max_abs": diff, "max_effect": effect, "rel": diff / max(effect, 1e-30), "p_corrupt_diff": low}


def timed(fn) -> tuple[Any, dict[str, float]]:
    """(fn(), {"wall": seconds, "cpu": this process's CPU seconds}): at one thread the CPU seconds are
    the steadier measure on a shared machine."""
    w, c = time.perf_counter(), time.process_time()
    out = fn()
    return out, {"wall": time.perf_counter() - w, "cpu": time.process_time() - c}


def compare(ct, model, facts: list, kinds: list[str], samples: int, window: int, batch_size: int = 128):
    """(agreement, capinterp times, ROME times, capinterp's fit) measured side by side, warm; times as
    :func:`timed` gives them."""
    twin = hf_twin(model)
    with torch.no_grad():  # warm both forwards once
        twin(input_ids=torch.tensor([[1, 2, 3]], device=model.cfg.device))
    capinterp_trace(model, facts[:1], kinds[:1], 2, window, batch_size)
    tr, t_ours = timed(lambda: capinterp_trace(model, facts, kinds, samples, window, batch_size))
    rome, t_rome = timed(lambda: rome_trace(ct, twin, model, tr, facts, kinds, samples, window))
    return agreement(tr, rome), t_ours, t_rome, tr


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rome-dir", default=None, help="a checkout of github.com/kmeng01/rome (beside the project)")
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--facts", type=int, default=1)
    ap.add_argument("--kinds", nargs="+", default=list(ROME_KIND), choices=list(ROME_KIND))
    ap.add_argument("--samples", type=int, default=10)
    ap.add_argument("--window", type=int, default=10)
    ap.add_argument("--batch-size", type=int, default=128)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--device", default=None)
    args = ap.parse_args(argv)
    if min(args.facts, args.samples, args.window, args.batch_size, args.threads) < 1:
        ap.error("--facts, --samples, --window, --batch-size and --threads must be >= 1")
    if not args.rome_dir or not os.path.isfile(os.path.join(args.rome_dir, "experiments", "causal_trace.py")):
        print(f"skipped: {HOW}")
        return 0
    ct = load_rome(args.rome_dir)
    from _roofline import Dims, model_matmul_gflops, roofline, trace_flops
    from bench_trace import block_positions

    from capinterp.arch.model import load_model

    torch.set_num_threads(args.threads)
    model = load_model(args.model, threads=args.threads, device=args.device)
    facts = facts_for(model, args.model, args.facts)
    agree, t_ours, t_rome, tr = compare(ct, model, facts, args.kinds, args.samples, args.window, args.batch_size)
    d, peak = Dims.of(model), model_matmul_gflops(model, args.threads)
    n = {"stair": 0, "rome_loop": 0}
    for r in tr.per_prompt_:
        T = len(r["tokens"])
        bp = block_positions(T, r["subject_range"][0], d.n_layers, args.samples, args.window, args.kinds)
        n = {k: n[k] + trace_flops(d, bp[k], T) for k in n}
    print(
        f"model {args.model}: {d.n_layers} layers; {len(tr.per_prompt_)} fact(s), kinds {' '.join(args.kinds)}, "
        f"samples {args.samples}, window {args.window}, threads {torch.get_num_threads()}"
    )
    print(
        f"agreement: max |restored p diff| {agree['max_abs']:.2e}, largest effect {agree['max_effect']:.3e}, "
        f"relative {agree['rel']:.2e}; |p_corrupt diff| {agree['p_corrupt_diff']:.2e}"
    )
    print(f"{'':12s}{'wall s':>9s}{'CPU s':>9s}  useful FLOPs (block x position work), rate per CPU second")
    for name, t, f in (("capinterp", t_ours, n["stair"]), ("ROME", t_rome, n["rome_loop"])):
        print(f"{name:12s}{t['wall']:9.2f}{t['cpu']:9.2f}  {f / 1e9:9.1f} GFLOP, {roofline(f, t['cpu'], peak)}")
    print(
        f"ratio (ROME / capinterp): {t_rome['wall'] / t_ours['wall']:.2f}x wall, {t_rome['cpu'] / t_ours['cpu']:.2f}x "
        f"CPU; work ratio {n['rome_loop'] / n['stair']:.2f}x; load average {os.getloadavg()[0]:.1f}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
