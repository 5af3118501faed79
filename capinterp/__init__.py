"""capinterp: where in a language model does a capability live, and what happens if you touch it?

    import capinterp as ci
    model = ci.load_model()                                   # embedded default (Gemma 3 270M)
    ds = ci.data.arithmetic(ops="+", n=200)
    cnl = ci.CNL(model, sigma=6).fit(ds)                      # capability neurons
    with ci.erase(model, cnl.neurons_):
        print(ci.evaluate(model, ds))
    ft = ci.finetune(model, ds, neurons=cnl.neurons_, arms=("located", "random"))   # CNLF
"""
from capinterp import circuits, data, experiments, localizers, metrics, plotting
from capinterp._version import __version__
from capinterp.attention_scaling import attention_scaling, scale_attention
from capinterp.data import Example
from capinterp.editing import KnowledgeEdit, edit_knowledge, edit_table
from capinterp.evaluate import EvalResult, evaluate
from capinterp.finetune import FinetuneResult, finetune
from capinterp.interventions import amplify, erase, scale
from capinterp.localizers.causal_trace import CausalTrace
from capinterp.localizers.cnl import CNL
from capinterp.localizers.dcsn import DCSN
from capinterp.localizers.kn import KN
from capinterp.localizers.knowledge_circuit import KnowledgeCircuit
from capinterp.model import DEFAULT_MODEL, load_model, model_meta
from capinterp.neurons import NeuronScores, NeuronSet
from capinterp.query_localization import QueryLocalization
from capinterp.reproduce import reproduce
from capinterp.settings import set_threads
from capinterp.units import KeySet, UnitSet

__all__ = [
    "CNL",
    "FinetuneResult",
    "KnowledgeEdit",
    "QueryLocalization",
    "attention_scaling",
    "edit_knowledge",
    "edit_table",
    "experiments",
    "finetune",
    "reproduce",
    "scale_attention",
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
