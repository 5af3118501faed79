"""Interventions on located neurons against hand-written references on the plain transformers model.

* ``erase``: :func:`capinterp.erase` / ``scale`` / ``amplify`` against a forward pre-hook on the
  transformers down projection multiplying the neurons' inputs by the factor (p(target) and
  last-position logits, 1e-5).
* ``finetune``: one step of the ``located`` arm against a hand-written masked Adam step on the
  plain model (the neurons' up / gate / fused rows, biases and down-projection inputs found by
  their transformers names); every other entry bit-identical.
* ``edit_knowledge``: the value vectors an erase / update writes, read back from the transformers
  down projection, against Dai et al.'s rule computed by hand; the edited model's logits against
  the plain model carrying the hand-made edit (inside ``apply`` and on ``edited_copy``); the
  weights restored bit-exactly afterwards.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

from capinterp.arch.family import family_of
from capinterp.arch.linear import is_conv1d, linear_layout
from capinterp.core.example import Example
from capinterp.core.protocol import Model
from capinterp.testing.contract import require
from capinterp.testing.family_checks._models import PROMPTS, encode, load_pair
from capinterp.testing.family_checks._moe_ref import ExpertsDown, split_values
from capinterp.testing.family_checks._one_sublayer_ref import reference_model
from capinterp.testing.family_checks._plain import layer_widths, mlps, neuron_entries, plain, plain_params
from capinterp.units.neurons import NeuronSet

__all__ = ["CHECKS"]

TRAIN = (("Rome is the capital of", " Italy"), ("The Eiffel Tower is in", " Paris"))
FACT = (("Rome is the capital of", " Italy"), ("Berlin is the capital of", " Italy"))
LR = 1e-3


def _neurons(model: Model, family: str) -> tuple[dict[int, list[int]], NeuronSet]:
    """A few neurons in every layer, spread over the FFN width (first, middle, last). On a model
    mixing dense and MoE layers, a dense layer's neurons are the first ones its transformers down
    projection reads (the rest of the axis is padding, never a neuron): capinterp must agree."""
    n_layers, d_mlp = int(model.cfg.n_layers), int(model.cfg.d_mlp)
    widths = layer_widths(plain(family))
    real = torch.arange(d_mlp)[None, :] < torch.tensor(widths)[:, None]
    require(
        torch.equal(family_of(model).valid_neurons(), real),
        lambda: f"{family}: capinterp's real neurons are not {widths}",
    )
    chosen = {  # a layer of width 0 (NemotronH's mixer layers: no FFN) has none
        l: sorted({l, w // 3 + 2 * l, w // 2 + 1, w - 1 - l}) if w else [] for l, w in enumerate(widths)
    }
    if family_of(model).moe is not None:  # every expert's neurons: a token reaches only top_k experts
        chosen = {l: list(range(l, widths[l], 2)) for l in range(n_layers)}
    return chosen, NeuronSet.from_indices([(l, i) for l, idx in chosen.items() for i in idx], n_layers, d_mlp)


@contextlib.contextmanager
def _scaled_inputs(hf, chosen: dict[int, list[int]], factor: float) -> Iterator[None]:
    """Pre-hooks on the plain model's down projections: the chosen inputs times ``factor``."""

    def hook(idx: torch.Tensor):
        def pre(_mod, args):
            x = args[0].clone()
            x[..., idx] = x[..., idx] * factor
            return (x, *args[1:])

        return pre

    handles = [
        mlp.down[1].register_forward_pre_hook(hook(torch.tensor(chosen[l], dtype=torch.long)))
        for l, mlp in enumerate(mlps(hf))
    ]
    try:
        yield
    finally:
        for h in handles:
            h.remove()


def _target_id(tok, prompt: str, target: str) -> int:
    n = len(tok(prompt)["input_ids"])
    return int(tok(prompt + target)["input_ids"][n])


def _rel(got: torch.Tensor, want: torch.Tensor) -> float:
    return ((got - want).abs().max() / want.abs().max().clamp_min(1e-12)).item()


