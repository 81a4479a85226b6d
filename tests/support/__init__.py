"""Test-only helpers: an in-memory adapter plugin and server fixtures."""

from collections.abc import Callable
from typing import Any, TypeVar

F = TypeVar("F", bound=Callable[..., Any])


def covers_hooks(*names: str) -> Callable[[F], F]:
    """Mark a test as exercising the named hooks (checked by ``test_every_hook_has_a_test``)."""

    def mark(func: F) -> F:
        func.covered_hooks = names  # type: ignore[attr-defined]
        return func

    return mark
