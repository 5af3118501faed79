"""Per-neuron scores and located neuron sets over ``blocks.{l}.mlp.hook_post`` ([n_layers, d_mlp]).

``NeuronScores`` holds a float32 CPU tensor of scores; ``NeuronSet`` a bool mask and is a
:class:`~capinterp.units.base.UnitSet` of kind ``"neuron"`` whose keys are ``(layer, index)`` tuples.

Selection rules (Huang et al. 2025, Eq. 8; the DCSN paper, anon. 2025, Eq. 2; docs/localizers/cnl.md):

- ``select(sigma)``: Mask(l,i) = |s(l,i) - mean(s)| > sigma * spread(s), mean and spread taken over
  all L*d_mlp neurons; spread = population std (default) or variance (fidelity checks only);
  ``two_sided=False`` keeps only s - mean > sigma * spread.
- ``top_k(k)``: the k largest scores (or |scores|); ties go to the lower flat index.
- ``threshold(t)``: s > t; ``relative=True``: s > t * max(s) and s > 0 (KN's coarse rule).

Metadata keys (all optional, JSON-serializable): method, params (hyper-parameters), model,
model_fingerprint, n_params (all model parameters), params_per_neuron, dataset, n_samples, version
(auto-filled). Sets made by a rule add ``selection``; random controls add ``random_control``.

Save format 2: one safetensors file (``.capi`` by convention) with one tensor, ``"scores"``
(float32) or ``"mask"`` (uint8), and metadata ``{"capinterp": JSON {type, format_version, shape,
checksum, meta}}``; a folder path (existing, or ending in "/") gets ``tensors.safetensors`` +
``meta.json``. ``checksum`` is the SHA-256 of the tensor's bytes: a load verifies it, so flipped
bytes are an error, not different scores (format 1 files, without it, still load). Saving never
replaces by accident: an existing file must be a capinterp file of the same type, an existing
folder empty or a saved folder of the same type, unless ``overwrite=True``.
"""

from __future__ import annotations

import copy
import hashlib
import json
import operator
import os
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, cast

import numpy as np
import pandas as pd
import torch
from jaxtyping import Bool, Float, Int
from safetensors import safe_open
from safetensors.torch import save_file
from torch import Tensor

from capinterp._version import __version__
from capinterp.core import validate
from capinterp.plots.heatmaps import neuron_heatmap
from capinterp.units.base import UnitSet

__all__ = ["FORMAT_VERSION", "NeuronScores", "NeuronSet", "load"]

FORMAT_VERSION = 2
MODEL_KEYS = ("model", "model_fingerprint", "architecture_fingerprint", "n_params", "params_per_neuron")
_TENSOR_FILE, _META_FILE = "tensors.safetensors", "meta.json"


def _shape_of(model_or_shape: Any) -> tuple[int, int]:
    """(n_layers, d_mlp) from a 2-tuple, or from an object with ``cfg.n_layers`` / ``cfg.d_mlp``."""
    x = model_or_shape
    if isinstance(x, (tuple, list, torch.Size)) and len(x) == 2:
        return int(x[0]), int(x[1])
    cfg = getattr(x, "cfg", x)
    if not (hasattr(cfg, "n_layers") and hasattr(cfg, "d_mlp")):
        raise ValueError(f"expected (n_layers, d_mlp) or a model with cfg.n_layers / cfg.d_mlp, got {x!r:.80}")
    return int(cfg.n_layers), int(cfg.d_mlp)


def _json_default(o: Any) -> Any:
    if isinstance(o, np.generic) or (isinstance(o, Tensor) and o.numel() == 1):
        return o.item()
    if isinstance(o, (set, frozenset, Path)):
        return sorted(o) if not isinstance(o, Path) else str(o)
    raise TypeError(f"metadata value {o!r} of type {type(o).__name__} is not JSON-serializable")


def _invalid(path: Path, err: Exception | str) -> ValueError:
    return ValueError(f"{path} is not a valid capinterp file (corrupted or truncated): {err}")


