"""ROME: capinterp's edited model against the rank-one update computed and written by hand on plain HF.

The reference recomputes every ingredient on a fresh transformers model with forward hooks on
its down projection: the key k* (the projection's input at the subject's last token, averaged
over the contexts), the key second moment C over the same texts, the value shift delta by the
documented optimisation (Adam on new-target NLL + KL on "{subject} is a" + weight decay, norm
clamp), then W' = W + delta (C_r^{-1} k*)^T / (k*^T C_r^{-1} k*) written into the HF weight in its
own orientation (Conv1D [in, out], Linear [out, in]); the logits of both edited models must agree.
On a mixture-of-experts layer (the plain model made dense, :mod:`._moe_ref`: the down projection's
input is every expert's neurons, router weights folded in) the edit is one expert's: the expert
whose part of k* writes most (``||W_e^T k*_e||``, by hand over the stacked value vectors), k* and
C restricted to its neurons, the update written into its rows of the stacked value vectors.
"""

from __future__ import annotations

from typing import Any

import torch

from capinterp.arch.linear import linear_layout
from capinterp.testing.contract import require
from capinterp.testing.family_checks._hf import hooked, mlp_down, subject_positions
from capinterp.testing.family_checks._models import PROMPTS

__all__ = ["CHECKS"]

# the subject's last token one position before the prompt's end: on families whose every layer
# has a 4-token sliding window (Mistral, Gemma 3, AFMoE tiny models) an edit further back would
# never reach the answer, its NLL gradient would be zero, and Adam would chase rounding noise
PROMPT, SUBJECT, NEW = "The capital of Rome is", "Rome", " Paris"
CONTEXTS = ("", "Tokyo Japan London England. ")
TEXTS = ("The Eiffel Tower is in the city of Paris .", "Berlin is the capital of Germany .", "1+2=3 4+5=9")
# RIDGE: C comes from 33 keys in 96 (or more) dimensions, so C + ridge I is as ill-conditioned as the ridge
# is small; at 1e-3 it magnified the two sides' float32 rounding (3e-7, from batching the texts differently)
# to 6e-4 in the left vector on the Mamba hybrids' tiny models, whose layer-0 keys span few directions
LAYER, STEPS, LR, KL, WD, CLAMP, RIDGE = 0, 6, 0.5, 0.0625, 0.5, 4.0, 0.1


def _ids(tok: Any, text: str) -> torch.Tensor:
    return tok(text, return_tensors="pt")["input_ids"]


def _value_at(down: torch.nn.Module, shared: bool) -> torch.nn.Module:
    """The module whose output ROME's value is: the down projection, or on a Gemma 4 MoE layer
    (:mod:`._branch_ref`, each branch normalized) the edited branch's sum, its norm's input."""
    sums = getattr(down, "branch_sums", None)
    return down if sums is None else sums[1 if shared else 0]


def _run(
    hf: Any,
    points: tuple[torch.nn.Module, torch.nn.Module],
    ids: torch.Tensor,
    pos: int,
    delta: torch.Tensor | None,
    keep: dict,
):
    """Log-softmax logits [T, V] of one row; delta added to the value (:func:`_value_at`) at ``pos``;
    ``points`` is ``(down projection, value module)``."""
    down, at = points
    T = ids.shape[1]

    def pre(mod, args):
        keep["key"] = args[0].flatten(0, -2).unflatten(0, (-1, T))[0, pos].detach().float().clone()

    def add(out: torch.Tensor) -> torch.Tensor:
        keep["value"] = out.reshape(-1, T, out.shape[-1])[0, pos].detach().float().clone()  # Falcon adds in place
        if delta is None:
            return out
        bump = torch.zeros(T, out.shape[-1], dtype=out.dtype)
        bump[pos] = delta.to(out.dtype)
        return out + bump.reshape(-1, out.shape[-1]) if out.dim() == 2 else out + bump

    handle = down.register_forward_pre_hook(pre)
    try:
        with hooked([(at, add)]):
            return hf(ids).logits[0].float().log_softmax(-1)
    finally:
        handle.remove()


def edited_layer(hf: Any) -> int:
    """The layer the check edits: ``LAYER``, or the first layer after it with neurons (NemotronH's
    layer 0 is a Mamba layer, whose FFN has none)."""
    from capinterp.testing.family_checks._plain import layer_widths

    return next(l for l, w in enumerate(layer_widths(hf)) if l >= LAYER and w > 0)


