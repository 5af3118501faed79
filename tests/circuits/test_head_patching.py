"""Per-head exact patching and AtP against hand-written references on the plain transformers model
(torch hooks on each layer's o_proj input, i.e. the per-head z), and a planted answer-carrying head."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import capinterp as ci
from capinterp.circuits.head_patching import head_atp, head_atp_graddrop, head_atp_qk, head_effects
from capinterp.core.tokens import encode
from capinterp.data import Example
from capinterp.experiments import patching_agreement as PA

EXAMPLES = [Example(f"{a}+{b}=", "7") for a, b in [(3, 4), (5, 2), (1, 6), (2, 9)]]


@pytest.fixture(scope="module")
def model():
    return ci.load_model("tiny")


def _raw(mod):
    return getattr(mod, "original_component", None) or mod


def _plain_hf(m):
    """A fresh transformers model (eager attention) with the bridge's weights: no bridge code runs."""
    from transformers import AutoModelForCausalLM

    cfg = m.original_model.config
    cfg._attn_implementation = "eager"
    hf = AutoModelForCausalLM.from_config(cfg, attn_implementation="eager")
    state = {k.replace("._original_component", ""): v for k, v in m.original_model.state_dict().items()}
    missing, _ = hf.load_state_dict(state, strict=False)  # the bridge's aliases come back as extra keys
    assert not missing
    hf.eval()
    toks = torch.tensor([encode(m, EXAMPLES[:1])[0].prompt_ids])
    with torch.no_grad():
        torch.testing.assert_close(hf(toks).logits, m(toks).float(), rtol=1e-4, atol=1e-5)
    return hf


def _o_proj(hf, l):
    return hf.model.layers[l].self_attn.o_proj


def _hf_mean_p(m, items, hooks=()):
    """Mean p(target) at the last prompt position on the plain HF model, with pre-hooks on o_proj."""
    hf = m.original_model
    handles = [_o_proj(hf, l).register_forward_pre_hook(fn) for l, fn in hooks]
    try:
        ps = [hf(torch.tensor([it.prompt_ids])).logits[0, -1].float().softmax(-1)[it.target_ids[0]] for it in items]
    finally:
        for h in handles:
            h.remove()
    return torch.stack(ps).mean()


def _z_means(m, items, dh):
    """Per layer, the mean o_proj input (the mean-ablation value) as a function of the sequence
    length: the mean over the items' first positions at position 0, over all later positions after."""
    hf, L = m.original_model, m.cfg.n_layers
    firsts: list[list[torch.Tensor]] = [[] for _ in range(L)]
    later: list[list[torch.Tensor]] = [[] for _ in range(L)]

    def rec(mod, args, l):
        firsts[l].append(args[0][0, 0])
        later[l].append(args[0][0, 1:])

    handles = [_o_proj(hf, l).register_forward_pre_hook(lambda mod, args, l=l: rec(mod, args, l)) for l in range(L)]
    with torch.no_grad():
        for it in items:
            hf(torch.tensor([it.ids]))
    for h in handles:
        h.remove()
    pairs = [(torch.stack(firsts[l]).mean(0), torch.cat(later[l]).mean(0)) for l in range(L)]
    return [lambda T, f=f, r=r: torch.cat([f[None], r[None].expand(T - 1, -1)]) for f, r in pairs]


@pytest.mark.parametrize("ablation", ["zero", "mean"])
def test_exact_effects_equal_a_hand_written_head_ablation(model, ablation):
    m = model
    items = encode(m, EXAMPLES)
    H, dh = m.cfg.n_heads, m.cfg.d_head
    means = _z_means(m, items, dh)
    effects = head_effects(m, EXAMPLES, ablation=ablation)
    assert effects.shape == (m.cfg.n_layers, H)
    with torch.no_grad():
        base = _hf_mean_p(m, items)
        for l, h in [(0, 1), (1, 3), (3, 0)]:

            def patch(mod, args, l=l, h=h):
                z = args[0].clone()
                z[..., h * dh : (h + 1) * dh] = (
                    0 if ablation == "zero" else means[l](z.shape[1])[:, h * dh : (h + 1) * dh]
                )
                return (z,)

            expected = float(base - _hf_mean_p(m, items, [(l, patch)]))
            assert effects[l, h] == pytest.approx(expected, rel=1e-3, abs=1e-7)
    assert np.abs(effects).max() > 1e-5


