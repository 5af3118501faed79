"""capinterp: where in a language model does a capability live, and what happens if you touch it?

    import capinterp as ci
    model = ci.load_model()                                   # embedded default (Gemma 3 270M)
    ds = ci.data.arithmetic(ops="+", n=200)
    cnl = ci.CNL(model, sigma=6).fit(ds)                      # capability neurons
    with ci.erase(model, cnl.neurons_):
        print(ci.evaluate(model, ds))
    ft = ci.finetune(model, ds, neurons=cnl.neurons_, arms=("located", "random"))   # CNLF
"""
from capinterp import circuits, data, experiments, interventions, kernels, localizers, plots, results, units
from capinterp import plots as plotting
from capinterp._version import __version__
from capinterp.app.reproduce import reproduce
from capinterp.core.example import Example
from capinterp.core.model import DEFAULT_MODEL, load_model, model_meta
from capinterp.core.settings import set_threads
from capinterp.interventions import (FinetuneResult, KnowledgeEdit, amplify, attention_scaling, edit_knowledge,
                                     edit_table, erase, finetune, scale, scale_attention)
from capinterp.interventions import RomeEdit, rome_edit
from capinterp.kernels.evaluate import EvalResult, evaluate
from capinterp.localizers import AMIG, CNL, DCSN, KN, SIG, CausalTrace, KnowledgeCircuit, NeFT, QueryLocalization
from capinterp.results import NeuronScores, NeuronSet
from capinterp.units import KeySet, UnitSet
from capinterp.units import metrics

__all__ = [
    "AMIG",
    "SIG",
    "NeFT",
    "CNL",
    "FinetuneResult",
    "KnowledgeEdit",
    "QueryLocalization",
    "RomeEdit",
    "rome_edit",
    "attention_scaling",
    "edit_knowledge",
    "edit_table",
    "experiments",
    "finetune",
    "reproduce",
    "scale_attention",
    "interventions",
    "kernels",
    "plots",
    "results",
    "units",
    "CausalTrace",
    "DCSN",
    "KN",
    "KnowledgeCircuit",
    "DEFAULT_MODEL",
    "EvalResult",
    "Example",
    "KeySet",
    "NeuronScores",
    "NeuronSet",
    "UnitSet",
    "__version__",
    "amplify",
    "circuits",
    "data",
    "erase",
    "evaluate",
    "load_model",
    "localizers",
    "metrics",
    "model_meta",
    "plotting",
    "scale",
    "set_threads",
]