class _NeuronTensor:
    """Shared shape, metadata, compatibility and save/load logic of NeuronScores and NeuronSet."""

    _tensor_name: str = ""
    meta: dict[str, Any]

    def _init_meta(self, meta: dict[str, Any] | None) -> None:
        self.meta = copy.deepcopy(dict(meta or {}))
        self.meta.setdefault("version", __version__)

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

    def _model_meta(self, other: _NeuronTensor | None = None) -> dict[str, Any]:
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
        or another ``architecture`` fingerprint. ``model_shape`` may also be a model with
        ``cfg.n_layers``/``cfg.d_mlp``; ``model_name`` only words the message."""
        name = type(self).__name__
        if model_shape is not None and (shape := _shape_of(model_shape)) != self.shape:
            raise ValueError(
                f"{name} was made for a model with {self.n_layers} layers x {self.d_mlp} "
                f"neurons; this model has {shape[0]} x {shape[1]}"
            )
        for key, theirs, what in (
            ("model_fingerprint", fingerprint, "weights or config"),
            ("architecture_fingerprint", architecture, "architecture"),
        ):
            mine = self.meta.get(key)
            if theirs is not None and mine is not None and str(theirs) != str(mine):
                hint = (
                    "; if this model is another checkpoint of the same architecture on purpose, pass across_models=True"
                    if key == "model_fingerprint"
                    else ""
                )
                raise ValueError(
                    f"{name} was made for model {self.meta.get('model')!r} ({key} {mine!r}); this "
                    f"model {model_name!r} has {key} {theirs!r}: their {what} differ{hint}"
                )

    def plot(self, **kwargs: Any):
        """Binned layer x neuron heatmap: max |score| or located count per block (:func:`capinterp.plots.neuron_heatmap`)."""
        return neuron_heatmap(self, **kwargs)

    # --- save / load --------------------------------------------------------------------------
    def save(self, path: str | os.PathLike, *, overwrite: bool = False) -> Path:
        """Write a ``.capi`` safetensors file, or a folder when ``path`` is a folder / ends in "/".

        Refuses (ValueError) to replace anything but a capinterp file / folder of the same type,
        or a non-empty folder of other files, unless ``overwrite=True``. Writes are atomic.
        """
        if not isinstance(path, (str, os.PathLike)):
            raise TypeError(f"path must be a str or Path, got {type(path).__name__}")
        p = Path(path)
        as_folder = str(path).endswith(("/", os.sep)) or p.is_dir()
        if not overwrite:
            self._check_target(p, as_folder)
        data = self._data()
        stored = (data.to(torch.uint8) if data.dtype == torch.bool else data).contiguous()
        header = {
            "type": type(self).__name__,
            "format_version": FORMAT_VERSION,
            "shape": list(self.shape),
            "checksum": _checksum(stored),
            "meta": self.meta,
        }
        blob = json.dumps(header, default=_json_default, sort_keys=True)
        tensors = {self._tensor_name: stored}
        if as_folder:
            p.mkdir(parents=True, exist_ok=True)
            _atomic_save(tensors, p / _TENSOR_FILE, blob)
            tmp = p / (_META_FILE + ".tmp")
            tmp.write_text(blob)
            os.replace(tmp, p / _META_FILE)
        else:
            p.parent.mkdir(parents=True, exist_ok=True)
            _atomic_save(tensors, p, blob)
        return p

    def _check_target(self, p: Path, as_folder: bool) -> None:
        """ValueError if saving at ``p`` would replace something that is not our own kind of file."""
        mine = type(self).__name__
        if p.is_dir():
            entries = sorted(x.name for x in p.iterdir())
            if not entries:
                return
            if set(entries) <= {_TENSOR_FILE, _META_FILE}:
                kind = _stored_type(p)
                if kind == mine:
                    return
                raise ValueError(
                    f"{p} holds a saved {kind or 'unreadable capinterp folder'}; saving a {mine} "
                    "there would replace it: choose another path or pass overwrite=True"
                )
            raise ValueError(
                f"{p} is an existing folder with other files ({', '.join(entries[:3])}"
                f"{', ...' if len(entries) > 3 else ''}); save to a new path, e.g. {p / 'scores.capi'}, "
                "or pass overwrite=True"
            )
        if p.exists():
            if as_folder:
                raise ValueError(f"{p} is an existing file, not a folder; choose another path")
            kind = _stored_type(p)
            if kind != mine:
                what = f"a saved {kind}" if kind else "a file that is not a capinterp file"
                raise ValueError(
                    f"{p} is {what}; saving a {mine} there would replace it: choose another path or pass overwrite=True"
                )

    @classmethod
    def load(
        cls,
        path: str | os.PathLike,
        expected_shape: Any = None,
        *,
        model_shape: Any = None,
        fingerprint: str | None = None,
    ):
        """Load a saved object of this class; ValueError for another type or an incompatible shape."""
        obj = load(path)
        if not isinstance(obj, cls):
            raise ValueError(
                f"{path} holds a {type(obj).__name__}, not a {cls.__name__}; "
                f"use {type(obj).__name__}.load or capinterp.results.neurons.load"
            )
        obj.check_compatible(expected_shape if expected_shape is not None else model_shape, fingerprint)
        return obj


def _checksum(t: Tensor) -> str:
    return hashlib.sha256(t.cpu().contiguous().numpy().tobytes()).hexdigest()


def _atomic_save(tensors: dict[str, Tensor], p: Path, blob: str) -> None:
    tmp = p.with_name(p.name + ".tmp")
    save_file(tensors, str(tmp), metadata={"capinterp": blob})
    os.replace(tmp, p)


def _stored_type(p: Path) -> str | None:
    """The type recorded in a saved capinterp file / folder, None when it is not one."""
    try:
        if p.is_dir():
            blob: str | None = (p / _META_FILE).read_text()
        else:
            with safe_open(str(p), framework="pt") as f:
                blob = (f.metadata() or {}).get("capinterp")
        return str(json.loads(blob)["type"]) if blob else None
    except Exception:
        return None


def _read_safetensors(p: Path) -> tuple[str | None, dict[str, Tensor]]:
    try:
        with safe_open(str(p), framework="pt") as f:
            md = f.metadata() or {}
            tensors = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118 (safe_open is not iterable)
    except Exception as e:  # safetensors raises its own SafetensorError, or OSError
        raise _invalid(p, e) from e
    return md.get("capinterp"), tensors


def load(
    path: str | os.PathLike, expected_shape: Any = None, *, model_shape: Any = None, fingerprint: str | None = None
) -> NeuronScores | NeuronSet:
    """Load whichever of NeuronScores / NeuronSet is stored at ``path`` (file or folder)."""
    p = Path(path)
    if not p.exists():
        raise FileNotFoundError(f"no capinterp file or folder at {p}")
    if p.is_dir():
        missing = [f for f in (_TENSOR_FILE, _META_FILE) if not (p / f).is_file()]
        if missing:
            raise FileNotFoundError(f"{p} is a folder without {missing}; not a saved capinterp folder")
        blob: str | None = (p / _META_FILE).read_bytes().decode("utf-8", errors="replace")
        _, tensors = _read_safetensors(p / _TENSOR_FILE)
    else:
        blob, tensors = _read_safetensors(p)
        if blob is None:
            raise _invalid(p, "a safetensors file without 'capinterp' metadata")
    try:
        header = json.loads(blob)  # type: ignore[arg-type]
        typ, version, shape, meta = header["type"], header["format_version"], header["shape"], header["meta"]
    except (ValueError, KeyError, TypeError) as e:
        raise _invalid(p, f"bad metadata ({type(e).__name__}: {e})") from e
    classes: dict[str, type[NeuronScores] | type[NeuronSet]] = {"NeuronScores": NeuronScores, "NeuronSet": NeuronSet}
    if typ not in classes:
        raise ValueError(f"{p} holds an unknown capinterp type {typ!r}")
    if isinstance(version, bool) or not isinstance(version, int) or not 1 <= version <= FORMAT_VERSION:
        raise ValueError(f"{p} has format_version {version!r}; capinterp {__version__} reads 1..{FORMAT_VERSION}")
    if not isinstance(meta, dict):
        raise _invalid(p, f"meta must be a JSON object, got {type(meta).__name__}")
    if not (
        isinstance(shape, list)
        and len(shape) == 2
        and all(isinstance(n, int) and not isinstance(n, bool) and n > 0 for n in shape)
    ):
        raise _invalid(p, f"shape must be two positive integers, got {shape!r}")
    cls = classes[typ]
    if set(tensors) != {cls._tensor_name}:
        raise _invalid(p, f"expected one tensor {cls._tensor_name!r}, found {sorted(tensors)}")
    t = tensors[cls._tensor_name]
    if t.dtype != (torch.uint8 if cls is NeuronSet else torch.float32):
        raise _invalid(p, f"tensor {cls._tensor_name!r} has dtype {t.dtype}")
    if list(t.shape) != list(shape):
        raise ValueError(f"{p}: shape in metadata {tuple(shape)} does not match the stored tensor {tuple(t.shape)}")
    if version >= 2 and header.get("checksum") != _checksum(t):
        raise _invalid(p, "the tensor data does not match its stored checksum (damaged bytes)")
    obj = cls(t, meta)
    obj.check_compatible(expected_shape if expected_shape is not None else model_shape, fingerprint)
    return obj


class NeuronScores(_NeuronTensor):
    """Float32 per-neuron scores, shape [n_layers, d_mlp], plus metadata (see module docstring)."""

    _tensor_name = "scores"

    def __init__(self, scores: Float[Tensor, "n_layers d_mlp"] | np.ndarray, meta: dict | None = None) -> None:
        t = self._as_2d(scores, "scores").to(torch.float32).clone().contiguous()
        if not torch.isfinite(t).all():
            raise ValueError(f"scores hold {int((~torch.isfinite(t)).sum())} non-finite values (NaN/inf)")
        self.scores: Float[Tensor, "n_layers d_mlp"] = t
        self._init_meta(meta)

    def _data(self) -> Tensor:
        return self.scores

    def __getitem__(self, key: Any) -> Float[Tensor, ...]:
        """``scores[l]`` is layer l's row [d_mlp]; any torch index works."""
        return self.scores[key]

    def _make_set(self, mask: Tensor, selection: dict[str, Any]) -> NeuronSet:
        meta = copy.deepcopy(self.meta)
        meta["selection"] = selection
        return NeuronSet(mask, meta)

    def select(self, sigma: float = 6.0, spread: str = "std", two_sided: bool = True) -> NeuronSet:
        """Neurons with |s - mean(s)| > sigma * spread(s) (global over all neurons; population std/var)."""
        sigma = validate.finite_float("sigma", sigma, low=0.0, low_open=True)
        s = self.scores.double()
        if spread not in ("std", "var"):
            raise ValueError(f"spread must be 'std' or 'var', got {spread!r}")
        sp = s.std(correction=0) if spread == "std" else s.var(correction=0)
        mean = s.mean()
        dev = s - mean
        mask = (dev.abs() if two_sided else dev) > sigma * sp
        return self._make_set(
            mask,
            {
                "rule": "sigma",
                "sigma": float(sigma),
                "spread": spread,
                "two_sided": bool(two_sided),
                "mean": float(mean),
                "spread_value": float(sp),
            },
        )

    def top_k(self, k: int, by: str = "score") -> NeuronSet:
        """The k neurons with the largest score (``by="score"``) or |score| (``by="abs"``)."""
        if by not in ("score", "abs"):
            raise ValueError(f"by must be 'score' or 'abs', got {by!r}")
        n = self.scores.numel()
        validate.integer("k", k, low=0, high=n)
        flat = self.scores.flatten()
        order = torch.sort(flat.abs() if by == "abs" else flat, descending=True, stable=True).indices
        mask = torch.zeros(n, dtype=torch.bool)
        mask[order[: int(k)]] = True
        return self._make_set(mask.view(self.shape), {"rule": "top_k", "k": int(k), "by": by})

    def threshold(self, t: float, relative: bool = False) -> NeuronSet:
        """s > t, or with ``relative=True`` s > t * max(s) and s > 0 (only positive scores count)."""
        t, relative = validate.finite_float("t", t), validate.boolean("relative", relative)
        cut = t * float(self.scores.max()) if relative else t
        mask = self.scores > cut
        if relative:
            mask &= self.scores > 0
        return self._make_set(mask, {"rule": "threshold", "t": float(t), "relative": bool(relative), "cut": cut})

    def to_frame(self, top: int | None = None, by: str = "abs") -> pd.DataFrame:
        """Columns layer, neuron, score; with ``top``, the top-n rows by |score| (or score), best first."""
        n_layers, d_mlp = self.shape
        s = self.scores.flatten().numpy()
        df = pd.DataFrame(
            {"layer": np.repeat(np.arange(n_layers), d_mlp), "neuron": np.tile(np.arange(d_mlp), n_layers), "score": s}
        )
        if top is not None:
            validate.nonneg_int("top", top)
            key = np.abs(s) if by == "abs" else s
            df = df.iloc[np.argsort(-key, kind="stable")[: int(top)]].reset_index(drop=True)
        return df

    def __repr__(self) -> str:
        s = self.scores
        return (
            f"NeuronScores({self.n_layers} layers x {self.d_mlp} neurons, method={self.meta.get('method')!r}, "
            f"min={float(s.min()):.4g}, max={float(s.max()):.4g}, mean={float(s.mean()):.4g})"
        )