@pytest.mark.parametrize("ablation", ["zero", "mean"])
def test_atp_equals_a_hand_written_gradient_times_difference(model, ablation):
    """(a_h - ref_h) . dm/da_h = (z_h - ref_z_h) . dm/dz_h, since a_h = z_h @ W_O[h] is linear in z_h."""
    m = model
    items = encode(m, EXAMPLES)
    L, H, dh = m.cfg.n_layers, m.cfg.n_heads, m.cfg.d_head
    means = _z_means(m, items, dh)
    expected = torch.zeros(L, H, dtype=torch.float64)
    for it in items:
        zs: dict[int, torch.Tensor] = {}
        eps = [torch.zeros(len(it.prompt_ids), H * dh, requires_grad=True) for _ in range(L)]

        def grab(l):
            def fn(mod, args):  # z + 0: the gradient at eps[l] is dm/dz_l through every later layer
                zs[l] = args[0].detach()
                return (args[0] + eps[l],)

            return fn

        p = _hf_mean_p(m, [it], [(l, grab(l)) for l in range(L)])
        grads = [g[None] for g in torch.autograd.grad(p, eps)]
        for l in range(L):
            diff = zs[l][0] - (0 if ablation == "zero" else means[l](zs[l].shape[1]))
            prod = (diff * grads[l][0]).reshape(-1, H, dh).sum((0, 2))
            expected[l] += prod.double()
    expected /= len(items)
    got = head_atp(m, EXAMPLES, ablation=ablation)
    np.testing.assert_allclose(got, expected.numpy(), rtol=1e-3, atol=1e-8)
    assert np.abs(expected.numpy()).max() > 1e-5


def test_planted_head_makes_atp_agree_with_patching():
    """A layer-0 head whose output is the target's unembedding direction carries the answer (p(target)
    ~0.27); its z depends on the embeddings only, so the other heads' effects stay small."""
    m = ci.load_model("tiny")
    items = encode(m, EXAMPLES)
    target = items[0].target_ids[0]
    l, h, dh = 0, 2, m.cfg.d_head
    zs = []
    hook = _o_proj(m.original_model, l).register_forward_pre_hook(lambda mod, args: zs.append(args[0][0, -1]))
    with torch.no_grad():
        for it in items:
            m.original_model(torch.tensor([it.prompt_ids]))
        hook.remove()
        v = torch.stack(zs).mean(0)[h * dh : (h + 1) * dh]
        u = m.W_U[:, target]
        w = _o_proj(m.original_model, l).weight  # [d_model, H * d_head]
        w[:, h * dh : (h + 1) * dh] = 30 * torch.outer(u / u.norm(), v / v.norm() ** 2)
    exact, atp = head_effects(m, EXAMPLES), head_atp(m, EXAMPLES)
    assert exact[l, h] > 0.1 and exact[l, h] == np.abs(exact).max() and atp[l, h] == np.abs(atp).max()
    pearson, spearman = PA.correlations(atp.ravel(), exact.ravel())
    assert pearson > 0.9 and spearman > 0.9
    qk = head_atp_qk(m, EXAMPLES)  # AtP* with the QK fix agrees as well; last-layer heads are unchanged
    assert min(PA.correlations(qk.ravel(), exact.ravel())) > 0.9 and np.array_equal(qk[-1], atp[-1])


