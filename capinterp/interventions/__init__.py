"""Acting on located units: erase, scale, fine-tune, edit, and measure how faithful a localization is.

Erase / scale / amplify hooks, neuron-level fine-tuning, knowledge editing through value vectors,
ROME rank-one editing, attention scaling, and faithfulness curves of a localization (kept /
ablated top-k against random sets: CPR, CMD)."""

from capinterp.interventions.attention_scaling import attention_scaling, scale_attention
from capinterp.interventions.configs import (
    EDIT_DAI,
    EDIT_SIGNED,
    FINETUNE_CNL,
    ROME_GPT2_XL,
    EditConfig,
    FinetuneConfig,
    RomeConfig,
)
from capinterp.interventions.editing import KnowledgeEdit, edit_knowledge, edit_table
from capinterp.interventions.faithfulness import Faithfulness, faithfulness
from capinterp.interventions.finetune import FinetuneResult, finetune
from capinterp.interventions.hooks import amplify, erase, scale
from capinterp.interventions.rome import RomeEdit, rome_edit
from capinterp.interventions.rome_eval import counterfact_scores, rome_counterfact
from capinterp.interventions.second_moment import second_moment

__all__ = [
    "EDIT_DAI",
    "EDIT_SIGNED",
    "FINETUNE_CNL",
    "ROME_GPT2_XL",
    "EditConfig",
    "Faithfulness",
    "FinetuneConfig",
    "FinetuneResult",
    "KnowledgeEdit",
    "RomeConfig",
    "RomeEdit",
    "amplify",
    "attention_scaling",
    "counterfact_scores",
    "edit_knowledge",
    "edit_table",
    "erase",
    "faithfulness",
    "finetune",
    "rome_counterfact",
    "rome_edit",
    "scale",
    "scale_attention",
    "second_moment",
]
