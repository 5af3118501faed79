"""ROME: rank-one model editing of one MLP layer (Meng et al. 2022, Sec. 3.1; Huang et al. 2025 Sec. 3.2).

Layer ``l``'s down projection W maps a key k (``blocks.{l}.mlp.hook_post``, ``[d_mlp]``) to a value
``W k`` (``[d_model]``, before any post-MLP norm). To make the model answer ``new_target``:

1. **key** k* = the key at the subject's last token, averaged over the prompt and a few random
   prefixes of sampled text (Sec. 3.1, Step 1);
2. **value** v* = W k* + delta, where delta (added to the layer's output at the subject's last
   token) minimises, with Adam, the new target's mean token NLL over the prefixed prompts
   + ``kl_factor`` * KL(p_before || p_after) of the next token after "{subject} is a"
   + ``weight_decay`` * ||delta||^2 / ||v0||^2, and ||delta|| is kept <= ``clamp`` * ||v0||
   (v0: the unedited value at the plain prompt; Eq. 4);
3. **update** W' = W + delta (C^{-1} k*)^T / (k*^T C^{-1} k*) (Eq. 2), C = E[k k^T] over local
   text (:func:`~capinterp.interventions.second_moment.second_moment`) plus ``ridge`` * mean(diag C) * I.
   Hence W' k* = v*, and W' k = W k for every key with k^T C^{-1} k* = 0.

On a mixture-of-experts layer the update is one expert's (``expert=``, by default the one that
writes most at the subject): :mod:`capinterp.interventions.rome_experts`.

:func:`rome_edit` returns a :class:`RomeEdit`; ``with edit:`` (or ``with edit.apply(model):``)
writes W' and restores the exact old W on exit, ``edit.apply_permanently(model)`` or
``inplace=True`` keeps it. An edit is not re-entrant: applying it to a model it is already
applied to (``with edit:`` inside ``with edit:``) is a RuntimeError, because the inner exit would
restore W while the outer block still expects W'.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from capinterp.arch.experts import branched
from capinterp.arch.family import family_of
from capinterp.arch.forward import capture, unembed
from capinterp.arch.model import model_fingerprint, neuron_hook
from capinterp.core import validate
from capinterp.core.example import Example, TokenizationError, check_target
from capinterp.core.params import copy_model
from capinterp.core.protocol import Model
from capinterp.core.tokens import encode, model_bos, pad_id, pad_right, subject_span
from capinterp.interventions.configs import RomeConfig, with_overrides
from capinterp.interventions.editing import value_weight
from capinterp.interventions.rome_experts import (
    SHARED,
    Expert,
    check_expert,
    choose_expert,
    expert_layer,
    expert_restore,
    expert_slice,
    expert_value,
    expert_write,
)
from capinterp.interventions.second_moment import key_corpus, second_moment

__all__ = ["EditUnreachable", "RomeConfig", "RomeEdit", "rome_edit", "subject_last_position"]


class EditUnreachable(ValueError):
    """The edited layer's value at the subject's last token cannot reach the answer at all."""


@dataclass
class RomeEdit:
    """A computed rank-one update of ``layer``'s down projection: ``update`` = outer(right, left)."""

    layer: int
    key: torch.Tensor  # k*, [d_mlp] (on an MoE layer: the edited expert's neurons only, 0 elsewhere)
    value: torch.Tensor  # v* = W k* + delta, [d_model]
    delta: torch.Tensor  # [d_model]
    left: torch.Tensor  # C^{-1} k* / (k*^T C^{-1} k*), [d_mlp]
    fact: Example
    new_target: str
    model_fingerprint: str
    params: dict[str, Any] = field(default_factory=dict)
    losses: list[float] = field(default_factory=list)
    model: Model | None = field(default=None, repr=False, compare=False)
    expert: Expert | None = None  # the edited expert of an MoE layer, or "shared" (rome_experts)
    _active: list[Any] = field(default_factory=list, init=False, repr=False, compare=False)
    _cms: list[Any] = field(default_factory=list, init=False, repr=False, compare=False)

    @property
    def update(self) -> torch.Tensor:
        """The weight change as a map from keys to values, ``[d_model, d_mlp]`` float32."""
        return torch.outer(self.delta, self.left)

    def _check(self, model: Model) -> None:
        if model_fingerprint(model) != self.model_fingerprint:
            raise ValueError("this ROME edit was computed for another model (fingerprints differ)")

    @torch.no_grad()
    def _add(self, model: Model) -> Callable[[], None]:
        """Write W' into ``model``; returns what restores W exactly."""
        if self.expert is not None:
            e = self.expert
            old_rows = expert_write(model, self.layer, self.update, e)
            return lambda: expert_restore(model, self.layer, old_rows, e)
        w, dim = value_weight(model, self.layer)
        old = w.detach().clone()
        upd = self.update[:, : w.shape[dim]].to(device=w.device, dtype=torch.float32)  # padding columns are 0
        w.copy_((w.float() + (upd if dim == 1 else upd.T)).to(w.dtype))

        def restore() -> None:
            w.copy_(old)

        return restore

    @contextlib.contextmanager
    def apply(self, model=None) -> Iterator[Any]:
        """Write W' into ``model`` (default: the model it was computed on); restore W exactly on exit.

        RuntimeError when this edit is already applied to ``model`` by an enclosing ``with``
        (nesting would apply the update twice, and the inner exit would undo the outer block's edit).
        """
        model = self.model if model is None else model
        if any(m is model for m in self._active):  # before the fingerprint check, which the edit itself fails
            raise RuntimeError(
                f"this ROME edit (layer {self.layer}, new target {self.new_target!r}) is already applied to "
                "this model by an enclosing 'with'; an edit is not re-entrant: use the outer block"
            )
        self._check(model)
        restore = self._add(model)
        self._active.append(model)
        try:
            yield model
        finally:
            self._active.remove(model)
            with torch.no_grad():
                restore()

    def __enter__(self):
        cm = self.apply()
        model = cm.__enter__()  # raises (nothing applied, nothing recorded) when already applied
        self._cms.append(cm)
        return model

    def __exit__(self, *exc):
        return self._cms.pop().__exit__(*exc)

    def apply_permanently(self, model=None) -> Any:
        """Write the edit into ``model`` for good; returns the model."""
        model = self.model if model is None else model
        self._check(model)
        self._add(model)
        return model

    def edited_copy(self, model: Model | None = None) -> Any:
        """A deep copy of ``model`` with the edit kept (``model`` itself is not touched)."""
        target = self.model if model is None else model
        if target is None:
            raise ValueError("edited_copy needs a model: this edit holds none")
        return self.apply_permanently(copy_model(target))


