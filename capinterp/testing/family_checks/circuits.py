"""Knowledge circuits (EAP, EAP-IG, ACDC) against hand-written references on plain transformers.

The reference runs on a fresh transformers model with the same seeded weights (loading wraps the
other copy's modules in bridge components) and finds its nodes on it, by tensor identity in one forward
pass, never through capinterp or TransformerLens:

* ``input``: the hidden states entering the first decoder layer;
* head h of layer l: ``z_h @ W[:, h]^T`` from the attention's output projection (its input split per
  head, times its weight slice), times the config's ``residual_multiplier`` where it has one;
* MLP of layer l: the layer's output minus its input minus the attention's (scaled) output;
* readers: the attention and the MLP read the output of a norm; each reads ``norm(x.clone())`` with
  x that norm's input, so d loss / d clone is the gradient through that reader alone (parallel
  blocks: both readers see the block's input); the logits read the final norm's input.

EAP edge score u -> reader = sum over positions of (a_u corrupt - a_u clean) . d loss / d reader
input; capinterp's per-head q/k/v (or per-layer) slot scores of a layer's attention summed must
equal it (the slots read the same residual), and so must every MLP and logits edge.
"""

from __future__ import annotations

import functools
from typing import Any, cast

import torch

from capinterp.arch.linear import linear_layout
from capinterp.arch.tiny import tiny_hf
from capinterp.core.protocol import Model
from capinterp.testing.contract import require
from capinterp.testing.family_checks._branch_ref import is_branched
from capinterp.testing.family_checks._models import load_pair

__all__ = ["CHECKS"]

_ATTN = ("self_attn", "attn", "attention", "self_attention")
_OUT = ("o_proj", "dense", "out_proj", "c_proj")
_MIXERS = ("Mixer", "Mamba", "DeltaNet", "ShortConv")  # transformers' class names of the non-attention mixers
_CANDIDATES = (  # same token count under the tiny tokenizer
    ("Rome is the capital of", "Berlin is the capital of"),
    ("The city of Paris is in", "The city of Tokyo is in"),
)


def _layers(hf: Any) -> torch.nn.ModuleList:
    n = hf.config.get_text_config().num_hidden_layers
    for _, mod in hf.named_modules():
        if isinstance(mod, torch.nn.ModuleList) and len(mod) == n:
            return mod
    raise AssertionError("no decoder-layer list found")


def _out_proj(layer: torch.nn.Module) -> torch.nn.Module | None:
    """The attention's output projection; None in a hybrid model's layer without softmax attention."""
    for name, child in layer.named_children():
        if name in _ATTN:
            for sub, mod in child.named_modules():
                if sub.split(".")[-1] in _OUT:
                    return mod
    if getattr(layer, "block_type", None) in ("attention", "full_attention"):  # NemotronH: its one sublayer
        mixer = cast(torch.nn.Module, layer.mixer)
        return next(m for n, m in mixer.named_modules() if n.split(".")[-1] in _OUT)
    if _hybrid(layer):
        return None
    raise AssertionError(f"no attention output projection in {type(layer).__name__}")


def _mixer(layer: torch.nn.Module) -> tuple[str, torch.nn.Module] | None:
    """A hybrid layer's token mixer that is not softmax attention (Mamba, gated delta net, short
    convolution), by its transformers class, as ``(name, module)``; None where there is none."""
    for name, child in layer.named_children():
        if any(k in type(child).__name__ for k in _MIXERS):
            return name, child
    return None


def _hybrid(layer: torch.nn.Module) -> bool:
    """A hybrid model's layer: a non-attention mixer in it, or NemotronH's one sublayer (``block_type``)."""
    return _mixer(layer) is not None or hasattr(layer, "block_type")


def _final_norm(hf: Any) -> torch.nn.Module:
    """The last norm registered outside the decoder layers (BLOOM's first is the embedding norm), but for the
    norms of Gemma 4's per-layer embeddings (``per_layer_projection_norm``), which run before the layers."""
    inside = {id(m) for m in _layers(hf).modules()}
    norms = [
        m
        for n, m in hf.named_modules()
        if "norm" in type(m).__name__.lower() and id(m) not in inside and "per_layer" not in n
    ]
    require(norms, "final norm not found")
    return norms[-1]


