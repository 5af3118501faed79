"""Interchangeable localizers, registered by name: ``capinterp.localizers.get("cnl")``."""

from capinterp.localizers.amig import AMIG
from capinterp.localizers.base import Localizer, available, get, register
from capinterp.localizers.causal_trace import CausalTrace
from capinterp.localizers.cnl import CNL
from capinterp.localizers.dcsn import DCSN
from capinterp.localizers.kn import KN
from capinterp.localizers.knowledge_circuit import KnowledgeCircuit
from capinterp.localizers.neft import NeFT
from capinterp.localizers.query_localization import QueryLocalization
from capinterp.localizers.sig import SIG

__all__ = [
    "AMIG",
    "CNL",
    "DCSN",
    "KN",
    "SIG",
    "CausalTrace",
    "KnowledgeCircuit",
    "Localizer",
    "NeFT",
    "QueryLocalization",
    "available",
    "get",
    "register",
]
