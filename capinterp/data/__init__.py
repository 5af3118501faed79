"""Datasets: the shared ``Example`` record, the arithmetic generator, answer parsing, fact loaders."""

from capinterp.core.example import Example, as_examples

from .arithmetic import arithmetic, arithmetic_suite, describe
from .capabilities import CAPABILITIES, describe_capability, load_capability
from .corpus import local_texts
from .facts import builtin_facts, facts_known_by, load_counterfact, load_jsonl, load_known_facts, load_pararel_bags
from .parsing import is_correct, parse_answer

__all__ = [
    "CAPABILITIES",
    "Example",
    "arithmetic",
    "arithmetic_suite",
    "as_examples",
    "builtin_facts",
    "describe",
    "describe_capability",
    "facts_known_by",
    "is_correct",
    "load_capability",
    "load_counterfact",
    "load_jsonl",
    "load_known_facts",
    "load_pararel_bags",
    "local_texts",
    "parse_answer",
]