def _graddrop_reference(m, hf, items, ablation):
    """AtP* GradDrop by hand on the plain HF model: for each dropped layer ld, decoder layer ld returns
    ``x + (layer(x) - x).detach()`` (same forward, no gradient through its residual contribution); the
    per-head gradient is dm/dz at o_proj's input (z + eps); |I| per prompt, summed over ld, / (L-1)."""
    L, H, dh = m.cfg.n_layers, m.cfg.n_heads, m.cfg.d_head
    means = _z_means(m, items, dh)
    expected = torch.zeros(L, H, dtype=torch.float64)
    for it in items:
        for ld in range(L):
            zs: dict[int, torch.Tensor] = {}
            eps = [torch.zeros(len(it.prompt_ids), H * dh, requires_grad=True) for _ in range(L)]
            inp: dict[str, torch.Tensor] = {}

            def grab(mod, args, l):
                zs[l] = args[0].detach()
                return (args[0] + eps[l],)

            def pre(mod, args, kwargs):
                inp["x"] = kwargs.get("hidden_states", args[0] if args else None)

            def drop(mod, args, kwargs, out):
                x = inp["x"]
                y = out[0] if isinstance(out, tuple) else out
                y = x + (y - x).detach()
                return (y, *out[1:]) if isinstance(out, tuple) else y

            layer = hf.model.layers[ld]
            handles = [_o_proj(hf, l).register_forward_pre_hook(lambda mod, a, l=l: grab(mod, a, l)) for l in range(L)]
            handles += [
                layer.register_forward_pre_hook(pre, with_kwargs=True),
                layer.register_forward_hook(drop, with_kwargs=True),
            ]
            try:
                p = hf(torch.tensor([it.prompt_ids])).logits[0, -1].float().softmax(-1)[it.target_ids[0]]
            finally:
                for hd in handles:
                    hd.remove()
            grads = torch.autograd.grad(p, eps, allow_unused=True)
            for l in range(L):
                if grads[l] is None:
                    continue
                diff = zs[l][0] - (0 if ablation == "zero" else means[l](zs[l].shape[1]))
                expected[l] += (diff * grads[l]).reshape(-1, H, dh).sum((0, 2)).double().abs()
    return (expected / (L - 1) / len(items)).numpy()


@pytest.mark.parametrize("ablation", ["zero", "mean"])
def test_graddrop_equals_a_hand_written_per_layer_dropped_gradient(model, ablation):
    m = model
    hf = _plain_hf(m)
    items = encode(m, EXAMPLES)
    expected = _graddrop_reference(m, hf, items, ablation)
    got = head_atp_graddrop(m, EXAMPLES, ablation=ablation)
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-9)
    # it must differ from plain AtP: unsigned, and the later blocks' paths are dropped one at a time
    atp = head_atp(m, EXAMPLES, ablation=ablation)
    assert np.abs(expected).max() > 1e-5 and np.all(got >= 0)
    assert not np.allclose(got, np.abs(atp), rtol=1e-2, atol=1e-7)
    if ablation == "mean":  # the mean ablation's reference depends on the whole data set
        return
    # last-layer heads keep their direct gradient under the L - 1 other drops: the mean |AtP| per prompt
    per_prompt = np.mean([np.abs(head_atp(m, [ex], ablation=ablation)[-1]) for ex in EXAMPLES], axis=0)
    np.testing.assert_allclose(got[-1], per_prompt, rtol=1e-5, atol=1e-9)


def test_graddrop_refuses_a_bad_ablation(model):
    with pytest.raises(ValueError, match="ablation"):
        head_atp_graddrop(model, EXAMPLES, ablation="corrupt")


def test_bad_ablation_is_refused(model):
    with pytest.raises(ValueError, match="ablation"):
        head_effects(model, EXAMPLES, ablation="corrupt")