class NeuronSet(_NeuronTensor, UnitSet):
    """A located set of neurons: bool mask [n_layers, d_mlp]; keys are ``(layer, index)`` tuples."""

    kind = "neuron"
    _tensor_name = "mask"
    __hash__ = None  # type: ignore[assignment]  # mutable and compared by value: unhashable

    def __init__(self, mask: Bool[Tensor, "n_layers d_mlp"] | np.ndarray, meta: dict | None = None) -> None:
        t = self._as_2d(mask, "mask")
        if t.dtype != torch.bool:
            if not ((t == 0) | (t == 1)).all():
                raise ValueError("mask must be boolean or hold only 0/1 values")
            t = t != 0
        self.mask: Bool[Tensor, "n_layers d_mlp"] = t.clone().contiguous()
        self._init_meta(meta)

    def _data(self) -> Tensor:
        return self.mask

    # --- UnitSet interface ---------------------------------------------------------------------
    space = property(lambda self: ("neuron", self.n_layers, self.d_mlp), doc='("neuron", n_layers, d_mlp)')
    n_units = property(lambda self: self.n_layers * self.d_mlp, doc="L * d_mlp")
    unit_params = property(lambda self: self.meta.get("params_per_neuron"), doc="meta['params_per_neuron']")
    n_params = property(lambda self: self.meta.get("n_params"), doc="meta['n_params']")

    def keys(self) -> frozenset[tuple[int, int]]:
        """The located neurons as ``(layer, index)`` pairs."""
        return frozenset(self)

    def __len__(self) -> int:
        return int(self.mask.sum())

    def __iter__(self) -> Iterator[tuple[int, int]]:
        """(layer, index) pairs in sorted order."""
        return ((p[0], p[1]) for p in self.mask.nonzero().tolist())

    def __contains__(self, key: object) -> bool:
        try:
            layer, idx = map(operator.index, cast("Iterable[Any]", key))  # ValueError unless two items
        except (TypeError, ValueError):
            return False
        return 0 <= layer < self.n_layers and 0 <= idx < self.d_mlp and bool(self.mask[layer, idx])

    @property
    def param_share(self) -> float:
        """|N| * params_per_neuron / n_params, both from ``meta``."""
        missing = [k for k in ("params_per_neuron", "n_params") if not self.meta.get(k)]
        if missing:
            raise ValueError(f"NeuronSet.param_share needs meta {missing} (localizers record them from the model)")
        return len(self) * int(self.meta["params_per_neuron"]) / int(self.meta["n_params"])

    # --- set algebra ---------------------------------------------------------------------------
    def _binop(self, other: object, fn: Any, op: str) -> NeuronSet:
        if not isinstance(other, NeuronSet):
            return NotImplemented
        if other.shape != self.shape:
            raise ValueError(f"cannot apply {op!r} to NeuronSets of shapes {self.shape} and {other.shape}")
        fa, fb = self.meta.get("model_fingerprint"), other.meta.get("model_fingerprint")
        if fa is not None and fb is not None and fa != fb:
            raise ValueError(f"cannot apply {op!r} to NeuronSets of different models (fingerprint {fa!r} vs {fb!r})")
        return NeuronSet(fn(self.mask, other.mask), self._model_meta(other))

    __and__ = lambda self, other: self._binop(other, torch.logical_and, "&")  # noqa: E731
    __or__ = lambda self, other: self._binop(other, torch.logical_or, "|")  # noqa: E731
    __sub__ = lambda self, other: self._binop(other, lambda a, b: a & ~b, "-")  # noqa: E731
    __xor__ = lambda self, other: self._binop(other, torch.logical_xor, "^")  # noqa: E731

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, NeuronSet):
            return NotImplemented
        return self.shape == other.shape and bool(torch.equal(self.mask, other.mask))

    # --- constructors and views ----------------------------------------------------------------
    @classmethod
    def from_indices(
        cls, pairs: Iterable[tuple[int, int]], n_layers: int, d_mlp: int, meta: dict[str, Any] | None = None
    ) -> NeuronSet:
        """Build from (layer, index) pairs; ValueError for pairs out of range."""
        mask = torch.zeros(int(n_layers), int(d_mlp), dtype=torch.bool)
        for pair in pairs:
            layer, idx = (operator.index(v) for v in pair)
            if not (0 <= layer < n_layers and 0 <= idx < d_mlp):
                raise ValueError(f"neuron {(layer, idx)} out of range for shape ({n_layers}, {d_mlp})")
            mask[layer, idx] = True
        return cls(mask, meta)

    def empty_like(self) -> NeuronSet:
        """An empty set over the same model (same shape and model metadata)."""
        return NeuronSet(torch.zeros_like(self.mask), self._model_meta())

    def random_like(self, seed: int, per_layer: bool = False, disjoint: bool = False) -> NeuronSet:
        """Seeded random set of the same size; ``per_layer`` matches each layer's count, ``disjoint``
        draws only neurons outside this set (random-control arms)."""
        g = torch.Generator().manual_seed(validate.integer("seed", seed))
        rows = self.mask if per_layer else self.mask.view(1, -1)
        out = torch.zeros_like(rows)
        for r, (row, count) in enumerate(zip(rows, rows.sum(dim=1).tolist())):
            pool = (~row).nonzero().flatten() if disjoint else torch.arange(row.numel())
            if count > pool.numel():
                raise ValueError(f"cannot draw {count} disjoint random neurons from {pool.numel()} left")
            out[r, pool[torch.randperm(pool.numel(), generator=g)[:count]]] = True
        meta = self._model_meta()
        meta["random_control"] = {"seed": int(seed), "per_layer": bool(per_layer), "disjoint": bool(disjoint)}
        return NeuronSet(out.view(self.shape), meta)

    def per_layer(self) -> Int[Tensor, " n_layers"]:
        """Located neurons per layer, int64 [n_layers]."""
        return self.mask.sum(dim=1)

    def to_frame(self, scores: NeuronScores | Float[Tensor, "n_layers d_mlp"] | None = None) -> pd.DataFrame:
        """Columns layer, neuron (sorted), plus score when ``scores`` is given."""
        idx = self.mask.nonzero().numpy().reshape(-1, 2)
        df = pd.DataFrame({"layer": idx[:, 0], "neuron": idx[:, 1]})
        if scores is not None:
            s = scores.scores if isinstance(scores, NeuronScores) else torch.as_tensor(scores)
            if tuple(s.shape) != self.shape:
                raise ValueError(f"scores shape {tuple(s.shape)} does not match the set's {self.shape}")
            df["score"] = s[self.mask].float().numpy()
        return df

    def __repr__(self) -> str:
        n = len(self)
        layers = [i for i, c in enumerate(self.per_layer().tolist()) if c]
        shown = ", ".join(map(str, layers[:8])) + (", ..." if len(layers) > 8 else "")
        return (
            f"NeuronSet({n} of {self.n_layers}x{self.d_mlp} neurons ({self.ratio:.3%}), "
            f"method={self.meta.get('method')!r}, layers=[{shown}])"
        )
