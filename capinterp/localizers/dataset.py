"""Shared machinery of dataset-level neuron localizers (CNL, DCSN): ``DatasetNeuronLocalizer``.

Mean per-neuron scores over a dataset, a sigma mask, resumable checkpoints, split-half
consistency, data parallel runs under ``torchrun`` (:mod:`capinterp.core.distributed`),
``batch_size="auto"`` and out-of-memory retries (:mod:`capinterp.kernels.memory`)."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any, ClassVar

import torch
from tqdm.auto import tqdm

from capinterp.arch.model import model_fingerprint, neuron_shape
from capinterp.core import distributed as dist
from capinterp.core import validate
from capinterp.core.constraints import PATH, Interval, Options
from capinterp.core.example import Example, as_examples
from capinterp.core.pathlimits import check_path
from capinterp.core.protocol import Model
from capinterp.core.tokens import Encoded, batches, encode, encode_prompt
from capinterp.kernels.accumulate import ScoreSum, dataset_fingerprint, keyed_path
from capinterp.kernels.completeness import CompletenessLog
from capinterp.kernels.memory import auto_batch_size, forward_row_bytes, is_oom, release
from capinterp.kernels.rank_resume import resume as resume_ranks
from capinterp.localizers.base import Localizer
from capinterp.units import metrics
from capinterp.units.neurons import NeuronScores

__all__ = ["DatasetNeuronLocalizer", "describe_data", "fill_greedy_targets"]


def describe_data(examples: list[Example]) -> str:
    """Short description recorded in result metadata."""
    meta = examples[0].meta if examples else {}
    if meta.get("task") == "arithmetic":
        from capinterp.data import describe

        return describe(examples)
    return f"{len(examples)} examples"


@torch.no_grad()
def fill_greedy_targets(model: Model, examples: list[Example]) -> list[Example]:
    """Give Examples with an empty target the model's greedy next token (``meta["target_from"] = "greedy"``).

    Public entry points validate their data first (:func:`capinterp.core.validate.examples`), which
    lets only bare prompts through with an empty target: an explicit empty target never gets here.
    """
    todo = [i for i, e in enumerate(examples) if not e.target]
    if not todo:
        return examples
    from capinterp.kernels.evaluate import greedy_continuations

    ids = [encode_prompt(model, examples[i].prompt) for i in todo]
    out = list(examples)
    for start in range(0, len(todo), 16):
        new, _ = greedy_continuations(model, ids[start : start + 16], 1)
        for i, toks in zip(todo[start : start + 16], new):
            e = examples[i]
            out[i] = Example(e.prompt, model.tokenizer.decode(toks), {**e.meta, "target_from": "greedy"})
    return out


#: Hyper-parameters that change no number the checkpoint holds (the verdict on a tolerance is
#: judged again from the records): left out of its key, so a rerun that only asks for a tolerance
#: resumes instead of starting over.
NOT_IN_KEY = ("completeness_tol",)
#: Prefix of the per-example records' tensors in a checkpoint (``ScoreSum.extra``).
RECORDS = "records."


def _restore_records(log: CompletenessLog, acc: ScoreSum, ckpt: str | None) -> list[int]:
    """Append the per-example records a checkpoint kept to ``log``; their example indices, in order.
    A checkpoint without records (written before they were kept) gives none."""
    rec = {k[len(RECORDS) :]: v for k, v in acc.extra.items() if k.startswith(RECORDS)}
    if "index" not in rec:
        return []
    index = [int(i) for i in rec.pop("index").tolist()]
    if len(set(index)) != len(index) or set(index) != acc.done:
        raise ValueError(
            f"checkpoint {ckpt}: its per-example records cover other examples than its sums: "
            "the file is damaged; delete it to start over"
        )
    log.extend(rec)
    return index


def _records(log: CompletenessLog, index: list[int]) -> dict[str, torch.Tensor]:
    """The log's records and their example indices, as checkpoint tensors (``ScoreSum.extra``)."""
    out = {RECORDS + k: v for k, v in log.tensors().items()}
    out[RECORDS + "index"] = torch.tensor(index, dtype=torch.long)
    return out


def _gather_records(log: CompletenessLog, index: list[int]) -> None:
    """Every rank's records into ``log`` (under torchrun), sorted by example index: the records,
    in the order, an uninterrupted single process would hold (so its report is the same, exactly)."""
    parts = dist.gather((list(index), log.tensors()))
    if len(parts) > 1:
        log.reorder([])  # emptied: every rank's records follow, in rank order
        for _, tensors in parts:
            log.extend(tensors)
        index = [i for part, _ in parts for i in part]
    if len(set(index)) != len(index):
        raise ValueError(f"per-example records overlap on examples {sorted(index)[:5]}...")
    log.reorder(sorted(range(len(index)), key=index.__getitem__))


