"""What the recorder needs to know of a facade function, declared where the function is defined."""

from __future__ import annotations

from typing import Callable, TypeVar

F = TypeVar("F", bound=Callable)


def query(fn: F) -> F:
    """Mark fn as changing no ggml memory (no pool, buffer or struct byte; it reads, or keeps its
    state outside ggml's memory): a program's call to it is not a step."""
    fn.ggml_query = True  # type: ignore[attr-defined]
    return fn


def is_query(fn: Callable) -> bool:
    return getattr(fn, "ggml_query", False)
