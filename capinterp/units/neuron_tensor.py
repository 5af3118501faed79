"""What neuron scores and neuron sets share: one ``[n_layers, d_mlp]`` tensor, metadata, save and load.

:class:`~capinterp.units.neuron_scores.NeuronScores` and :class:`~capinterp.units.neuron_set.NeuronSet`
share one ``[n_layers, d_mlp]`` CPU tensor over ``blocks.{l}.mlp.hook_post``, metadata, the model
check, drawing, and ``save`` / :func:`load` (file format: :mod:`capinterp.units.neuron_io`)."""

from __future__ import annotations

import copy
import os
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch
from torch import Tensor

from capinterp._version import __version__
from capinterp.arch.family import width_mask
from capinterp.plots.heatmaps import neuron_heatmap
from capinterp.units import neuron_io
from capinterp.units.saved import IDENTITY_UNKNOWN, check_identity

__all__ = ["MODEL_KEYS", "NeuronTensor", "load"]

MODEL_KEYS = (
    "model",
    "model_fingerprint",
    "architecture_fingerprint",
    "n_params",
    "params_per_neuron",
    "layer_widths",
    IDENTITY_UNKNOWN,  # loaded from a file without model identity: kept by derived sets, so they stay unchecked
)


def _shape_of(model_or_shape: Any) -> tuple[int, int]:
    """(n_layers, d_mlp) from a 2-tuple, or from an object with ``cfg.n_layers`` / ``cfg.d_mlp``."""
    x = model_or_shape
    if isinstance(x, (tuple, list, torch.Size)) and len(x) == 2:
        return int(x[0]), int(x[1])
    cfg = getattr(x, "cfg", x)
    if not (hasattr(cfg, "n_layers") and hasattr(cfg, "d_mlp")):
        raise ValueError(f"expected (n_layers, d_mlp) or a model with cfg.n_layers / cfg.d_mlp, got {x!r:.80}")
    return int(cfg.n_layers), int(cfg.d_mlp)


class NeuronTensor:
    """Shared shape, metadata, compatibility and save/load logic of NeuronScores and NeuronSet.

    A subclass names its stored tensor (``_tensor_name``) and the dtype it is stored as
    (``_stored_dtype``); defining it registers it with :func:`load` under its class name."""

    _tensor_name: ClassVar[str] = ""
    _stored_dtype: ClassVar[torch.dtype] = torch.float32
    _types: ClassVar[dict[str, type[NeuronTensor]]] = {}
    meta: dict[str, Any]

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        NeuronTensor._types[cls.__name__] = cls

    def __init__(self, values: Any, meta: dict[str, Any] | None = None) -> None:
        raise NotImplementedError  # subclasses build from (tensor, meta); load relies on it

    def _init_meta(self, meta: dict[str, Any] | None) -> None:
        self.meta = copy.deepcopy(dict(meta or {}))
        self.meta.setdefault("version", __version__)
        self._valid = width_mask(self.meta.get("layer_widths"), self.shape)  # ValueError for widths that do not fit

    @property
    def valid(self) -> Tensor:
        """Bool ``[n_layers, d_mlp]``: True at the model's real neurons. All True but for models whose
        layers differ in width (``meta["layer_widths"]``: dense layers between MoE layers), whose
        narrower layers are padded to ``d_mlp``; padding neurons are never selected, drawn or counted."""
        return self._valid

    @property
    def padded(self) -> bool:
        """Whether some layers are narrower than ``d_mlp`` (see :attr:`valid`)."""
        return not bool(self._valid.all())

    def _data(self) -> Tensor:  # the stored tensor
        raise NotImplementedError

    @staticmethod
    def _as_2d(x: Any, what: str) -> Tensor:
        t = x.detach() if isinstance(x, Tensor) else torch.as_tensor(np.asarray(x))
        if t.ndim != 2 or t.numel() == 0:
            raise ValueError(f"{what} must be a non-empty [n_layers, d_mlp] array, got shape {tuple(t.shape)}")
        return t.cpu()

    shape = property(lambda self: tuple(self._data().shape), doc="(n_layers, d_mlp)")
    n_layers = property(lambda self: self.shape[0], doc="number of layers")
    d_mlp = property(lambda self: self.shape[1], doc="neurons per layer")

    def _model_meta(self, other: NeuronTensor | None = None) -> dict[str, Any]:
        """The model-level metadata, kept by derived sets (only keys both sides agree on)."""
        keep = {k: copy.deepcopy(self.meta[k]) for k in MODEL_KEYS if k in self.meta}
        if other is not None:
            keep = {k: v for k, v in keep.items() if other.meta.get(k, v) == v}
        return keep

    def check_compatible(
        self,
        model_shape: Any = None,
        fingerprint: str | None = None,
        *,
        architecture: str | None = None,
        model_name: str | None = None,
    ) -> None:
        """ValueError if made for a model of another (n_layers, d_mlp) or, when both are known,
        another fingerprint (weights + config, :func:`capinterp.core.fingerprint.model_fingerprint`)
        or another ``architecture`` fingerprint; also when ``fingerprint`` is given and this was
        loaded from a file that records no model identity (:func:`capinterp.units.saved.check_identity`).
        ``model_shape`` may also be a model with ``cfg.n_layers``/``cfg.d_mlp``; ``model_name`` only
        words the message."""
        name = type(self).__name__
        if model_shape is not None and (shape := _shape_of(model_shape)) != self.shape:
            raise ValueError(
                f"{name} was made for a model with {self.n_layers} layers x {self.d_mlp} "
                f"neurons; this model has {shape[0]} x {shape[1]}"
            )
        check_identity(self.meta, name, fingerprint=fingerprint, architecture=architecture, model_name=model_name)

    def check_model(self, model: Any, *, across_models: bool = False) -> None:
        """ValueError when this was made for a model other than ``model``: another shape, or another
        fingerprint (weights and config), or with ``across_models=True`` (another checkpoint of the
        same architecture on purpose) another architecture; :meth:`check_compatible` words it."""
        from capinterp.arch.model import neuron_shape
        from capinterp.core import validate
        from capinterp.core.fingerprint import architecture_fingerprint, model_fingerprint

        validate.model(model)
        name = getattr(model, "capinterp_name", None)
        if validate.boolean("across_models", across_models):
            self.check_compatible(neuron_shape(model), architecture=architecture_fingerprint(model), model_name=name)
        else:
            self.check_compatible(neuron_shape(model), model_fingerprint(model), model_name=name)

    def plot(self, **kwargs: Any):
        """Binned layer x neuron heatmap: max |score| or located count per block (:func:`capinterp.plots.neuron_heatmap`)."""
        return neuron_heatmap(self, **kwargs)

    # --- save / load --------------------------------------------------------------------------
    def save(self, path: str | os.PathLike, *, overwrite: bool = False) -> Path:
        """Write a ``.capi`` safetensors file, or a folder when ``path`` is a folder / ends in "/".

        Refuses (ValueError) to replace anything but a capinterp file / folder of the same type,
        or a non-empty folder of other files, unless ``overwrite=True``. Writes are atomic, and a
        link at ``path`` is replaced by the file, never followed. The file's checksums cover the
        tensor and the whole header (:mod:`capinterp.units.neuron_io`).
        """
        if not isinstance(path, (str, os.PathLike)):
            raise TypeError(f"path must be a str or Path, got {type(path).__name__}")
        p = Path(path)
        as_folder = str(path).endswith(("/", os.sep)) or p.is_dir()
        data = self._data()
        stored = (data.to(torch.uint8) if data.dtype == torch.bool else data).contiguous()
        header = {"type": type(self).__name__, "shape": list(self.shape), "meta": self.meta}
        return neuron_io.write(p, as_folder, self._tensor_name, stored, header, overwrite=overwrite)

    @classmethod
    def load(
        cls,
        path: str | os.PathLike,
        expected_shape: Any = None,
        *,
        model_shape: Any = None,
        fingerprint: str | None = None,
        model: Any = None,
        across_models: bool = False,
    ):
        """Load a saved object of this class; ValueError for another type or an incompatible shape.

        ``model=m`` checks the file against that model: its shape and its fingerprint (weights and
        config), or only its architecture with ``across_models=True`` (another checkpoint of the
        same architecture on purpose); :meth:`check_compatible` words the error.
        """
        obj = load(path, model=model, across_models=across_models)
        if not isinstance(obj, cls):
            raise ValueError(
                f"{path} holds a {type(obj).__name__}, not a {cls.__name__}; "
                f"use {type(obj).__name__}.load or capinterp.units.neurons.load"
            )
        obj.check_compatible(expected_shape if expected_shape is not None else model_shape, fingerprint)
        return obj


