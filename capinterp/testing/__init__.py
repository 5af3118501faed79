"""Tools for people who write localizers: :func:`check_localizer` checks a class against the contract."""

from capinterp.testing.localizer_checks import CHECKS, check_facts, check_localizer, untouchable_model

__all__ = ["CHECKS", "check_facts", "check_localizer", "untouchable_model"]
