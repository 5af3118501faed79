"""capinterp's EAP against TransformerLens 4's own ``attribution_patch``, side by side.

    .venv/bin/python benchmarks/bench_vs_tl_eap.py                        # tiny model, a quick check
    .venv/bin/python benchmarks/bench_vs_tl_eap.py --model smollm2 --n 2

The same weights, prompt pairs and loss on both sides: each fact's prompt and its subject-swapped
twin (``make_pairs``' own swap), loss = mean -log p(answer) over the teacher-forced answer tokens.
TransformerLens' ``attribution_patch`` (Syed et al., "Attribution Patching Outperforms Automated
Circuit Discovery", arXiv:2310.10348) linearizes at its *corrupted* run and scores
(a_clean - a_corrupt) . dL/da; capinterp's EAP (Hanna et al., arXiv:2403.17806, steps=1) at its
*clean* run. So capinterp gets each pair the other way round (its clean run = TL's corrupted one),
and the two compute the same first-order estimate.

What is compared: every writer's score (the embedding, each attention head, each MLP), summed
over positions on TL's side and over the writer's outgoing edges on capinterp's (equal because every
writer feeds the logits). TL's node granularity is used: its edge granularity refuses grouped-query
attention (SmolLM2, Gemma 3), and its node sweep is the cheaper of the two; capinterp still scores
every edge of its graph, so the time ratio is conservative.
"""

from __future__ import annotations

import argparse

import torch
from peers import FACTS, agreement, report, timed

from capinterp.circuits import Graph, score_edges
from capinterp.circuits.eap import Pair
from capinterp.core.tokens import Encoded, _bos, encode


def _pairs(model, facts):
    """capinterp pairs with clean/corrupted exchanged: clean = the corrupted prompt (same answer).

    The corruption is a token-level subject swap: fact i's subject tokens (those before the prompt
    suffix all facts share) are replaced by fact i+1's, repeated or cut to the same count."""
    encs = encode(model, facts)
    n_suffix = 0
    while all(len(e.prompt_ids) > n_suffix + 1 for e in encs) and (
        len({tuple(e.prompt_ids[len(e.prompt_ids) - n_suffix - 1 :]) for e in encs}) == 1
    ):
        n_suffix += 1
    if len(encs) > 1 and n_suffix == 0:
        raise ValueError("the facts share no prompt suffix, so their subjects cannot be found")
    n_bos = len(_bos(model.tokenizer))
    out = []
    for i, enc in enumerate(encs):
        other = encs[(i + 1) % len(encs)]
        subj = enc.prompt_ids[n_bos : len(enc.prompt_ids) - n_suffix]
        repl = other.prompt_ids[n_bos : len(other.prompt_ids) - n_suffix] or [enc.prompt_ids[-1]]
        repl = (repl * (len(subj) // len(repl) + 1))[: len(subj)]
        if repl == subj:  # a single fact: the subject's tokens reversed
            repl = subj[::-1] if subj[::-1] != subj else [t + 1 for t in subj]
        corrupt = enc.prompt_ids[:n_bos] + repl + enc.prompt_ids[len(enc.prompt_ids) - n_suffix :]
        clean = Encoded(corrupt, list(enc.target_ids), enc.example)  # capinterp's clean = TL's corrupted
        out.append(Pair(clean, list(enc.ids), None, [], "custom"))
    return out


def ours(model, graph, pairs) -> torch.Tensor:
    """capinterp's per-writer EAP scores: [n_src], summed over outgoing edges, averaged over pairs."""
    scores, _ = score_edges(model, graph, pairs, steps=1, metric="nll")
    return scores.double().sum(1)


def theirs(model, graph, pairs) -> torch.Tensor:
    """TransformerLens' node attribution patching on the same runs, in capinterp's source order."""
    from transformer_lens.tools.analysis.attribution_patching import EdgeAttributionConfig, attribution_patch

    out = torch.zeros(graph.n_src, dtype=torch.float64)
    for p in pairs:  # TL's clean = capinterp's corrupted run, TL's corrupted = capinterp's clean run
        pos = torch.tensor(p.clean.answer_positions)
        tgt = torch.tensor(p.clean.target_ids)

        def loss(logits, pos=pos, tgt=tgt):
            return -torch.log_softmax(logits[0].float(), -1)[pos, tgt].mean()

        dev = model.cfg.device
        res = attribution_patch(
            model,
            torch.tensor([p.corrupt_ids], device=dev),
            torch.tensor([p.clean.ids], device=dev),
            loss,
            EdgeAttributionConfig(granularity="node"),
        )
        for node, s in res.node_scores.items():
            if node.kind == "embed":
                out[0] += s
            elif node.kind == "attn_head_out":
                out[graph.head_src(node.layer, node.head)] += s
            elif node.kind == "mlp_out":
                out[graph.mlp_src(node.layer)] += s
    return out / len(pairs)


def compare(model, n: int = 2) -> tuple[dict, float, float]:
    """(agreement, capinterp seconds, TransformerLens seconds) over the first ``n`` facts."""
    graph = Graph.from_model(model)
    pairs = _pairs(model, FACTS[:n])
    ours(model, graph, pairs[:1])  # warm-up, both sides
    theirs(model, graph, pairs[:1])
    a, t_ours = timed(lambda: ours(model, graph, pairs))
    b, t_peer = timed(lambda: theirs(model, graph, pairs))
    return agreement(a, b), t_ours, t_peer


def main(argv: list[str] | None = None) -> int:
    from capinterp.arch.model import load_model

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--n", type=int, default=2, help=f"facts (1..{len(FACTS)})")
    ap.add_argument("--device", default=None)
    args = ap.parse_args(argv)
    if not 1 <= args.n <= len(FACTS) or args.threads < 1:
        ap.error(f"--n must be in 1..{len(FACTS)}, --threads >= 1")
    torch.set_num_threads(args.threads)
    model = load_model(args.model, device=args.device, threads=args.threads)
    agree, t_ours, t_peer = compare(model, args.n)
    print(f"model {args.model}: {model.cfg.n_layers} layers; {args.n} fact pairs; threads {torch.get_num_threads()}")
    print(report("TransformerLens attribution_patch", "EAP writer scores (steps=1, -log p)", agree, t_ours, t_peer))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
