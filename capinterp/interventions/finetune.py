"""Neuron-level fine-tuning (CNL "enhance", DCSN's CNLF): train only chosen neurons' weights.

    ft = ci.finetune(model, train, neurons=cnl.neurons_, lr=1e-5, epochs=3, eval_data=test)
    ft.table          # arm, trainable parameters, train loss and accuracy before / after
    ft.plot().show()

A neuron's parameters are the entries it owns (:mod:`capinterp.interventions.neuron_params`): its ``W_in``
and ``W_gate`` columns, ``b_in`` entry and ``W_out`` row. Arms:

* ``"located"``: only the given neurons' entries are trained;
* ``"random"``: the same number of random neurons (``neurons.random_like(seed)``);
* ``"without_located"``: every parameter except the located neurons' entries, which are set
  to 0 first and stay 0 (the neurons are erased during training and evaluation);
* ``"full"``: every parameter.

Frozen entries are frozen exactly: parameters with nothing to train get
``requires_grad=False``, and partly trained ones have their gradients zeroed outside the mask
after every backward pass. Adam runs *without* weight decay, so a zero gradient gives a zero
moment and a zero update: frozen entries stay bit-identical (tests check ``torch.equal``).
The loss is teacher-forced cross-entropy on the target tokens only (``prompt + target``,
targets tokenized in context by :func:`capinterp.core.tokens.encode`), averaged over tokens.

Each arm trains its own copy of the model (one :func:`capinterp.core.params.copy_model`, reset
to the caller's weights between arms; one copy per arm with ``keep_models=True``); the
caller's model is changed only with ``inplace=True`` (one arm). Hooks attached to the model
when ``finetune`` is called are copied with it and apply throughout.
"""

from __future__ import annotations

import gc
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pandas as pd
import torch
from jaxtyping import Float
from torch import Tensor
from tqdm.auto import tqdm

from capinterp.arch.family import family_of
from capinterp.arch.forward import capture, unembed
from capinterp.arch.model import valid_neurons
from capinterp.core import validate
from capinterp.core.example import Example
from capinterp.core.params import copy_model
from capinterp.core.protocol import Model
from capinterp.core.settings import resolve_device
from capinterp.core.tokens import Encoded, batches, collate, encode, pad_id
from capinterp.interventions.configs import FinetuneConfig, with_overrides
from capinterp.interventions.finetune_result import FinetuneResult, finetune_figure
from capinterp.interventions.hooks import check_neurons
from capinterp.interventions.neuron_params import count_params, neuron_masks, zero_neurons
from capinterp.kernels.evaluate import evaluate
from capinterp.units.neurons import NeuronSet

__all__ = ["ARMS", "FinetuneConfig", "FinetuneResult", "finetune", "finetune_figure", "mean_target_loss", "target_loss"]

ARMS: tuple[str, ...] = ("located", "random", "without_located", "full")
_START = {"located": "original", "random": "original", "full": "original", "without_located": "erased"}


def target_loss(model: Model, items: Sequence[Encoded]) -> Float[Tensor, ""]:
    """Mean cross-entropy of the target tokens, teacher-forced (one scalar with autograd)."""
    dev = torch.device(model.cfg.device)
    batch = collate(items, pad_id(model.tokenizer), device=dev)
    rows = torch.tensor([b for b, it in enumerate(items) for _ in it.target_ids], device=dev)
    pos = torch.tensor([p for it in items for p in it.answer_positions], device=dev)
    tgt = torch.tensor([t for it in items for t in it.target_ids], device=dev)
    resid = capture(model, batch.tokens, "ln_final.hook_in")
    logits = unembed(model, resid[rows, pos][:, None])[:, 0].float()
    return torch.nn.functional.cross_entropy(logits, tgt)


@torch.no_grad()
def mean_target_loss(model: Model, items: Sequence[Encoded], batch_size: int = 16) -> float:
    """Token-weighted mean target cross-entropy over ``items`` (no gradients)."""
    total, count = 0.0, 0
    for chunk in batches(list(items), batch_size):
        n = sum(len(it.target_ids) for it in chunk)
        total += float(target_loss(model, chunk)) * n
        count += n
    return total / count