def subject_last_position(model: Model, text: str, subject: str, start: int = 0) -> int:
    """Index, in ``model_bos + tokens(text)``, of the last token of ``subject``'s first occurrence at or after ``start``.

    The subject must start and end on token boundaries (:func:`capinterp.core.tokens.subject_span`,
    the rule causal tracing uses too): otherwise a :class:`~capinterp.core.tokens.TokenizationError`
    shows the tokens.
    """
    return subject_span(model.tokenizer, text, subject, offset=len(model_bos(model)), start=start)[1] - 1


@torch.no_grad()
def sample_prefixes(model: Model, n: int, n_tokens: int, seed: int = 0, top_k: int = 5) -> list[str]:
    """``n`` short texts sampled from the model (top-``top_k``, seeded), each ending in ". " (ROME's context templates)."""
    if n == 0:
        return []
    tok, dev = model.tokenizer, model.cfg.device
    start = model_bos(model) or list(tok("The", add_special_tokens=False)["input_ids"])
    ids = torch.tensor([start] * n, device=dev)
    gen = torch.Generator().manual_seed(seed)
    for _ in range(n_tokens):
        logits = unembed(model, capture(model, ids, "ln_final.hook_in")[:, -1:].contiguous())[:, 0].float().cpu()
        top = logits.topk(top_k, dim=-1)
        pick = torch.multinomial(top.values.softmax(-1), 1, generator=gen)
        ids = torch.cat([ids, top.indices.gather(1, pick).to(dev)], dim=1)
    texts = tok.batch_decode(ids[:, len(model_bos(model)) :].tolist(), skip_special_tokens=True)
    return [" ".join(t.replace("{", "").replace("}", "").split()) + ". " for t in texts]