def check_erase(family: str) -> None:
    """erase / scale(0.5) / amplify(3) vs a pre-hook on the transformers down projection: 1e-5."""
    from capinterp.interventions.hooks import amplify, erase, scale
    from capinterp.kernels.evaluate import evaluate

    _, tok, model = load_pair(family)
    hf = plain(family)
    chosen, ns = _neurons(model, family)
    data = [Example(prompt=p, target=" Paris") for p in PROMPTS]
    with torch.no_grad():
        base = hf(encode(tok, PROMPTS[0])).logits[0, -1].double()
    for factor, ctx in (
        (0.0, lambda: erase(model, ns)),
        (0.5, lambda: scale(model, ns, 0.5)),
        (3.0, lambda: amplify(model, ns, 3.0)),
    ):
        want_p = []
        with torch.no_grad(), _scaled_inputs(hf, chosen, factor):
            want_logits = hf(encode(tok, PROMPTS[0])).logits[0, -1].double()
            for p in PROMPTS:
                logits = hf(encode(tok, p)).logits[0, -1].double()
                want_p.append(logits.softmax(-1)[_target_id(tok, p, " Paris")].item())
        require(
            _rel(want_logits, base) > 1e-3, lambda: f"{family}: factor {factor} on {len(ns)} neurons changed nothing"
        )
        with ctx():
            with torch.no_grad():
                got_logits = model(encode(tok, PROMPTS[0]))[0, -1].double()
            got_p = evaluate(model, data, progress=False).frame["prob"].to_numpy()
        rel = _rel(got_logits, want_logits)
        require(rel < 1e-5, lambda: f"{family}: factor {factor}: logits relative error {rel:.3g}")
        for g, w in zip(got_p, want_p):
            require(
                abs(g - w) <= 1e-5 * max(w, 1e-3), lambda: f"{family}: factor {factor}: p(target) {g:.6g} vs {w:.6g}"
            )


def _reference_step(family: str, chosen: dict[int, list[int]], tok) -> tuple[dict, dict]:
    """One masked Adam step (no weight decay) on a fresh plain model: ``(before, after)`` parameters."""
    from capinterp.arch.tiny import tiny_hf

    hf = tiny_hf(family)[0]
    hf = reference_model(hf)
    params = plain_params(hf)
    before = {n: p.detach().clone() for n, p in params.items()}
    masks = neuron_entries(hf, chosen)
    total, count = torch.zeros(()), 0
    for prompt, target in TRAIN:
        k = len(tok(prompt)["input_ids"])
        ids = tok(prompt + target)["input_ids"]
        logits = hf(torch.tensor([ids])).logits[0].float()
        total = total + torch.nn.functional.cross_entropy(logits[k - 1 : -1], torch.tensor(ids[k:]), reduction="sum")
        count += len(ids) - k
    (total / count).backward()
    trained = [params[name] for name in masks]
    for name, m in masks.items():
        grad = params[name].grad
        assert grad is not None, f"{family}: {name} got no gradient in the plain model"
        grad.masked_fill_(~m, 0.0)
    torch.optim.Adam(trained, lr=LR, weight_decay=0.0).step()
    return before, {n: p.detach().clone() for n, p in params.items()}


def check_finetune(family: str) -> None:
    """The located arm, one Adam step, vs a masked Adam step on the plain model: the neurons' entries
    within 1e-3 of the step (``lr * 1e-3``; where the reference step is below 0.99 lr, its gradient
    within ~100 Adam eps, its sign and bound), every other entry bit-identical."""
    from capinterp.interventions.finetune import finetune

    _, tok, model = load_pair(family)
    chosen, ns = _neurons(model, family)
    train = [Example(p, t) for p, t in TRAIN]
    res = finetune(
        model,
        train,
        neurons=ns,
        arms=("located",),
        lr=LR,
        epochs=1,
        batch_size=len(train),
        keep_models=True,
        progress=False,
    )
    trained = res.models["located"]
    got = {n: p.detach() for n, p in plain_params(trained.original_model).items()}
    before, want = _reference_step(family, chosen, tok)
    masks = neuron_entries(plain(family), chosen)
    # an expert no training token is routed to gets no gradient (Ernie 4.5's layer 1 leaves half idle),
    # nor does a neuron whose gate activation sparsity zeroes (Gemma 3n's layer 0 keeps 5% of its gates)
    sparse = any(getattr(plain(family).config.get_text_config(), "activation_sparsity_pattern", None) or ())
    need = 0.25 if family_of(model).moe is not None or sparse else 0.5
    for name, m in masks.items():
        require(name in got, lambda: f"{family}: the trained model has no parameter {name}")
        g, b, w = got[name], before[name], want[name]
        require(torch.equal(g[~m], b[~m]), lambda: f"{family}: {name} changed outside the located neurons")
        # Adam's first step is lr * grad / (|grad| + eps): full size (lr) where |grad| >> eps; where
        # |grad| is within ~100 eps (step < 0.99 lr) its size is grad's float32 rounding, so there
        # only its direction and bound are checked
        full = (w[m] - b[m]).abs() >= 0.99 * LR
        err = (g[m] - w[m])[full].abs().max().item() if full.any() else 0.0
        require(
            err <= LR * 1e-3, lambda: f"{family}: {name}: located entries differ from the reference step by {err:.3g}"
        )
        small_got, small_want = (g[m] - b[m])[~full], (w[m] - b[m])[~full]
        require(
            (small_got * small_want >= 0).all() and (small_got.abs() <= LR * 1.001).all(),
            lambda: f"{family}: {name}: a small step of a located entry has the wrong sign or size",
        )
        moved = (w[m] != b[m]).float().mean().item()
        require(
            moved > need or name.endswith("bias"), lambda: f"{family}: {name}: the reference step moved {moved:.0%}"
        )
    # every other parameter (the bridge renames some, e.g. split attention) is bit-identical to the
    # caller's; views of a located parameter (Phi-3's split gate / up) were compared through it above
    located = {got[n].untyped_storage().data_ptr() for n in masks}
    caller = dict(model.named_parameters())
    for name, p in trained.named_parameters():
        if p.untyped_storage().data_ptr() not in located:
            require(torch.equal(p, caller[name]), lambda: f"{family}: {name} changed but no located neuron owns it")


