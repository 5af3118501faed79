"""Gemma 4's text model (row gemma4_text of the family matrix, which checks every method against plain
transformers): what that row does not show on its own. Its last layer reuses layer 1's keys and values
from the same forward (KV sharing), so IG's staircase must hand it the keys of the rows it runs; its
KV-sharing layer's MLP is twice as wide, padded onto one neuron axis; its per-layer embeddings are nodes
of the circuit graph and its layer scales carried there (head patching checked against transformers).
Its MoE layers (experts beside the MLP): tests/families/test_gemma4_moe.py."""

from __future__ import annotations

import functools
import warnings

import numpy as np
import pytest
import torch

import capinterp as ci
from capinterp.arch.family import UnsupportedFamily, family_of
from capinterp.arch.layer_extras import layer_extras
from capinterp.arch.tiny import tiny_hf
from capinterp.circuits.head_patching import head_effects
from capinterp.core.example import Example
from capinterp.core.tokens import encode
from capinterp.kernels import prefix as _prefix
from capinterp.kernels.ig import site


@functools.cache
def _model(family: str = "gemma4_text"):
    hf, tok = tiny_hf(family)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return ci.load_model(hf, tokenizer=tok)


@pytest.mark.parametrize("batch", [False, True])
def test_staircase_rows_read_the_keys_their_own_forward_shares(batch, monkeypatch):
    """Rows entering at every layer, the KV-sharing last one included, give the logits of transformers'
    own forward with the same neurons (the prefix route: whole forwards over the cached prefix), with
    the rows folded into one sequence and in the batch dimension (GPT-Neo's layout)."""
    model = _model()
    monkeypatch.setattr(_prefix, "_batch_layout", lambda m: batch)
    assert model.original_model.model.layers[2].self_attn.is_kv_shared_layer
    s = site(encode(model, [Example("The Eiffel Tower is in the city of", " Paris")])[0], "answer")
    run = _prefix.clean_suffix(model, s.seq, s.p0, keep_cache=True)
    assert run.cache is not None and s.p0 > 0
    gen = torch.Generator().manual_seed(0)
    groups = [(l, run.acts[l][None] + torch.randn(2, *run.acts[l].shape, generator=gen)) for l in range(3)]
    with torch.no_grad():
        got, want = _prefix.stair_logits(model, run, groups), _prefix.bridge_logits(model, run, groups)
    assert got.shape == want.shape
    assert (got - want).abs().max() <= 1e-4 * want.abs().max()
    clean_last = [(2, run.acts[2][None])]  # a row entering at the last layer is the clean run
    with torch.no_grad():
        assert torch.allclose(_prefix.stair_logits(model, run, clean_last)[0], run.logits, atol=1e-4)
    assert _prefix.stair_supported(model, run)


def test_double_wide_mlp_is_the_axis_and_padding_is_no_neuron():
    model = _model()
    fam = family_of(model)
    assert (fam.d_mlp, fam.layer_widths) == (192, (96, 96, 192))
    acts = {}
    tokens = model.to_tokens("Rome is the capital of")
    model.run_with_hooks(
        tokens,
        fwd_hooks=[(f"blocks.{l}.mlp.hook_post", lambda a, hook, l=l: acts.__setitem__(l, a)) for l in range(3)],
    )
    assert all(a.shape[-1] == 192 for a in acts.values())
    assert acts[0][..., 96:].abs().max() == 0  # padding: always 0
    assert acts[2][..., 96:].abs().max() > 0  # the wide layer's own neurons