def load(
    path: str | os.PathLike,
    expected_shape: Any = None,
    *,
    model_shape: Any = None,
    fingerprint: str | None = None,
    model: Any = None,
    across_models: bool = False,
) -> Any:
    """Load whichever of NeuronScores / NeuronSet is stored at ``path`` (file or folder); with
    ``model=`` checked against that model (shape and fingerprint, or its architecture only with
    ``across_models=True``)."""
    p = Path(path)
    header, tensors = neuron_io.read(p)
    typ, version, shape, meta = header["type"], header["format_version"], header["shape"], header["meta"]
    classes = NeuronTensor._types
    if not isinstance(typ, str) or typ not in classes:
        raise ValueError(f"{p} holds an unknown capinterp type {typ!r}")
    if isinstance(version, bool) or not isinstance(version, int) or not 1 <= version <= neuron_io.FORMAT_VERSION:
        raise ValueError(
            f"{p} has format_version {version!r}; capinterp {__version__} reads 1..{neuron_io.FORMAT_VERSION}"
        )
    if not isinstance(meta, dict):
        raise neuron_io.invalid(p, f"meta must be a JSON object, got {type(meta).__name__}")
    if not (
        isinstance(shape, list)
        and len(shape) == 2
        and all(isinstance(n, int) and not isinstance(n, bool) and n > 0 for n in shape)
    ):
        raise neuron_io.invalid(p, f"shape must be two positive integers, got {shape!r}")
    cls = classes[typ]
    if set(tensors) != {cls._tensor_name}:
        raise neuron_io.invalid(p, f"expected one tensor {cls._tensor_name!r}, found {sorted(tensors)}")
    t = tensors[cls._tensor_name]
    if t.dtype != cls._stored_dtype:
        raise neuron_io.invalid(p, f"tensor {cls._tensor_name!r} has dtype {t.dtype}")
    if list(t.shape) != list(shape):
        raise ValueError(f"{p}: shape in metadata {tuple(shape)} does not match the stored tensor {tuple(t.shape)}")
    if version >= 2 and "checksum" not in header:
        raise neuron_io.invalid(p, f"format {version} file without its tensor checksum")
    if "checksum" in header and header["checksum"] != neuron_io.checksum(t):  # whatever format_version says
        raise neuron_io.invalid(p, "the tensor data does not match its stored checksum (damaged bytes)")
    if meta.get("model_fingerprint") is None:  # no identity: refused where a model's is required
        meta = {**meta, IDENTITY_UNKNOWN: str(p)}
    obj = cls(t, meta)
    obj.check_compatible(expected_shape if expected_shape is not None else model_shape, fingerprint)
    if model is not None:
        obj.check_model(model, across_models=across_models)
    return obj
