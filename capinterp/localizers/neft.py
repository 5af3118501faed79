"""NeFT: the neurons a short full fine-tune moves most (Xu et al. 2025; the baseline of Appendix C of
"Combination Generalization of Capability-Specific Neurons in LLMs", anon. 2025).

Fine-tune every parameter of the model on the data for ``steps`` optimizer steps (teacher-forced
mean NLL of the targets), then score each FFN neuron (l, i) by how far its weights turned:
``1 - cos(w, w')``, where w concatenates the neuron's input row, gate row (gated MLPs) and
output column, before (w) and after (w') the fine-tune. NeFT selects the least similar rows up
to a parameter budget: here the ``top_k`` neurons (default 1 % of all). The model's weights are
restored exactly after the fit.

``optimizer="sgd"`` (default) moves each weight in proportion to its gradient, so the cosine
ranks neurons by how much the task pulls on them; ``"adam"`` (the paper's fine-tune) normalises
each entry's step, which over a short run moves every touched weight by about ``lr`` and ranks
neurons mostly by their (inverse) weight norm.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from tqdm.auto import tqdm

from capinterp.arch.family import family_of
from capinterp.arch.forward import capture, unembed
from capinterp.arch.model import neuron_shape, valid_neurons
from capinterp.core import validate
from capinterp.core.constraints import Interval, Options
from capinterp.core.protocol import Model
from capinterp.core.tokens import batches, collate, encode, pad_id
from capinterp.localizers.base import Localizer, register
from capinterp.localizers.dataset import describe_data
from capinterp.units.neurons import NeuronScores

__all__ = ["NeFT", "neuron_weights"]

OPTIMIZERS = ("sgd", "adam")


def neuron_weights(model: Model, layer: int) -> torch.Tensor:
    """Every neuron's weights of ``layer`` side by side: ``[d_mlp, n_per_neuron]`` (a detached float64 copy: 1 - cos of a short fine-tune is below float32 resolution)."""
    _, d_mlp = neuron_shape(model)
    if getattr(model, "capinterp_experts", None):  # gate, up and value rows of every expert neuron
        from capinterp.arch.experts import expert_block

        return expert_block(model, layer).neuron_rows().detach().double().clone()
    mlp = model.blocks[layer].mlp
    parts = []
    for name in ("in", "gate", "out"):
        comp = getattr(getattr(mlp, name, None), "original_component", None)
        w = getattr(comp, "weight", None)
        if w is None:
            continue
        axes = [a for a in (0, 1) if w.shape[a] == d_mlp]
        if len(axes) != 1:
            raise ValueError(f"cannot tell the neuron axis of layer {layer}'s {name} weight {tuple(w.shape)}")
        parts.append((w if axes[0] == 0 else w.T).detach().double().clone())
    if not parts:
        raise ValueError(f"layer {layer} exposes no MLP weights (mlp.in / mlp.out) to compare")
    return torch.cat(parts, dim=1)


def _loss(model: Model, items) -> torch.Tensor:
    """Mean over examples of the mean target-token NLL (teacher forced).

    Unembeds the answer positions only (the loss reads nothing else): with Gemma 3's 262k-token
    vocabulary the full logits' forward and backward cost more than the blocks."""
    b = collate(items, pad_id(model.tokenizer), device=model.cfg.device)
    resid = capture(model, b.tokens, "ln_final.hook_in")
    rows = [r for r, it in enumerate(items) for _ in it.answer_positions]
    pos = [p for it in items for p in it.answer_positions]
    dev = resid.device
    logp = unembed(model, resid[torch.tensor(rows, device=dev), torch.tensor(pos, device=dev)][None])[0]
    logp = logp.float().log_softmax(-1)
    nll = -logp.gather(1, torch.tensor([t for it in items for t in it.target_ids], device=dev)[:, None])[:, 0]
    weight = torch.tensor([1.0 / len(it.answer_positions) for it in items for _ in it.answer_positions], device=dev)
    return (nll * weight).sum() / len(items)


