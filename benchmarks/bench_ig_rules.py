"""``bench_ig.py --rules``: quadrature rules of the IG kernel side by side in one run.

Per rule (``name:points``): seconds per prompt (fast route, all layers, CNL's answer positions),
max |IG - IG_ref| / max |IG_ref| (worst prompt) against a high-order Gauss-Legendre reference,
completeness error |sum_i IG_{l,i} - (F(a) - F(a_l = 0))| / max_l |F(a) - F(a_l = 0)| (worst
layer and prompt), IoU of the sigma = 6 CNL set of the prompts' mean scores with the reference's,
and mean IoU of the per-prompt KN sets (last prompt token, first answer token, > 0.2 x max).
Rules run interleaved prompt by prompt so machine load hits them alike. The profile splits one
prompt's time between operators on vocabulary-sized tensors (unembedding and objective, forward
and backward) and the rest, and prints the analytic multiply-accumulate split beside it.
"""

from __future__ import annotations

import os
import time

import torch
from bench_ig import make_prompts, objective_at, rss_mb

from capinterp.arch.model import load_model
from capinterp.core.tokens import encode
from capinterp.kernels.ig import ig_scores
from capinterp.kernels.ig_config import IGConfig


def _iou(a: torch.Tensor, b: torch.Tensor) -> float:
    union = (a | b).sum().item()
    return 1.0 if union == 0 else (a & b).sum().item() / union


def _sigma_set(mean: torch.Tensor, sigma: float = 6.0) -> torch.Tensor:
    z = (mean - mean.mean()).abs() > sigma * mean.std()
    return z


def _kn_set(s: torch.Tensor, t: float = 0.2) -> torch.Tensor:
    top = s.max()
    return s > t * top if top > 0 else torch.zeros_like(s, dtype=torch.bool)


def _profile(model, enc, rule: str, steps: int, batch_size: int) -> tuple[float, float]:
    """(seconds on ops touching a vocabulary-sized dimension, total op seconds), one prompt."""
    from torch.profiler import ProfilerActivity, profile

    V = int(model.cfg.d_vocab)
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        ig_scores(model, enc, IGConfig(steps=steps, rule=rule, batch_size=batch_size))
    vocab = total = 0.0
    for ev in prof.key_averages(group_by_input_shape=True):
        t = ev.self_cpu_time_total / 1e6
        total += t
        if any(V in (shape or []) for shape in (ev.input_shapes or [])):
            vocab += t
    return vocab, total


def _per_layer_table(kn: dict, runs: list, L: int, k: int = 50) -> None:
    """Per layer, at the KN position (last prompt token): max |IG - IG_ref| / max |IG_ref| of the
    layer (worst prompt) and how many of the reference's top-k neurons each rule keeps (fewest)."""
    ref = torch.stack(kn[runs[0]])  # [prompts, layers, d]
    print(
        f"\nper layer, last prompt token: max err / max of the layer (worst prompt), top-{k} shared with the reference"
    )
    print(f"{'layer':>5} " + " ".join(f"{a + ':' + str(m):>17}" for a, m in runs[1:]))
    for layer in range(L):
        cells = []
        for r in runs[1:]:
            s = torch.stack(kn[r])
            err = max(
                ((a[layer] - b[layer]).abs().max() / b[layer].abs().max().clamp_min(1e-30)).item()
                for a, b in zip(s, ref)
            )
            top = min(
                len(set(a[layer].topk(k).indices.tolist()) & set(b[layer].topk(k).indices.tolist()))
                for a, b in zip(s, ref)
            )
            cells.append(f"{err:10.1e} ({top:2d}/{k})")
        print(f"{layer:5d} " + " ".join(cells))