def _first_tensor(args: tuple, kwargs: dict) -> torch.Tensor | None:
    for v in (*args, kwargs.get("hidden_states")):
        if isinstance(v, torch.Tensor) and v.is_floating_point():
            return v
    return None


class _Ref:
    """Hooks on a transformers model: node outputs and the gradients of the readers' inputs."""

    def __init__(self, hf: Any) -> None:
        self.hf, self.layers, self.norm_f = hf, _layers(hf), _final_norm(hf)
        cfg = self.cfg = hf.config.get_text_config()
        self.H = cfg.num_attention_heads
        self.mult = float(getattr(cfg, "residual_multiplier", None) or 1.0)
        self.attn_mult = float(getattr(cfg, "attention_out_multiplier", None) or 1.0)  # Falcon-H1
        self.post: list[torch.nn.Module | None] = []  # a norm on the attention output (Gemma 2/3, OLMo 2)
        self.readers = [self._find_readers(l) for l in range(len(self.layers))]
        # Gemma 4: a layer's per-layer embedding (its gate reads the residual after the MLP, its norm's output
        # joins the residual), then layer_scalar scales the whole residual at the layer's end; P[l], the
        # product of the scales before layer l, is what a node of layer l is multiplied by at a reader of a
        # later layer, relative to P[its own layer]
        self.ple = [getattr(layer, "per_layer_input_gate", None) for layer in self.layers]
        self.P = [1.0]
        for layer in self.layers:
            s = getattr(layer, "layer_scalar", None)
            self.P.append(self.P[-1] * (float(s.float().prod()) if isinstance(s, torch.Tensor) else 1.0))
        for l, gate in enumerate(self.ple):
            if gate is not None:  # its gate reads the residual itself, no norm
                self.readers[l].append(("ple", gate, None, 1.0))

    def _find_readers(self, l: int) -> list[tuple[str, torch.nn.Module, torch.nn.Module | None, float]]:
        """``[(kind, reader, its norm, input scale)]``, kind ``"attn"``, ``"mixer"`` (hybrid layers), ``"mlp"``
        in that order, for the parts the layer has: modules reading a norm's output (norm None: the module
        reads the residual itself, OLMo 2)."""
        layer, o = self.layers[l], _out_proj(self.layers[l])
        if o is None or _hybrid(layer):
            return self._hybrid_readers(l, o)
        mods = dict(layer.named_modules())
        top, post = self._norm_readers(layer, o)
        o_name = next(n for n, m in mods.items() if m is o)
        self.post.append(mods[post] if post else None)
        attn: list[tuple[str, str | None]] = [(n, nm) for n, nm in top if o_name.startswith(n + ".")]
        box = o_name.split(".")[0] + "."  # the attention's own module (q/k norms inside it read nothing of ours)
        mlp: list[tuple[str, str | None]] = [
            (n, nm) for n, nm in top if not o_name.startswith(n + ".") and not n.startswith(box)
        ]
        attn = attn or [(n, None) for n in mods if n in _ATTN]
        mlp = mlp or [(n, None) for n in mods if n == "mlp"]
        if is_branched(layer):  # Gemma 4's MoE layer: the MLP, the experts (their own norm), the router (the
            mlp.append(("router", None))  # residual itself) read one slot
            require(
                len(attn) == 1 and [n for n, _ in mlp] == ["mlp", "experts", "router"],
                lambda: f"layer {l}: readers {top}",
            )
        else:
            require(len(attn) == 1 and len(mlp) == 1, lambda: f"layer {l}: readers {top}")
        return [
            (k, mods[n], None if nm is None else mods[nm], 1.0)
            for k, (n, nm) in [("attn", attn[0])] + [("mlp", m) for m in mlp]
        ]

    def _norm_readers(
        self, layer: torch.nn.Module, o: torch.nn.Module | None = None
    ) -> tuple[list[tuple[str, str]], str | None]:
        """The layer's outermost modules reading a norm's output, as ``(module name, norm name)`` in call
        order, and the name of the norm run on the output of ``o`` (a post-attention norm), if any."""
        mods = dict(layer.named_modules())
        norm_out: dict[int, str] = {}
        reads: list[tuple[str, int]] = []
        alive: list[Any] = []  # every tensor seen stays alive, so no id is reused
        o_out: list[torch.Tensor] = []
        hs = [] if o is None else [o.register_forward_hook(lambda m, a, out: o_out.append(out))]

        def wrote(n: str) -> Any:
            def fn(m: Any, a: tuple, out: Any) -> None:
                alive.append(out)
                norm_out[id(out)] = n

            return fn

        def read(n: str) -> Any:
            def fn(m: Any, a: tuple, k: dict) -> None:
                alive.append(_first_tensor(a, k))
                reads.append((n, id(alive[-1])))

            return fn

        for name, mod in mods.items():
            if not name:
                continue
            if "norm" in type(mod).__name__.lower():
                hs.append(mod.register_forward_hook(wrote(name)))
            hs.append(mod.register_forward_pre_hook(read(name), with_kwargs=True))
        try:
            with torch.no_grad():
                self.hf(torch.tensor([[1, 2, 3]]))
        finally:
            for h in hs:
                h.remove()
        is_norm = {n for n, m in mods.items() if "norm" in type(m).__name__.lower()}
        found = [(n, norm_out[i]) for n, i in reads if i in norm_out and n not in is_norm]
        names = [n for n, _ in found]
        top = [(n, nm) for n, nm in dict(found).items() if not any(n.startswith(p + ".") for p in names)]
        post = [n for n, i in reads if o_out and i == id(o_out[0]) and n in is_norm]
        return top, post[0] if post else None

    def _hybrid_readers(
        self, l: int, o: torch.nn.Module | None
    ) -> list[tuple[str, torch.nn.Module, torch.nn.Module | None, float]]:
        """Readers of a hybrid model's layer: its attention (if any), its mixer (if any), its MLP (if any:
        NemotronH's layers hold one sublayer each). Falcon-H1's attention reads the mixer's norm output
        times ``attention_in_multiplier``."""
        layer = self.layers[l]
        mods = dict(layer.named_modules())
        top, _ = self._norm_readers(layer)
        o_name = None if o is None else next(n for n, m in mods.items() if m is o)
        mix = _mixer(layer)
        out: list[tuple[str, torch.nn.Module, torch.nn.Module | None, float]] = []
        attn: list[tuple[str, str | None]] = [(n, nm) for n, nm in top if o_name and o_name.startswith(n + ".")]
        mixer: list[tuple[str, str | None]] = [(n, nm) for n, nm in top if mix is not None and n == mix[0]]
        mlp = [(n, nm) for n, nm in top if (n, nm) not in attn + mixer]
        scale = 1.0
        if o_name and not attn:  # Falcon-H1: beside the mixer, on its norm, times its input multiplier
            require(mixer, lambda: f"layer {l}: no reader of a norm's output leads to the attention ({top})")
            attn = [(o_name.split(".")[0], mixer[0][1])]
            scale = float(getattr(self.cfg, "attention_in_multiplier", 1.0) or 1.0)
        self.post.append(None)  # the hybrid layers served are pre-norm
        require(len(attn) <= 1 and len(mixer) <= 1, lambda: f"layer {l}: readers {top}")
        for kind, found, sc in (("attn", attn, scale), ("mixer", mixer, 1.0), ("mlp", mlp, 1.0)):
            for n, nm in found:  # Granite 4.0: experts and a shared MLP read one norm's output: one MLP slot
                out.append((kind, mods[n], None if nm is None else mods[nm], sc))
        return out

    def kinds(self, l: int) -> list[str]:
        """The graph nodes layer ``l`` has before its MLP: ``"attn"`` (heads), ``"mixer"``."""
        layer = self.layers[l]
        return (["attn"] if _out_proj(layer) is not None else []) + (["mixer"] if _mixer(layer) is not None else [])

    def run(self, ids: torch.Tensor, resid0: torch.Tensor | None = None, grad: bool = False) -> dict:
        """Node outputs ``[T, n_src, d]`` (input; heads, mixer and MLP per layer), logits, reader inputs
        (``slots``: ``{(layer, kind): [tensor per reader]}``, ``(-1, "logits")`` the final norm's)."""
        hooks = _Recorder(self, resid0, grad)
        hs = hooks.register()
        try:
            logits = self.hf(ids).logits
        finally:
            for h in hs:
                h.remove()
        rec = hooks.rec
        outs = [rec["in"][0][0]]
        layer_of = [0]  # each node output's layer
        for l in range(len(self.layers)):
            mine = self._layer_outputs(l, rec)
            outs += mine
            layer_of += [l] * len(mine)
        slots = dict(rec["slots"])
        if hooks.final:
            slots[-1, "logits"] = [hooks.final[0]]
        return {
            "outputs": torch.stack(outs, 1),
            "logits": logits,
            "slots": slots,
            "final": hooks.final[0][0],
            "at_final": torch.tensor([self.P[-1] / self.P[l] for l in layer_of]),  # each output's scale there
            "layer_of": layer_of,
        }

    def _layer_outputs(self, l: int, rec: dict) -> list[torch.Tensor]:
        """Layer ``l``'s node outputs ``[T, d]`` from a recorded run: its heads, its mixer, its MLP
        (and Gemma 4's per-layer embedding)."""
        layer = self.layers[l]
        kinds = self.kinds(l)
        outs: list[torch.Tensor] = []
        attn = torch.zeros_like(rec["in"][l][0])
        if "attn" in kinds:
            o = cast(torch.nn.Module, _out_proj(layer))
            w = linear_layout(o)  # [d_model, H * d_head]
            z = rec["z"][l][0]
            heads = torch.einsum("the,dhe->htd", z.unflatten(-1, (self.H, -1)), w.unflatten(1, (self.H, -1)))
            heads = heads * self.attn_mult
            attn = rec["o"][l][0] * self.mult * self.attn_mult
            if l in rec["p"]:  # a post-norm with its scale at this input: head h's share is result_h * post(o) / o
                heads = heads * (rec["p"][l][0] / rec["o"][l][0])
                attn = rec["p"][l][0]
            outs += list(heads * self.mult)
        if _hybrid(layer):  # the MLP reads the residual mid, after the mixer (or NemotronH's one sublayer)
            mid = rec["mid"][l][0] if l in rec["mid"] else rec["out"][l][0]
            if "mixer" in kinds:
                outs.append(mid - rec["in"][l][0] - attn)
            outs.append(rec["out"][l][0] - mid)
        elif self.ple[l] is not None:  # the MLP: the gate's input less the layer's input and attention
            outs.append(rec["ple_in"][l][0] - rec["in"][l][0] - attn)
            outs.append(rec["ple_out"][l][0])
        else:  # Gemma 4 scales the layer's output by its own layer_scalar after the residual adds
            outs.append(rec["out"][l][0] / (self.P[l + 1] / self.P[l]) - rec["in"][l][0] - attn)
        return outs


