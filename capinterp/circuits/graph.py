"""The computational graph of a transformer as knowledge circuits see it, and the Circuit result.

Nodes (Yao et al. 2024, Sec. 2), in topological order:

* ``input``: the residual stream entering block 0 (token embeddings, scaled and with learned
  position embeddings where the model has them; rotary models add positions inside attention);
* ``a{l}.h{h}``: every attention head; its output is its slice of the output projection,
  ``z_h @ W_O[h]`` (TransformerLens ``hook_result``);
* ``m{l}``: every MLP (``hook_mlp_out``);
* ``x{l}`` (hybrid models): the whole token mixer of a layer whose mixer is not softmax attention
  (Mamba, gated delta net, short convolution), one node read through one slot ``x{l}`` (the
  residual before the mixer's norm); its output is what the mixer adds to the residual stream;
* ``p{l}`` (Gemma 4 E2B / E4B): a layer's per-layer embedding (PLE), after its MLP: its gate reads
  the residual after the MLP (slot ``p{l}``, no norm), its output is ``post_per_layer_input_norm``'s;
* ``logits``.

Every node except ``logits`` writes into the residual stream and every node except ``input``
reads it, so an *edge* u -> v exists whenever u is computed before v reads. Edges end at input
*slots*: a head reads through three slots, q, k and v (granularity ``"qkv"``). With grouped-query
attention the query slot is per query head (``a{l}.h{h}<q``) and the key/value slots are per
KV group (``a{l}.g{g}<k``, ``a{l}.g{g}<v``; the group feeds heads g*H/G .. (g+1)*H/G-1, as in
``repeat_kv``): a KV projection is computed once per group, so a per-head k/v input does not
exist in the model. Without GQA the k/v slots are named per head (``a{l}.h{h}<k``). An MLP reads
through one slot (``m{l}``), the unembedding through ``logits``.

The input of a slot is the residual stream *before* the slot's layer norm (TransformerLens
``hook_q_input`` / ``hook_k_input`` / ``hook_v_input`` with ``use_split_qkv_input``, ``hook_mlp_in``
with ``use_hook_mlp_in``, and ``ln_final.hook_in``). Pre-norm, that input is exactly the sum of the
upstream nodes' outputs (plus constant biases), which is what makes per-edge contributions additive.

Granularity ``"head"`` is the fallback for attention bridges that cannot split q/k/v: one slot per
head (``a{l}.h{h}``, TransformerLens ``hook_attn_in``). There TransformerLens feeds the k/v of KV
group g from head slot g, so with GQA slot h < G also carries group h's keys and values.

Granularity ``"layer"`` is the fallback for attention bridges that expose no per-head input at all
(GPT-J, GPT-Neo, OPT, XGLM, CodeGen, MPT): the heads of a layer read through one shared slot
``a{l}`` (the residual before the layer's attention norm); their outputs stay per head. An edge
u -> ``a{l}`` is then the sum of u's edges into that layer's per-head q/k/v slots.

Parallel blocks (GPT-J, GPT-NeoX, Phi, CodeGen, Falcon, Cohere; ``parallel=True``): attention and
MLP of a block both read the block's input, so there is no edge ``a{l}.h* -> m{l}``; the MLP slot
reads the same sources as the layer's attention slots.

Sizes: SmolLM2-135M (30 layers, 9 heads, 3 KV heads) 302 nodes, 481 slots, 70,651 edges; Gemma 3
270M (18 x 4 heads, 1 KV head) 92 nodes, 5,644 edges. Scores and masks are ``[n_src, n_slots]``
matrices (``graph.edge_mask`` marks the edges); a :class:`Circuit` holds the kept edges with their
scores and saves to JSON.
"""

from __future__ import annotations

import bisect
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import torch

from capinterp._version import __version__
from capinterp.core import validate
from capinterp.core.protocol import Model
from capinterp.plots.circuits import edge_heatmap, plot_circuit
from capinterp.units.base import KeySet
from capinterp.units.saved import IDENTITY_UNKNOWN, check_model_identity, digest, save_bytes

__all__ = ["GRANULARITIES", "LAYER_KINDS", "Circuit", "EdgeSet", "Graph", "prune_dead", "select_edges"]

GRANULARITIES = ("qkv", "head", "layer")
INPUT, LOGITS = "input", "logits"


