"""What the recorder needs to know of a facade function, declared where the function is defined.

Every public function of the facades (engine/ggml*.py and what they re-export) carries exactly one
declaration, and the recorder (engine/trace/recorder.py) reads it, never the function's name:

    @query                        changes no ggml memory: a program's call to it is not a step
    @op                           an op constructor: its step compares tensor structs only
    @writes(Writes.DATA, ...)     may change ggml memory: its step compares its arguments and its
                                  result, and what each Writes named adds

ggml has no such markers (C needs none: nothing watches its calls); they are the debugger's.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum, Flag, auto
from typing import Callable, TypeVar

F = TypeVar("F", bound=Callable)


class Kind(Enum):
    QUERY = "query"  # reads, or keeps its state outside ggml's memory (no pool, buffer or struct byte)
    OP = "op"  # ggml_add, ggml_view_2d, ggml_set_op_params...: writes tensor structs, never data
    WRITES = "writes"  # may change ggml memory otherwise


class Writes(Flag):
    """What a writing call changes beyond its arguments and its result, each a thing the recorder
    does for it (in this order in a declaration's text)."""
    DATA = auto()  # the data of the tensor it is given first, as ggml's memcpy: the step says so
    PLACES = auto()  # the buffer and data fields of every tensor in the contexts, graphs or
    #                  scheduler it is given (an allocator placing them): all those structs compared
    OPT = auto()  # the contexts inside the ggml-opt objects it is given, which the program never
    #               named: they are tracked and every byte is compared
    LOOP = auto()  # a training loop: the nodes it computes, batch after batch, are not steps
    WALK = auto()  # walks a graph from its outputs: each tensor visited is a step inside the call's
    CONTEXT = auto()  # makes a context: the step says its size and address


@dataclass(frozen=True, slots=True)
class Declaration:
    """What one facade function says it is."""
    kind: Kind
    writes: Writes = Writes(0)  # only for Kind.WRITES

    def __str__(self) -> str:
        """`query`, `op`, `writes`, `writes DATA`, `writes PLACES OPT LOOP`."""
        return " ".join([self.kind.value, *(name for name, w in Writes.__members__.items() if w in self.writes)])


def _declare(fn: F, declaration: Declaration) -> F:
    """Attach the declaration; a second one is a mistake (which would the recorder believe?)."""
    if hasattr(fn, "ggml_declaration"):
        raise TypeError(f"{fn.__name__} is declared twice ({fn.ggml_declaration} and {declaration}): "
                        "a facade function declares exactly one kind")
    fn.ggml_declaration = declaration  # type: ignore[attr-defined]  # (a function takes attributes; Callable does not say so)
    return fn


def query(fn: F) -> F:
    """Mark fn as changing no ggml memory (no pool, buffer or struct byte; it reads, or keeps its
    state outside ggml's memory): a program's call to it is not a step."""
    return _declare(fn, Declaration(Kind.QUERY))


def op(fn: F) -> F:
    """Mark fn as an op constructor (or an op's setter, ggml_set_op_params, ggml_mul_mat_set_prec):
    it adds its result (a new tensor or a view) and may write its arguments' structs, never a
    tensor's data, so its step compares structs only (a view's data can be a KV cache's megabytes)."""
    return _declare(fn, Declaration(Kind.OP))


def writes(*what: Writes) -> Callable[[F], F]:
    """Mark fn as a call that may change ggml memory: its step compares its arguments and its result
    (their structs, data and graphs) and what `what` names besides."""
    flags = Writes(0)
    for w in what:
        flags |= w
    return lambda fn: _declare(fn, Declaration(Kind.WRITES, flags))


def declaration_of(fn: Callable) -> Declaration | None:
    """What fn declares; None for a function that declares nothing."""
    return getattr(fn, "ggml_declaration", None)
