"""What every contract check shares: the error it raises, and a counter of forward passes.

The checks are run by users (``check_localizer``, ``parametrize_with_checks``), sometimes under
``python -O``, which strips ``assert`` statements: they never use ``assert`` but :func:`require`,
which raises :class:`ContractError` (an AssertionError, so pytest reports it as a failed check).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["ContractError", "ForwardCounter", "require"]


class ContractError(AssertionError):
    """A localizer breaks the contract; the message names what, and :func:`check_localizer` the check."""


def require(condition: Any, message: str | Callable[[], str]) -> None:
    """Raise :class:`ContractError` with ``message`` unless ``condition`` holds (``assert`` that ``-O``
    keeps). A callable message is built only on failure, as ``assert``'s is: ``lambda: f"{x.max()}"``
    may read what exists only when the check fails."""
    if not condition:
        raise ContractError(message() if callable(message) else message)


class ForwardCounter:
    """Counts a model's forward passes (a pre-hook on its embedding, which every pass runs; on the
    model itself when it has no ``embed``). A context manager: the hook is removed on exit.

    >>> with ForwardCounter(model) as passes:
    ...     loc.fit(data)
    >>> passes.n
    """

    def __init__(self, model: Any) -> None:
        self.n = 0
        self._module = getattr(model, "embed", None) or model
        self._handle: Any = None

    def _count(self, *_: Any) -> None:
        self.n += 1

    def __enter__(self) -> ForwardCounter:
        self._handle = self._module.register_forward_pre_hook(self._count)
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._handle is not None:
            self._handle.remove()
            self._handle = None
