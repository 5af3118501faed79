"""The settings of the editing and fine-tuning interventions, each in one frozen value.

* :class:`RomeConfig`: ROME's value search and key statistics (:func:`~capinterp.interventions.rome.rome_edit`);
* :class:`EditConfig`: the value-vector update rule of :func:`~capinterp.interventions.editing.edit_knowledge`
  and :func:`~capinterp.interventions.editing.edit_table`;
* :class:`FinetuneConfig`: the optimisation of :func:`~capinterp.interventions.finetune.finetune`.

Each is validated on construction (a ValueError or TypeError naming the field), like
:class:`~capinterp.kernels.ig_config.IGConfig`. The functions take ``config=`` and, as the one
other path, keyword overrides of its fields: ``rome_edit(model, fact, layer=4, steps=10)`` is
``rome_edit(model, fact, layer=4, config=RomeConfig(steps=10))``, and overrides apply on top of a
given config. What varies per call and is data rather than a setting (the fact, the layer, the
neurons, texts, a seed) stays a call argument.

Named presets:

* :data:`ROME_GPT2_XL`: the value search of ROME's GPT-2 XL hyper-parameters (Meng et al. 2022,
  *Locating and Editing Factual Associations in GPT*, arXiv 2202.05262): 20 Adam steps at lr 0.5,
  KL factor 0.0625, weight decay 0.5, clamp 4; the default ``RomeConfig()``;
* :data:`EDIT_SIGNED`: Dai et al.'s update (*Knowledge Neurons in Pretrained Transformers*, arXiv
  2104.08696; params 1 and 8) along the unembedding, sign-corrected for neurons that fire negative;
  the default ``EditConfig()``;
* :data:`EDIT_DAI`: the same update without the sign correction, as Dai et al. write it;
* :data:`FINETUNE_CNL`: Adam at lr 1e-5, CNL's setting (Huang et al. 2025, *Capability
  Localization*, arXiv 2502.20992), one epoch of batches of 8; the default ``FinetuneConfig()``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields, replace
from types import MappingProxyType
from typing import Any, TypeVar

from capinterp.core import validate

__all__ = [
    "DIRECTIONS",
    "EDIT_DAI",
    "EDIT_SIGNED",
    "FINETUNE_CNL",
    "ROME_GPT2_XL",
    "EditConfig",
    "FinetuneConfig",
    "RomeConfig",
    "with_overrides",
]

#: The answer direction of the value-vector update: the unembedding column or the embedding row.
DIRECTIONS = ("unembed", "embed")

C = TypeVar("C", "RomeConfig", "EditConfig", "FinetuneConfig")


def with_overrides(cls: type[C], config: C | None, overrides: Mapping[str, Any], where: str) -> C:
    """``config`` (default ``cls()``) with ``overrides`` of its fields applied and validated;
    a TypeError for a config of another class or a keyword that is no field of ``cls``."""
    if config is None:
        config = cls()
    elif not isinstance(config, cls):
        raise TypeError(f"{where}: config must be a {cls.__name__} or None, got {type(config).__name__}")
    names = {f.name for f in fields(cls)}
    unknown = sorted(set(overrides) - names)
    if unknown:
        raise TypeError(
            f"{where}() got unexpected keyword argument(s) {unknown}; the {cls.__name__} fields are {sorted(names)}"
        )
    return replace(config, **overrides) if overrides else config


@dataclass(frozen=True)
class RomeConfig:
    """ROME's settings (:mod:`capinterp.interventions.rome`); validated on construction.

    Args:
        steps: Adam steps of the value optimisation (step 2, Eq. 4).
        lr: Adam learning rate.
        kl_factor: weight of the KL term on "{subject} is a".
        weight_decay: weight of ||delta||^2 / ||v0||^2.
        clamp: ||delta|| is kept <= clamp * ||v0||.
        ridge: C + ridge * mean(diag C) * I is inverted (a local corpus is small).
        n_prefixes: sampled context prefixes for k* and delta (when the call gives no ``prefixes``).
        prefix_tokens: tokens per sampled prefix.
    """

    steps: int = 20
    lr: float = 0.5
    kl_factor: float = 0.0625
    weight_decay: float = 0.5
    clamp: float = 4.0
    ridge: float = 1e-3
    n_prefixes: int = 5
    prefix_tokens: int = 8

    def __post_init__(self) -> None:
        validate.positive_int("steps", self.steps)
        for name in ("lr", "clamp"):
            validate.finite_float(name, getattr(self, name), low=0.0, low_open=True)
        for name in ("kl_factor", "weight_decay", "ridge"):
            validate.finite_float(name, getattr(self, name), low=0.0)
        validate.nonneg_int("n_prefixes", self.n_prefixes)
        validate.positive_int("prefix_tokens", self.prefix_tokens)

    def replace(self, **changes: Any) -> RomeConfig:
        """A copy with ``changes`` (validated again)."""
        return replace(self, **changes)


@dataclass(frozen=True)
class EditConfig:
    """The value-vector update of :mod:`capinterp.interventions.editing`; validated on construction.

    Args:
        lambdas: the update's (param1, param2): lambda_k = param_k * ||v|| / ||e||, each >= 0.
        direction: ``"unembed"`` (W_U column) or ``"embed"`` (W_E row) of the answer's first token.
        signed: flip the update of neurons whose activation at the edited query is negative.
        batch_size: prompts per forward pass when measuring.
    """

    lambdas: tuple[float, float] = (1.0, 8.0)
    direction: str = "unembed"
    signed: bool = True
    batch_size: int = 16

    def __post_init__(self) -> None:
        lam = self.lambdas
        if isinstance(lam, (str, bytes)) or not isinstance(lam, Sequence) or len(lam) != 2:
            raise ValueError(f"lambdas must be two finite numbers >= 0, got {lam!r}")
        for i, x in enumerate(lam):
            validate.finite_float(f"lambdas[{i}]", x, low=0.0)
        object.__setattr__(self, "lambdas", (float(lam[0]), float(lam[1])))  # [1, 8] == (1.0, 8.0), hashable
        if self.direction not in DIRECTIONS:
            raise ValueError(f"direction must be one of {DIRECTIONS}, got {self.direction!r}")
        validate.boolean("signed", self.signed)
        validate.positive_int("batch_size", self.batch_size)

    def replace(self, **changes: Any) -> EditConfig:
        """A copy with ``changes`` (validated again)."""
        return replace(self, **changes)


def _check_lr(lr: Any) -> None:
    for arm, v in lr.items() if isinstance(lr, Mapping) else [(None, lr)]:
        try:
            validate.finite_float("lr", v, low=0.0, low_open=True)
        except (TypeError, ValueError):
            where = f" (arm {arm!r})" if arm is not None else ""
            raise ValueError(f"lr must be a finite number > 0, got {v!r}{where}") from None


@dataclass(frozen=True)
class FinetuneConfig:
    """The optimisation of :func:`~capinterp.interventions.finetune.finetune`; validated on construction.

    Args:
        lr: Adam learning rate (no weight decay), or ``{arm: lr}`` with one entry per trained arm
            (few trained parameters usually want a larger rate than full fine-tuning).
        epochs: passes over the training set, shuffled per epoch by the call's ``seed``.
        batch_size: training examples per Adam step.
        eval_batch_size: batch size of the evaluations and of the before / after training loss.
    """

    lr: float | Mapping[str, float] = 1e-5
    epochs: int = 1
    batch_size: int = 8
    eval_batch_size: int = 16

    def __post_init__(self) -> None:
        _check_lr(self.lr)
        if isinstance(self.lr, Mapping):  # a read-only copy: the caller's dict may change later
            object.__setattr__(self, "lr", MappingProxyType({str(k): float(v) for k, v in self.lr.items()}))
        validate.positive_int("epochs", self.epochs)
        validate.positive_int("batch_size", self.batch_size)
        validate.positive_int("eval_batch_size", self.eval_batch_size)

    def __hash__(self) -> int:  # lr may be a mapping: hashed by its sorted items
        lr = tuple(sorted(self.lr.items())) if isinstance(self.lr, Mapping) else self.lr
        return hash((lr, self.epochs, self.batch_size, self.eval_batch_size))

    def replace(self, **changes: Any) -> FinetuneConfig:
        """A copy with ``changes`` (validated again)."""
        return replace(self, **changes)


#: ROME's GPT-2 XL value search (the default).
ROME_GPT2_XL = RomeConfig(steps=20, lr=0.5, kl_factor=0.0625, weight_decay=0.5, clamp=4.0)
#: Dai et al.'s update (params 1 and 8) along the unembedding, sign-corrected (the default).
EDIT_SIGNED = EditConfig(lambdas=(1.0, 8.0), direction="unembed", signed=True)
#: Dai et al.'s update without the sign correction.
EDIT_DAI = EditConfig(lambdas=(1.0, 8.0), direction="unembed", signed=False)
#: CNL's learning rate, one epoch (the default).
FINETUNE_CNL = FinetuneConfig(lr=1e-5, epochs=1, batch_size=8)
