"""Acting on located units: erase / scale / amplify hooks, neuron-level fine-tuning, knowledge
editing through value vectors, attention scaling."""
from capinterp.interventions.attention_scaling import attention_scaling, scale_attention
from capinterp.interventions.editing import KnowledgeEdit, edit_knowledge, edit_table
from capinterp.interventions.finetune import FinetuneResult, finetune
from capinterp.interventions.hooks import amplify, erase, scale

__all__ = ["FinetuneResult", "KnowledgeEdit", "amplify", "attention_scaling", "edit_knowledge", "edit_table",
           "erase", "finetune", "scale", "scale_attention"]