def run_rules(args) -> int:
    torch.set_num_threads(args.threads)
    n, ref_steps = (2, 16) if args.quick else (args.n, args.ref_steps)
    rules = [(r.split(":")[0], int(r.split(":")[1])) for r in args.rule_list.split(",")]
    model = load_model(args.model, device=args.device, threads=args.threads)
    L, d, V = int(model.cfg.n_layers), int(model.cfg.d_mlp), int(model.cfg.d_vocab)
    print(
        f"model {args.model}: {L} layers x {d} neurons, vocabulary {V}; torch threads "
        f"{torch.get_num_threads()}, batch_size {args.batch_size}, {n} prompts; reference Gauss-Legendre "
        f"{ref_steps} points; load average {os.getloadavg()[0]:.1f}"
    )
    examples = make_prompts(n)
    encs = encode(model, examples)
    cfg = IGConfig(batch_size=args.batch_size)
    ig_scores(model, encs[0], cfg.replace(steps=2, rule="gauss"))  # warm-up

    runs = [("gauss", ref_steps)] + rules
    scores = {r: [] for r in runs}
    kn = {r: [] for r in runs}
    secs = {r: [] for r in runs}
    deltas = []
    for i, enc in enumerate(encs):
        zero = torch.zeros(len(enc.target_ids), d)
        f_clean = objective_at(model, enc, 0, None)
        deltas.append(torch.tensor([f_clean - objective_at(model, enc, l, zero) for l in range(L)]))
        for r in runs:
            t = time.perf_counter()
            scores[r].append(ig_scores(model, enc, cfg.replace(steps=r[1], rule=r[0]))[0])
            secs[r].append(time.perf_counter() - t)
            kn[r].append(ig_scores(model, enc, cfg.replace(steps=r[1], rule=r[0], positions="last_prompt"))[0])
        print(
            f"  prompt {i} ({len(enc.ids)} tokens, {len(enc.target_ids)} answer tokens): "
            + ", ".join(f"{a}:{m} {secs[(a, m)][-1]:.1f}s" for a, m in runs),
            flush=True,
        )

    ref = torch.stack(scores[runs[0]])
    ref_set = _sigma_set(ref.mean(0))
    base = sum(secs[rules[0]]) / n
    print(
        f"\nreference sigma=6 CNL set: {int(ref_set.sum())} neurons; "
        f"max |F(a) - F(a_l=0)| over layers and prompts {max(float(x.abs().max()) for x in deltas):.3e}"
    )
    print(
        f"{'rule':>12} {'s/prompt':>9} {'speed vs ' + rules[0][0] + ':' + str(rules[0][1]):>16} "
        f"{'max err/max':>12} {'completeness':>13} {'CNL IoU':>8} {'KN IoU':>7}"
    )
    for r in runs:
        s = torch.stack(scores[r])
        err = max(((a - b).abs().max() / b.abs().max()).item() for a, b in zip(s, ref))
        comp = max(((x.sum(-1) - dl).abs().max() / dl.abs().max()).item() for x, dl in zip(s, deltas))
        cnl = _iou(_sigma_set(s.mean(0)), ref_set)
        kn_iou = sum(_iou(_kn_set(a), _kn_set(b)) for a, b in zip(kn[r], kn[runs[0]])) / n
        per = sum(secs[r]) / n
        label = f"{r[0]}:{r[1]}" + (" (ref)" if r == runs[0] else "")
        print(f"{label:>12} {per:9.2f} {base / per:15.2f}x {err:12.2e} {comp:13.2e} {cnl:8.3f} {kn_iou:7.3f}")

    if args.per_layer:
        _per_layer_table(kn, runs, L)

    print(
        "\nprofile, prompt 0 (torch.profiler self CPU time; ops on [.., vocabulary] tensors = unembedding "
        "and objective):"
    )
    S = len(encs[0].target_ids)
    n_params = sum(p.numel() for p in model.blocks.parameters())
    for a, m in rules:
        vocab, total = _profile(model, encs[0], a, m, args.batch_size)
        rows = L * m
        mac_unembed = rows * S * int(model.cfg.d_model) * V * 2  # forward logits + backward d(hidden)
        mac_blocks = sum(m * S * n_params / L * (L - l) * 2 for l in range(L))  # staircase, fwd + bwd(input)
        print(
            f"  {a}:{m}: {vocab:.2f}s of {total:.2f}s on vocabulary-sized ops ({100 * vocab / total:.0f}%); "
            f"analytic MACs: unembedding {mac_unembed / 1e9:.1f} G, blocks (weights) {mac_blocks / 1e9:.1f} G "
            f"({100 * mac_unembed / (mac_unembed + mac_blocks):.0f}% unembedding)"
        )
    print(f"\npeak RSS {rss_mb():.0f} MB; load average now {os.getloadavg()[0]:.1f}")
    return 0
