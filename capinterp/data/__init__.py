"""Datasets: the shared ``Example`` record, the arithmetic generator, and answer parsing."""
from __future__ import annotations

from .arithmetic import arithmetic, arithmetic_suite, describe
from .example import Example, as_examples
from .parsing import is_correct, parse_answer

__all__ = [
    "Example",
    "as_examples",
    "arithmetic",
    "arithmetic_suite",
    "describe",
    "parse_answer",
    "is_correct",
]
