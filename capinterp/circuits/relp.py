"""RelP: attribution patching with LRP propagation rules in the backward pass (Jafari et al. 2025).

Jafari, Eberle, Khakzar, Nanda (2025), "RelP: Faithful and efficient circuit discovery via
relevance patching": AtP's estimate ``(a - ref) . dm/da`` with the gradient replaced by the
relevance coefficients of layer-wise relevance propagation. :func:`relp_rules` switches the rules on
over a model; the forward values stay those of the model (each rule adds an exact zero that carries
the modified gradient), only the backward pass changes:

* ``"ln"`` (LN-rule): every normalization ``y = gain * C(x) / s(x) + b`` (``C`` centring for a
  LayerNorm, the identity for an RMSNorm) is differentiated with its scale ``s(x)`` held constant;
* ``"act"`` (identity rule): the MLP nonlinearity ``h = act(x)`` passes ``act(x) / x`` (0 where
  ``x = 0``) instead of ``act'(x)``;
* ``"half"`` (half rule): a gated MLP's product ``act(g) * u`` gives each factor half of its
  gradient-times-input, ``d/dg = 0.5 * act(g) u / g`` (the identity rule included) and
  ``d/du = 0.5 * act(g)`` (on a gated MLP ``"act"`` and ``"half"`` go together; on a plain MLP
  ``"half"`` has nothing to act on);
* ``"attn"``: the attention weights (softmax pattern) are constants; gradients flow through the
  values only.

Where each rule acts is read off the bridge and the transformers modules, never a family name: the
normalizations are the transformers modules the bridge's normalization components wrap (and any other
``*Norm`` module, e.g. QK norms and sub-norms), each checked at entry against the formula above; the
MLP's ``hook_pre`` / ``hook_pre_linear`` / ``hook_post`` hook points give the pre-activation, the
linear factor and the product; ``attn.hook_pattern`` the pattern. A model without them is refused
with :class:`~capinterp.arch.family.UnsupportedFamily` naming what is missing.

:func:`head_relp` is :func:`~capinterp.circuits.head_patching.head_atp` under these rules.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import torch

from capinterp.arch.family import UnsupportedFamily, family_of, layer_kinds
from capinterp.arch.layer_extras import require_additive_layers
from capinterp.circuits.graph import Graph
from capinterp.circuits.head_patching import HeadRuns, qk_slots
from capinterp.core.protocol import Model

__all__ = ["RELP_RULES", "head_relp", "relp_rules"]

RELP_RULES = ("ln", "act", "half", "attn")


def _ratio(num: torch.Tensor, den: torch.Tensor) -> torch.Tensor:
    """``num / den``, 0 where ``den == 0`` (LRP's safe division)."""
    safe = torch.where(den == 0, torch.ones_like(den), den)
    return torch.where(den == 0, torch.zeros_like(num), num / safe)


def _live(x: torch.Tensor) -> torch.Tensor:
    """An exact zero that carries ``x``'s gradient (``x - x.detach()``)."""
    return x - x.detach()


class _Norm:
    """A normalization module read as ``gain * C(x) * rsqrt(mean(C(x)^2) + eps) + bias``."""

    def __init__(self, name: str, mod: torch.nn.Module):
        self.name = name
        eps = getattr(mod, "eps", None)
        if eps is None:
            eps = getattr(mod, "variance_epsilon", None)
        if isinstance(eps, tuple):
            eps = eps[0]
        if eps is None and not list(mod.parameters()) and hasattr(mod, "normalized_shape"):
            eps = 1e-5  # a parameter-free LayerNorm module (OLMo's) calls F.layer_norm's default; checked below
        if eps is None:
            raise UnsupportedFamily(f"RelP's LN-rule: normalization {name} ({type(mod).__name__}) exposes no eps")
        self.eps = float(eps)
        p = next(mod.parameters(), None)
        dtype = p.dtype if p is not None else torch.float32
        dev = p.device if p is not None else torch.device("cpu")
        d = int(p.shape[-1]) if p is not None else int(getattr(mod, "normalized_shape", (0,))[-1])
        if d <= 1:
            raise UnsupportedFamily(f"RelP's LN-rule: cannot read the width of normalization {name}")
        probe = torch.tensor([(-1.0) ** i * (1 + i / d) for i in range(d)], dtype=dtype, device=dev)[None]
        test = torch.randn(3, d, generator=torch.Generator().manual_seed(0)).to(dtype=dtype, device=dev)
        with torch.no_grad():
            zero = mod(torch.zeros_like(probe)).float()
            out_p, out_t = mod(probe).float(), mod(test).float()
        for centre in (False, True):  # RMSNorm, then LayerNorm
            self.centre = centre
            self.gain = (out_p - zero)[0] / (self._c(probe.float()) * self._inv(probe.float()))[0]
            self.bias = zero[0]
            want = self.gain * self._c(test.float()) * self._inv(test.float()) + self.bias
            if torch.allclose(want, out_t, rtol=1e-4, atol=1e-5 * float(out_t.abs().max())):
                return
        raise UnsupportedFamily(
            f"RelP's LN-rule: normalization {name} ({type(mod).__name__}) is neither an RMSNorm nor a LayerNorm "
            "(gain * centred x / rms + bias)"
        )

    def _c(self, x: torch.Tensor) -> torch.Tensor:
        return x - x.mean(-1, keepdim=True) if self.centre else x

    def _inv(self, x: torch.Tensor) -> torch.Tensor:
        return torch.rsqrt(self._c(x).pow(2).mean(-1, keepdim=True) + self.eps)

    def hook(self, mod: torch.nn.Module, args: tuple, out: Any) -> Any:
        x = args[0]
        y = out[0] if isinstance(out, tuple) else out
        if not (isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor)) or not x.requires_grad:
            return None
        inv = self._inv(x.detach().float())
        lin = (self.gain * self._c(_live(x).float()) * inv).to(y.dtype)
        y = y.detach() + lin
        return (y, *out[1:]) if isinstance(out, tuple) else y