class DatasetNeuronLocalizer(Localizer):
    """Base for localizers whose score is a mean over examples of per-example neuron scores.

    Subclasses implement :meth:`_score_chunk` (``list[Encoded] -> [n, n_layers, d_mlp]``).
    ``checkpoint=path`` saves the running sums after every chunk; a later ``fit`` with the same
    path, model, data and hyper-parameters resumes where it stopped. A ``{key}`` in the path is
    replaced by a hash of those (:func:`capinterp.kernels.accumulate.keyed_path`; the file used is
    ``checkpoint_path_``), so other settings get a checkpoint of their own instead of a refusal.

    Under ``torchrun`` each rank scores every ``world_size``-th chunk of ``chunk_examples``
    examples (the chunks a single process would score, so per-example scores are bitwise the
    same), checkpoints its own shard to ``checkpoint.rank<r>-of-<n>``, and the float64 sums are
    all-reduced: every rank ends with the one-process result (sums equal to rounding, ~1e-16).
    ``batch_size="auto"`` picks the largest batch that fits in free memory
    (:func:`capinterp.kernels.memory.auto_batch_size`); an out-of-memory error halves the batch
    (or splits the chunk) and scores the same examples again, so nothing is lost or counted twice.

    Per-example records (:meth:`_example_log`; CNL: its IG completeness records) are kept in the
    checkpoint beside the sums and gathered over ranks, sorted by example index: a resumed or
    sharded fit reports on every example exactly as an uninterrupted single process does.
    """

    #: Its fit fingerprints the model's weights (the checkpoint key): :mod:`capinterp.localizers.cost` counts it.
    fingerprints_weights = True

    checkpointable = True
    fills_greedy = True  # fit: fill_greedy_targets
    chunk_examples: int = 8

    _parameter_constraints: ClassVar[dict[str, list[Any]]] = {
        "sigma": [Interval(float, 0, None, closed="neither")],
        "spread": [Options("std", "var")],
        "batch_size": [Interval(int, 1, None), "auto"],
        "checkpoint": [PATH, None],
    }

    def __init__(
        self,
        model: Model,
        *,
        sigma: float = 6.0,
        spread: str = "std",
        batch_size: int | str = 32,
        checkpoint: str | Path | None = None,
        device: Any = None,
        progress: bool = True,
    ) -> None:
        if batch_size == "auto":  # resolved at fit time, from the data and the free memory
            super().__init__(model, batch_size=1, device=device, progress=progress)
            self.batch_size = "auto"  # type: ignore[assignment]  # fit resolves it into the int batch_size_
        else:  # the base checks it is an integer >= 1
            super().__init__(model, batch_size=batch_size, device=device, progress=progress)  # type: ignore[arg-type]
        self.sigma = float(sigma)
        self.spread = spread
        self.checkpoint = None if checkpoint is None else str(checkpoint)
        if self.checkpoint is not None:  # a name the file system refuses: an error now, not after an example
            check_path(str(keyed_path(self.checkpoint, {})), "checkpoint")

    # -- subclass API ---------------------------------------------------------------
    def _encode(self, examples: list[Example]) -> list[Encoded]:
        return encode(self.model, examples)

    def _score_chunk(self, items: list[Encoded]) -> torch.Tensor:  # pragma: no cover - abstract
        """Scores ``[len(items), n_layers, d_mlp]`` with ``self.batch_size_`` (an int) as batch size."""
        raise NotImplementedError

    def _example_log(self) -> CompletenessLog | None:
        """Per-example records that the fit keeps in its checkpoint and gathers over ranks (one row
        added per example scored, in order); None: none (DCSN). IG localizers: their completeness log."""
        return None

    def _chunk_size(self) -> int:
        """Examples scored together (one checkpoint step); DCSN: its batch size."""
        return self.chunk_examples

    def _row_bytes(self, items: list[Encoded]) -> int:
        """Peak bytes one batch row needs (for ``batch_size="auto"``); by default one forward pass
        without gradients over the longest prompt. Override when a row costs more (CNL: IG rows)."""
        return forward_row_bytes(self.model, max(len(it.prompt_ids) for it in items))

    def _cost(self, data: Any) -> Any:
        """The work of ``fit(data)``, counted before any model work (:meth:`Localizer.estimate`)."""
        from capinterp.localizers.cost_counts import items_for
        from capinterp.localizers.cost_work import Work

        examples = validate.examples(data, f"{type(self).__name__}.fit(data)")
        work = Work(validate.model(self.model))
        items = items_for(work, examples)
        if not items:
            raise ValueError(f"{type(self).__name__}.fit: no usable example in {len(examples)}")
        bs = self.batch_size
        if bs == "auto":
            bs = auto_batch_size(self.model.cfg.device, self._row_bytes(items))
        self._count(work, items, int(bs))
        return work

    def _count(self, work: Any, items: list, batch_size: int) -> None:
        """Add the work of scoring ``items`` with ``batch_size`` to ``work`` (:meth:`estimate`); by
        default one forward pass per batch of prompts. Override when scoring does more (CNL's IG
        rows, DCSN's projections, NeFT's training steps)."""
        from capinterp.localizers.cost_counts import forward_work

        forward_work(work, "forward", [len(it.prompt_ids) for it in items], batch_size)

    def _score_safely(self, items: list[Encoded]) -> torch.Tensor:
        """:meth:`_score_chunk`, halving the batch (or splitting the chunk) on out-of-memory."""
        try:
            return self._score_chunk(items)
        except Exception as err:
            if not is_oom(err):
                raise
        release(self.model.cfg.device)
        if len(items) > 1:
            half = len(items) // 2
            return torch.cat([self._score_safely(items[:half]), self._score_safely(items[half:])])
        if self.batch_size_ <= 1:
            raise torch.OutOfMemoryError(f"{self.name}: out of memory with batch_size 1 on one example")
        self.batch_size_ //= 2
        self.oom_retries_ += 1
        return self._score_safely(items)

    # -------------------------------------------------------------------------------
    def fit(self, data: Any) -> DatasetNeuronLocalizer:
        """Mean per-example scores over ``data`` (Examples, dicts or pairs): ``scores_``
        ``[n_layers, d_mlp]``, ``neurons_`` (the sigma mask), ``sums_`` (the running sums)."""
        examples = validate.examples(data, f"{type(self).__name__}.fit(data)")
        validate.model(self.model)  # before the tokenizer is read
        encode(self.model, examples, bare="skip")  # TokenizationError before any model work
        self._begin_fit()
        examples = fill_greedy_targets(self.model, examples)
        encoded = self._encode(examples)  # every tokenization problem surfaces here, before work
        if not encoded:
            raise ValueError(f"{type(self).__name__}.fit: no usable example in {len(examples)}")
        shape = neuron_shape(self.model)
        key = {
            "method": self.name,
            "params": {k: v for k, v in self.hyper_params().items() if k not in NOT_IN_KEY},
            "model": model_fingerprint(self.model),
            "data": dataset_fingerprint(e.example for e in encoded),
        }
        dist.init(self.model.cfg.device)
        self.batch_size_ = (
            self.batch_size
            if self.batch_size != "auto"
            else auto_batch_size(self.model.cfg.device, self._row_bytes(encoded))
        )
        self.oom_retries_ = 0
        ckpt = dist.rank_path(keyed_path(self.checkpoint, key))
        if ckpt:  # with torchrun's rank suffix
            check_path(ckpt, "checkpoint")
        self.checkpoint_path_ = ckpt
        # this rank's sums, and the examples done on any rank, also by a run with another number
        # of processes (rank 0 adopts its files: a rerun never silently starts from scratch)
        acc, done = resume_ranks(keyed_path(self.checkpoint, key), shape, key)
        stray = sorted(i for i in done if not 0 <= i < len(encoded))
        if stray:
            raise ValueError(
                f"checkpoint {ckpt} marks examples {stray[:5]} as done, but the data has "
                f"{len(encoded)} examples: the file is damaged; delete it to start over"
            )
        mine = dist.shard(list(batches(list(range(len(encoded))), self._chunk_size())))
        todo = [[i for i in chunk if i not in done] for chunk in mine]
        show = self.progress and dist.is_main()
        desc = self.name if dist.world_size() == 1 else f"{self.name} (rank 0 of {dist.world_size()})"
        bar = tqdm(total=sum(map(len, todo)) + acc.count, initial=acc.count, desc=desc, disable=not show)
        log = self._example_log()
        rec_index = [] if log is None else _restore_records(log, acc, ckpt)
        for chunk in filter(None, todo):
            before = 0 if log is None else log.n_examples
            scores = self._score_safely([encoded[i] for i in chunk])
            for i, row in zip(chunk, scores):
                acc.add(i, row)
            if log is not None:
                if log.n_examples - before != len(chunk):
                    raise RuntimeError(f"{self.name}: {log.n_examples - before} records for {len(chunk)} examples")
                rec_index += chunk
                acc.extra = _records(log, rec_index)
            if ckpt:
                acc.save(ckpt)
            bar.update(len(chunk))
        bar.close()
        acc = acc.all_reduced()
        if log is not None:
            _gather_records(log, rec_index)
        self.sums_ = acc
        meta = self._set_meta(dataset=describe_data([e.example for e in encoded]), n_samples=acc.count)
        self.scores_ = NeuronScores(acc.mean(), meta=meta)
        self.neurons_ = self.scores_.select(sigma=self.sigma, spread=self.spread)
        self.units_ = self.neurons_
        return self

    def clone(self, **changes: Any) -> DatasetNeuronLocalizer:
        """A new unfitted localizer with the same hyper-parameters (no checkpoint) and ``changes`` applied."""
        params = {**self.get_params(), "progress": self.progress, "checkpoint": None, **changes}
        return type(self)(self.model, **params)

    def split_half(self, data: Any, seed: int = 0) -> dict[str, float]:
        """Localize on two disjoint random halves; overlap, IoU and ratio (Huang et al. 2025, Table 1),
        with the chance levels of overlap and IoU and the p-value of the intersection
        (:func:`capinterp.units.metrics.chance`)."""
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
            **metrics.chance_stats(a, b),
            "ratio": (a.ratio + b.ratio) / 2,
            "n_a": len(a),
            "n_b": len(b),
            "n_examples_per_half": half,
        }
