"""Query Localization on a real model: consistency of paraphrased facts, editing table, KS experiment.

    CAPINTERP_THREADS=1 .venv/bin/python scripts/ql_real_run.py --model smollm2 --out out/ql

1. ParaRel facts (knowledge-neurons ``data_11.json``, 14 paraphrases per fact, those ending in the
   object kept) are shuffled (seeded) and scanned in chunks; a fact is kept when the model's greedy
   next token is the answer on at least ``--paraphrases`` of its prompts (the first ones are used).
2. KN (integrated gradients, ``--steps``) per query -> per-query neuron sets -> CS1 / CS2 per fact,
   classes by the static tau 0.3 and by Otsu. Per-fact scores are cached under ``OUT/scores`` so an
   interrupted run resumes.
3. Editing table: erase and update (new answer = another fact's answer; Dai's lambdas (1, 8), then
   again with ``--small-lambdas``, default (1, 1)) with the consistency-aware,
   query-level and fact-union neuron sets; locality on 10 ROME known facts of other relations that the
   model answers; perplexity on 4 GSM8K questions.
4. KS experiment: attention from the last position to the subject's tokens scaled by 0 / 2 in all
   layers, against as many random other positions (position 0, the attention sink, left out).
Writes consistency.csv, edit_table.csv, edit_per_fact.csv, ks.csv, consistency.html, results.json
and results.md under ``--out``; prints the summary.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import sys
import time
from pathlib import Path

import pandas as pd
import torch

import capinterp as ci
from capinterp.arch.model import model_fingerprint
from capinterp.data.facts import facts_known_by, load_jsonl, load_known_facts, load_pararel_bags
from capinterp.interventions.attention_scaling import attention_scaling, knowledge_synapses
from capinterp.interventions.editing import edit_table
from capinterp.localizers.query_localization import QueryLocalization

DATA = Path(__file__).resolve().parent.parent.parent / "shared" / "data"
PAPER = {"share_inconsistent": {"GPT-2": 0.504, "LLaMA2-7b": 0.667, "LLaMA3-8b": 0.809}}


def pick_facts(model, path: Path, n_facts: int, n_para: int, seed: int, chunk: int = 40) -> list[list]:
    """Facts the model answers correctly on at least ``n_para`` paraphrases (first ``n_para`` kept)."""
    bags = load_pararel_bags(path, min_prompts=n_para)
    random.Random(seed).shuffle(bags)
    out, scanned = [], 0
    for start in range(0, len(bags), chunk):
        part = bags[start : start + chunk]
        known = facts_known_by(model, [e for b in part for e in b], on_mismatch="skip")
        ok = {(e.meta["fact_id"], e.meta["paraphrase_index"]) for e in known}
        scanned += len(part)
        for bag in part:
            good = [e for e in bag if (e.meta["fact_id"], e.meta["paraphrase_index"]) in ok]
            if len(good) >= n_para:
                out.append(good[:n_para])
        print(f"scanned {scanned} facts, kept {len(out)}", file=sys.stderr)
        if len(out) >= n_facts:
            break
    return out[:n_facts]


def query_scores(ql: QueryLocalization, facts: list[list], folder: Path) -> list[torch.Tensor]:
    """Per-query KN scores of every fact, cached one file per fact (key: model, params, prompts)."""
    folder.mkdir(parents=True, exist_ok=True)
    loc, out, t0 = ql.localizer_, [], time.time()
    for k, fact in enumerate(facts):
        key = json.dumps([model_fingerprint(ql.model), loc.get_params(), [(e.prompt, e.target) for e in fact]])
        f = folder / (hashlib.sha256(key.encode()).hexdigest()[:20] + ".pt")
        if f.exists():
            out.append(torch.load(f))
            continue
        loc.fit(fact)
        out.append(loc.prompt_scores_.float().cpu())
        torch.save(out[-1], f)
        print(f"fact {k + 1}/{len(facts)} localized ({time.time() - t0:.0f} s)", file=sys.stderr)
    return out


def other_relations(model, n: int) -> list:
    """``n`` ROME known facts of relations other than capitals that the model answers (locality set)."""
    known = [
        e
        for e in load_known_facts(DATA / "rome_knowns" / "known_1000.json")
        if e.meta["relation_id"] not in ("P36", "P1376")
    ]
    out = []
    for start in range(0, len(known), 40):
        out += facts_known_by(model, known[start : start + 40], on_mismatch="skip")
        if len(out) >= n:
            break
    return out[:n]


def md_table(df: pd.DataFrame, digits: int = 3) -> str:
    """A GitHub markdown table (no tabulate dependency)."""
    cols = list(df.columns)
    fmt = lambda v: f"{v:.{digits}f}" if isinstance(v, float) else str(v)  # noqa: E731
    lines = ["| " + " | ".join(map(str, cols)) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(fmt(v) for v in row) + " |" for row in df.itertuples(index=False)]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--data", default=str(DATA / "knowledge_neurons" / "data_11.json"))
    ap.add_argument("--n-facts", type=int, default=30)
    ap.add_argument("--paraphrases", type=int, default=4)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--n-unrelated", type=int, default=10, help="locality prompts (ROME known facts, other relations)")
    ap.add_argument(
        "--small-lambdas",
        type=float,
        nargs=2,
        default=(1.0, 1.0),
        help="a second update run with these (lambda1, lambda2); Dai's (1, 8) is the first",
    )
    ap.add_argument("--out", default="out/ql")
    ap.add_argument("--device", default=None)
    ap.add_argument("--threads", type=int, default=None)
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    model = ci.load_model(args.model, device=args.device, threads=args.threads)
    facts = pick_facts(model, Path(args.data), args.n_facts, args.paraphrases, args.seed)
    t_pick = time.time() - t0
    if len(facts) < 2:
        raise SystemExit(f"only {len(facts)} facts known on {args.paraphrases} paraphrases; lower --paraphrases")
    ql = QueryLocalization(model, "kn", steps=args.steps, progress=False)
    names = [f"{f[0].meta['relation_id']}:{f[0].meta.get('subject') or f[0].meta['fact_id']}" for f in facts]
    ql.fit_scores(query_scores(ql, facts, out / "scores"), names=names, facts=facts)
    t_ql = time.time() - t0 - t_pick
    summary = ql.summary()
    ql.consistency_.to_csv(out / "consistency.csv")
    ql.plot().write_html(out / "consistency.html", include_plotlyjs="cdn")

    neutral = [e.prompt for e in load_jsonl(DATA / "gsm8k" / "test.jsonl", "question", "answer", limit=4)]
    unrelated = other_relations(model, args.n_unrelated)
    print(f"editing {len(facts)} facts x 9 edits ({time.time() - t0:.0f} s)", file=sys.stderr)
    named = dict(zip(names, facts))
    table, raw = edit_table(model, named, ql=ql, unrelated=unrelated, neutral_text=neutral, per_fact=True)
    small, raw_small = edit_table(
        model,
        named,
        ql=ql,
        modes=("update",),
        unrelated=unrelated,
        neutral_text=neutral,
        lambdas=tuple(args.small_lambdas),
        per_fact=True,
    )
    small["mode"] = f"update lambdas={tuple(args.small_lambdas)}"
    raw_small["mode"] = small["mode"].iloc[0]
    table = pd.concat([table, small], ignore_index=True)
    pd.concat([raw, raw_small], ignore_index=True).to_csv(out / "edit_per_fact.csv", index=False)
    table.to_csv(out / "edit_table.csv", index=False)
    t_edit = time.time() - t0 - t_pick - t_ql

    print(f"KS experiment ({time.time() - t0:.0f} s)", file=sys.stderr)
    ks_ex, ks_sets = [], []
    for k, fact in enumerate(facts):  # per fact, the first query whose subject is not only position 0
        j = next((j for j, q in enumerate(fact) if q.meta.get("subject") and knowledge_synapses(model, q)), None)
        if j is not None:
            ks_ex.append(fact[j])
            ks_sets.append(ql.neurons(k, "query", j))
    ks = attention_scaling(model, ks_ex, keys="subject", factors=(0.0, 2.0), neurons=ks_sets, seed=args.seed)
    ks.to_csv(out / "ks.csv", index=False)
    ks_ok = ks.dropna(subset=["p_after"])
    ks_table = ks_ok.groupby(["factor", "arm"])[["p_before", "p_after", "delta", "rel_delta"]].mean()
    ks_table["act_rel_change"] = ks_ok.groupby(["factor", "arm"]).apply(
        lambda g: float(((g["act_after"] - g["act_before"]) / g["act_before"].abs().clip(lower=1e-9)).mean()),
        include_groups=False,
    )
    ks_table["n"] = ks_ok.groupby(["factor", "arm"]).size()
    ks_table = ks_table.reset_index()
    total = time.time() - t0

    result = {
        "model": args.model,
        "n_facts": len(facts),
        "paraphrases": args.paraphrases,
        "steps": args.steps,
        "summary": {k: (v if isinstance(v, str) else float(v)) for k, v in summary.items()},
        "edit_table": table.to_dict(orient="records"),
        "ks": ks_table.to_dict(orient="records"),
        "seconds": {"pick": t_pick, "localize": t_ql, "edit": t_edit, "total": total},
        "paper": PAPER,
    }
    (out / "results.json").write_text(json.dumps(result, indent=2, default=float))
    cls = ql.consistency_[["answer", "n_queries", "mean_size", "n_union", "n_intersection", "cs1", "cs2", "class"]]
    md = [
        f"# Query Localization on {args.model}",
        "",
        f"{len(facts)} ParaRel facts x {args.paraphrases} paraphrases (all answered correctly), KN steps "
        f"{args.steps}; {total / 60:.1f} min (pick {t_pick:.0f} s, localize {t_ql:.0f} s, edit {t_edit:.0f} s).",
        "",
        "## Summary",
        "",
        md_table(summary.reset_index().set_axis(["quantity", "value"], axis=1)),
        "",
        "## Editing table (means over facts)",
        "",
        md_table(table),
        "",
        "## KS experiment (attention last position -> subject tokens, all layers)",
        "",
        md_table(ks_table),
        "",
        "## Per fact",
        "",
        md_table(cls.reset_index()),
    ]
    (out / "results.md").write_text("\n".join(md) + "\n")
    print("\n".join(md[:16]))


if __name__ == "__main__":
    main()
