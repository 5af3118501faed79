"""capinterp: where in a language model does a capability live, and what happens if you touch it?

import capinterp as ci
model = ci.load_model()                                   # embedded default (Gemma 3 270M)
ds = ci.data.arithmetic(ops="+", n=200)
cnl = ci.CNL(model, sigma=6).fit(ds)                      # capability neurons
with ci.erase(model, cnl.neurons_):
    print(ci.evaluate(model, ds))
ft = ci.finetune(model, ds, neurons=cnl.neurons_, arms=("located", "random"))   # CNLF
"""

from capinterp import circuits, data, experiments, interventions, kernels, localizers, plots, units
from capinterp._version import __version__
from capinterp.app.reproduce import reproduce
from capinterp.arch.family import Family, UnsupportedFamily, family_of
from capinterp.arch.model import DEFAULT_MODEL, load_model, model_meta
from capinterp.cards import describe
from capinterp.core.example import Example
from capinterp.core.protocol import Model
from capinterp.core.settings import set_threads
from capinterp.interventions import (
    Faithfulness,
    FinetuneResult,
    KnowledgeEdit,
    RomeEdit,
    amplify,
    attention_scaling,
    edit_knowledge,
    edit_table,
    erase,
    faithfulness,
    finetune,
    rome_edit,
    scale,
    scale_attention,
)
from capinterp.interventions.certify import Certificate, certify
from capinterp.kernels.evaluate import EvalResult, evaluate
from capinterp.kernels.ig_config import ADAPTIVE, CLOSED_FORM, GAUSS_LEGENDRE, PAPERS, IGConfig
from capinterp.localizers.amig import AMIG
from capinterp.localizers.causal_trace import CausalTrace
from capinterp.localizers.cnl import CNL
from capinterp.localizers.dcsn import DCSN
from capinterp.localizers.kn import KN
from capinterp.localizers.knowledge_circuit import KnowledgeCircuit
from capinterp.localizers.neft import NeFT
from capinterp.localizers.query_localization import QueryLocalization
from capinterp.localizers.sig import SIG
from capinterp.units import KeySet, NeuronScores, NeuronSet, UnitSet, metrics

__all__ = [
    "ADAPTIVE",
    "AMIG",
    "CLOSED_FORM",
    "CNL",
    "DCSN",
    "DEFAULT_MODEL",
    "GAUSS_LEGENDRE",
    "KN",
    "PAPERS",
    "SIG",
    "CausalTrace",
    "Certificate",
    "EvalResult",
    "Example",
    "Faithfulness",
    "Family",
    "FinetuneResult",
    "IGConfig",
    "KeySet",
    "KnowledgeCircuit",
    "KnowledgeEdit",
    "Model",
    "NeFT",
    "NeuronScores",
    "NeuronSet",
    "QueryLocalization",
    "RomeEdit",
    "UnitSet",
    "UnsupportedFamily",
    "__version__",
    "amplify",
    "attention_scaling",
    "certify",
    "circuits",
    "data",
    "describe",
    "edit_knowledge",
    "edit_table",
    "erase",
    "evaluate",
    "experiments",
    "faithfulness",
    "family_of",
    "finetune",
    "interventions",
    "kernels",
    "load_model",
    "localizers",
    "metrics",
    "model_meta",
    "plots",
    "reproduce",
    "rome_edit",
    "scale",
    "scale_attention",
    "set_threads",
    "units",
]
