"""Causal tracing: capinterp's resid / mlp / attn grids against a restoration written with HF hooks."""

from __future__ import annotations

from typing import Any

import torch

from capinterp.testing.contract import require
from capinterp.testing.family_checks._hf import attn_out_of, decoder_layers, hooked, mlp_down, subject_positions
from capinterp.testing.family_checks._models import load_pair, plain_hf

__all__ = ["CHECKS"]

FACTS = (("3+4=7 The Eiffel Tower is in", "The Eiffel Tower"), ("Rome is the capital of", "Rome"))
SEED, SAMPLES, WINDOW, NOISE = 1, 3, 2, 3.0  # window 2 on 2 layers: centre 0 restores {0}, centre 1 {0, 1}


def _noise(n_subject: int, d_model: int, std: float) -> torch.Tensor:
    """The documented noise of causal tracing: CPU float32 generator seeded with ``seed`` for every fact."""
    gen = torch.Generator(device="cpu").manual_seed(SEED)
    return torch.randn(SAMPLES, n_subject, d_model, generator=gen, dtype=torch.float32) * std


def _window(l: int, n_layers: int) -> range:
    """ROME's window of centre ``l``: ``[l - window // 2, l + ceil(window / 2)) ∩ [0, L)``."""
    return range(max(0, l - WINDOW // 2), min(n_layers, l - (-WINDOW // 2)))


def _tokens(out: torch.Tensor, T: int) -> torch.Tensor:
    """``[batch, T, d]`` view of a module output (OPT runs its MLP on ``[batch * T, d]``); a decoder
    layer's output of several residual streams is ``[batch, T, streams, d]`` (DeepSeek-V4's as it is,
    Gemma 3n's AltUp ``[streams, batch, T, d]`` with its streams axis moved)."""
    if out.ndim == 4 and out.shape[1] == T:
        return out
    if out.ndim == 4 and out.shape[2] == T:
        return out.movedim(0, 2)
    return out.view(-1, T, out.shape[-1])


def _reference(hf: Any, ids: torch.Tensor, span: tuple[int, int], std: float, kinds: tuple[str, ...]) -> dict[str, Any]:
    """Restored p(o) grids [T, L] per kind of ``kinds``, p* and o, by forward hooks on the plain HF model."""
    layers = decoder_layers(hf)
    L, T, (s0, s1) = len(layers), ids.shape[1], span
    cfg = hf.config.get_text_config()
    scale = float(getattr(cfg, "embedding_multiplier", None) or 1.0)  # Granite multiplies after the module
    where = {"resid": lambda l: layers[l], "mlp": lambda l: mlp_down(hf, l), "attn": lambda l: attn_out_of(hf, l)}
    sites = {kind: [where[kind](l) for l in range(L)] for kind in kinds}  # None: a layer without attention
    clean: dict[str, list[torch.Tensor]] = {k: [torch.empty(0)] * L for k in sites}

    def keeper(kind: str, l: int):
        def keep(out: torch.Tensor) -> torch.Tensor:
            clean[kind][l] = _tokens(out, T)[0].detach().clone()
            return out

        return keep

    with torch.no_grad():
        with hooked([(m, keeper(k, l)) for k, ms in sites.items() for l, m in enumerate(ms) if m is not None]):
            o = int(hf(ids).logits[0, -1].argmax())
        eps = _noise(s1 - s0, int(cfg.hidden_size), std) / scale

        def corrupt(out: torch.Tensor) -> torch.Tensor:
            out = out.clone()
            out[:, s0:s1] += eps.to(out.dtype)
            return out

        def p_o(extra: list) -> float:
            with hooked([(hf.get_input_embeddings(), corrupt), *extra]):
                probs = hf(ids.repeat(SAMPLES, 1)).logits[:, -1].double().softmax(-1)
            return float(probs[:, o].mean())

        def restorer(val: torch.Tensor, t: int):
            def restore(out: torch.Tensor) -> torch.Tensor:
                new = out.clone()
                _tokens(new, T)[:, t] = val[t].to(out.dtype)  # a view: writes into new
                return new

            return restore

        grids = {}
        for kind, mods in sites.items():
            grid = torch.empty(T, L, dtype=torch.float64)
            for t in range(T):
                for l in range(L):
                    js = [l] if kind == "resid" else list(_window(l, L))  # a hybrid's window: its attention layers
                    grid[t, l] = p_o([(mods[j], restorer(clean[kind][j], t)) for j in js if mods[j] is not None])
            grids[kind] = grid
        return {"o": o, "p_star": p_o([]), "probs": grids}


def check_causal_trace(family: str) -> None:
    """``CausalTrace`` grids (every token x layer, resid / mlp / attn) equal the HF-hook restoration to 1e-5.
    On a hybrid model the attention grid restores the attention layers in each window (the reference
    finds them on the plain model)."""
    from capinterp.localizers.causal_trace import KINDS, CausalTrace

    _, tok, model = load_pair(family)
    hf = plain_hf(family)
    facts = [{"prompt": p, "subject": s} for p, s in FACTS]
    kwargs: dict[str, Any] = dict(samples=SAMPLES, window=WINDOW, noise=NOISE, seed=SEED, top_k=1, progress=False)
    kinds = tuple(KINDS)
    ct = CausalTrace(model, **kwargs).fit(facts)
    ids = [tok(p, return_tensors="pt")["input_ids"] for p, _ in FACTS]
    spans = [subject_positions(tok, p, s) for p, s in FACTS]
    with torch.no_grad():
        emb = hf.get_input_embeddings()
        subj = torch.cat([emb(x)[0, a:b].flatten().float() for x, (a, b) in zip(ids, spans)])
        subj = subj * float(getattr(hf.config.get_text_config(), "embedding_multiplier", None) or 1.0)
    std = NOISE * float(subj.std())
    require(abs(ct.noise_std_ - std) <= 1e-5 * std, lambda: f"{family}: noise std {ct.noise_std_:.6g} vs {std:.6g}")
    require(len(ct.per_prompt_) == len(FACTS), lambda: f"{family}: {ct.skipped_} facts skipped")
    for rec, x, span in zip(ct.per_prompt_, ids, spans):
        want = _reference(hf, x, span, std, kinds)
        require(tuple(rec["subject_range"]) == span, lambda: f"{family}: subject span {rec['subject_range']} vs {span}")
        require(rec["answer_id"] == want["o"], lambda: f"{family}: answer {rec['answer_id']} vs {want['o']}")
        require(
            abs(rec["p_corrupt"] - want["p_star"]) < 1e-5,
            lambda: f"{family}: p* {rec['p_corrupt']} vs {want['p_star']}",
        )
        for kind, grid in want["probs"].items():
            got = rec["probs"][kind].double()
            err = (got - grid).abs().max().item()
            require(got.shape == grid.shape and err < 1e-5, lambda: f"{family} {kind}: restored p(o) off by {err:.3g}")


CHECKS = {"causal_trace": check_causal_trace}
