"""Test markers of the kit (no pytest import: usable anywhere)."""

from __future__ import annotations

from collections.abc import Callable
from typing import ParamSpec, TypeVar

P = ParamSpec("P")
R = TypeVar("R")

#: The attribute :func:`covers_hooks` sets on a test function.
COVERED_HOOKS_ATTR = "covered_hooks"


def covers_hooks(*names: str) -> Callable[[Callable[P, R]], Callable[P, R]]:
    """Mark a test as exercising the named hooks (``werk_prefill``, …).

    The names are kept on the function as ``covered_hooks`` (read them with
    :func:`covered_hooks`), so a suite can check that every hook it implements has a test."""

    def mark(func: Callable[P, R]) -> Callable[P, R]:
        setattr(func, COVERED_HOOKS_ATTR, (*covered_hooks(func), *names))
        return func

    return mark


def covered_hooks(func: object) -> tuple[str, ...]:
    """The hook names ``func`` was marked with by :func:`covers_hooks` (empty when unmarked)."""
    names = getattr(func, COVERED_HOOKS_ATTR, ())
    return tuple(n for n in names if isinstance(n, str)) if isinstance(names, tuple) else ()


__all__ = ["COVERED_HOOKS_ATTR", "covered_hooks", "covers_hooks"]