def supports(model: Model, flag: str) -> bool:
    """Whether the bridge accepts ``set_<flag>(True)`` (probed, then restored)."""
    before = bool(getattr(model.cfg, flag, False))
    try:
        getattr(model, f"set_{flag}")(True)
    except (NotImplementedError, ValueError, AttributeError):
        return False
    getattr(model, f"set_{flag}")(before)
    return True


#: What a layer of a hybrid graph mixes tokens with: attention heads, one mixer node (a Mamba,
#: linear-attention or convolution mixer), both side by side (Falcon-H1), or nothing (NemotronH's
#: layers that are an FFN alone).
LAYER_KINDS = ("attn", "mixer", "both", "ffn")


@dataclass(frozen=True)
class Graph:
    """Structure of the edge graph of a model with ``n_layers`` blocks of ``n_heads`` heads.

    ``kinds`` (hybrid models only; empty: every layer has attention) gives each layer's token mixer,
    one of :data:`LAYER_KINDS`: a layer of kind ``"mixer"`` has one node ``x{l}`` (its whole mixer)
    read through one slot ``x{l}`` instead of heads; ``"both"`` has the heads and ``x{l}``;
    ``"ffn"`` neither. Every layer has its MLP ``m{l}`` (0 wide on NemotronH's mixer and attention
    layers, whose one sublayer is not an FFN)."""

    n_layers: int
    n_heads: int
    n_kv_heads: int
    granularity: str = "qkv"
    parallel: bool = False  # attention and MLP of a block read the same residual (the block's input)
    kinds: tuple[str, ...] = ()
    ple: bool = False  # a per-layer-embedding node p{l} after each layer's MLP (Gemma 4 E2B / E4B)
    sources: tuple[str, ...] = field(init=False, repr=False)
    slots: tuple[str, ...] = field(init=False, repr=False)
    nodes: tuple[str, ...] = field(init=False, repr=False)
    _src_start: tuple[int, ...] = field(init=False, repr=False, compare=False)
    _slot_start: tuple[int, ...] = field(init=False, repr=False, compare=False)
    input_node: ClassVar[str] = INPUT
    logits_node: ClassVar[str] = LOGITS

    def __post_init__(self) -> None:
        if self.granularity not in GRANULARITIES:
            raise ValueError(f"granularity must be one of {GRANULARITIES}, got {self.granularity!r}")
        if self.n_kv_heads < 1 or self.n_heads % self.n_kv_heads:
            raise ValueError(f"n_heads={self.n_heads} is not a multiple of n_kv_heads={self.n_kv_heads}")
        kinds = tuple(self.kinds)
        if kinds and (len(kinds) != self.n_layers or any(k not in LAYER_KINDS for k in kinds)):
            raise ValueError(f"kinds must give one of {LAYER_KINDS} per layer ({self.n_layers}), got {kinds!r}")
        if (kinds or self.ple) and self.parallel:
            raise ValueError("a hybrid or per-layer-embedding graph with parallel attention and MLP is not defined")
        object.__setattr__(self, "kinds", () if all(k == "attn" for k in kinds) else kinds)
        src: list[str] = [INPUT]
        slots: list[str] = []
        src_start: list[int] = []
        slot_start: list[int] = []
        for l in range(self.n_layers):
            src_start.append(len(src))
            slot_start.append(len(slots))
            src += [f"a{l}.h{h}" for h in range(self.n_heads)] if self.has_heads(l) else []
            src += [f"x{l}"] if self.has_mixer(l) else []
            src += [f"m{l}"] + ([f"p{l}"] if self.ple else [])
            slots += self.attn_slots(l) + ([f"x{l}"] if self.has_mixer(l) else []) + [f"m{l}"]
            slots += [f"p{l}"] if self.ple else []
        slots.append(LOGITS)
        object.__setattr__(self, "sources", tuple(src))
        object.__setattr__(self, "slots", tuple(slots))
        object.__setattr__(self, "nodes", tuple(src) + (LOGITS,))
        object.__setattr__(self, "_src_start", tuple(src_start) + (len(src),))
        object.__setattr__(self, "_slot_start", tuple(slot_start) + (len(slots) - 1,))

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_model(cls, model: Model, granularity: str = "auto") -> Graph:
        """Graph of a TransformerBridge; ``granularity="auto"`` picks q/k/v slots when the model's
        attention exposes per-head q/k/v inputs, else one attention slot per layer (``"layer"``).
        Block layout (parallel or sequential), head counts and, on hybrid models, each layer's
        mixer come from the family record and the blocks."""
        from capinterp.arch.family import UnsupportedFamily, family_of, require_fixed_heads
        from capinterp.arch.layer_extras import ple_layers, require_additive_layers
        from capinterp.arch.model import layer_mixers
        from capinterp.circuits.probe import splits_qkv

        fam = family_of(model)
        require_fixed_heads(fam, "a knowledge-circuit graph (attention heads as nodes)")
        # Gemma 4's per-layer embeddings are nodes p{l}, its layer scales carried by run_graph
        require_additive_layers(model, "a knowledge-circuit graph", served=("ple", "scaled"))
        ple = ple_layers(model)
        if ple and len(ple) != fam.n_layers:
            raise UnsupportedFamily(
                f"{fam.name} ({fam.architecture}): a knowledge-circuit graph takes a per-layer embedding in every "
                f"layer or in none, and this model has one in layers {ple} only"
            )
        scaled_in = fam.attn_in_multiplier != 1.0  # the bridge's split q/k/v inputs skip it (Falcon-H1)
        if granularity == "auto":
            granularity = "qkv" if splits_qkv(model) and not scaled_in else "layer"
        elif granularity in ("qkv", "head") and scaled_in:
            raise ValueError(
                f"{fam.name}: granularity {granularity!r} is not served on this model: its attention reads its "
                f"norm's output times attention_in_multiplier={fam.attn_in_multiplier:g}, which the bridge's per-head "
                "q/k/v inputs leave out; use granularity='layer' (the default here)"
            )
        return cls(
            fam.n_layers, fam.n_heads, fam.n_kv_heads, granularity, fam.parallel_block, layer_mixers(model), bool(ple)
        )

    @classmethod
    def from_dict(cls, d: dict) -> Graph:
        """The graph described by :meth:`to_dict`'s output."""
        return cls(
            int(d["n_layers"]),
            int(d["n_heads"]),
            int(d["n_kv_heads"]),
            str(d["granularity"]),
            bool(d.get("parallel", False)),
            tuple(str(k) for k in d.get("kinds", ())),
            bool(d.get("ple", False)),
        )

    def to_dict(self) -> dict:
        """The numbers that define the graph (JSON-serializable); ``kinds`` on hybrid graphs only."""
        out: dict[str, Any] = {
            "n_layers": self.n_layers,
            "n_heads": self.n_heads,
            "n_kv_heads": self.n_kv_heads,
            "granularity": self.granularity,
            "parallel": self.parallel,
        }
        out = {**out, "kinds": list(self.kinds)} if self.kinds else out
        return {**out, "ple": True} if self.ple else out

    @property
    def signature(self) -> tuple:
        """``(n_layers, n_heads, n_kv_heads, granularity)``, plus ``"parallel"`` for parallel blocks and
        the layer kinds of a hybrid graph: graphs with equal signatures have the same edges (sequential
        graphs keep their former signature)."""
        base: tuple = (self.n_layers, self.n_heads, self.n_kv_heads, self.granularity)
        base = base + ("parallel",) if self.parallel else base
        base = base + ("kinds",) + self.kinds if self.kinds else base
        return base + ("ple",) if self.ple else base

    # ------------------------------------------------------------------ slot layout
    def kind(self, l: int) -> str:
        """Layer ``l``'s token mixer: ``"attn"``, ``"mixer"``, ``"both"`` or ``"ffn"`` (:data:`LAYER_KINDS`)."""
        return self.kinds[l] if self.kinds else "attn"

    def has_heads(self, l: int) -> bool:
        """Whether layer ``l`` has attention heads."""
        return self.kind(l) in ("attn", "both")

    def has_mixer(self, l: int) -> bool:
        """Whether layer ``l`` has a mixer node ``x{l}`` (a Mamba, linear-attention or convolution mixer)."""
        return self.kind(l) in ("mixer", "both")

    @property
    def head_layers(self) -> list[int]:
        """The layers with attention heads (every layer but on a hybrid graph)."""
        return [l for l in range(self.n_layers) if self.has_heads(l)]

    @property
    def gqa(self) -> bool:
        """True when key/value heads are shared by groups of query heads (grouped-query attention)."""
        return self.n_kv_heads < self.n_heads

    def attn_slots(self, l: int) -> list[str]:
        """Names of layer ``l``'s attention input slots (per head and q / k / v, or per head; none in a
        layer without attention)."""
        H, G = self.n_heads, self.n_kv_heads
        if not self.has_heads(l):
            return []
        if self.granularity == "head":
            return [f"a{l}.h{h}" for h in range(H)]
        if self.granularity == "layer":
            return [f"a{l}"]
        u = "g" if self.gqa else "h"
        return [f"a{l}.h{h}<q" for h in range(H)] + [f"a{l}.{u}{g}<{k}" for k in "kv" for g in range(G)]

    @property
    def slots_per_layer(self) -> int:
        """Input slots of one layer: its attention slots and its MLP (graphs whose layers all have attention)."""
        if self.kinds:
            raise ValueError("the layers of a hybrid graph differ in their slots: use slot_index / layer_slots")
        return len(self.attn_slots(0)) + 1 + self.ple

    def layer_slots(self, l: int) -> slice:
        """Every input slot of layer ``l`` (attention, mixer, MLP)."""
        return slice(self._slot_start[l], self._slot_start[l + 1])

    def head_src(self, l: int, h: int = 0) -> int:
        """Source index of head ``a{l}.h{h}``; ``head_src(l, H)`` is ``m{l}`` (:meth:`mlp_src`). A layer's
        heads are ``head_src(l) .. head_src(l) + H - 1``; on a hybrid graph's ``"both"`` layer its mixer
        comes next, before ``m{l}``."""
        if h == self.n_heads:
            return self.mlp_src(l)
        if not self.has_heads(l):
            raise ValueError(f"layer {l} of this graph has no attention heads (its kind: {self.kind(l)})")
        return self._src_start[l] + h

    def mixer_src(self, l: int) -> int:
        """Source index of layer ``l``'s mixer node ``x{l}``."""
        if not self.has_mixer(l):
            raise ValueError(f"layer {l} of this graph has no mixer node (its kind: {self.kind(l)})")
        return self._src_start[l + 1] - 2 - self.ple

    def mlp_src(self, l: int) -> int:
        """Source index of ``m{l}``."""
        return self._src_start[l + 1] - 1 - self.ple

    def ple_src(self, l: int) -> int:
        """Source index of layer ``l``'s per-layer-embedding node ``p{l}`` (the layer's last)."""
        if not self.ple:
            raise ValueError("this graph has no per-layer-embedding nodes")
        return self._src_start[l + 1] - 1

    def slot_index(self, l: int, kind: str) -> slice:
        """Slots of layer ``l`` of one kind: ``"q"``, ``"k"``, ``"v"``, ``"head"``, ``"layer"``, ``"mixer"``
        or ``"mlp"``."""
        H, G, base, end = self.n_heads, self.n_kv_heads, self._slot_start[l], self._slot_start[l + 1]
        if kind == "ple":
            if not self.ple:
                raise ValueError("this graph has no per-layer-embedding slots")
            return slice(end - 1, end)
        end -= self.ple
        if kind == "mlp":
            return slice(end - 1, end)
        if kind == "mixer":
            if not self.has_mixer(l):
                raise ValueError(f"layer {l} of this graph has no mixer (its kind: {self.kind(l)})")
            return slice(end - 2, end - 1)
        if not self.has_heads(l):
            raise ValueError(f"layer {l} of this graph has no attention slots (its kind: {self.kind(l)})")
        if kind == "layer":
            return slice(base, base + 1)
        offsets = (
            {"head": (0, H)} if self.granularity == "head" else {"q": (0, H), "k": (H, H + G), "v": (H + G, H + 2 * G)}
        )
        a, b = offsets[kind]
        return slice(base + a, base + b)

    n_src = property(lambda self: len(self.sources))
    n_slots = property(lambda self: len(self.slots))

    def n_upstream(self, j: int) -> int:
        """Number of sources computed before slot ``j`` reads (sources ``0 .. n-1``)."""
        if j == self.n_slots - 1:
            return self.n_src
        l = bisect.bisect_right(self._slot_start, j) - 1
        if self.ple and j == self._slot_start[l + 1] - 1:  # p{l} reads the residual after its layer's MLP
            return self.ple_src(l)
        if j == self._slot_start[l + 1] - 1 - self.ple and not self.parallel:  # a sequential MLP reads its mixers
            return self.mlp_src(l)
        return self._src_start[l]

    @property
    def edge_mask(self) -> torch.Tensor:
        """Bool ``[n_src, n_slots]``: True where source i feeds slot j."""
        up = torch.tensor([self.n_upstream(j) for j in range(self.n_slots)])
        return torch.arange(self.n_src)[:, None] < up[None, :]

    @property
    def n_edges(self) -> int:
        """Number of edges (source -> slot pairs allowed by the topological order)."""
        return int(sum(self.n_upstream(j) for j in range(self.n_slots)))

    def slot_nodes(self, j: int) -> tuple[str, ...]:
        """Nodes that read through slot ``j`` (a KV group slot feeds every head of its group)."""
        name = self.slots[j]
        if name == LOGITS or name.startswith(("m", "x", "p")):
            return (name,)
        head, _, kind = name.partition("<")
        if "." not in head:  # "layer" granularity: a{l} feeds every head of the layer
            return tuple(f"{head}.h{h}" for h in range(self.n_heads))
        l, unit = head[1:].split(".")
        idx = int(unit[1:])
        if unit.startswith("g"):
            per = self.n_heads // self.n_kv_heads
            return tuple(f"a{l}.h{h}" for h in range(idx * per, (idx + 1) * per))
        return (head,)

    # ------------------------------------------------------------------ edges <-> matrices
    def edges(self, mask: torch.Tensor | None = None) -> list[tuple[str, str]]:
        """Edge keys ``(source, slot)`` where ``mask`` (default: all edges) is True, slot-major."""
        m = self.edge_mask if mask is None else (mask.bool() & self.edge_mask)
        jj, ii = torch.nonzero(m.T, as_tuple=True)
        return [(self.sources[i], self.slots[j]) for i, j in zip(ii.tolist(), jj.tolist())]

    def mask_of(self, keys: Any) -> torch.Tensor:
        """Bool matrix of edge keys; KeyError for a pair that is not an edge of this graph."""
        si = {s: i for i, s in enumerate(self.sources)}
        sj = {s: j for j, s in enumerate(self.slots)}
        m = torch.zeros(self.n_src, self.n_slots, dtype=torch.bool)
        em = self.edge_mask
        for src, dst in keys:
            i, j = si[src], sj[dst]
            if not em[i, j]:
                raise KeyError(f"({src!r}, {dst!r}) is not an edge: {src} is computed after {dst} reads")
            m[i, j] = True
        return m


