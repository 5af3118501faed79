"""Top activating contexts and activation statistics: a planted token detector is found, the results
equal a brute-force pass with plain transformers hooks, the buffers stay bounded, bad input is
refused before any forward, and a 2-process torchrun launch returns the one-process result."""

from __future__ import annotations

import dataclasses
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from contexts_job import UNITS, texts

import capinterp
from capinterp.arch.model import load_model
from capinterp.arch.tiny import tiny_llama_hf
from capinterp.cards import _act_stats, contexts
from capinterp.cards.contexts import activation_stats, top_contexts
from capinterp.core.tokens import model_bos
from capinterp.units.neuron_set import NeuronSet

HERE = Path(__file__).parent
ROOT = Path(capinterp.__file__).parent.parent
K, WINDOW = 6, 2


@torch.no_grad()
def _plant_detector(model, word: str, unit: tuple[int, int]) -> int:
    """Give token ``word`` an embedding component along a random direction e, and make ``unit``'s
    gate and up rows read e: the neuron fires where that token is, and barely elsewhere."""
    (token,) = model.tokenizer(word, add_special_tokens=False)["input_ids"]
    e = torch.randn(model.cfg.d_model, generator=torch.Generator().manual_seed(1))
    e /= e.norm()
    w_e = model.embed.original_component.weight
    w_e[token] += 4 * w_e.norm(dim=1).mean() * e
    mlp = model.blocks[unit[0]].mlp
    mlp.gate.original_component.weight[unit[1]] = 3 * e
    getattr(mlp, "in").original_component.weight[unit[1]] = 3 * e
    return token


def test_a_planted_token_detector_has_that_token_as_its_top_contexts():
    model = load_model("tiny")  # its own copy: the planting edits the weights
    corpus = texts() + [f"{a}+{b}={a + b} is the capital" for a in range(4) for b in range(3)]
    _plant_detector(model, " capital", (0, 7))
    (det, other) = top_contexts(model, [(0, 7), (0, 8)], corpus, k=8, window=3, batch_size=4, progress=False)
    assert det.unit == (0, 7) and len(det.contexts) == 8
    assert all(c.tokens[c.focus] == " capital" for c in det.contexts), [c.tokens[c.focus] for c in det.contexts]
    assert any(c.tokens[c.focus] != " capital" for c in other.contexts)  # an unplanted neuron: no such pattern
    acts = [c.activation for c in det.contexts]
    assert acts == sorted(acts, reverse=True) and det.stats.max == acts[0]
    assert det.stats.quantiles[0.5] < acts[-1] / 10  # the token is rare: the median is far below it


def _brute_force(corpus: list[str], units, tok, bos) -> list[list[list[float]]]:
    """``[unit][text][position]`` activations from an untouched plain transformers copy of the tiny
    model (same seed, same weights), one text at a time (no padding), read by forward pre-hooks on the
    down projections."""
    hf, _ = tiny_llama_hf()
    seen: dict[int, torch.Tensor] = {}
    handles = [
        layer.mlp.down_proj.register_forward_pre_hook(lambda mod, args, i=i: seen.__setitem__(i, args[0][0]))
        for i, layer in enumerate(hf.model.layers)
    ]
    out: list[list[list[float]]] = [[] for _ in units]
    with torch.no_grad():
        for text in corpus:
            hf(torch.tensor([bos + tok(text, add_special_tokens=False)["input_ids"]]))
            for j, (layer, idx) in enumerate(units):
                out[j].append(seen[layer][:, idx].tolist())
    for h in handles:
        h.remove()
    return out


@pytest.fixture(scope="module")
def brute(tiny):
    corpus = texts()
    return corpus, _brute_force(corpus, UNITS, tiny.tokenizer, model_bos(tiny))