def _is_bridge(mod: torch.nn.Module) -> bool:
    return hasattr(mod, "original_component") and hasattr(mod, "hook_in")


def _norms(model: Model) -> list[tuple[str, torch.nn.Module]]:
    """The transformers normalization modules under the model (the ones bridges wrap and any other)."""
    root = getattr(model, "original_model", model)
    seen, out = set(), []
    for name, mod in root.named_modules():
        if _is_bridge(mod) or id(mod) in seen or "norm" not in type(mod).__name__.lower():
            continue
        bare = not list(mod.parameters()) and not hasattr(mod, "eps") and not hasattr(mod, "normalized_shape")
        if any(_is_bridge(c) for c in mod.modules()) or bare:
            continue
        seen.add(id(mod))
        out.append((name, mod))
    return out


def _python_norm_scales(model: Model) -> list[torch.nn.Module]:
    """``hook_scale`` of the normalization bridges that compute the norm themselves (not through the
    wrapped module, whose hook then never fires)."""
    out = []
    for mod in model.modules():
        scale = getattr(mod, "hook_scale", None)
        if isinstance(scale, torch.nn.Module) and hasattr(mod, "use_native_layernorm_autograd"):
            native = mod.use_native_layernorm_autograd or getattr(mod.config, "layer_norm_folding", False)
            if not native:
                out.append(scale)
    return out


def _hook_point(model: Model, name: str) -> torch.nn.Module:
    hp = model.hook_dict.get(name) if hasattr(model, "hook_dict") else None
    if hp is None:
        fam = family_of(model)
        raise UnsupportedFamily(f"{fam.name} ({fam.architecture}): RelP needs the hook point {name}, absent here")
    return hp


@contextlib.contextmanager
def relp_rules(model: Model, rules: Sequence[str] = RELP_RULES) -> Iterator[None]:
    """Switch RelP's propagation rules on over ``model`` (see the module docstring); off on exit.

    ``rules``: a subset of :data:`RELP_RULES`; ``()`` changes nothing (plain gradients).
    """
    bad = [r for r in rules if r not in RELP_RULES]
    if bad:
        raise ValueError(f"unknown RelP rule(s) {bad}: choose among {list(RELP_RULES)}")
    fam = family_of(model)
    L = fam.n_layers
    handles: list[Any] = []
    try:
        if "ln" in rules:
            norms = _norms(model)
            if not norms:
                raise UnsupportedFamily(f"{fam.name} ({fam.architecture}): RelP's LN-rule found no normalization")
            for name, mod in norms:
                handles.append(mod.register_forward_hook(_Norm(name, mod).hook))
            for hp in _python_norm_scales(model):  # the scale they compute themselves, held constant
                handles.append(hp.register_forward_hook(lambda m, a, s: s.detach()))
        if "attn" in rules:
            for l in range(L):
                hp = _hook_point(model, f"blocks.{l}.attn.hook_pattern")
                handles.append(hp.register_forward_hook(lambda m, a, p: p.detach()))
        if fam.gated_mlp and ("act" in rules) != ("half" in rules):
            raise ValueError("RelP's rules for a gated MLP: 'act' and 'half' go together (act(g) * u is one product)")
        if "act" in rules:
            handles += _mlp_hooks(model, L, fam.gated_mlp, "half" in rules)
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*hook_scale/hook_normalized.*")
            yield
    finally:
        for h in handles:
            h.remove()


