"""The engine's errors: ggml's GGML_ASSERT and pool exhaustion, as Python exceptions.

ggml aborts the process when an assertion fails; the engine raises instead, naming the condition
exactly as ggml writes it and the function that checked it, so a learner can find the line in ggml.c.
"""

from __future__ import annotations

from typing import TypeVar

import numpy as np

from engine.core.api import query

T = TypeVar("T")


class GGMLAssertionError(AssertionError):
    """GGML_ASSERT(condition) failed inside `function`."""

    def __init__(self, condition: str, function: str, detail: str = "") -> None:
        self.condition = condition
        self.function = function
        self.detail = detail
        msg = f"{function}: GGML_ASSERT({condition}) failed"
        super().__init__(f"{msg}: {detail}" if detail else msg)


class GGMLPoolError(MemoryError):
    """ggml_new_object: the context's pool has no room for an object."""

    def __init__(self, needed: int, available: int) -> None:
        self.needed = needed
        self.available = available
        super().__init__(
            "ggml_new_object: not enough space in the context's memory pool "
            f"(needed {needed}, available {available})"
        )


@query
def ggml_assert(ok: bool | np.bool_, condition: str, function: str, detail: str = "") -> None:
    """GGML_ASSERT: raise GGMLAssertionError naming `condition` when `ok` is false."""
    if not ok:
        raise GGMLAssertionError(condition, function, detail)


def ggml_assert_not_null(value: T | None, condition: str, function: str, detail: str = "") -> T:
    """GGML_ASSERT(ptr) on a pointer ggml goes on to use: the value, known to be set from here on
    (GGMLAssertionError naming `condition` when it is None)."""
    if value is None:
        raise GGMLAssertionError(condition, function, detail)
    return value


class TensorBoundsError(ValueError):
    """A numpy view of a tensor's memory whose bytes would not all lie inside the pool holding it.

    ggml keeps whatever ne and nb a program gives (ggml_view_4d checks only the view's packed size
    against its source) and reads such a tensor's bytes unchecked; the engine checks the bytes a
    view reaches, with exact integers, before numpy sees its strides (engine.core.tensor_data).
    `rule` is the condition that does not hold, written as C."""

    def __init__(self, rule: str, function: str, detail: str) -> None:
        self.rule, self.function, self.detail = rule, function, detail
        super().__init__(f"{function}: {rule} does not hold: {detail}")


class GGMLNotSupportedError(NotImplementedError):
    """An op (or an op with these types) that this backend does not compute."""


class GGMLAbortError(RuntimeError):
    """GGML_ABORT(message) inside `function`: ggml stops the process; the engine raises."""

    def __init__(self, message: str, function: str) -> None:
        self.message, self.function = message, function
        super().__init__(f"{function}: GGML_ABORT: {message}")


class ProgramStopped(BaseException):
    """A limit stopped the program being recorded (the step cap, a sandbox's time or size limit).

    A BaseException, like KeyboardInterrupt: a program's own `except Exception` cannot swallow it,
    so the recording ends with the limit's message as its last step."""


class StepCapReached(ProgramStopped):
    """The trace reached its step cap: a runaway program ends here instead of hanging."""

    def __init__(self, cap: int) -> None:
        super().__init__(f"stopped after {cap} steps")


def program_line(exc: BaseException, source_file: str) -> int | None:
    """The line of `source_file` the exception passed through last (where the program was)."""
    line, tb = None, exc.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code.co_filename == source_file:
            line = tb.tb_lineno
        tb = tb.tb_next
    return line