class _Recorder:
    """The hooks of one :meth:`_Ref.run`, one method per hook kind: what each module reads and writes
    goes into ``rec``; with ``grad`` every reader's input is a fresh clone, kept in ``rec["slots"]``."""

    def __init__(self, ref: _Ref, resid0: torch.Tensor | None, grad: bool) -> None:
        self.ref, self.resid0, self.grad = ref, resid0, grad
        self.rec: dict[str, Any] = {
            k: {} for k in ("in", "out", "z", "o", "p", "x", "mid", "ple_in", "ple_out", "slots")
        }
        self.busy: list[bool] = []  # a reader re-running its norm must not overwrite the norm's input
        self.final: list[torch.Tensor] = []

    def register(self) -> list[Any]:
        """Register every hook on the reference model; returns the handles."""
        ref, pre = self.ref, functools.partial
        hs = []
        for l, layer in enumerate(ref.layers):
            hs.append(layer.register_forward_pre_hook(pre(self.layer_pre, l), with_kwargs=True))
            hs.append(layer.register_forward_hook(pre(self.layer_post, l)))
            o = _out_proj(layer)
            if o is not None:
                hs += [o.register_forward_pre_hook(pre(self.o_pre, l)), o.register_forward_hook(pre(self.keep, "o", l))]
            post = ref.post[l]
            if post is not None:
                hs.append(post.register_forward_hook(pre(self.keep, "p", l)))
            if ref.ple[l] is not None:
                ple_norm = cast(torch.nn.Module, layer.post_per_layer_input_norm)
                hs.append(ple_norm.register_forward_hook(pre(self.keep, "ple_out", l)))
            for kind, reader, norm, scale in ref.readers[l]:
                if norm is not None:
                    hs.append(norm.register_forward_pre_hook(pre(self.norm_pre, (l, kind)), with_kwargs=True))
                hook = pre(self.reader_pre, (l, kind), norm, scale)
                hs.append(reader.register_forward_pre_hook(hook, with_kwargs=True))
        hs.append(ref.norm_f.register_forward_pre_hook(self.final_pre, with_kwargs=True))
        return hs

    def layer_pre(self, l: int, m: Any, a: tuple, k: dict) -> tuple[tuple, dict]:
        x = _first_tensor(a, k)
        if l == 0 and self.resid0 is not None:
            x = self.resid0
            if a and isinstance(a[0], torch.Tensor):
                a = (x,) + a[1:]
            else:
                k = {**k, "hidden_states": x}
        self.rec["in"][l] = x
        return a, k

    def layer_post(self, l: int, m: Any, a: tuple, out: Any) -> None:
        self.rec["out"][l] = out[0] if isinstance(out, tuple) else out

    def o_pre(self, l: int, m: Any, a: tuple) -> None:
        self.rec["z"][l] = a[0]

    def keep(self, what: str, l: int, m: Any, a: tuple, out: Any) -> None:
        """A module's output, as ``rec[what][l]``."""
        self.rec[what][l] = out

    def norm_pre(self, key: tuple[int, str], m: Any, a: tuple, k: dict) -> None:
        if not self.busy:
            self.rec["x"][key] = _first_tensor(a, k)
            if key[1] == "mlp":
                self.rec["mid"].setdefault(key[0], self.rec["x"][key])

    def reader_pre(
        self, key: tuple[int, str], norm: torch.nn.Module | None, scale: float, m: Any, a: tuple, k: dict
    ) -> tuple[tuple, dict] | None:
        rec = self.rec
        first = cast(torch.Tensor, _first_tensor(a, k))  # every reader is called with its input tensor
        if norm is None and key[1] == "mlp":
            rec["mid"].setdefault(key[0], first)
        if key[1] == "ple":
            rec["ple_in"][key[0]] = first
        if not self.grad:
            return None
        x = (first if norm is None else rec["x"][key]).clone()
        rec["slots"].setdefault(key, []).append(x)
        self.busy.append(True)
        new = x if norm is None else norm(x)
        self.busy.pop()
        new = new * scale if scale != 1.0 else new
        if a and a[0] is first:
            return (new,) + a[1:], k
        return a, {**k, "hidden_states": new}

    def final_pre(self, m: Any, a: tuple, k: dict) -> tuple[tuple, dict]:
        if len(self.rec["out"]) < len(self.ref.layers):  # NanoChat's final norm also normalizes the embeddings
            return a, k
        x = cast(torch.Tensor, _first_tensor(a, k))
        x = x.clone() if self.grad else x
        self.final.append(x)
        return (x,) + a[1:] if a else a, k if a else {**k, "hidden_states": x}