def _check_args(
    train: list[Example],
    lr: float | Mapping[str, float],
    arms: Sequence[str],
    neurons: NeuronSet | None,
    inplace: bool,
) -> tuple[tuple[str, ...], dict[str, float]]:
    """The arms, checked against ``neurons`` and ``inplace``, and the learning rate of each
    (``lr``'s values are checked by :class:`~capinterp.interventions.configs.FinetuneConfig`)."""
    if not train:
        raise ValueError("finetune() got an empty training set")
    validate.boolean("inplace", inplace)
    arms = (arms,) if isinstance(arms, str) else tuple(arms)
    bad = [a for a in arms if a not in ARMS]
    if not arms or bad or len(set(arms)) != len(arms):
        raise ValueError(f"arms must be distinct names from {ARMS}, got {arms!r}")
    if neurons is None and any(a != "full" for a in arms):
        raise ValueError(f"arms {[a for a in arms if a != 'full']} need neurons=")
    if neurons is not None and len(neurons) == 0 and ("located" in arms or "random" in arms):
        raise ValueError("neurons is empty: the located and random arms would train nothing")
    lrs = dict(lr) if isinstance(lr, Mapping) else dict.fromkeys(arms, lr)
    if set(lrs) != set(arms):
        raise ValueError(f"lr as a mapping needs one entry per arm {arms}, got {sorted(lrs)}")
    if inplace and len(arms) != 1:
        raise ValueError(f"inplace=True trains the caller's model, so it takes exactly one arm, got {arms!r}")
    return arms, {a: float(v) for a, v in lrs.items()}


def _eval_sets(eval_data: Any) -> dict[str, list[Example]]:
    if eval_data is None:
        return {}
    sets = dict(eval_data) if isinstance(eval_data, Mapping) else {"eval": eval_data}
    out = {str(k): validate.examples(v, f"eval_data[{k!r}]", min_count=0) for k, v in sets.items()}
    empty = [k for k, v in out.items() if not v]
    if empty:
        raise ValueError(f"eval_data set(s) {empty} are empty")
    return out


def _located(neurons: NeuronSet | None, arm: str) -> NeuronSet:
    """The located set an arm other than ``full`` needs (checked before training starts)."""
    if neurons is None:
        raise ValueError(f"the {arm!r} arm needs neurons=")
    return neurons


def _trainable(model: Model, arm: str, neurons: NeuronSet | None) -> dict[str, torch.Tensor | None]:
    """``{parameter name: mask of trained entries, or None for the whole parameter}``."""
    if arm == "full":
        return {name: None for name, _ in model.named_parameters()}
    masks = neuron_masks(model, _located(neurons, arm))
    if arm == "without_located":
        return {name: (~masks[name] if name in masks else None) for name, _ in model.named_parameters()}
    return {name: m for name, m in masks.items() if bool(m.any())}


def _train(
    model: Model,
    items: list[Encoded],
    trainable: dict[str, torch.Tensor | None],
    *,
    lr: float,
    epochs: int,
    batch_size: int,
    seed: int,
    arm: str,
    progress: bool,
) -> list[dict[str, Any]]:
    """Adam (no weight decay) over the trainable entries; returns the per-step losses."""
    params = dict(model.named_parameters())
    for p in params.values():
        p.requires_grad_(False)
    frozen: list[tuple[torch.nn.Parameter, torch.Tensor]] = []
    for name, mask in trainable.items():
        params[name].requires_grad_(True)
        if mask is not None:
            frozen.append((params[name], ~mask))
    opt = torch.optim.Adam([params[n] for n in trainable], lr=lr, weight_decay=0.0)
    gen = torch.Generator().manual_seed(int(seed))
    n_steps = epochs * math.ceil(len(items) / batch_size)
    history: list[dict[str, Any]] = []
    with tqdm(total=n_steps, desc=f"finetune {arm}", disable=not progress) as bar:
        for epoch in range(epochs):
            order = torch.randperm(len(items), generator=gen).tolist()
            for chunk in batches([items[i] for i in order], batch_size):
                opt.zero_grad(set_to_none=True)
                loss = target_loss(model, chunk)
                value = loss.detach().item()
                if not math.isfinite(value):
                    raise FloatingPointError(f"arm {arm!r}: non-finite loss at epoch {epoch}; lower lr (now {lr})")
                loss.backward()
                for p, off in frozen:
                    if p.grad is not None:
                        p.grad.masked_fill_(off, 0.0)
                opt.step()
                history.append({"arm": arm, "epoch": epoch, "step": len(history), "loss": value})
                bar.update(1)
                bar.set_postfix(loss=f"{value:.4f}")
    opt.zero_grad(set_to_none=True)
    return history