def _one_expert(hf: Any, key: torch.Tensor, layer: int, shared: bool = False) -> slice | None:
    """On an MoE layer: the neurons of the expert whose part of ``key`` writes most (``shared``: the
    shared expert's, after the routed experts'); None on a dense layer."""
    from capinterp.testing.family_checks._moe_ref import moe_layers

    if layer not in moe_layers(hf):
        require(not shared, lambda: f"layer {layer} is no MoE layer")
        return None
    ex = moe_layers(hf)[layer][1].experts
    n_exp, d = ex.down_proj.shape[0], ex.down_proj.shape[1] if ex.is_transposed else ex.down_proj.shape[2]
    rows = torch.as_tensor(mlp_down(hf, layer).weight).detach().float()  # [every expert's neurons (+ shared), d]
    if shared:
        require(rows.shape[0] > n_exp * d, lambda: f"layer {layer} has no shared expert")
        return slice(n_exp * d, rows.shape[0])
    writes = [float((key[e * d : (e + 1) * d, None] * rows[e * d : (e + 1) * d]).sum(0).norm()) for e in range(n_exp)]
    e = max(range(n_exp), key=writes.__getitem__)
    return slice(e * d, (e + 1) * d)


def _block_bias(hf: Any, layer: int) -> torch.Tensor | float:
    """The bias an MoE block adds to its experts' sum (JetMoE's), at ``layer``; 0 elsewhere."""
    from capinterp.testing.family_checks._moe_ref import _jetmoe, moe_layers

    block: Any = moe_layers(hf).get(layer, (None, None))[1]
    return block.bias.detach().float() if _jetmoe(block) else 0.0


def reference_edit(hf: Any, tok: Any, layer: int = LAYER, shared: bool = False) -> dict[str, Any]:
    """k*, delta and the left vector of the ROME update at ``layer``, all from HF hooks (and the
    edited expert's neurons on an MoE layer: the shared expert's with ``shared``)."""
    down = mlp_down(hf, layer)
    points = (down, _value_at(down, shared))
    rows = []  # (ids, subject's last position, answer positions, gold ids)
    for c in CONTEXTS:
        p_ids, full = _ids(tok, c + PROMPT), _ids(tok, c + PROMPT + NEW)
        n = p_ids.shape[1]
        require(torch.equal(full[0, :n], p_ids[0]), "the prompt's tokens must prefix the prompt + target's")
        s1 = subject_positions(tok, c + PROMPT, SUBJECT)[1]
        rows.append((full, s1 - 1, list(range(n - 1, full.shape[1] - 1)), full[0, n:]))
    kl_text = f"{SUBJECT} is a"
    kl_ids, kl_pos = _ids(tok, kl_text), subject_positions(tok, kl_text, SUBJECT)[1] - 1
    keys: list[torch.Tensor] = []
    keep: dict[str, torch.Tensor] = {}
    with torch.no_grad():
        for i, (x, pos, _, _) in enumerate(rows):
            _run(hf, points, x, pos, None, keep)
            keys.append(keep["key"])
            if i == 0:  # the layer's output: JetMoE's block adds its bias after the experts' sum
                v0_norm = (keep["value"] + _block_bias(hf, layer)).norm()
        kl_before = _run(hf, points, kl_ids, kl_pos, None, keep)[-1]
    key = torch.stack(keys).mean(0)
    cols = _one_expert(hf, key, layer, shared)
    if cols is not None:  # the other neurons' keys are not the edited expert's
        key = torch.zeros_like(key).index_copy_(0, torch.arange(cols.start, cols.stop), key[cols])
    part = slice(None) if cols is None else cols
    for p in hf.parameters():
        p.requires_grad_(False)
    delta = torch.zeros(int(hf.config.get_text_config().hidden_size), requires_grad=True)
    opt = torch.optim.Adam([delta], lr=LR)
    losses: list[float] = []
    for _ in range(STEPS):
        nll = torch.stack(
            [
                -_run(hf, points, x, pos, delta, keep)[ans, gold].sum() / len(gold) / len(rows)
                for x, pos, ans, gold in rows
            ]
        ).sum()
        lp = _run(hf, points, kl_ids, kl_pos, delta, keep)[-1]
        loss = nll + KL * torch.sum(kl_before.exp() * (kl_before - lp)) + WD * delta.pow(2).sum() / v0_norm**2
        losses.append(float(nll.detach()))
        if losses[-1] < 5e-2:
            break
        opt.zero_grad()
        loss.backward()
        opt.step()
        with torch.no_grad():
            if delta.norm() > CLAMP * v0_norm:
                delta.mul_(CLAMP * v0_norm / delta.norm())
    # C = mean k k^T over every token of TEXTS (keys: the down projection's input)
    width = key[part].numel()
    acc, n = torch.zeros(width, width, dtype=torch.float64), 0
    with torch.no_grad():
        for text in TEXTS:
            x = _ids(tok, text)
            got: list[torch.Tensor] = []
            h = down.register_forward_pre_hook(lambda m, a: got.append(a[0].reshape(-1, a[0].shape[-1])))
            try:
                hf(x)
            finally:
                h.remove()
            k = got[0][:, part].double()
            acc, n = acc + k.T @ k, n + k.shape[0]
    C = acc / n
    C = C + RIDGE * C.diagonal().mean() * torch.eye(width, dtype=torch.float64)
    u = torch.linalg.solve(C, key[part].double())
    left = torch.zeros_like(key)
    left[part] = (u / (u @ key[part].double())).float()
    return {"key": key, "delta": delta.detach(), "left": left, "losses": losses, "expert": cols}


