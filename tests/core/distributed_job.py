"""A data-parallel job for tests/test_distributed.py: run with ``torchrun`` or plain python.

    torchrun --standalone --nproc-per-node 2 tests/distributed_job.py OUT.pt CKPT_DIR

Fits CNL, DCSN (with checkpoints) and causal tracing on the tiny model, refits CNL and DCSN
from their checkpoints with scoring disabled (resume must need no work), evaluates a dataset,
runs Query Localization (KN) over facts, scores a knowledge circuit (EAP-IG) over facts and
measures the faithfulness of CNL's neurons and the circuit's edges (random bands checkpointed);
rank 0 saves every float64 sum, located mask, grid, record and score map to OUT.pt.
"""

import sys

import torch

from capinterp.arch.model import load_model
from capinterp.core import distributed as dist
from capinterp.core.example import Example
from capinterp.data import arithmetic
from capinterp.interventions.faithfulness import faithfulness
from capinterp.kernels.evaluate import evaluate
from capinterp.localizers.causal_trace import CausalTrace
from capinterp.localizers.cnl import CNL
from capinterp.localizers.dcsn import DCSN
from capinterp.localizers.knowledge_circuit import KnowledgeCircuit
from capinterp.localizers.query_localization import QueryLocalization
from capinterp.units.neurons import NeuronScores

# three facts and seven problems: uneven shards on two ranks, little work per launch
SUBJECTS = [
    ("The Eiffel Tower is in the city of", "Eiffel Tower"),
    ("Rome is the capital of", "Rome"),
    ("Mount Fuji is in", "Mount Fuji"),
]


TARGETS = [("Paris", " France"), ("Rome", " Italy"), ("Tokyo", " Japan")]


def refuse(items):
    raise AssertionError("a resumed fit scored an example again")


def main(out: str, ckpt: str) -> None:
    model = load_model("tiny", threads=1)
    ds = arithmetic(ops="+", n=7, seed=0)
    res = {"world": dist.world_size() if dist.init() else 1}
    for name, make in (
        ("cnl", lambda **k: CNL(model, steps=6, progress=False, **k)),
        ("dcsn", lambda **k: DCSN(model, batch_size=3, progress=False, **k)),
    ):
        loc = make(checkpoint=f"{ckpt}/{name}.ckpt").fit(ds)
        again = make(checkpoint=f"{ckpt}/{name}.ckpt")
        again._score_chunk = refuse
        again.fit(ds)
        assert torch.equal(again.sums_.sum, loc.sums_.sum) and again.sums_.done == loc.sums_.done
        res[name] = {"sum": loc.sums_.sum, "done": sorted(loc.sums_.done), "mask": loc.neurons_.mask}
        # IG completeness report (CNL): every rank's examples, and the same from the checkpoints alone
        res[name]["ig_check"] = loc.meta_.get("ig_check")
        assert again.meta_.get("ig_check") == loc.meta_.get("ig_check")
    facts = [Example(p, "", {"target_from": "greedy", "subject": s}) for p, s in SUBJECTS]
    tr = CausalTrace(model, samples=3, kinds=("mlp",), progress=False).fit(facts)
    res["trace"] = {
        "grid": tr.grids_["mlp"],
        "per_prompt": [r["grids"]["mlp"] for r in tr.per_prompt_],
        "index": [r["index"] for r in tr.per_prompt_],
        "layers": tr.layers_,
    }
    ev = evaluate(model, ds, batch_size=2, progress=False)
    res["evaluate"] = {"records": ev.records, "accuracy": ev.accuracy, "mean_prob": ev.mean_prob}
    bags = [[(p, t) for p in (f"{s} is", f"{s}, we know, is", f"Everyone says {s} is")] for s, t in TARGETS]
    ql = QueryLocalization(model, localizer="kn", steps=3, progress=False).fit(bags)
    res["ql"] = {
        "scores": ql.query_scores_,
        "consistency": ql.consistency_.to_dict("list"),
        "ig_check": ql.meta_["ig_check"],
    }
    kc_facts = [Example(p, t, {"subject": s}) for (p, s), (_, t) in zip(SUBJECTS, TARGETS)]
    kc = KnowledgeCircuit(model, algorithm="eap-ig", steps=2, top_n=20, batch_size=2, progress=False).fit(kc_facts)
    res["kc"] = {"scores": kc.scores_, "mask": kc.circuit_.mask, "clean_loss": kc.info_["clean_loss"]}
    # faithfulness: the random band (checkpointed chunk by chunk) and the located sets, neurons and edges
    cnl = res["cnl"]["sum"].float()
    for name, units, data in (("faith", NeuronScores(cnl), ds), ("faith_edges", kc, kc_facts)):
        f = faithfulness(
            model,
            units,
            data,
            ks=[0.1, 0.5],
            random_sets=3,
            batch_size=2,
            bootstrap=0,
            checkpoint=f"{ckpt}/{name}_band.npz",
        )
        res[name] = {"band": f.band.values, "table": f.table.to_dict("list")}
    if dist.is_main():
        torch.save(res, out)
    dist.finish()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