# ---------------------------------------------------------------------- selection and pruning


def select_edges(
    graph: Graph, scores: torch.Tensor, top_n: int | None = None, min_score: float | None = None
) -> torch.Tensor:
    """Bool mask of the ``top_n`` edges by |score|, or of those with |score| >= ``min_score``.

    Both given: the top ``top_n`` among those with |score| >= min_score. Ties at the cut are broken by
    edge order (stable). Non-edges are never selected.
    """
    if top_n is None and min_score is None:
        raise ValueError("give top_n, min_score, or both")
    em = graph.edge_mask
    s = scores.detach().float().abs().masked_fill(~em, float("-inf"))
    keep = em.clone()
    if min_score is not None:
        keep &= s >= float(min_score)
    if top_n is not None:
        top_n = validate.nonneg_int("top_n", top_n)
        flat = s.masked_fill(~keep, float("-inf")).flatten()
        k = min(int(top_n), int(keep.sum()))
        idx = torch.sort(flat, descending=True, stable=True).indices[:k]
        keep = torch.zeros_like(flat, dtype=torch.bool)
        keep[idx] = True
        keep = keep.view_as(em)
    return keep


def prune_dead(graph: Graph, mask: torch.Tensor) -> torch.Tensor:
    """Drop edges that lie on no input -> logits path.

    A node is *fed* when one of its slots has a kept edge from a fed node (``input`` is fed), and
    *live* when it has a kept edge into a slot of a live node (``logits`` is live). An edge is kept
    when its source is fed and one of the nodes its slot feeds is live. One pass of each is a
    fixed point: an unfed node has no edge from a fed node, so dropping its edges changes no other
    node's status (and likewise for dead nodes).
    """
    m = mask.bool() & graph.edge_mask
    node_idx = {n: i for i, n in enumerate(graph.nodes)}
    slot_feeds = [[node_idx[n] for n in graph.slot_nodes(j)] for j in range(graph.n_slots)]
    fed = torch.zeros(len(graph.nodes), dtype=torch.bool)
    fed[0] = True
    slot_fed = torch.zeros(graph.n_slots, dtype=torch.bool)
    for j in range(graph.n_slots):  # slots are in topological order: their sources are settled
        if (m[:, j] & fed[: graph.n_src]).any():
            slot_fed[j] = True
            fed[slot_feeds[j]] = True
    live = torch.zeros(len(graph.nodes), dtype=torch.bool)
    live[-1] = True
    slot_live = torch.zeros(graph.n_slots, dtype=torch.bool)
    for j in reversed(range(graph.n_slots)):
        slot_live[j] = bool(live[slot_feeds[j]].any())
        if not slot_live[j]:
            continue
        live[: graph.n_src] |= m[:, j]
        # a source's liveness is final once every slot after it was visited: slots of later layers
        # come later in slot order, and a source only feeds slots after it.
    return m & fed[: graph.n_src, None] & slot_live[None, :]


