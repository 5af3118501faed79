"""``parametrize_with_checks``: the contract as one pytest test per (localizer class, check).

As scikit-learn's ``parametrize_with_checks``::

    from capinterp.testing import parametrize_with_checks

    @parametrize_with_checks([MyLocalizer])
    def test_contract(localizer, check):
        check()                      # or check(model=my_model, facts=my_facts)

Each test's id reads ``MyLocalizer-check_fit``. ``check`` is a :class:`BoundCheck`: calling it runs
that check on the class with :func:`~capinterp.testing.localizer_checks.contract_params` (the
class's :attr:`~capinterp.localizers.base.Localizer.check_params` over ``steps=2`` / ``samples=2``).
A known failure is declared, not skipped: ``expected_failures={"check_bare_prompt": "why"}`` marks
that check ``xfail(strict=True)``, so the test fails again the day the check passes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from capinterp.core.protocol import Model
from capinterp.localizers.base import Localizer, get
from capinterp.testing.localizer_checks import CHECKS, run_check

__all__ = ["BoundCheck", "parametrize_with_checks"]

Failures = Mapping[str, str] | Callable[[type[Localizer]], Mapping[str, str]] | None


class BoundCheck:
    """One contract check bound to one localizer class; call it to run the check."""

    def __init__(self, cls: type[Localizer], check: Callable[..., None]) -> None:
        self.cls = cls
        self.check = check
        self.__name__ = check.__name__
        self.__doc__ = check.__doc__

    def __call__(
        self, *, model: Model | None = None, facts: list | None = None, params: dict[str, Any] | None = None
    ) -> None:
        """Run the check (:func:`~capinterp.testing.localizer_checks.run_check`): on ``model`` (default:
        the tiny model) and ``facts`` (default: :func:`~capinterp.testing.localizer_checks.check_facts`),
        with ``params`` over :func:`~capinterp.testing.localizer_checks.contract_params`."""
        run_check(self.cls, self.check, model=model, facts=facts, params=params)

    def __repr__(self) -> str:
        return f"{self.cls.__name__}-{self.check.__name__}"


def parametrize_with_checks(classes: Iterable[type[Localizer] | str], *, expected_failures: Failures = None) -> Any:
    """A ``pytest.mark.parametrize`` over ``(localizer, check)``: every class (or registered name) of
    ``classes`` with every check of :data:`~capinterp.testing.localizer_checks.CHECKS`, ids
    ``ClassName-check_name``.

    Args:
        classes: localizer classes or registry names (e.g. ``capinterp.localizers.available()``).
        expected_failures: ``{check_name: reason}`` for every class, or a function of the class giving
            that mapping: those checks are marked ``xfail(strict=True, reason=reason)``. An unknown
            check name is a ValueError (a typo would otherwise hide a failure).
    """
    import pytest

    names = [c.__name__ for c in CHECKS]
    params = []
    for entry in classes:
        cls = get(entry) if isinstance(entry, str) else entry
        if not (isinstance(cls, type) and issubclass(cls, Localizer)):
            raise TypeError(f"parametrize_with_checks takes Localizer classes or names, got {entry!r}")
        failures = expected_failures(cls) if callable(expected_failures) else (expected_failures or {})
        unknown = sorted(set(failures) - set(names))
        if unknown:
            raise ValueError(f"expected_failures names unknown checks {unknown}; the checks are {names}")
        for check in CHECKS:
            reason = failures.get(check.__name__)
            marks = [pytest.mark.xfail(strict=True, reason=str(reason))] if reason is not None else []
            bound = BoundCheck(cls, check)
            params.append(pytest.param(cls, bound, id=repr(bound), marks=marks))
    return pytest.mark.parametrize(("localizer", "check"), params)
