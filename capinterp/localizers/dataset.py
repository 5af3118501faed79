"""Shared machinery of dataset-level neuron localizers (CNL, DCSN): mean per-neuron scores over
a dataset, a sigma mask, resumable checkpoints, and split-half consistency."""
from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import torch
from tqdm.auto import tqdm

from capinterp.units import metrics
from capinterp.kernels.accumulate import ScoreSum, dataset_fingerprint
from capinterp.core.example import Example, as_examples
from capinterp.localizers.base import Localizer
from capinterp.core.model import model_fingerprint, neuron_shape
from capinterp.results.neurons import NeuronScores
from capinterp.core.tokens import Encoded, batches, encode


def describe_data(examples: list[Example]) -> str:
    """Short description recorded in result metadata."""
    meta = examples[0].meta if examples else {}
    if meta.get("task") == "arithmetic":
        from capinterp.data import describe

        return describe(examples)
    return f"{len(examples)} examples"


@torch.no_grad()
def fill_greedy_targets(model, examples: list[Example]) -> list[Example]:
    """Give plain prompts (empty target) the model's greedy next token as target."""
    todo = [i for i, e in enumerate(examples) if not e.target]
    if not todo:
        return examples
    from capinterp.kernels.evaluate import greedy_continuations

    ids = [encode(model, [Example(examples[i].prompt, "x")])[0].prompt_ids for i in todo]
    out = list(examples)
    for start in range(0, len(todo), 16):
        new, _ = greedy_continuations(model, ids[start : start + 16], 1)
        for i, toks in zip(todo[start : start + 16], new):
            e = examples[i]
            out[i] = Example(e.prompt, model.tokenizer.decode(toks), {**e.meta, "target_from": "greedy"})
    return out


class DatasetNeuronLocalizer(Localizer):
    """Base for localizers whose score is a mean over examples of per-example neuron scores.

    Subclasses implement :meth:`_score_chunk` (``list[Encoded] -> [n, n_layers, d_mlp]``).
    ``checkpoint=path`` saves the running sums after every chunk; a later ``fit`` with the same
    path, model, data and hyper-parameters resumes where it stopped.
    """

    checkpointable = True
    chunk_examples: int = 8

    def __init__(
        self,
        model: Any,
        *,
        sigma: float = 6.0,
        spread: str = "std",
        batch_size: int = 32,
        checkpoint: str | Path | None = None,
        device: Any = None,
        progress: bool = True,
    ) -> None:
        super().__init__(model, batch_size=batch_size, device=device, progress=progress)
        if not sigma > 0:
            raise ValueError(f"sigma must be > 0, got {sigma}")
        if spread not in ("std", "var"):
            raise ValueError(f"spread must be 'std' or 'var', got {spread!r}")
        self.sigma = float(sigma)
        self.spread = spread
        self.checkpoint = None if checkpoint is None else str(checkpoint)

    # -- subclass API ---------------------------------------------------------------
    def _encode(self, examples: list[Example]) -> list[Encoded]:
        return encode(self.model, examples)

    def _score_chunk(self, items: list[Encoded]) -> torch.Tensor:  # pragma: no cover - abstract
        raise NotImplementedError

    # -------------------------------------------------------------------------------
    def fit(self, data: Any) -> "DatasetNeuronLocalizer":
        """Mean per-example scores over ``data`` (Examples, dicts or pairs): ``scores_``
        ``[n_layers, d_mlp]``, ``neurons_`` (the sigma mask), ``sums_`` (the running sums)."""
        examples = as_examples(data)
        if not examples:
            raise ValueError(f"{type(self).__name__}.fit got an empty dataset")
        examples = fill_greedy_targets(self.model, examples)
        encoded = self._encode(examples)  # every tokenization problem surfaces here, before work
        if not encoded:
            raise ValueError(f"{type(self).__name__}.fit: no usable example in {len(examples)}")
        shape = neuron_shape(self.model)
        key = {
            "method": self.name,
            "params": self.hyper_params(),
            "model": model_fingerprint(self.model),
            "data": dataset_fingerprint(e.example for e in encoded),
        }
        acc = ScoreSum.resume(self.checkpoint, shape, key)
        todo = [i for i in range(len(encoded)) if i not in acc.done]
        bar = tqdm(total=len(encoded), initial=acc.count, desc=self.name, disable=not self.progress)
        for chunk in batches(todo, self.chunk_examples):
            scores = self._score_chunk([encoded[i] for i in chunk])
            for i, row in zip(chunk, scores):
                acc.add(i, row)
            if self.checkpoint:
                acc.save(self.checkpoint)
            bar.update(len(chunk))
        bar.close()
        self.sums_ = acc
        meta = self._set_meta(dataset=describe_data([e.example for e in encoded]), n_samples=acc.count)
        self.scores_ = NeuronScores(acc.mean(), meta=meta)
        self.neurons_ = self.scores_.select(sigma=self.sigma, spread=self.spread)
        self.units_ = self.neurons_
        return self

    def clone(self, **changes: Any) -> "DatasetNeuronLocalizer":
        """A new unfitted localizer with the same hyper-parameters (no checkpoint) and ``changes`` applied."""
        params = {**self.get_params(), "progress": self.progress, "checkpoint": None, **changes}
        return type(self)(self.model, **params)

    def split_half(self, data: Any, seed: int = 0) -> dict[str, float]:
        """Localize on two disjoint random halves; overlap, IoU and ratio (Huang et al. 2025, Table 1)."""
        examples = as_examples(data)
        if len(examples) < 2:
            raise ValueError("split_half needs at least 2 examples")
        order = list(range(len(examples)))
        random.Random(seed).shuffle(order)
        half = len(order) // 2
        a = self.clone().fit([examples[i] for i in order[:half]]).neurons_
        b = self.clone().fit([examples[i] for i in order[half : 2 * half]]).neurons_
        return {
            "overlap": metrics.overlap(a, b),
            "iou": metrics.iou(a, b),
            "ratio": (a.ratio + b.ratio) / 2,
            "n_a": len(a),
            "n_b": len(b),
            "n_examples_per_half": half,
        }