def test_qk_fix_replaces_the_linear_qk_paths_by_recomputed_patterns(model):
    """AtP* QK fix minus AtP, per head, against a hand-written version on the plain HF model: the
    later layers' q_proj / k_proj read ``ln1(resid - t * a_h)``; the linear q/k term is
    ``-dm/dt`` at t=0, the fixed term ``-sum dm/dpattern * (pattern(t=1) - pattern)`` per layer."""
    m = model
    hf = _plain_hf(m)
    items = encode(m, EXAMPLES)
    L, H, dh = m.cfg.n_layers, m.cfg.n_heads, m.cfg.d_head
    expected = np.zeros((L, H))
    for it in items:
        toks = torch.tensor([it.prompt_ids])

        def run(head, t_of, attn=False):
            """Forward with layer l2's q/k inputs = ln1(resid_l2 - t_of(l2) * a_head); returns (p, attentions)."""
            l, h = head
            cap: dict = {}
            pats: dict = {}
            handles = [_o_proj(hf, l).register_forward_pre_hook(lambda mod, args: cap.__setitem__("z", args[0]))]
            for l2 in range(l + 1, L):
                layer = hf.model.layers[l2]

                def pre(mod, args, kwargs, l2=l2):
                    cap[l2] = kwargs.get("hidden_states", args[0] if args else None)

                def qk(mod, args, out, l2=l2, layer=layer):
                    w = _o_proj(hf, l).weight[:, h * dh : (h + 1) * dh]
                    a = cap["z"][..., h * dh : (h + 1) * dh] @ w.T
                    x = _raw(layer.input_layernorm)(cap[l2] - t_of(l2) * a)
                    return torch.nn.functional.linear(x, mod.weight, mod.bias)

                handles.append(layer.register_forward_pre_hook(pre, with_kwargs=True))
                if attn:  # eager attention returns its post-softmax weights
                    handles.append(
                        layer.self_attn.register_forward_hook(
                            lambda mod, args, out, l2=l2: pats.__setitem__(l2, out[1])
                        )
                    )
                for proj in (_raw(layer.self_attn.q_proj), _raw(layer.self_attn.k_proj)):
                    handles.append(proj.register_forward_hook(qk))
            try:
                out = hf(toks)
            finally:
                for hd in handles:
                    hd.remove()
            return out.logits[0, -1].float().softmax(-1)[it.target_ids[0]], pats

        for l in range(L - 1):
            for h in range(H):
                t = torch.zeros((), requires_grad=True)
                p, _ = run((l, h), lambda l2, t=t: t)
                linear = -float(torch.autograd.grad(p, t)[0])
                p, pats = run((l, h), lambda l2: 0.0, attn=True)
                g = torch.autograd.grad(p, [pats[l2] for l2 in range(l + 1, L)])
                fixed = 0.0
                with torch.no_grad():
                    for j, l2 in enumerate(range(l + 1, L)):
                        _, new = run((l, h), lambda x, l2=l2: float(x == l2), attn=True)
                        fixed -= float((g[j] * (new[l2] - pats[l2])).sum())
                expected[l, h] += (fixed - linear) / len(items)
    got = head_atp_qk(m, EXAMPLES) - head_atp(m, EXAMPLES)
    np.testing.assert_allclose(got, expected, rtol=1e-3, atol=1e-8)
    assert np.abs(expected).max() > 1e-6 and np.all(got[-1] == 0)


def test_qk_fix_refuses_where_the_pattern_is_not_on_the_outputs_path():
    """GPT-J's bridge computes attention without its hooked pattern: the pattern's gradient is 0 there,
    so the QK fix would silently drop its correction; it is refused naming the family."""
    from capinterp.arch.family import UnsupportedFamily
    from capinterp.arch.tiny import tiny_hf

    hf, tok = tiny_hf("gptj")
    with pytest.raises(UnsupportedFamily, match=r"^gptj .*hook_pattern does not reach.*QK fix"):
        head_atp_qk(ci.load_model(hf, tokenizer=tok), EXAMPLES)