def _fact(fact: Any, subject: str | None, new_target: str | None) -> tuple[Example, str, str]:
    if isinstance(fact, str):
        fact = Example(fact, "", {"target_from": "greedy"})
    if not isinstance(fact, Example):
        raise TypeError(f"fact must be an Example or a prompt string, got {type(fact).__name__}")
    check_target(fact, 0)  # an explicit empty target is refused as everywhere else
    subject = subject if subject is not None else fact.meta.get("subject")
    if not subject or subject not in fact.prompt:
        raise ValueError(
            f"subject={subject!r} must be given (or in fact.meta['subject']) and occur in the prompt {fact.prompt!r}"
        )
    new_target = new_target if new_target is not None else fact.meta.get("target_new")
    if not isinstance(new_target, str):
        raise ValueError(f"new_target must be given as a string (or fact.meta['target_new']), got {new_target!r}")
    if not new_target.strip():
        raise TokenizationError(f"new_target is an empty target ({new_target!r}); give the new answer text")
    if fact.target and new_target.strip() == fact.target.strip():
        raise ValueError(f"new_target {new_target!r} equals the fact's current target")
    return fact, subject, new_target


@dataclass(frozen=True)
class _Plan:
    """What :func:`rome_edit` settled before the value search: the checked fact, its subject and new
    target, whether the layer is an MoE layer, the edited expert's columns (when known) and C (None
    while C waits for the expert the search chooses)."""

    fact: Example
    subject: str
    new_target: str
    moe: bool
    columns: slice | None
    C: torch.Tensor | None


def rome_edit(
    model: Model,
    fact: Any,
    new_target: str | None = None,
    *,
    layer: int,
    config: RomeConfig | None = None,
    subject: str | None = None,
    texts: Sequence[str] | None = None,
    data_dir: str | os.PathLike | None = None,
    second_moment_matrix: torch.Tensor | None = None,
    prefixes: Sequence[str] | None = None,
    seed: int = 0,
    inplace: bool = False,
    expert: Expert | None = None,
    **overrides: Any,
) -> RomeEdit:
    """Compute the ROME edit that makes ``model`` continue ``fact``'s prompt with ``new_target``.

    Args:
        model: a model from :func:`~capinterp.load_model` (left unchanged unless ``inplace=True``).
        fact: an Example (``meta["subject"]`` and ``meta["target_new"]`` are used when present, as
            from :func:`~capinterp.data.load_counterfact`) or a prompt string.
        new_target: the new answer as it follows the prompt (e.g. ``" English"``).
        layer: the edited MLP layer.
        config: the value search's and key statistics' settings, a
            :class:`~capinterp.interventions.configs.RomeConfig` (default ``RomeConfig()``: ROME's
            GPT-2 XL value search, :data:`~capinterp.interventions.configs.ROME_GPT2_XL`).
        subject: the subject string inside the prompt (default ``fact.meta["subject"]``).
        texts: local texts for the key second moment C.
        data_dir: a folder of local text files for C when ``texts`` is None (default: the shared
            data folder).
        second_moment_matrix: C itself (``[d_mlp, d_mlp]``), skipping the estimate.
        prefixes: context prefixes for k* and delta (default: ``config.n_prefixes`` texts of
            ``config.prefix_tokens`` tokens sampled from the model); the plain prompt is always included.
        seed: seeds the sampled prefixes.
        inplace: keep the edit in ``model``.
        expert: on a mixture-of-experts layer, the expert whose down projection is edited (default:
            the routed expert that writes most at the subject's last token), or ``"shared"``: the
            layer's shared expert; None on dense layers. ``second_moment_matrix`` is then that
            expert's ``[d_expert, d_expert]`` (``[d_shared, d_shared]``).
        overrides: fields of :class:`~capinterp.interventions.configs.RomeConfig` (``steps``, ``lr``,
            ``kl_factor``, ``weight_decay``, ``clamp``, ``ridge``, ``n_prefixes``, ``prefix_tokens``),
            applied on top of ``config``.
    """
    cfg = with_overrides(RomeConfig, config, overrides, "rome_edit")
    plan = _plan(model, fact, new_target, layer, subject, texts, data_dir, second_moment_matrix, seed, inplace, expert)
    if prefixes is None:
        prefixes = sample_prefixes(model, cfg.n_prefixes, cfg.prefix_tokens, seed)
    contexts = [""] + [str(p) for p in prefixes]
    delta, key, losses = _optimise(model, cfg, layer, plan.fact.prompt, plan.subject, plan.new_target, contexts, expert)
    edit = _measured_edit(model, cfg, layer, plan, texts, data_dir, second_moment_matrix, expert, delta, key)
    edit.losses = losses
    edit.params = dict(layer=layer, subject=plan.subject, contexts=contexts, steps=cfg.steps, lr=cfg.lr)
    edit.params.update(kl_factor=cfg.kl_factor, weight_decay=cfg.weight_decay, clamp=cfg.clamp, ridge=cfg.ridge)
    edit.params.update(seed=seed, expert=edit.expert)
    if inplace:
        edit.apply_permanently(model)
    return edit