@register("neft")
class NeFT(Localizer):
    """Neurons whose weights a short full fine-tune on the data turns most (lowest cosine similarity).

    Args:
        steps: optimizer steps (each over one batch of ``batch_size`` examples, cycling) (20).
        lr: learning rate (1e-3 for ``"sgd"``; pass ~1e-5 for ``"adam"``).
        optimizer: ``"sgd"`` or ``"adam"`` (see the module docstring).
        top_k: neurons selected (default: 1 % of all neurons; of the real ones where layers differ in width).
    """

    per_query = False

    _parameter_constraints: ClassVar[dict[str, list[Any]]] = {
        "steps": [Interval(int, 1, None)],
        "lr": [Interval(float, 0, None, closed="neither")],
        "optimizer": [Options(*OPTIMIZERS)],
        "top_k": [Interval(int, 1, None), None],  # at most the model's neurons: checked in fit
    }

    def __init__(
        self,
        model: Model,
        *,
        steps: int = 20,
        lr: float = 1e-3,
        optimizer: str = "sgd",
        top_k: int | None = None,
        batch_size: int = 8,
        device: Any = None,
        progress: bool = True,
    ) -> None:
        super().__init__(model, batch_size=batch_size, device=device, progress=progress)
        self.steps, self.lr, self.optimizer, self.top_k = steps, float(lr), optimizer, top_k

    def _begin_fit(self) -> None:
        super()._begin_fit()
        n = int(valid_neurons(self.model).sum())  # the model's real neurons (no padding of narrower layers)
        if self.top_k is not None and not 1 <= self.top_k <= n:
            raise ValueError(f"top_k must be in [1, {n}], got {self.top_k}")

    def _cost(self, data: Any) -> Any:
        """The work of ``fit(data)``, counted before any model work (:meth:`Localizer.estimate`)."""
        from capinterp.localizers.cost_counts import finetune_work
        from capinterp.localizers.cost_work import Work

        examples = validate.examples(data, "NeFT.fit(data)")
        work = Work(validate.model(self.model))
        finetune_work(work, list(batches(encode(self.model, examples), self.batch_size)), self.steps, self.optimizer)
        return work

    def fit(self, data: Any) -> NeFT:
        examples = validate.examples(data, "NeFT.fit(data)")  # the shared rules; an empty list is refused
        self._begin_fit()
        items = encode(self.model, examples)  # a bare prompt: TokenizationError (NeFT trains on the answer)
        n_layers, d_mlp = neuron_shape(self.model)
        before = [neuron_weights(self.model, l) for l in range(n_layers)]
        params = [p for p in self.model.parameters()]
        saved = [p.detach().clone() for p in params]
        grad_flags = [p.requires_grad for p in params]
        opt_cls = torch.optim.SGD if self.optimizer == "sgd" else torch.optim.Adam
        chunks = list(batches(items, self.batch_size))
        losses = []
        try:
            for p in params:
                p.requires_grad_(True)
            opt = opt_cls(params, lr=self.lr)
            for step in tqdm(range(self.steps), desc="neft", disable=not self.progress):
                opt.zero_grad(set_to_none=True)
                loss = _loss(self.model, chunks[step % len(chunks)])
                loss.backward()
                opt.step()
                losses.append(float(loss.detach()))
            after = [neuron_weights(self.model, l) for l in range(n_layers)]
        finally:
            with torch.no_grad():
                for p, s, g in zip(params, saved, grad_flags):
                    p.copy_(s)
                    p.grad = None
                    p.requires_grad_(g)
        scores = torch.stack(
            [1 - torch.nn.functional.cosine_similarity(b, a, dim=1) for b, a in zip(before, after)]
        ).float()
        if family_of(self.model).layer_widths:  # padding of a mixed model's dense layers: no weights, score 0
            scores = scores.masked_fill(~valid_neurons(self.model).to(scores.device), 0.0)
        meta = self._set_meta(dataset=describe_data(examples), n_samples=len(items))
        k = self.top_k if self.top_k is not None else max(1, round(0.01 * int(valid_neurons(self.model).sum())))
        self.losses_ = losses
        self.scores_ = NeuronScores(scores, meta=meta)
        self.neurons_ = self.scores_.top_k(k)
        self.units_ = self.neurons_
        return self