def _mlp_hooks(model: Model, L: int, gated: bool, half: bool) -> list[Any]:
    """Hooks on each MLP (the identity rule, and with ``half`` on a gated MLP the half rule): capture
    the pre-activation (and linear factor) live, rewrite the product."""
    handles = []
    for l in range(L):
        live: dict[str, torch.Tensor] = {}

        def grab(key: str, live: dict[str, torch.Tensor] = live):
            def fn(m: Any, a: Any, x: torch.Tensor) -> None:
                live[key] = x

            return fn

        def post(m: Any, a: Any, p: torch.Tensor, live: dict[str, torch.Tensor] = live) -> torch.Tensor:
            g = live.pop("g", None)
            u = live.pop("u", None)
            if g is None or (gated and u is None) or g.shape != p.shape:
                raise UnsupportedFamily("RelP: the MLP's hook_pre / hook_pre_linear did not fire before hook_post")
            gd, pd = g.detach(), p.detach()
            if not gated:  # identity rule: act(x) / x
                return pd + _ratio(pd, gd) * _live(g)
            ud = u.detach()  # type: ignore[union-attr]
            share = 0.5 if half else 1.0  # half rule: each factor gets half of the gradient-times-input
            return pd + share * _ratio(pd, gd) * _live(g) + share * _ratio(pd, ud) * _live(u)  # type: ignore[arg-type]

        handles.append(_hook_point(model, f"blocks.{l}.mlp.hook_pre").register_forward_hook(grab("g")))
        if gated:
            handles.append(_hook_point(model, f"blocks.{l}.mlp.hook_pre_linear").register_forward_hook(grab("u")))
        handles.append(_hook_point(model, f"blocks.{l}.mlp.hook_post").register_forward_hook(post))
    return handles


def head_relp(
    model: Model,
    data: Any,
    *,
    ablation: str = "zero",
    batch_size: int = 16,
    graph: Graph | None = None,
    rules: Sequence[str] = RELP_RULES,
) -> np.ndarray:
    """``[n_layers, n_heads]`` RelP estimates ``sum_t (a_h - ref_h) . R_h`` of the exact head effects
    (:func:`~capinterp.circuits.head_patching.head_effects`), ``R_h`` being the gradient to the head's
    output under :func:`relp_rules` (``rules=()``: plain AtP, :func:`~capinterp.circuits.head_patching.head_atp`).

    Where the graph has query / key slots, their relevance must vanish with the ``"attn"`` rule (the
    pattern is constant); a model whose attention computes its output without the hooked pattern
    is refused there.
    """
    fam = family_of(model)
    if fam.hybrid_layers:
        raise UnsupportedFamily(
            f"{fam.name} ({fam.architecture}): RelP's propagation rules cover norms, attention and MLPs, and this "
            f"hybrid model's layers include {layer_kinds(fam)}, which no rule covers; head_atp (plain AtP) runs"
        )
    # a per-layer embedding's gate (Gemma 4) is a product no rule covers; layer scales are linear
    require_additive_layers(model, "RelP (its rules cover norms, attention and MLPs)", served=("scaled",))
    runs = HeadRuns(model, data, ablation, batch_size, graph)
    qk = qk_slots(runs.graph)
    total = torch.zeros(len(runs.srcs), dtype=torch.float64)
    with relp_rules(model, rules):
        for step in runs:
            grads = step.grads()[0]
            if "attn" in rules and qk.any() and bool(grads[:, :, qk.to(grads.device)].abs().amax() > 0):
                fam = family_of(model)
                raise UnsupportedFamily(
                    f"{fam.name} ({fam.architecture}): RelP holds the attention pattern constant through "
                    "attn.hook_pattern, but this model's attention output does not use the hooked pattern"
                )
            total += step.estimate(grads, runs.feeds)
    return runs.result(total)