def test_top_contexts_equal_a_brute_force_max_with_plain_transformers_hooks(tiny, brute):
    corpus, ref = brute
    res = top_contexts(tiny, UNITS, corpus, k=K, window=WINDOW, batch_size=3, progress=False)
    assert [u.unit for u in res] == UNITS
    for u, per_text in zip(res, ref):
        flat = sorted(((v, t, p) for t, vals in enumerate(per_text) for p, v in enumerate(vals)), key=lambda e: -e[0])
        assert [(c.text_index, c.position) for c in u.contexts] == [(t, p) for _, t, p in flat[:K]], u.unit
        for c, (v, t, p) in zip(u.contexts, flat):
            assert c.activation == pytest.approx(v, abs=1e-5)
            ids = tiny.tokenizer(corpus[t], add_special_tokens=False)["input_ids"]
            lo, hi = max(0, p - WINDOW), min(len(ids), p + WINDOW + 1)
            assert c.tokens == tuple(tiny.tokenizer.decode([i]) for i in ids[lo:hi]) and c.focus == p - lo
            assert c.values == pytest.approx(per_text[t][lo:hi], abs=1e-5)
        _check_stats(u.stats, torch.tensor([v for vals in per_text for v in vals], dtype=torch.float64))


def _check_stats(s, x: torch.Tensor) -> None:
    assert s.count == x.numel()
    # float32 forwards, batched (bridge) vs one text at a time (transformers): equal to ~1e-6 relative
    assert s.mean == pytest.approx(float(x.mean()), abs=1e-5)
    assert s.std == pytest.approx(float(x.std(unbiased=False)), abs=1e-5)
    assert (s.min, s.max) == pytest.approx((float(x.min()), float(x.max())), rel=1e-5, abs=1e-5)
    assert abs(s.frac_positive - float((x > 0).double().mean())) <= 1 / x.numel()
    bound = _act_stats._WIDTH * math.exp(_act_stats._WIDTH)  # the documented bin-width error
    for q, got in s.quantiles.items():
        lo, hi = (float(torch.quantile(x, q, interpolation=m)) for m in ("lower", "higher"))
        assert (
            lo - bound * (abs(lo) + _act_stats.SCALE) - 1e-5 <= got <= hi + bound * (abs(hi) + _act_stats.SCALE) + 1e-5
        )
    edges, counts = s.histogram
    assert len(edges) == len(counts) + 1 == _act_stats.DISPLAY_BINS + 1 and sum(counts) == x.numel()
    assert edges[0] == s.min and edges[-1] == s.max
    # each display count lies between the values whose fine bin sits inside it and those whose fine bin touches it
    fine = _act_stats.fine_bin(x.float())
    a = _act_stats._value(-_act_stats._SPAN + fine.double() * _act_stats._WIDTH).clamp(s.min, s.max)
    b = _act_stats._value(-_act_stats._SPAN + (fine.double() + 1) * _act_stats._WIDTH).clamp(s.min, s.max)
    for j, c in enumerate(counts):
        e0, e1 = edges[j], edges[j + 1]
        inside = int(((a >= e0) & (b <= e1) & (b > a)).sum())
        touching = int(((a <= e1) & (b >= e0)).sum())
        assert inside - 1 <= c <= touching + 1, (j, inside, c, touching)


def test_activation_stats_equal_the_brute_force_and_follow_the_order_given(tiny, brute):
    corpus, ref = brute
    order = [3, 0, 4]
    got = activation_stats(tiny, torch.tensor([UNITS[i] for i in order]), corpus, batch_size=4)
    for s, i in zip(got, order):
        _check_stats(s, torch.tensor([v for vals in ref[i] for v in vals], dtype=torch.float64))
    mask = torch.zeros(4, 128, dtype=torch.bool)
    mask[3, 127] = mask[0, 3] = True
    from_set = top_contexts(tiny, NeuronSet(mask), corpus[:3], k=2, progress=False)
    assert [u.unit for u in from_set] == [(0, 3), (3, 127)]  # a NeuronSet: its sorted order


def test_buffers_keep_their_shapes_whatever_the_corpus_size(tiny, monkeypatch):
    shapes: list[tuple] = []

    class Recording(contexts.RunningTopK):
        def add(self, *args):
            super().add(*args)
            shapes.append((tuple(self.values.shape), tuple(self.around.shape)))

    monkeypatch.setattr(contexts, "RunningTopK", Recording)
    for n in (2, 40):
        top_contexts(tiny, UNITS[:3], (texts() * 4)[:n], k=5, window=1, batch_size=4, progress=False)
    assert len(shapes) == 1 + 10 and set(shapes) == {((3, 5), (3, 5, 3))}
    stats = _act_stats.RunningStats(3)
    for n in (1, 500):
        stats.add(torch.randn(n, 3))
        assert stats.hist.shape == (3, _act_stats.FINE_BINS) and stats.count.shape == (3,)