def test_circuit_graph_takes_the_per_layer_embeddings_as_nodes(tmp_path):
    """Each layer's per-layer embedding is a node p{l} after its MLP, read through the residual its gate reads;
    slots and outputs carried at the layer scales between them, the decomposition holds and the graph's
    forward keeps the logits; p{l} owns the gate, projection and norm; a circuit saves (format 3) and draws."""
    from capinterp.circuits.forward import check_additive, node_params
    from capinterp.circuits.graph import Circuit, Graph
    from capinterp.plots.circuits import plot_circuit

    model = _model()
    assert set(layer_extras(model)) == {"ple", "scaled"}
    graph = Graph.from_model(model)
    assert graph.ple and [n for n in graph.sources if n.startswith("p")] == ["p0", "p1", "p2"]
    l = 1
    assert graph.sources[graph.ple_src(l)] == "p1" and graph.slots[graph.slot_index(l, "ple").start] == "p1"
    assert graph.n_upstream(graph.slot_index(l, "ple").start) == graph.mlp_src(l) + 1  # through m1
    assert graph.n_upstream(graph.slot_index(l + 1, "mlp").start) == graph.mlp_src(l + 1)  # p1 feeds layer 2
    assert check_additive(model, graph) <= 1e-4
    with pytest.raises(ValueError, match="per-layer embeddings False.*per-layer embeddings True"):
        check_additive(model, Graph(3, graph.n_heads, graph.n_kv_heads, graph.granularity))  # a graph without p{l}
    layer = model.original_model.model.layers[l]
    own = sum(
        p.numel()
        for m in (layer.per_layer_input_gate, layer.per_layer_projection, layer.post_per_layer_input_norm)
        for p in m.parameters()
    )
    assert node_params(model, graph)["p1"] == own > 0
    kc = ci.KnowledgeCircuit(model, algorithm="eap", top_n=6, progress=False).fit(
        [Example("Rome is the capital of", " Italy")]
    )
    d = kc.circuit_.to_dict()
    assert d["format_version"] == 3 and Circuit.load(kc.circuit_.save(tmp_path / "c.json")).graph == graph
    assert len(plot_circuit(kc.circuit_).data) > 0


def test_head_effects_are_the_head_patched_out_of_the_residual():
    """Exact head effects on Gemma 4 (zero ablation) equal, on plain transformers, p(target) after removing the
    head's share of the post-normed attention output from the residual (every later layer's scale then
    applies to it as to everything else); RelP refuses the gate, which no rule of its covers."""
    from capinterp.circuits.relp import head_relp

    model = _model()
    plain = tiny_hf("gemma4_text")[0]
    fact = Example("Rome is the capital of", " Italy")
    enc = encode(model, [fact])[0]
    ids, target = torch.tensor([enc.prompt_ids]), enc.target_ids[0]
    got = head_effects(model, [fact])
    layers = plain.model.layers
    H = plain.config.num_attention_heads

    def p_target(layer: int | None = None, head: int | None = None) -> float:
        seen: dict = {}
        attn = layers[layer].self_attn if layer is not None else None
        hooks = []
        if attn is not None:
            hooks.append(attn.o_proj.register_forward_pre_hook(lambda m, a: seen.__setitem__("z", a[0])))
            hooks.append(attn.o_proj.register_forward_hook(lambda m, a, out: seen.__setitem__("o", out)))

            def drop(m, a, out):
                w = attn.o_proj.weight  # [d_model, H * d_head]
                z = seen["z"].unflatten(-1, (H, -1))[..., head, :]
                share = z @ w.unflatten(1, (H, -1))[:, head, :].T * (out / seen["o"])
                return out - share

            hooks.append(layers[layer].post_attention_layernorm.register_forward_hook(drop))
        try:
            with torch.no_grad():
                logits = plain(ids).logits[0, -1]
        finally:
            for h in hooks:
                h.remove()
        return float(logits.double().softmax(-1)[target])

    clean = p_target()
    want = np.array([[clean - p_target(l, h) for h in range(H)] for l in range(len(layers))])
    assert np.abs(got - want).max() <= 1e-5 * max(np.abs(want).max(), 1e-6), (got, want)
    with pytest.raises(UnsupportedFamily, match="RelP.*per-layer embeddings"):
        head_relp(model, [fact])


def test_hyper_connection_streams_still_refuse_the_circuit_graph():
    """DeepSeek-V4's four residual streams: no sublayer output joins the residual additively."""
    from moe_tiny import load_tiny_moe

    model, *_ = load_tiny_moe("deepseek_v4")
    kc = ci.KnowledgeCircuit(model, algorithm="eap", top_n=5, progress=False)
    with pytest.raises(UnsupportedFamily, match=r"^deepseek_v4 .*4 residual streams"):
        kc.fit([Example("Rome is the capital of", " Italy")])


def test_layer_scalars_of_one_and_no_per_layer_embeddings_are_no_extras():
    """A layer scale of exactly 1 changes nothing; Gemma 3 has no such steps."""
    model = _model("gemma3_text")
    assert layer_extras(model) == {}