@functools.lru_cache(maxsize=1)
def _plain(family: str) -> Any:
    """The family's tiny transformers model, never wrapped by a bridge (same seed, same weights)."""
    return tiny_hf(family)[0]


def _pair(model: Model, tok: Any) -> Any:
    from capinterp.circuits.eap import make_pairs
    from capinterp.core.example import Example

    for clean, corrupt in _CANDIDATES:
        n = len(tok(clean)["input_ids"])
        if len(tok(corrupt)["input_ids"]) == n:
            fact = Example(clean, " Italy", {"subject": clean.split()[0]})
            return fact, make_pairs(model, [fact], lambda ex, c=corrupt: c)[0]
    raise AssertionError("no candidate pair of equal token length")


def _nll(logits: torch.Tensor, pair: Any) -> torch.Tensor:
    logp = logits[0].double().log_softmax(-1)
    pos, tgt = torch.tensor(pair.clean.answer_positions), torch.tensor(pair.clean.target_ids)
    return -logp[pos, tgt].mean()


def _columns(ref: _Ref, parallel: bool) -> tuple[list[tuple[int, str]], list[int]]:
    """The readers in graph order (per layer: attention, mixer, MLP; then the logits) and how many
    node outputs precede each (a sequential MLP also reads its layer's heads and mixer)."""
    cols, up, n = [], [], 1
    for l in range(len(ref.layers)):
        kinds = ref.kinds(l)
        width = ref.H * ("attn" in kinds) + ("mixer" in kinds)
        cols += [(l, k) for k in kinds] + [(l, "mlp")]
        up += [n] * len(kinds) + [n if parallel else n + width]
        n += width + 1
        if ref.ple[l] is not None:  # Gemma 4's per-layer embedding reads everything through its MLP
            cols.append((l, "ple"))
            up.append(n)
            n += 1
    return cols + [(-1, "logits")], up + [n]