def _fresh_copy(model: Model, spare=None):
    """A trainable copy of ``model``: ``spare`` (a used copy) reset to its weights, else a deep copy.

    The tokenizer is shared (it is only read). Training changes parameters only, so copying
    them back restores a used copy exactly, faster than a new deep copy.
    """
    if spare is None:
        return copy_model(model)
    source = dict(model.named_parameters())
    with torch.no_grad():
        for name, p in spare.named_parameters():
            p.copy_(source[name])
    return spare


def _measure(model: Model, items: list[Encoded], sets: dict[str, list[Example]], batch_size: int) -> dict[str, Any]:
    out: dict[str, Any] = {"train_loss": mean_target_loss(model, items, batch_size)}
    for name, exs in sets.items():
        out[name] = evaluate(model, exs, batch_size=batch_size, progress=False)
    return out


def _arm_neuron_sets(
    model: Model, arms: Sequence[str], neurons: NeuronSet | None, random_neurons: NeuronSet | None, seed: int
) -> dict[str, NeuronSet]:
    """The neuron set each neuron arm trains: ``located`` the given one, ``random`` a random draw of
    the same size (``random_neurons``, or ``neurons.random_like(seed)``), checked against the model."""
    sets_neurons: dict[str, NeuronSet] = {}
    if neurons is not None and "located" in arms:
        sets_neurons["located"] = neurons
    if "random" in arms:
        assert neurons is not None  # _check_args: every arm but "full" needs neurons
        rnd = random_neurons if random_neurons is not None else _on_model(model, neurons).random_like(seed)
        check_neurons(model, rnd)
        if len(rnd) != len(neurons):
            raise ValueError(f"random_neurons has {len(rnd)} neurons, neurons has {len(neurons)}")
        sets_neurons["random"] = rnd
    return sets_neurons


def _on_model(model: Model, neurons: NeuronSet) -> NeuronSet:
    """``neurons``, knowing the model's layer widths (a set built without them, e.g. from a bare mask,
    would draw its random twin among padding neurons too); itself on models without padding."""
    widths = family_of(model).layer_widths
    if not widths or neurons.padded:
        return neurons
    return NeuronSet(neurons.mask, {**neurons.meta, "layer_widths": list(widths)})


def _neuron_counts(model: Model, neurons: NeuronSet | None) -> dict[str, int]:
    """Neurons each arm trains (the table's ``n_neurons``; the model's real neurons, not padding)."""
    all_neurons = int(valid_neurons(model).sum())
    n_located = len(neurons) if neurons is not None else 0
    return {
        "located": n_located,
        "random": n_located,
        "without_located": all_neurons - n_located,
        "full": all_neurons,
    }


def _arm_model(model: Model, arm: str, spare, inplace: bool, dev: torch.device, neurons: NeuronSet | None):
    """The model an arm trains: the caller's (``inplace``) or a fresh copy, on ``dev``; the
    ``without_located`` arm starts with the located neurons zeroed."""
    work = model if inplace else _fresh_copy(model, spare)
    if torch.device(work.cfg.device) != dev:
        work.to(dev, print_details=False)
    if arm == "without_located":
        zero_neurons(work, _located(neurons, arm))
    return work


def _train_then_restore_flags(
    work, items: list[Encoded], trainable: dict[str, torch.Tensor | None], flags: dict[str, bool], **train_kw: Any
) -> list[dict[str, Any]]:
    """:func:`_train`, then every parameter's ``requires_grad`` put back as it was (also on error)."""
    try:
        return _train(work, items, trainable, **train_kw)
    finally:
        for name, p in work.named_parameters():
            p.requires_grad_(flags.get(name, True))


@dataclass(frozen=True)
class _Run:
    """What every arm of one :func:`finetune` call shares: the data, the caller's ``requires_grad``
    flags, the model's parameter count, and the training and measuring settings."""

    items: list[Encoded]
    sets: dict[str, list[Example]]
    flags: dict[str, bool]
    n_total: int
    epochs: int
    batch_size: int
    seed: int
    eval_batch_size: int
    progress: bool