def test_the_forward_stops_after_the_last_layer_needed(tiny):
    calls = []
    handle = tiny.blocks[2].register_forward_hook(lambda *a: calls.append(1))
    try:
        top_contexts(tiny, [(0, 1), (1, 2)], texts()[:2], progress=False)
        assert calls == []
        top_contexts(tiny, [(3, 1)], texts()[:2], progress=False)
        assert calls
    finally:
        handle.remove()


def test_bad_input_is_refused_before_any_forward(tiny):
    long_text = "1 " * 600  # digits are single tokens: over the tiny model's 512-token context
    cases = [
        (dict(texts=[]), ValueError, "texts is empty"),
        (dict(texts="one text"), TypeError, "not one string"),
        (dict(texts=["a", 3]), TypeError, r"texts\[1\]"),
        (dict(texts=["a", ""]), ValueError, "text 1"),
        (dict(texts=["a", long_text]), ValueError, "text 1 .*max_tokens"),
        (dict(neurons=[]), ValueError, "no neurons"),
        (dict(neurons=[(4, 0)]), ValueError, "out of range"),
        (dict(neurons=[(0, 128)]), ValueError, "out of range"),
        (dict(neurons=[(0, 1.5)]), TypeError, "pairs"),
        (dict(neurons=torch.zeros(2, 3, dtype=torch.long)), ValueError, r"\[n, 2\]"),
        (dict(k=0), ValueError, "k"),
        (dict(batch_size=0), ValueError, "batch_size"),
        (dict(max_tokens=0), ValueError, "max_tokens"),
        (dict(device="cuda:99"), ValueError, "device"),
    ]
    calls = []
    handle = tiny.blocks[0].register_forward_hook(lambda *a: calls.append(1))
    try:
        for change, err, match in cases:
            kwargs = {"neurons": [(0, 1)], "texts": ["a b"], **change}
            with pytest.raises(err, match=match):
                top_contexts(tiny, kwargs.pop("neurons"), kwargs.pop("texts"), progress=False, **kwargs)
        assert calls == []
    finally:
        handle.remove()
    (u,) = top_contexts(tiny, [(0, 1)], ["a b", long_text], max_tokens=50, progress=False)
    short = len(model_bos(tiny)) + len(tiny.tokenizer("a b", add_special_tokens=False)["input_ids"])
    assert u.stats.count == short + 50
    assert all(c.position < 50 for c in u.contexts)


def _env() -> dict:
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
    }
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(HERE), env.get("PYTHONPATH", "")])
    env["CAPINTERP_THREADS"] = "1"
    return env


def _run(args: list[str], cwd: Path) -> None:
    done = subprocess.run(args, cwd=cwd, env=_env(), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]


def test_two_ranks_under_torchrun_return_the_one_process_result(tmp_path, tiny):
    job = str(HERE / "contexts_job.py")
    _run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", job, "two"], tmp_path)
    r0, r1 = (torch.load(tmp_path / f"two.rank{r}.pt", weights_only=False) for r in (0, 1))
    assert r0["world"] == r1["world"] == 2 and r0["units"] == r1["units"]  # every rank the same
    one = [
        dataclasses.asdict(u) for u in top_contexts(tiny, UNITS, texts(), k=6, window=2, batch_size=3, progress=False)
    ]
    for a, b in zip(one, r0["units"]):
        assert a["unit"] == tuple(b["unit"])
        assert [(c["text_index"], c["position"], c["tokens"]) for c in a["contexts"]] == [
            (c["text_index"], c["position"], c["tokens"]) for c in b["contexts"]
        ]
        assert [c["activation"] for c in a["contexts"]] == pytest.approx(
            [c["activation"] for c in b["contexts"]], abs=1e-5
        )
        sa, sb = a["stats"], b["stats"]
        assert sa["count"] == sb["count"] and sa["histogram"][0] == pytest.approx(sb["histogram"][0], abs=1e-5)
        for key in ("mean", "std", "min", "max", "frac_positive"):
            assert sa[key] == pytest.approx(sb[key], abs=1e-6), key
        assert sum(abs(x - y) for x, y in zip(sa["histogram"][1], sb["histogram"][1])) <= 2
        assert list(sa["quantiles"].values()) == pytest.approx(list(sb["quantiles"].values()), rel=1e-2, abs=1e-5)