def _reference_scores(hf: Any, pair: Any, steps: int, parallel: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """``(scores [n_src, n_readers], upstream counts)``: per reader in :func:`_columns`' order."""
    ref = _Ref(hf)
    cols, up = _columns(ref, parallel)
    clean, corrupt = torch.tensor([pair.clean.ids]), torch.tensor([pair.corrupt_ids])
    with torch.no_grad():
        rc, rk = ref.run(clean), ref.run(corrupt)
    d_out = (rk["outputs"] - rc["outputs"]).double()
    e_clean, e_corr = rc["outputs"][:, 0], rk["outputs"][:, 0]
    grads = None
    for k in range(1, steps + 1):  # right Riemann rule: alpha = k / steps, weight 1 / steps
        x = (e_corr + (k / steps) * (e_clean - e_corr))[None].detach().requires_grad_(True)
        with torch.enable_grad():
            run = ref.run(clean, resid0=x, grad=True)
            keys = [(c, t) for c in cols for t in run["slots"].get(c, [])]  # NemotronH's mixer layers: no MLP
            gs = torch.autograd.grad(_nll(run["logits"], pair), [t for _, t in keys], allow_unused=True)
        d = x.shape[-1]  # OPT's MLP reads [batch * pos, d]: one row per position (batch 1)
        got: dict[Any, torch.Tensor] = {}
        for (c, t), gi in zip(keys, gs):  # readers of one slot (Granite 4.0's two FFN modules) add up
            got[c] = got.get(c, 0) + (torch.zeros_like(t) if gi is None else gi).reshape(-1, d)
        zero = torch.zeros(x.shape[1], d)
        g = torch.stack([got.get(c, zero) for c in cols]).double()
        grads = g / steps if grads is None else grads + g / steps
    assert grads is not None
    scores = torch.einsum("tud,rtd->ur", d_out, grads)
    # a node of layer lu reaches a reader of layer lr scaled by the layer scales between (Gemma 4)
    reader_layer = [len(ref.layers) if l < 0 else l for l, _ in cols]
    scale = torch.tensor([[ref.P[lr] / ref.P[lu] for lr in reader_layer] for lu in rc["layer_of"]], dtype=torch.float64)
    return scores * scale, torch.tensor(up)


def _aggregate(graph: Any, scores: torch.Tensor) -> torch.Tensor:
    """capinterp's ``[n_src, n_slots]`` scores -> per reader: a layer's attention slots summed, mixer, MLP, logits."""
    cols = []
    for l in range(graph.n_layers):
        if graph.has_heads(l):
            cols.append(scores[:, [graph.slots.index(n) for n in graph.attn_slots(l)]].sum(1))
        if graph.has_mixer(l):
            cols.append(scores[:, graph.slot_index(l, "mixer").start])
        cols.append(scores[:, graph.slot_index(l, "mlp").start])
        if graph.ple:
            cols.append(scores[:, graph.slot_index(l, "ple").start])
    cols.append(scores[:, -1])
    return torch.stack(cols, 1).double()


def _check_eap(family: str, steps: int) -> None:
    from capinterp.arch.family import family_of
    from capinterp.circuits.eap import score_edges
    from capinterp.circuits.graph import Graph
    from capinterp.localizers.knowledge_circuit import KnowledgeCircuit

    _, tok, model = load_pair(family)
    graph = Graph.from_model(model)  # a model capinterp refuses is refused here, before the reference runs
    hf = _plain(family)
    fact, pair = _pair(model, tok)
    got, _ = score_edges(model, graph, [pair], steps=steps, rule="right", metric="nll")
    want, up = _reference_scores(hf, pair, steps, family_of(model).parallel_block)
    got = _aggregate(graph, got)
    require(
        got.shape == want.shape,
        lambda: f"{family}: capinterp's graph has {got.shape[1]} readers, the model {want.shape[1]}",
    )
    mask = torch.arange(want.shape[0])[:, None] < up[None, :]
    err = ((got - want) * mask).abs().max().item()
    scale = (want * mask).abs().max().item()
    require((got * ~mask).abs().max().item() == 0, lambda: f"{family}: scores on non-edges")
    require(
        err <= 1e-4 * scale + 1e-7,
        lambda: f"{family}: EAP{'-IG' if steps > 1 else ''} scores differ by {err:.3g} (max {scale:.3g})",
    )
    kc = KnowledgeCircuit(model, algorithm="eap" if steps == 1 else "eap-ig", steps=steps, top_n=10, progress=False)
    require(
        kc.fit([fact]).circuit_.meta["n_selected"] == 10, 'failed: kc.fit([fact]).circuit_.meta["n_selected"] == 10'
    )


def check_eap(family: str) -> None:
    """EAP scores (gradient at the clean run) equal the hand-written gradient on transformers, 1e-4 relative."""
    _check_eap(family, 1)


def check_eap_ig(family: str) -> None:
    """EAP-IG (3-point right Riemann path from the corrupted to the clean input) against the same reference."""
    _check_eap(family, 3)


def check_acdc(family: str) -> None:
    """Node outputs sum to the final residual on transformers (up to constant biases); zero-ablating
    edges into the logits equals the same subtraction before transformers' final norm; ACDC runs."""
    from capinterp.circuits.acdc import match_nll
    from capinterp.circuits.graph import Graph
    from capinterp.localizers.knowledge_circuit import KnowledgeCircuit

    _, tok, model = load_pair(family)
    graph = Graph.from_model(model)  # a model capinterp refuses is refused here, before the reference runs
    hf = _plain(family)
    fact, pair = _pair(model, tok)
    ref = _Ref(hf)
    ids = torch.tensor([pair.clean.ids])
    with torch.no_grad():
        run = ref.run(ids)
    at_final = run["at_final"].double()[None, :, None]  # Gemma 4's layer scales between a node and the logits
    resid = run["final"].double() - (run["outputs"].double() * at_final).sum(1)
    drift = (resid - resid[:1]).abs().max().item()
    require(
        drift <= 1e-4 * run["final"].abs().max().item(),
        lambda: f"{family}: node outputs miss the residual by {drift:.3g}",
    )
    first = graph.head_src(0, 1) if graph.has_heads(0) else graph.mixer_src(0) if graph.has_mixer(0) else 0
    cut = [first, graph.mlp_src(0)]  # a0.h1 (or layer 0's mixer) and m0 -> logits
    removed = torch.zeros(graph.n_src, graph.n_slots, dtype=torch.bool)
    removed[cut, -1] = True
    got = match_nll(model, graph, [fact], removed)
    drop = (run["outputs"].double() * at_final)[:, cut].sum(1).to(run["outputs"].dtype)

    last: list[bool] = []  # the final norm's call after the last layer (NanoChat's also runs on the embeddings)

    def ablate(m, a, k):
        if not last:
            return a, k
        x = _first_tensor(a, k) - drop
        return ((x,) + a[1:], k) if a else (a, {**k, "hidden_states": x})

    hs = [
        ref.layers[-1].register_forward_hook(lambda m, a, out: last.append(True)),
        ref.norm_f.register_forward_pre_hook(ablate, with_kwargs=True),
    ]
    try:
        with torch.no_grad():
            want = (_nll(hf(ids).logits, pair) - _nll(run["logits"], pair)).item()
    finally:
        for h in hs:
            h.remove()
    require(
        abs(got - want) <= 1e-4 * max(abs(want), 1e-2), lambda: f"{family}: ablated MatchNLL {got:.6g} vs {want:.6g}"
    )
    kc = KnowledgeCircuit(model, algorithm="acdc", candidates=12, steps=1, acdc_threshold=0.05, progress=False)
    require(
        kc.fit([fact]).circuit_.meta["info"]["n_visited"] == 12,
        'failed: kc.fit([fact]).circuit_.meta["info"]["n_visited"] == 12',
    )


CHECKS = {"eap": check_eap, "eap_ig": check_eap_ig, "acdc": check_acdc}