def _plan(
    model: Model,
    fact: Any,
    new_target: str | None,
    layer: int,
    subject: Any,
    texts: Sequence[str] | None,
    data_dir: Any,
    matrix: torch.Tensor | None,
    seed: int,
    inplace: bool,
    expert: Expert | None,
) -> _Plan:
    """Validate every argument (before any forward pass), then settle C where it does not wait for the
    expert the value search chooses (on an MoE layer without ``expert``: its corpus is checked now)."""
    validate.model(model)
    validate.integer("layer", layer, low=0, high=int(model.cfg.n_layers) - 1)
    _check_has_neurons(model, layer)
    check_expert(model, layer, expert)
    validate.integer("seed", seed)
    validate.boolean("inplace", inplace)
    fact, subject, new_target = _checked_fact(model, fact, subject, new_target)
    _check_matrix(model, layer, matrix, expert)
    moe = expert_layer(model, layer)  # one expert's neurons: its key, its covariance, its down projection
    columns = expert_slice(model, expert) if moe and expert is not None else None
    C = None
    if moe and expert is None:
        key_corpus(model, texts=texts, data_dir=data_dir)
    else:
        C = _key_second_moment(model, layer, texts, data_dir, matrix, columns)
    return _Plan(fact, subject, new_target, moe, columns, C)


def _measured_edit(
    model: Model,
    cfg: RomeConfig,
    layer: int,
    plan: _Plan,
    texts: Sequence[str] | None,
    data_dir: Any,
    matrix: torch.Tensor | None,
    expert: Expert | None,
    delta: torch.Tensor,
    key: torch.Tensor,
) -> RomeEdit:
    """Step 3: the :class:`RomeEdit` of the searched ``delta`` at ``key`` (on an MoE layer: of the
    chosen expert, its neurons' part of the key and its C), with v* = W k* + delta and the left vector."""
    columns, C = plan.columns, plan.C
    if plan.moe:
        expert = choose_expert(model, layer, key) if expert is None else expert
        columns = expert_slice(model, expert)
        mine = torch.zeros_like(key)
        mine[columns] = key[columns]
        key = mine
        C = _key_second_moment(model, layer, texts, data_dir, matrix, columns) if C is None else C
    assert C is not None
    value = _unedited_value(model, layer, key) if expert is None else expert_value(model, layer, key, expert)
    return RomeEdit(
        layer,
        key.cpu(),
        value + delta.cpu(),
        delta.cpu(),
        _padded_left(model, layer, C, key, cfg.ridge, columns).cpu(),
        plan.fact,
        plan.new_target,
        model_fingerprint(model),
        model=model,
        expert=expert,
    )


