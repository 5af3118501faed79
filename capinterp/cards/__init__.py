"""Unit cards: what a located unit does (top activating contexts, direct logit effect, specificity).

The layer above the interventions: a card reads a model, a located unit set or score ranking and
texts, and may ablate a unit to measure its effect on a task; the experiments build on it.
"""

from capinterp.cards.card import Cards, UnitCard
from capinterp.cards.describe import describe

__all__ = ["Cards", "UnitCard", "describe"]
