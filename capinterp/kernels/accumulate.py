"""Mergeable score sums with checkpointing, shared by the dataset-level localizers.

Dataset-level scores are means over examples. Keeping per-neuron *sums and counts* (in
float64) instead of means makes them mergeable: shards of a dataset scored separately (other
processes, other machines) combine exactly with :meth:`ScoreSum.merge`, and an interrupted
``fit`` resumes from its checkpoint with the examples already done, giving the same result
as an uninterrupted run.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable
from pathlib import Path

import torch
from jaxtyping import Float
from safetensors.torch import load_file
from safetensors.torch import save as save_bytes
from torch import Tensor

from capinterp.core import distributed as dist
from capinterp.core.atomic import write_atomic
from capinterp.core.example import Example

__all__ = ["ScoreSum", "dataset_fingerprint"]


def dataset_fingerprint(examples: Iterable[Example]) -> str:
    """Hash of the prompts and targets, in order (meta ignored)."""
    h = hashlib.sha256()
    for ex in examples:
        h.update(ex.prompt.encode())
        h.update(b"\x00")
        h.update(ex.target.encode())
        h.update(b"\x01")
    return h.hexdigest()[:16]


def key_digest(key: dict) -> str:
    """A short hash of a computation's key (method, hyper-parameters, model, data): equal keys, equal
    digests, whatever the dict order or tuple-vs-list spelling."""
    text = json.dumps(json.loads(json.dumps(key)), sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


KEY_FIELD = "{key}"


def keyed_path(path: str | os.PathLike | None, key: dict) -> str | None:
    """``path`` with every ``{key}`` replaced by :func:`key_digest` of ``key`` (``path`` unchanged
    without one): ``"out/cnl-{key}.ckpt"`` gives each computation its own checkpoint, so a run
    with other settings starts fresh beside an older one and the same settings resume."""
    if path is None:
        return None
    return str(path).replace(KEY_FIELD, key_digest(key))


def _key_diff(old: dict, new: dict) -> str:
    """The fields in which two keys differ, briefly: ``params.steps (20 -> 50), data``."""
    new = json.loads(json.dumps(new))
    parts = []
    for field in sorted(set(old) | set(new)):
        a, b = old.get(field), new.get(field)
        if a == b:
            continue
        if isinstance(a, dict) and isinstance(b, dict):
            parts += [
                f"{field}.{k} ({a.get(k)!r} -> {b.get(k)!r})" for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)
            ]
        elif field in ("model", "data"):
            parts.append(f"{field} (another {'model' if field == 'model' else 'dataset'})")
        else:
            parts.append(f"{field} ({a!r} -> {b!r})")
    return ", ".join(parts) or "nothing visible"


class ScoreSum:
    """Per-neuron sums over scored examples, the set of example indices done, and a key.

    ``key`` identifies what is being summed (method, hyper-parameters, model, dataset): merging
    or resuming with a different key is refused, so results never silently mix.
    """

    def __init__(self, shape: tuple[int, ...], key: dict | None = None) -> None:  # [n_layers, d_mlp]
        self.sum = torch.zeros(shape, dtype=torch.float64)
        self.done: set[int] = set()
        self.key = dict(key or {})
        #: Tensors kept beside the sums in the checkpoint (saved and loaded with them, in the same
        #: atomic file; not merged: their owner combines them, e.g. a dataset fit's per-example records).
        self.extra: dict[str, torch.Tensor] = {}

    @property
    def count(self) -> int:
        """Number of examples added so far."""
        return len(self.done)

    def add(self, index: int, scores: Float[Tensor, "n_layers d_mlp"]) -> None:
        """Add example ``index``'s scores ``[n_layers, d_mlp]`` (in float64); ValueError if it was added before."""
        if index in self.done:
            raise ValueError(f"example {index} was already added")
        if tuple(scores.shape) != tuple(self.sum.shape):
            raise ValueError(f"scores of shape {tuple(scores.shape)} do not fit sums of shape {tuple(self.sum.shape)}")
        self.sum += scores.detach().to("cpu", torch.float64)
        self.done.add(int(index))

    def mean(self) -> Float[Tensor, "n_layers d_mlp"]:
        """Mean score per neuron ``[n_layers, d_mlp]`` (float32); ValueError when nothing was added."""
        if not self.done:
            raise ValueError("no example has been scored")
        return (self.sum / len(self.done)).to(torch.float32)

    def merge(self, other: ScoreSum) -> ScoreSum:
        """Exact combination of two disjoint shards of the same computation."""
        if self.key != other.key:
            raise ValueError(f"cannot merge sums of different computations: {self.key} vs {other.key}")
        if self.done & other.done:
            raise ValueError(f"shards overlap on examples {sorted(self.done & other.done)[:5]}...")
        out = ScoreSum(tuple(self.sum.shape), self.key)
        out.sum = self.sum + other.sum
        out.done = self.done | other.done
        return out

    def all_reduced(self) -> ScoreSum:
        """The merge of every rank's shard under torchrun (float64 all-reduce); ``self`` on one process."""
        if dist.world_size() == 1:
            return self
        shards = dist.gather(sorted(self.done))
        seen: set[int] = set()
        for part in shards:
            if seen & set(part):
                raise ValueError(f"ranks overlap on examples {sorted(seen & set(part))[:5]}...")
            seen |= set(part)
        out = ScoreSum(tuple(self.sum.shape), self.key)
        out.sum = dist.all_reduce_sum(self.sum)
        out.done = seen
        return out

    # ------------------------------------------------------------------ checkpoints
    def save(self, path: str | os.PathLike) -> None:
        """Atomic write (:func:`capinterp.core.atomic.write_atomic`: a temp file of its own in the same
        folder, then a rename): an interruption never leaves a half file, concurrent writers never
        share a temp name, and a full disk is an OSError naming ``path``."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        meta = {"capinterp_scoresum": json.dumps({"done": sorted(self.done), "key": self.key})}
        extra = {f"extra.{k}": v.contiguous() for k, v in self.extra.items()}
        write_atomic(path, save_bytes({"sum": self.sum.contiguous(), **extra}, metadata=meta))

    @classmethod
    def load(cls, path: str | os.PathLike, key: dict | None = None) -> ScoreSum:
        """Read sums saved by :meth:`save`; ValueError when ``key`` differs from the saved computation's key."""
        path = Path(path)
        if not path.exists():
            raise FileNotFoundError(f"no checkpoint at {path}")
        if path.is_dir():
            raise ValueError(
                f"checkpoint {path} is a directory; give the path of a checkpoint file (e.g. {path / 'cnl.ckpt'})"
            )
        try:
            from safetensors import safe_open

            with safe_open(str(path), "pt") as f:
                info = json.loads((f.metadata() or {})["capinterp_scoresum"])
            tensors = load_file(str(path))
        except Exception as err:  # safetensors raises its own SafetensorError, or OSError / KeyError
            raise ValueError(f"{path} is not a valid capinterp checkpoint (corrupted or truncated): {err}") from err
        out = cls(tuple(tensors["sum"].shape), info["key"])
        out.sum = tensors["sum"].to(torch.float64)
        out.done = set(int(i) for i in info["done"])
        out.extra = {k[len("extra.") :]: v for k, v in tensors.items() if k.startswith("extra.")}
        if key is not None and json.loads(json.dumps(key)) != out.key:
            raise ValueError(
                f"checkpoint {path} was made by a different computation (differs in {_key_diff(out.key, key)}); "
                "use another checkpoint path (a '{key}' in it names the file by the settings) or delete it"
            )
        return out

    @classmethod
    def resume(cls, path: str | os.PathLike | None, shape: tuple[int, int], key: dict) -> ScoreSum:
        """Load ``path`` if it exists (checking its key and shape), else start empty."""
        key = json.loads(json.dumps(key))  # normalise tuples etc. as they come back from JSON
        if path is not None and Path(path).exists():
            acc = cls.load(path, key)
            if tuple(acc.sum.shape) != tuple(shape):
                raise ValueError(f"checkpoint {path} has shape {tuple(acc.sum.shape)}, expected {shape}")
            return acc
        return cls(shape, key)