def _check_has_neurons(model: Model, layer: int) -> None:
    """Refuse a layer whose FFN has no neurons (NemotronH's mixer layers): there is no down projection to edit."""
    fam = family_of(model)
    if fam.layer_widths and fam.layer_widths[layer] == 0:
        ffn = [l for l, w in enumerate(fam.layer_widths) if w]
        raise ValueError(
            f"layer {layer} of {fam.name} has no FFN neurons (a layer with a mixer and no FFN); ROME edits an FFN's "
            f"down projection: pick one of the layers with neurons, {ffn}"
        )


def _checked_fact(model: Model, fact: Any, subject: Any, new_target: str | None) -> tuple[Example, str, str]:
    """Step 0: the fact, its subject and the new target, each checked on the model's tokenizer before any work."""
    if subject is not None and not isinstance(subject, str):
        raise TypeError(f"subject must be a string or None, got {type(subject).__name__}")
    fact, subject, new_target = _fact(fact, subject, new_target)
    encode(model, [Example(fact.prompt, new_target)])  # tokenization problems surface before any work
    subject_last_position(model, fact.prompt, subject)
    return fact, subject, new_target


def _check_matrix(model: Model, layer: int, matrix: torch.Tensor | None, expert: Expert | None) -> None:
    """A given C is ``[d_mlp, d_mlp]``, or on an MoE layer the ``[d_expert, d_expert]`` of the expert named
    (``[d_shared, d_shared]`` for the shared expert)."""
    moe = family_of(model).moe
    n = moe.d_expert if moe is not None and expert_layer(model, layer) else int(model.cfg.d_mlp)
    if moe is not None and expert == SHARED:
        n = moe.d_shared
    if matrix is not None and n != int(model.cfg.d_mlp) and expert is None:
        raise ValueError(
            f"second_moment_matrix on a mixture-of-experts layer is one expert's keys' ([{n}, {n}]): pass expert= too"
        )
    if matrix is not None and tuple(matrix.shape) != (n, n):
        raise ValueError(f"second_moment_matrix must be [{n}, {n}], got {tuple(matrix.shape)}")


def _key_second_moment(
    model: Model,
    layer: int,
    texts: Sequence[str] | None,
    data_dir: Any,
    matrix: torch.Tensor | None,
    columns: slice | None,
) -> torch.Tensor:
    """C = E[k k^T] of ``layer``'s keys (of the neurons in ``columns`` only: one expert's): the given
    matrix, or estimated from local text."""
    if matrix is None:
        return second_moment(model, layer, texts=texts, data_dir=data_dir, neurons=columns)[0]
    return matrix


def _left_vector(C: torch.Tensor, key: torch.Tensor, ridge: float) -> torch.Tensor:
    """Step 3: C^{-1} k* / (k*^T C^{-1} k*), C regularised by ``ridge`` * mean(diag C) * I (float64 solve)."""
    Cd = C.double().to(key.device)
    Cd = Cd + ridge * Cd.diagonal().mean() * torch.eye(Cd.shape[0], dtype=torch.float64, device=key.device)
    u = torch.linalg.solve(Cd, key.double())
    return (u / (u @ key.double())).float()