def shared_expert_layer(family: str) -> int | None:
    """The first MoE layer of the family's tiny model whose block has a shared expert, or None."""
    from capinterp.interventions.rome_experts import has_shared_expert
    from capinterp.testing.family_checks._models import load_pair

    model = load_pair(family)[2]
    return next((l for l in range(int(model.cfg.n_layers)) if has_shared_expert(model, l)), None)


def check_rome_edit(family: str, expert: str | None = None) -> None:
    """k* and delta equal the HF-hook recomputation; the edited logits equal the hand-edited HF model's.
    ``expert="shared"``: the edit of the first MoE layer's shared expert (:func:`shared_expert_layer`)."""
    from capinterp.arch.model import load_model
    from capinterp.arch.tiny import tiny_hf
    from capinterp.core.example import Example
    from capinterp.interventions.rome import rome_edit
    from capinterp.testing.family_checks._one_sublayer_ref import reference_model

    hf, _ = tiny_hf(family)
    hf = reference_model(hf)  # MoE: the down projection's input is every expert's neurons
    layer = edited_layer(hf) if expert is None else shared_expert_layer(family)
    assert layer is not None, f"{family}: no layer with a shared expert"
    hf_b, tok = tiny_hf(family)  # fresh models: the edit writes weights
    model = load_model(hf_b, tokenizer=tok)
    fact = Example(prompt=PROMPT, target="", meta={"subject": SUBJECT, "target_from": "greedy"})
    edit = rome_edit(
        model, fact, NEW, layer=layer, texts=list(TEXTS), prefixes=list(CONTEXTS[1:]), steps=STEPS,
        lr=LR, kl_factor=KL, weight_decay=WD, clamp=CLAMP, ridge=RIDGE, expert=expert,
    )  # fmt: skip
    want = reference_edit(hf, tok, layer, shared=expert == "shared")
    for name in ("key", "delta", "left"):
        got, ref = getattr(edit, name).float(), want[name]
        if name != "delta" and got.numel() > ref.numel():  # a dense layer of a mixed model: then padding
            require(not got[ref.numel() :].any(), lambda: f"{family}: ROME's {name} is not 0 on the padding neurons")
            got = got[: ref.numel()]
        err = float((got - ref).norm() / ref.norm())
        require(err < 1e-4, lambda: f"{family}: ROME {name} differs from the HF-hook reference by {err:.3g} (relative)")
    down = mlp_down(hf, layer)
    update = torch.outer(want["delta"], want["left"])  # [d_model, d_mlp]: keys to values
    with torch.no_grad():
        before = {p: hf(_ids(tok, p)).logits[0, -1].double().log_softmax(-1) for p in (PROMPT, *PROMPTS)}
        if want["expert"] is not None:  # the stacked value vectors, written back into the experts' weights
            from capinterp.testing.family_checks._moe_ref import split_values

            params = dict(hf.named_parameters())
            for name, new in split_values(hf, layer, torch.as_tensor(down.weight) + update.T).items():
                params[name].copy_(new)
        else:
            w = linear_layout(down)  # [d_model, d_mlp], a view of the stored weight
            w += update.to(w.dtype)
        with edit:
            for p in before:
                ids = _ids(tok, p)
                got = model(ids)[0, -1].double().log_softmax(-1)
                ref = hf(ids).logits[0, -1].double().log_softmax(-1)
                err = (got - ref).abs().max().item()
                require(
                    err < 1e-4, lambda: f"{family}: edited log-probs differ from the hand-edited HF model by {err:.3g}"
                )
        shift = (hf(_ids(tok, PROMPT)).logits[0, -1].double().log_softmax(-1) - before[PROMPT]).abs().max().item()
        require(
            shift > 1e-3,
            lambda: f"{family}: the edit left the prompt's log-probs unchanged ({shift:.3g}); a vacuous check",
        )


CHECKS = {"rome_edit": check_rome_edit}