def _run_arm(
    run: _Run,
    work,
    arm: str,
    lr: float,
    n_neurons: int,
    neurons: NeuronSet | None,
    before: dict[str, dict[str, Any]],
) -> tuple[dict[str, Any], list[dict[str, Any]], list[dict[str, Any]]]:
    """Train one arm's model ``work``, measured before (once per starting point, kept in ``before``)
    and after: its table row (with timings), long-form evaluations and loss history."""
    trainable = _trainable(work, arm, neurons)
    sizes = {n: p.numel() for n, p in work.named_parameters()}
    n_train = sum(sizes[n] if m is None else int(m.sum()) for n, m in trainable.items())
    start = _START[arm]
    if start not in before:
        before[start] = _measure(work, run.items, run.sets, run.eval_batch_size)
    t0 = time.perf_counter()
    history = _train_then_restore_flags(
        work,
        run.items,
        trainable,
        run.flags,
        lr=lr,
        epochs=run.epochs,
        batch_size=run.batch_size,
        seed=run.seed,
        arm=arm,
        progress=run.progress,
    )
    secs = time.perf_counter() - t0
    after = _measure(work, run.items, run.sets, run.eval_batch_size)
    row, evals = _arm_row(arm, lr, n_neurons, n_train, run.n_total, before[start], after, run.sets)
    return {**row, "train_s": secs, "s_per_epoch": secs / run.epochs}, evals, history


