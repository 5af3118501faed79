"""DeepSeek-V4's hash routing (layer 0 of its tiny model): a fixed token id -> experts table picks each
token's experts, its gate only weights them. capinterp passes the token ids to its expert forward, so
a neuron's activation is non-zero exactly on the experts the table names for its token; a neuron
planted in an expert the table picks for the prompts' last tokens is ranked first; a forward without
token ids is refused. (The family matrix checks every method against plain transformers, row
deepseek_v4; tests/experts/test_planted_experts.py plants in its gate-routed layer 1.)"""

from __future__ import annotations

import functools

import pytest
import torch
from moe_tiny import load_tiny_moe

import capinterp as ci
from capinterp.data import Example
from capinterp.units.experts import expert_scores

EXPERT, NEURON = 3, 5
PROMPTS = ("The Eiffel Tower is in the city of", "The Eiffel Tower is located in", "Paris is the capital of")


def _neurons(model, ids: torch.Tensor) -> torch.Tensor:
    got = {}
    model.run_with_hooks(ids, fwd_hooks=[("blocks.0.mlp.hook_post", lambda a, hook: got.setdefault("a", a))])
    return got["a"][0]


@functools.cache
def _planted():
    """Layer 0's table sends every prompt's last token to expert 3 (beside another), whose neuron 5
    reads that token's FFN input and writes the target's unembedding direction; written on the
    transformers weights."""
    model, _, tok, hf = load_tiny_moe("deepseek_v4")
    block = hf.model.layers[0].mlp
    block = getattr(block, "original_component", block)
    d = block.experts.down_proj.shape[2]
    seen = []
    handle = block.register_forward_pre_hook(lambda _m, args: seen.append(args[0][0, -1]))
    with torch.no_grad():
        for p in PROMPTS:
            model(tok(p, return_tensors="pt")["input_ids"])
        handle.remove()
        u = torch.nn.functional.normalize(torch.stack(seen).mean(0), dim=0)
        gate = block.gate
        gate = getattr(gate, "original_component", gate)
        for p in PROMPTS:
            last = tok(p)["input_ids"][-1]
            gate.tid2eid[last] = torch.tensor([EXPERT, (EXPERT + 1) % 4])
        gate.weight[EXPERT] = 4.0 * u
        block.experts.gate_up_proj[EXPERT][[NEURON, d + NEURON]] = 1.5 * u
        target = tok(" Paris")["input_ids"][0]
        w_u = model.W_U[:, target]
        block.experts.down_proj[EXPERT][:, NEURON] = w_u / w_u.norm()
    model.capinterp_fingerprint = None  # weights changed after load
    return model, tok, gate, d


def test_neurons_are_nonzero_on_the_experts_the_table_names():
    model, tok, gate, d = _planted()
    ids = tok(PROMPTS[0], return_tensors="pt")["input_ids"]
    with torch.no_grad():
        acts = _neurons(model, ids)
    routed = acts[:, : 4 * d].reshape(len(ids[0]), 4, d).abs().amax(-1) > 0  # [pos, expert]
    want = torch.zeros_like(routed)
    want[torch.arange(len(ids[0]))[:, None], gate.tid2eid[ids[0]]] = True
    assert torch.equal(routed, want)


@pytest.mark.parametrize("method", ["kn", "cnl", "dcsn"])
def test_a_neuron_in_a_hash_routed_expert_ranks_first(method):
    model, _, _, d = _planted()
    cls = ci.localizers.get(method)
    data = [Example(p, " Paris") for p in PROMPTS]
    loc = (cls(model) if method == "dcsn" else cls(model, progress=False)).fit(data)
    flat = int(loc.scores_.scores.flatten().argmax())
    assert divmod(flat, loc.scores_.scores.shape[1]) == (0, EXPERT * d + NEURON)
    assert int(expert_scores(model, loc.scores_)[0].argmax()) == EXPERT


def test_a_forward_without_token_ids_is_refused():
    model, *_ = _planted()
    spec = model.capinterp_experts[0]
    assert spec.by_token and not model.capinterp_experts[1].by_token
    with pytest.raises(ValueError, match="routes each token by its id"):
        spec.forward(torch.nn.Identity(), torch.randn(1, 3, model.cfg.d_model))


@pytest.mark.parametrize("compressed", [False, True])
@pytest.mark.parametrize("positions", ["last_prompt", "answer"])
def test_fast_route_runs_on_four_residual_streams(compressed, positions):
    """IG's fast route runs, the rows carrying all four residual streams and hc_head collapsing them, and
    equals the loop route's scores: with every layer sliding (rows folded into one sequence, reading the
    recorded keys and values), and with the tiny model's compressed attention (each row continuing from
    its own copy of the prefix's compressor buffers and compressed keys and values), for one scaled
    position and for an answer of several tokens."""
    import warnings

    from capinterp.core.tokens import encode
    from capinterp.kernels import ig as _ig
    from capinterp.kernels.ig import ig_scores
    from capinterp.kernels.ig_config import IGConfig
    from capinterp.kernels.prefix_state import compressed_state

    sliding = {} if compressed else {"layer_types": ["sliding_attention", "sliding_attention"]}
    model, *_ = load_tiny_moe("deepseek_v4", **sliding)
    assert model.capinterp_family.residual_streams == 4
    assert (compressed_state(model) is not None) == compressed
    items = encode(model, [Example(p, " Paris, France") for p in PROMPTS])
    cfg = dict(steps=5, rule="right", positions=positions, invariance="off")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fast = ig_scores(model, items, IGConfig(route="fast", **cfg))
    assert not [w for w in caught if "route" in str(w.message)], [str(w.message) for w in caught]
    assert all(_ig._STAIR_OK[model].values())
    loop = ig_scores(model, items, IGConfig(route="loop", **cfg))
    assert (fast - loop).abs().max() <= 1e-5 * loop.abs().max()