# ---------------------------------------------------------------------- results


def _touched(graph: Graph, mask: torch.Tensor) -> list[str]:
    """Nodes an edge set touches: its sources and the single readers of its slots (topological order).

    A KV-group slot is shared by its group's heads; it counts none of them by itself (a head of the
    group is in the circuit when it has a kept outgoing edge).
    """
    m = mask.bool() & graph.edge_mask
    names = {graph.sources[i] for i in torch.nonzero(m.any(1)).flatten().tolist()}
    for j in torch.nonzero(m.any(0)).flatten().tolist():
        owners = graph.slot_nodes(j)
        if len(owners) == 1:
            names.add(owners[0])
    return [n for n in graph.nodes if n in names]


class EdgeSet(KeySet):
    """Located edges ``(source, slot)``; ``param_share`` counts the parameters of the nodes touched."""

    def __init__(
        self, keys: Any, graph: Graph, *, node_params: dict[str, int] | None = None, n_params: int | None = None
    ) -> None:
        super().__init__(keys, "edge", ("edge",) + graph.signature, n_params=n_params, n_units=graph.n_edges)
        self.graph = graph
        self.node_params = dict(node_params) if node_params is not None else None

    def nodes(self) -> list[str]:
        """Names of the nodes the edges touch, in topological order."""
        return _touched(self.graph, self.graph.mask_of(self.keys()))

    def param_count(self) -> int:
        """Parameters of the nodes the edges touch (needs ``node_params``)."""
        if self.node_params is None:
            raise ValueError("param_count of an EdgeSet needs node_params (see capinterp.circuits.node_params)")
        return int(sum(self.node_params.get(n, 0) for n in self.nodes()))

    def _combine(self, other: object, keys: frozenset) -> EdgeSet:
        o = other if isinstance(other, EdgeSet) else None
        return EdgeSet(
            keys,
            self.graph,
            node_params=self.node_params
            if self.node_params is not None
            else (o.node_params if o is not None else None),
            n_params=self.n_params if self.n_params is not None else (o.n_params if o is not None else None),
        )