def _last(x: torch.Tensor) -> torch.Tensor:
    """The last token's down-projection input (OPT / XGLM flatten ``[batch * seq, d_mlp]``)."""
    return x.detach().flatten(0, -2)[-1]


def _hand_edit(family: str, chosen: dict[int, list[int]], tok, mode: str) -> dict[str, torch.Tensor]:
    """Dai et al.'s erase / signed update of the chosen value vectors, on the plain model's weights."""
    hf = plain(family)
    params = plain_params(hf)
    unembed = hf.get_output_embeddings().weight.detach().float()  # [vocab, d_model]
    prompt, old = FACT[0]
    e_old, e_new = unembed[_target_id(tok, prompt, old)], unembed[_target_id(tok, prompt, " Paris")]
    acts: dict[int, torch.Tensor] = {}
    handles = [
        mlp.down[1].register_forward_pre_hook(lambda _m, a, l=l: acts.__setitem__(l, _last(a[0])))
        for l, mlp in enumerate(mlps(hf))
    ]
    try:
        with torch.no_grad():
            hf(encode(tok, prompt))
    finally:
        for h in handles:
            h.remove()
    out = {}
    for layer, idx in chosen.items():
        if not idx:  # a layer without neurons (NemotronH's mixer layers)
            continue
        name, down = mlps(hf)[layer].down
        name += ".weight"
        dense_moe = isinstance(down, ExpertsDown)
        stored = (
            down.weight if isinstance(down, ExpertsDown) else linear_layout(down, params[name]).T
        )  # [d_mlp, d_model]
        new = stored.detach().clone()
        for i in idx:
            v = new[i].float()
            if mode == "erase":
                new[i] = 0.0
                continue
            s = -1.0 if acts[layer][i] < 0 else 1.0
            upd = 8.0 * v.norm() * e_new / e_new.norm() - 1.0 * v.norm() * e_old / e_old.norm()
            new[i] = (v + s * upd).to(new.dtype)
        if dense_moe:
            out.update(split_values(hf, layer, new))
        else:
            out[name] = new if is_conv1d(down) else new.T.contiguous()
    return out


def check_edit_knowledge(family: str) -> None:
    """Erase and update: the transformers down projection holds the hand-computed value vectors
    (1e-6), nothing else changes, the logits equal the plain model's with the hand edit (1e-5),
    and the weights are restored bit-exactly on exit."""
    from capinterp.interventions.editing import edit_knowledge

    hf_b, tok, model = load_pair(family)
    chosen, ns = _neurons(model, family)
    live = plain_params(hf_b)
    before = {n: p.detach().clone() for n, p in live.items()}
    ids = encode(tok, PROMPTS[1])
    fact = [Example(p, t) for p, t in FACT]
    for mode in ("erase", "update"):
        edit = edit_knowledge(
            model, fact, mode=mode, new_target=" Paris" if mode == "update" else None, neurons=ns, evaluate=False
        )
        want = _hand_edit(family, chosen, tok, mode)
        ref = plain(family)
        saved = {n: plain_params(ref)[n].detach().clone() for n in want}
        with edit.apply(model), torch.no_grad():
            for name, p in live.items():
                if name in want:
                    err = (p.float() - want[name].float()).abs().max().item()
                    require(
                        err <= 1e-6 * max(1.0, want[name].abs().max().item()),
                        lambda: f"{family} {mode}: {name} differs from the hand-made edit by {err:.3g}",
                    )
                else:
                    require(torch.equal(p, before[name]), lambda: f"{family} {mode}: {name} changed")
            got = model(ids)[0, -1].double()
            try:
                for n, w in want.items():
                    plain_params(ref)[n].copy_(w)
                expect = ref(ids).logits[0, -1].double()
            finally:
                for n, w in saved.items():
                    plain_params(ref)[n].copy_(w)
        require(
            _rel(got, expect) < 1e-5, lambda: f"{family} {mode}: edited logits relative error {_rel(got, expect):.3g}"
        )
        with torch.no_grad():
            copied = edit.edited_copy(model)(ids)[0, -1].double()
        require(
            _rel(copied, expect) < 1e-5,
            lambda: f"{family} {mode}: edited copy's logits relative error {_rel(copied, expect):.3g}",
        )
        for name, p in live.items():
            require(torch.equal(p, before[name]), lambda: f"{family} {mode}: {name} not restored after the edit")


CHECKS = {"erase": check_erase, "finetune": check_finetune, "edit_knowledge": check_edit_knowledge}
