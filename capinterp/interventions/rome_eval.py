"""ROME's CounterFact scores (Meng et al. 2022, Sec. 3.2 / Table 4): efficacy, paraphrase, neighbourhood.

For a fact (s, r, o_true) rewritten to o_new, each score is the share of prompts on which the
model prefers the right answer, comparing the mean token log-probabilities of the two full
answers after the prompt:

- efficacy (ES): the rewrite prompt prefers o_new;
- paraphrase (PS): the fact's paraphrase prompts prefer o_new;
- neighbourhood (NS, specificity): prompts about *other* subjects with the same true answer still
  prefer their true answer over o_new.

Facts come from :func:`capinterp.data.load_counterfact` (``meta``: ground_truth, target_new,
paraphrases, locality).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd
import torch

from capinterp.arch.forward import capture, unembed
from capinterp.core.example import Example
from capinterp.core.protocol import Model
from capinterp.core.tokens import batches, collate, encode, pad_id
from capinterp.interventions.rome import EditUnreachable, rome_edit

__all__ = ["SCORES", "counterfact_scores", "rome_counterfact", "summarize", "target_logprob"]

SCORES = ("efficacy", "paraphrase", "neighborhood")


@torch.no_grad()
def target_logprob(model: Model, pairs: Sequence[tuple[str, str]], batch_size: int = 16) -> torch.Tensor:
    """Mean log-probability per token of each ``target`` after its ``prompt`` (teacher forced): ``[n]``."""
    enc = encode(model, [Example(p, t) for p, t in pairs])
    out: list[torch.Tensor] = []
    dev = model.cfg.device
    for chunk in batches(enc, batch_size):
        b = collate(chunk, pad_id(model.tokenizer), device=dev)
        resid = capture(model, b.tokens, "ln_final.hook_in")
        for r, e in enumerate(chunk):
            pos = torch.tensor(e.answer_positions, device=dev)
            logp = unembed(model, resid[r, pos][None])[0].float().log_softmax(-1)
            out.append(logp.gather(1, torch.tensor(e.target_ids, device=dev)[:, None]).mean().cpu())
    return torch.stack(out) if out else torch.zeros(0)


def _probes(fact: Example) -> list[tuple[str, str, str, str]]:
    """``(score, prompt, right answer, wrong answer)`` rows of one CounterFact fact."""
    m = fact.meta
    if "target_new" not in m or "ground_truth" not in m:
        raise ValueError(
            f"fact {fact.prompt!r} has no meta['target_new'] / meta['ground_truth'] "
            "(load it with capinterp.data.load_counterfact)"
        )
    true, new = m["ground_truth"], m["target_new"]
    rows = [("efficacy", fact.prompt, new, true)]
    rows += [("paraphrase", p, new, true) for p in m.get("paraphrases", [])]
    rows += [("neighborhood", loc["prompt"], loc["target"], new) for loc in m.get("locality", [])]
    return rows


def counterfact_scores(model: Model, facts: Sequence[Example], batch_size: int = 16) -> pd.DataFrame:
    """One row per probe (fact, score, prompt, ``success``) under the model as it is now (edited or not)."""
    rows = [(i, *r) for i, f in enumerate(facts) for r in _probes(f)]
    if not rows:
        raise ValueError("facts must not be empty")
    lp_right = target_logprob(model, [(r[2], r[3]) for r in rows], batch_size)
    lp_wrong = target_logprob(model, [(r[2], r[4]) for r in rows], batch_size)
    return pd.DataFrame(
        {
            "fact": [r[0] for r in rows],
            "score": [r[1] for r in rows],
            "prompt": [r[2] for r in rows],
            "lp_right": lp_right.numpy(),
            "lp_wrong": lp_wrong.numpy(),
            "success": (lp_right > lp_wrong).numpy(),
        }
    )


def summarize(df: pd.DataFrame) -> dict[str, float]:
    """Mean success per score (per fact first, then over facts, as ROME averages)."""
    per_fact = df.groupby(["score", "fact"])["success"].mean().groupby("score").mean()
    return {s: float(per_fact.get(s, np.nan)) for s in SCORES}


def rome_counterfact(
    model: Model, facts: Sequence[Example], layer: int, batch_size: int = 16, **rome_params: Any
) -> pd.DataFrame:
    """Edit each fact alone at ``layer`` (model restored after each) and score it before and after.

    One row per fact: ``case_id``, and ``efficacy / paraphrase / neighborhood`` with suffixes
    ``_before`` and ``_after`` (each 0..1 for one fact), plus the edit's final NLL. Where the layer
    cannot reach the answer at all (:class:`~capinterp.interventions.rome.EditUnreachable`: the last
    layer, the subject mid-prompt), the ``_after`` scores and the NLL are NaN and ``note`` says why.
    """
    out = []
    for i, f in enumerate(facts):
        before = summarize(counterfact_scores(model, [f], batch_size))
        note = ""
        try:
            edit = rome_edit(model, f, f.meta.get("target_new"), layer=layer, **rome_params)
        except EditUnreachable as err:
            after, losses, note = {k: float("nan") for k in before}, [], str(err)
        else:
            with edit.apply(model):
                after = summarize(counterfact_scores(model, [f], batch_size))
            losses = edit.losses
        out.append(
            {
                "case_id": f.meta.get("case_id", i),
                "layer": layer,
                **{f"{k}_before": v for k, v in before.items()},
                **{f"{k}_after": v for k, v in after.items()},
                "final_nll": losses[-1] if losses else float("nan"),
                "note": note,
            }
        )
    return pd.DataFrame(out)
