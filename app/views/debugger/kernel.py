"""The kernel panel: what computed the current node (ggml's C kernel and the engine's numpy code
that mirrors it, highlighted), the share the selected thread took, and one quantized block (or
one element) worked through with the node's numbers (engine.compute.kernel_card)."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from threading import Thread

from markupsafe import Markup
from pygments import highlight
from pygments.formatters import HtmlFormatter
from pygments.lexers import PythonLexer

from app.i18n import _
from app.views.debugger.threads import ShareRow, ranges_text
from app.views.debugger.values import unreadable
from app.views.debugger.where import Where, current_node
from engine.compute.kernel_card import Code, KernelCard, WorkedBlock, WorkedElement, every_code, kernel_card, \
    worked_block, worked_element
from engine.compute.shares import Tile
from engine.trace import State, Step, StepKind


SHOWN = 6  # ranges of the selected thread listed; the rest counted


@dataclass(frozen=True, slots=True)
class KernelView:
    card: KernelCard
    code: list[tuple[Code, Markup]]  # each function and its highlighted source
    shares: list[ShareRow]
    selected: int  # the thread whose share is shown
    took: str  # what it took: its rows, or its first chunks
    block: WorkedBlock | None
    element: WorkedElement | None
    row: int  # the weight row and activation row of the worked block
    col: int
    error: str = ""  # why nothing is worked through: the node's memory was not read


@cache
def highlighted(code: Code) -> Markup:
    """A function's source as HTML, its tokens in pygments' classes (styled in debugger.css)."""
    return Markup(highlight(code.text, PythonLexer(), HtmlFormatter(nowrap=True)))


_WARMING: list[Thread] = []


def warm() -> None:
    """Highlight every kernel's source once per process, in the background (pygments is slow on
    whole functions), so that no step page waits for its kernel's first highlighting."""
    if not _WARMING:
        _WARMING.append(Thread(target=lambda: [highlighted(c) for c in sorted(every_code(), key=repr)],
                               name="highlight kernels", daemon=True))
        _WARMING[0].start()


def kernel_view(step: Step, state: State, where: Where, shares: list[ShareRow]) -> KernelView | None:
    """The panel at a node step; `shares` are the threads panel's (ThreadsView.shares)."""
    if step.kind != StepKind.NODE:
        return None
    node = current_node(state, step)
    card = kernel_card(node) if node is not None else None
    if node is None or card is None:
        return None
    selected = min(max(where.ith, 0), len(shares) - 1) if shares else 0
    row, col = where.row, 0
    mine = next((t for t in step.threads if t.ith == selected), None)
    took = "" if mine is None else ranges_text(mine.kind, mine.ranges[:SHOWN]) + (
        _(" … and {n} more").format(n=len(mine.ranges) - SHOWN) if len(mine.ranges) > SHOWN else "")
    first = mine.ranges[0] if mine is not None and mine.ranges else None
    if not where.row and isinstance(first, Tile):  # the thread's first chunk: its first output
        row, col = first.rows.start, first.cols.start
    block, element, error = None, None, ""
    try:
        block = worked_block(node, row, col, where.block)
        element = worked_element(node)
    except ValueError as e:  # (ne and nb reaching outside the memory of the node or a source)
        error = unreadable(e)
    return KernelView(card, [(c, highlighted(c)) for c in card.code], shares, selected, took, block,
                      element, block.row if block else row, block.col if block else col, error)
