"""Tools for people who write localizers: the contract every localizer meets, as scikit-learn's.

:func:`check_localizer` runs every check on a class; :func:`parametrize_with_checks` makes one pytest
test per (class, check), with known failures marked; :func:`contract_params` builds the arguments
the checks construct a class with (from its ``check_params``). A broken contract raises
:class:`ContractError`. The data checks (bad input refused before any forward pass, the bare-prompt
rule) are in :mod:`capinterp.testing.data_checks`.
"""

from capinterp.testing.contract import ContractError, ForwardCounter
from capinterp.testing.data_checks import BAD_EXAMPLES, bad_data, bad_examples, bare_prompts
from capinterp.testing.localizer_checks import (
    CHECKS,
    check_facts,
    check_localizer,
    contract_params,
    default_model,
    run_check,
    untouchable_model,
)
from capinterp.testing.parametrize import BoundCheck, parametrize_with_checks

__all__ = [
    "BAD_EXAMPLES",
    "CHECKS",
    "BoundCheck",
    "ContractError",
    "ForwardCounter",
    "bad_data",
    "bad_examples",
    "bare_prompts",
    "check_facts",
    "check_localizer",
    "contract_params",
    "default_model",
    "parametrize_with_checks",
    "run_check",
    "untouchable_model",
]
