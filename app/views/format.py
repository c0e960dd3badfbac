"""How the pages write numbers, sizes, shapes and strings: shared by every view."""

from __future__ import annotations

SHOW_CHARS = 160  # a string value is cut after this many characters


def human_bytes(n: int) -> str:
    """1536 -> '1.5 KiB'; exact counts stay available beside it on the page."""
    if n < 1024:
        return f"{n} B"
    size: float = n
    for unit in ("KiB", "MiB", "GiB", "TiB"):
        size /= 1024
        if size < 1024 or unit == "TiB":
            return f"{size:.1f} {unit}"
    raise AssertionError("unreachable")


def fmt_float(v: float) -> str:
    """A value as the GGUF pages print it: 6 significant digits."""
    return f"{v:.6g}"


def fmt_short(v: float) -> str:
    """A value in a small cell of the debugger: 4 significant digits, exponent when far from 1."""
    if v != v:
        return "nan"
    if abs(v) >= 1e5 or (abs(v) < 1e-3 and v != 0):
        return f"{v:.2e}"
    return f"{v:.4g}"


def visible_text(s: str, limit: int = SHOW_CHARS) -> str:
    """A string value made visible: control characters escaped, long ones cut."""
    if not s.isprintable():
        s = s.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
        s = "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii")
                    for c in s)
    return s if len(s) <= limit else s[:limit] + "…"


# signs the installed fonts draw (DejaVu has ␣, not ␠ or ␍: a carriage return is escaped, \r)
WHITESPACE = {" ": "␣", "\n": "⏎", "\t": "⇥"}


def token_text(piece: str) -> str:
    """A token's piece as a chip shows it: spaces, newlines and tabs as visible signs (␣ ⏎ ⇥),
    other control characters escaped, an empty piece as ∅; special tokens (<bos>) as they are."""
    if not piece:
        return "∅"
    return visible_text("".join(WHITESPACE.get(c, c) for c in piece))


def shape_text(ne: tuple[int, ...]) -> str:
    """(4096, 32000) -> '[4,096, 32,000]'."""
    return "[" + ", ".join(f"{x:,}" for x in ne) + "]"