def _padded_left(
    model: Model, layer: int, C: torch.Tensor, key: torch.Tensor, ridge: float, columns: slice | None
) -> torch.Tensor:
    """:func:`_left_vector` over the layer's stored neurons: all ``d_mlp``, but on a dense layer of a
    mixed dense / MoE model only its real ones (C's padding rows and columns, all 0, would otherwise
    lower the ridge's mean(diag C)), on an MoE layer the edited expert's (``columns``, C being
    theirs); the other entries of the result are 0."""
    if columns is not None:
        left = torch.zeros_like(key, dtype=torch.float32)
        left[columns] = _left_vector(C, key[columns], ridge).to(left.device)
        return left
    w, dim = value_weight(model, layer)
    n = int(w.shape[dim])
    left = _left_vector(C[:n, :n], key[:n], ridge)
    return left if n == key.shape[0] else torch.nn.functional.pad(left, (0, key.shape[0] - n))


@torch.no_grad()
def _unedited_value(model: Model, layer: int, key: torch.Tensor) -> torch.Tensor:
    """W k*: what ``layer``'s down projection makes of the key before the edit, on the CPU (a dense layer;
    an expert's: :func:`~capinterp.interventions.rome_experts.expert_value`)."""
    w, dim = value_weight(model, layer)
    key = key[: w.shape[dim]]  # a dense layer of a mixed model: its real neurons (the padding's keys are 0)
    return (w.float() @ key if dim == 1 else key @ w.float()).cpu()


@dataclass
class _ValueBatch:
    """Step 2's one padded batch: the prefixed prompts with the new target (NLL rows) and the
    "{subject} is a" row (KL), the subject's last position in each, and the answer positions read."""

    tokens: torch.Tensor  # [rows, seq]
    rows: torch.Tensor  # arange(rows)
    subject_pos: torch.Tensor  # [rows]
    pick_rows: torch.Tensor  # row of each read position: the answer positions, then the KL row's last
    pick_pos: torch.Tensor
    gold: torch.Tensor  # the new target's token at each answer position
    weights: torch.Tensor  # 1 / len(target) / n_prompts per answer position (a mean NLL per prompt)
    n_prompts: int


def _value_batch(model: Model, prompt: str, subject: str, new_target: str, contexts: list[str]) -> _ValueBatch:
    dev = model.cfg.device
    enc = encode(model, [Example(c + prompt, new_target) for c in contexts])
    subj = [subject_last_position(model, c + prompt, subject, len(c)) for c in contexts]
    kl_text = f"{subject} is a"
    seqs = [e.ids for e in enc] + [
        model_bos(model) + list(model.tokenizer(kl_text, add_special_tokens=False)["input_ids"])
    ]
    subj.append(subject_last_position(model, kl_text, subject))
    tokens, lengths = pad_right(seqs, pad_id(model.tokenizer))
    pos_rows = [r for r, e in enumerate(enc) for _ in e.answer_positions]
    pos = [p for e in enc for p in e.answer_positions] + [int(lengths[-1]) - 1]
    return _ValueBatch(
        tokens=tokens.to(dev),
        rows=torch.arange(len(seqs), device=dev),
        subject_pos=torch.tensor(subj, device=dev),
        pick_rows=torch.tensor(pos_rows + [len(seqs) - 1], device=dev),
        pick_pos=torch.tensor(pos, device=dev),
        gold=torch.tensor([t for e in enc for t in e.target_ids], device=dev),
        weights=torch.tensor([1.0 / len(e.target_ids) / len(enc) for e in enc for _ in e.target_ids], device=dev),
        n_prompts=len(enc),
    )


def _value_hook(model: Model, layer: int, expert: Expert | None = None) -> str:
    """Where the layer's down projection's output is hooked: its ``out`` component, or on a
    mixture-of-experts model (its layers served by :mod:`capinterp.arch.experts`' blocks, whose
    output is the sum over their neurons' value vectors) the MLP's ``hook_out``; on a layer whose
    branches are normalized apart (Gemma 4: :mod:`capinterp.arch.branch_experts`) the edited branch's
    sum, the input of its norm."""
    if branched(model, layer):
        norm = "post_feedforward_layernorm_1" if expert == SHARED else "post_feedforward_layernorm_2"
        return f"blocks.{layer}.{norm}.hook_in"
    if getattr(model, "capinterp_experts", None):
        return f"blocks.{layer}.mlp.hook_out"
    return f"blocks.{layer}.mlp.out.hook_out"