def _arm_row(
    arm: str,
    lr: float,
    n_neurons: int,
    n_train: int,
    n_total: int,
    before: dict[str, Any],
    after: dict[str, Any],
    sets: dict[str, list[Example]],
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """One arm's table row (losses, accuracies before / after) and its long-form evaluations."""
    row: dict[str, Any] = {
        "arm": arm,
        "lr": lr,
        "n_neurons": n_neurons,
        "n_trainable_params": n_train,
        "param_share": n_train / n_total,
        "train_loss_before": before["train_loss"],
        "train_loss_after": after["train_loss"],
    }
    evals: list[dict[str, Any]] = []
    for name in sets:
        row[f"{name}_acc_before"] = before[name].accuracy
        row[f"{name}_acc_after"] = after[name].accuracy
        evals += [
            {"arm": arm, "dataset": name, "stage": stage, **res.to_dict()}
            for stage, res in (("before", before[name]), ("after", after[name]))
        ]
    return row, evals


def finetune(
    model: Model,
    train: Sequence[Any],
    *,
    neurons: NeuronSet | None = None,
    arms: Sequence[str] = ARMS,
    eval_data: Any = None,
    config: FinetuneConfig | None = None,
    seed: int = 0,
    device: str | torch.device | None = None,
    inplace: bool = False,
    keep_models: bool = False,
    random_neurons: NeuronSet | None = None,
    progress: bool = True,
    **overrides: Any,
) -> FinetuneResult:
    """Fine-tune each arm on ``train`` and measure it before and after.

    Args:
        model: a ``TransformerBridge`` from :func:`capinterp.load_model` (left untouched unless
            ``inplace=True``).
        train: Examples (or ``(prompt, target)`` pairs); loss on the target tokens only.
        neurons: the located neurons (required by every arm but ``"full"``).
        arms: any of ``"located"``, ``"random"``, ``"without_located"``, ``"full"``.
        eval_data: None, a list of Examples, or ``{name: examples}``; accuracy by
            :func:`capinterp.kernels.evaluate` before and after training.
        config: the optimisation, a :class:`~capinterp.interventions.configs.FinetuneConfig`
            (``lr``, ``epochs``, ``batch_size``, ``eval_batch_size``; default ``FinetuneConfig()``:
            :data:`~capinterp.interventions.configs.FINETUNE_CNL`, Adam at lr 1e-5, one epoch).
        seed: draws the random arm's neurons (``neurons.random_like(seed)``) and the batch order.
        device: where to train (default: the model's device); the copy is moved there.
        inplace: train the caller's model itself (one arm only).
        keep_models: return the trained copies in ``result.models``.
        random_neurons: the random arm's set, instead of ``neurons.random_like(seed)``.
        progress: a tqdm bar per arm (stderr).
        overrides: fields of ``config`` (e.g. ``lr=1e-5, epochs=3``; ``lr`` may be ``{arm: lr}``
            for every arm), applied on top of it.

    Returns:
        A :class:`FinetuneResult` (table, long-form evaluations, loss history, neuron sets).

    Raises:
        ValueError: empty training or evaluation set, ``lr <= 0``, ``epochs < 1``, an unknown or
            repeated arm, missing or empty ``neurons``, a NeuronSet made for another model
            (via :func:`capinterp.interventions.hooks.check_neurons`), ``inplace`` with several arms.
        TypeError: a keyword that is no field of :class:`~capinterp.interventions.configs.FinetuneConfig`.
        TokenizationError: an example's target does not tokenize after its prompt.
        FloatingPointError: the training loss became NaN/inf (lower ``lr``).
    """
    cfg = with_overrides(FinetuneConfig, config, overrides, "finetune")
    arms, lrs, items, sets = _validated(model, train, cfg, arms, neurons, inplace, eval_data)
    sets_neurons = _arm_neuron_sets(model, arms, neurons, random_neurons, seed)
    dev = resolve_device(device) if device is not None else torch.device(model.cfg.device)
    flags = {name: p.requires_grad for name, p in model.named_parameters()}
    run = _Run(items, sets, flags, count_params(model), cfg.epochs, cfg.batch_size, seed, cfg.eval_batch_size, progress)
    rows, evals, history, models = _run_arms(model, run, arms, lrs, neurons, sets_neurons, dev, inplace, keep_models)
    summary = {"lr": lrs, "epochs": cfg.epochs, "batch_size": cfg.batch_size, "seed": seed, "device": str(dev)}
    summary.update({"n_train": len(items), "n_params": run.n_total, "arms": list(arms)})
    return FinetuneResult(
        table=pd.DataFrame(rows),
        evals=pd.DataFrame(evals, columns=["arm", "dataset", "stage", "accuracy", "mean_prob", "n"]),
        history=pd.DataFrame(history, columns=["arm", "epoch", "step", "loss"]),
        neurons=sets_neurons,
        models=models,
        config=summary,
    )


def _validated(
    model: Model,
    train: Sequence[Any],
    cfg: FinetuneConfig,
    arms: Sequence[str],
    neurons: NeuronSet | None,
    inplace: bool,
    eval_data: Any,
) -> tuple[tuple[str, ...], dict[str, float], list[Encoded], dict[str, list[Example]]]:
    """Every check before training: ``(arms, lr per arm, encoded training items, evaluation sets)``;
    every set is tokenized here, so a tokenization problem surfaces before any training."""
    validate.model(model)
    train_ex = validate.examples(train, "finetune(train)", min_count=0)
    arms, lrs = _check_args(train_ex, cfg.lr, arms, neurons, inplace)
    if neurons is not None:
        check_neurons(model, neurons)
    sets = _eval_sets(eval_data)
    items = encode(model, train_ex)
    for exs in sets.values():
        encode(model, exs)
    return arms, lrs, items, sets


def _run_arms(
    model: Model,
    run: _Run,
    arms: tuple[str, ...],
    lrs: dict[str, float],
    neurons: NeuronSet | None,
    sets_neurons: dict[str, NeuronSet],
    dev: torch.device,
    inplace: bool,
    keep_models: bool,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]], dict[str, Any]]:
    """Train and measure every arm in turn: ``(table rows, evaluations, loss history, kept models)``.
    A finished arm's copy is reset and reused by the next arm unless it is kept."""
    counts = _neuron_counts(model, neurons)
    before: dict[str, dict[str, Any]] = {}  # measurements of each starting point, shared by the arms
    rows: list[dict[str, Any]] = []
    evals: list[dict[str, Any]] = []
    history: list[dict[str, Any]] = []
    models: dict[str, Any] = {}
    spare = None
    for arm in arms:
        work = _arm_model(model, arm, spare, inplace, dev, neurons)
        row, arm_evals, arm_history = _run_arm(
            run, work, arm, lrs[arm], counts[arm], sets_neurons.get(arm, neurons), before
        )
        rows.append(row)
        evals += arm_evals
        history += arm_history
        if keep_models or inplace:
            models[arm] = work
        else:
            spare = work
        del work
    if spare is not None and run.n_total > 10_000_000:  # free a big copy now (the bridge holds reference cycles)
        del spare
        gc.collect()
    return rows, evals, history, models