class Circuit:
    """Kept edges of a graph, the edges' scores, and how they were found.

    ``mask``: bool ``[n_src, n_slots]`` of kept edges; ``scores``: float ``[n_src, n_slots]`` of every
    edge's score (0 off the edges) or None; ``node_params``: parameters per node (for param_share).
    """

    #: 2: a hybrid graph's layer kinds; 3: per-layer-embedding nodes (to_dict keeps the lowest that describes
    #: the graph); 4: a saved file, with a checksum over its whole content (:meth:`save`)
    FORMAT_VERSION = 4

    def __init__(
        self,
        graph: Graph,
        mask: torch.Tensor,
        scores: torch.Tensor | None = None,
        meta: dict | None = None,
        node_params: dict[str, int] | None = None,
    ) -> None:
        if tuple(mask.shape) != (graph.n_src, graph.n_slots):
            raise ValueError(f"mask has shape {tuple(mask.shape)}, expected {(graph.n_src, graph.n_slots)}")
        self.graph = graph
        self.mask = mask.detach().cpu().bool() & graph.edge_mask
        self.scores = None if scores is None else scores.detach().cpu().float() * graph.edge_mask
        self.meta = dict(meta or {})
        self.node_params = None if node_params is None else {k: int(v) for k, v in node_params.items()}

    @classmethod
    def full(cls, graph: Graph, **kw: Any) -> Circuit:
        """The circuit with every edge of ``graph``."""
        return cls(graph, graph.edge_mask, **kw)

    @classmethod
    def empty(cls, graph: Graph, **kw: Any) -> Circuit:
        """The circuit with no edge of ``graph``."""
        return cls(graph, torch.zeros(graph.n_src, graph.n_slots, dtype=torch.bool), **kw)

    # ------------------------------------------------------------------ views
    @property
    def edges(self) -> dict[tuple[str, str], float | None]:
        """Kept edges -> score (None without scores), slot-major topological order."""
        keys = self.graph.edges(self.mask)
        if self.scores is None:
            return dict.fromkeys(keys)
        si = {s: i for i, s in enumerate(self.graph.sources)}
        sj = {s: j for j, s in enumerate(self.graph.slots)}
        return {(a, b): float(self.scores[si[a], sj[b]]) for a, b in keys}

    @property
    def nodes(self) -> list[str]:
        """Names of the nodes the kept edges touch, in topological order."""
        return _touched(self.graph, self.mask)

    def __len__(self) -> int:
        return int(self.mask.sum())

    def __contains__(self, key: object) -> bool:
        return isinstance(key, tuple) and key in set(self.graph.edges(self.mask))

    def pruned(self) -> Circuit:
        """A copy without dead edges (see :func:`prune_dead`)."""
        return Circuit(self.graph, prune_dead(self.graph, self.mask), self.scores, self.meta, self.node_params)

    def units(self, n_params: int | None = None) -> EdgeSet:
        """The kept edges as an :class:`EdgeSet` (a ``KeySet`` of kind ``"edge"``) for the unit metrics."""
        n = n_params if n_params is not None else self.meta.get("n_params")
        return EdgeSet(self.graph.edges(self.mask), self.graph, node_params=self.node_params, n_params=n)

    @property
    def param_share(self) -> float:
        """Share of the model's parameters in the nodes the circuit touches."""
        return self.units().param_share

    def plot(self, **kw: Any):
        """The layered circuit graph (:func:`capinterp.plots.plot_circuit`)."""
        return plot_circuit(self, **kw)

    def edge_heatmap(self, **kw: Any):
        """Sources x slots edge scores (:func:`capinterp.plots.edge_heatmap`)."""
        return edge_heatmap(self, **kw)

    def __repr__(self) -> str:
        return (
            f"Circuit(edges={len(self)}/{self.graph.n_edges}, nodes={len(self.nodes)}, "
            f"algorithm={self.meta.get('algorithm', self.meta.get('method'))!r})"
        )

    # ------------------------------------------------------------------ save / load
    def to_dict(self) -> dict:
        """The circuit as a JSON-serializable dict (graph, ``[n_src, n_slots]`` mask and scores, metadata)."""
        return {
            "type": "Circuit",
            "format_version": 3 if self.graph.ple else 2 if self.graph.kinds else 1,
            "version": __version__,
            "graph": self.graph.to_dict(),
            "edges": [[a, b, s] for (a, b), s in self.edges.items()],
            "scores": None if self.scores is None else self.scores[self.graph.edge_mask].tolist(),
            "node_params": self.node_params,
            "meta": self.meta,
        }

    @classmethod
    def from_dict(cls, d: dict) -> Circuit:
        """The circuit described by :meth:`to_dict`'s output (or a saved file's content, whose checksum
        is verified when present); ValueError for another type, an edited or a damaged one."""
        if not isinstance(d, dict) or d.get("type") != "Circuit":
            raise ValueError(f"not a saved Circuit (type {d.get('type') if isinstance(d, dict) else d!r:.40})")
        d = dict(d)
        recorded, version = d.pop("checksum", None), d.get("format_version", 0)
        if isinstance(version, bool) or not isinstance(version, int) or version < 0:
            raise ValueError(f"Circuit format_version must be a whole number, got {version!r:.40}")
        if version > cls.FORMAT_VERSION:
            raise ValueError(f"Circuit format_version {version} is newer than {cls.FORMAT_VERSION}")
        if version >= 4 and recorded is None:
            raise ValueError(f"a format {version} Circuit without its checksum (edited or damaged)")
        if recorded is not None and recorded != digest(d):
            raise ValueError(
                "the circuit's content does not match its checksum: its edges, scores, graph or metadata "
                "(model, fingerprint, method, ...) were edited or damaged; locate it again, or restore the original file"
            )
        try:
            g = Graph.from_dict(d["graph"])
            mask = g.mask_of((a, b) for a, b, _ in d["edges"])
            scores = None
            if d.get("scores") is not None:
                scores = torch.zeros(g.n_src, g.n_slots)
                scores[g.edge_mask] = torch.tensor(d["scores"], dtype=torch.float32)
            meta, node_params = d.get("meta"), d.get("node_params")
            if not isinstance(meta, (dict, type(None))) or not isinstance(node_params, (dict, type(None))):
                raise TypeError("meta and node_params must be JSON objects")
            return cls(g, mask, scores, meta, node_params)
        except (KeyError, TypeError, ValueError, IndexError, RuntimeError) as e:
            plain = type(e) is KeyError and " " not in str(e.args[0] if e.args else "")
            what = f"no such field, node or slot: {e}" if plain else str(e.args[0] if type(e) is KeyError else e)
            raise ValueError(f"a damaged Circuit: its structure does not fit its graph ({what})") from e

    def save(self, path: str | os.PathLike, *, overwrite: bool = False) -> Path:
        """Write the circuit to ``path`` as JSON (format 4: with a checksum over its whole content);
        returns the path. Atomic (temporary file, then rename; a link at ``path`` is replaced, never
        followed); ValueError if ``path`` holds anything but a saved Circuit, unless ``overwrite=True``."""
        if not isinstance(path, (str, os.PathLike)):
            raise TypeError(f"path must be a str or Path, got {type(path).__name__}")
        d = {**self.to_dict(), "format_version": self.FORMAT_VERSION}
        d = json.loads(json.dumps(d, default=lambda o: o.tolist() if hasattr(o, "tolist") else str(o)))
        return save_bytes(path, json.dumps({**d, "checksum": digest(d)}), "Circuit", overwrite=overwrite)

    @classmethod
    def load(cls, path: str | os.PathLike, *, model: Model | None = None, across_models: bool = False) -> Circuit:
        """Read a circuit written by :meth:`save`, verifying its checksum (files of formats 1-3, written
        before it, have none and load unverified). A circuit without ``meta["model_fingerprint"]``
        is marked ``identity_unknown`` (refused by :meth:`check_model` unless ``across_models=True``).
        ``model=`` checks it against that model (:meth:`check_model`)."""
        p = Path(path)
        if not p.is_file():
            raise FileNotFoundError(f"no saved Circuit at {p}")
        try:
            d = json.loads(p.read_bytes())
            c = cls.from_dict(d)
        except ValueError as e:  # json's decode errors are ValueErrors too
            raise ValueError(f"{p} is not a valid saved Circuit: {e}") from e
        if c.meta.get("model_fingerprint") is None:
            c.meta[IDENTITY_UNKNOWN] = str(p)
        if model is not None:
            c.check_model(model, across_models=across_models)
        return c

    def check_model(self, model: Model, *, across_models: bool = False) -> None:
        """ValueError unless this circuit can run on ``model``: the same graph, and (when both are known)
        the same model fingerprint (weights and config), or with ``across_models=True`` (another
        checkpoint of the architecture on purpose) the same architecture. A circuit loaded from a file
        without model identity is refused unless ``across_models=True``."""

        validate.model(model)
        theirs = Graph.from_model(model, self.graph.granularity).signature
        if theirs != self.graph.signature:
            raise ValueError(f"the circuit's graph {self.graph.signature} is not this model's graph {theirs}")
        check_model_identity(self.meta, "Circuit", model, across_models)