def _optimise(
    model: Model,
    cfg: RomeConfig,
    layer: int,
    prompt: str,
    subject: str,
    new_target: str,
    contexts: list[str],
    expert: Expert | None = None,
) -> tuple[torch.Tensor, torch.Tensor, list[float]]:
    """Steps 1 and 2: ``(delta [d_model], k* [d_mlp], losses)``, ROME's key and value optimisation (Eq. 4)."""
    b = _value_batch(model, prompt, subject, new_target, contexts)
    out_hook = _value_hook(model, layer, expert)
    saved: dict[str, torch.Tensor] = {}

    def keep(name: str):
        def hook(act, hook):
            saved[name] = act[b.rows, b.subject_pos].detach().float()

        return hook

    def run(delta: torch.Tensor | None, extra=()):
        def add(act, hook):
            if delta is None:
                return act
            act = act.clone()
            act[b.rows, b.subject_pos] = act[b.rows, b.subject_pos] + delta.to(act.dtype)
            return act

        resid = capture(model, b.tokens, "ln_final.hook_in", [(out_hook, add), *extra])
        return unembed(model, resid[b.pick_rows, b.pick_pos][:, None])[:, 0].float().log_softmax(-1)

    params = [p for p in model.parameters() if p.requires_grad]
    try:
        for p in params:
            p.requires_grad_(False)
        with torch.no_grad():
            logp0 = run(None, [(neuron_hook(layer), keep("key")), (out_hook, keep("value"))])
        key = saved["key"][: b.n_prompts].mean(0)
        delta, losses = _descend(model, cfg, b, run, logp0[-1], saved["value"][0].norm(), layer)
    finally:
        for p in params:
            p.requires_grad_(True)
    return delta.detach(), key, losses


def _check_reach(grad: torch.Tensor, layer: int) -> None:
    """Refuse an edit whose value cannot move the new target's probability at all (a zero gradient
    before the first step): Adam would otherwise turn rounding noise into a large, meaningless delta."""
    if not bool(grad.ne(0).any()):
        raise EditUnreachable(
            f"ROME at layer {layer}: a change of the value at the subject's last token does not reach the answer "
            "(the gradient of the new target's log-probability is exactly 0): no later attention layer can carry it "
            "from the subject to the prompt's end (the subject ends too far before it for a sliding window, or the "
            "edited layer is the last one and the subject does not end the prompt); edit an earlier layer or move "
            "the subject closer to the end of the prompt"
        )


def _descend(
    model: Model,
    cfg: RomeConfig,
    b: _ValueBatch,
    run: Any,
    kl_before: torch.Tensor,
    v0_norm: torch.Tensor,
    layer: int,
) -> tuple[torch.Tensor, list[float]]:
    """Step 2's Adam loop on delta: NLL + KL + weight decay, ||delta|| clamped; stops early at NLL < 0.05."""
    delta = torch.zeros(int(model.cfg.d_model), device=model.cfg.device, requires_grad=True)
    opt = torch.optim.Adam([delta], lr=cfg.lr)
    losses: list[float] = []
    for _ in range(cfg.steps):
        logp = run(delta)
        nll = -(logp[:-1].gather(1, b.gold[:, None])[:, 0] * b.weights).sum()
        kl = torch.sum(kl_before.exp() * (kl_before - logp[-1]))
        loss = nll + cfg.kl_factor * kl + cfg.weight_decay * delta.pow(2).sum() / v0_norm**2
        losses.append(float(nll.detach()))
        if losses[-1] < 5e-2:
            break
        if len(losses) == 1:
            _check_reach(torch.autograd.grad(nll, delta, retain_graph=True)[0], layer)
        opt.zero_grad()
        loss.backward()
        opt.step()
        with torch.no_grad():
            cap = cfg.clamp * v0_norm
            if delta.norm() > cap:
                delta.mul_(cap / delta.norm())
    return delta, losses
