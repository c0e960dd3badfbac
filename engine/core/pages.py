"""Pools whose bytes are a file's pages: a zeroed region in which chosen ranges are the file's own
pages, mapped private (copy on write: a write changes the pool, never the file). Not part of
ggml: how the engine holds a model's weights without copying them, for a GGUF context whose data
section is the file's (engine/gguf/loader.py) and for a recorded state whose weights buffer is
partly loaded (engine/trace/states.py).

Where there is no libc mmap (not Linux), the ranges are copied instead: the same bytes.
"""

from __future__ import annotations

import ctypes
import mmap
import sys

import numpy as np

PAGE = mmap.PAGESIZE
_PROT_READ, _PROT_WRITE, _MAP_PRIVATE, _MAP_FIXED = 1, 2, 2, 0x10  # Linux's values
_MAP_FAILED = ctypes.c_void_p(-1).value


def _libc_mmap():
    """libc's mmap (None where there is none: the pool is then read, not mapped)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        fn = libc.mmap
    except (OSError, AttributeError):
        return None
    fn.restype = ctypes.c_void_p
    fn.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    return fn


mmap_fn = _libc_mmap() if sys.platform == "linux" else None


def map_private(addr: int, size: int, fd: int, offset: int) -> bool:
    """Map the file's bytes [offset, offset + size) copy-on-write at addr, in place of what was
    there (page-aligned addr, offset and size: MAP_FIXED | MAP_PRIVATE). False where it cannot
    be (no libc mmap, or the call failed: what was there still is)."""
    if mmap_fn is None:
        return False
    got = mmap_fn(addr, size, _PROT_READ | _PROT_WRITE, _MAP_PRIVATE | _MAP_FIXED, fd, offset)
    return got == addr and got != _MAP_FAILED


def pool_over_file(size: int, path: str, shift: int, ranges: list[tuple[int, int]],
                   data: np.ndarray) -> np.ndarray:
    """A zeroed pool of `size` bytes whose ranges [a, b) hold the file's bytes from a + shift:
    their whole pages are the file's own pages, mapped private; the partial pages at each range's
    ends are copied from `data` (the file's bytes, any readable view of them). The pool is placed
    so that its bytes and the file's fall at the same offset within a page, as a mapping needs."""
    anon = mmap.mmap(-1, size + PAGE)  # zero pages, none touched yet
    addr = np.frombuffer(anon, np.uint8).ctypes.data
    lead = (shift - addr) % PAGE  # pool byte o at address addr + lead + o = o + shift (mod page)
    pool = np.frombuffer(anon, np.uint8, size, lead)
    with open(path, "rb") as f:
        for a, b in ranges:
            start = addr + lead + a
            first, last = -(-start // PAGE) * PAGE, (start + b - a) // PAGE * PAGE
            # (where it cannot be mapped, the anonymous pages are still there: copied into)
            mapped = last - first >= PAGE and map_private(first, last - first, f.fileno(),
                                                         a + shift + (first - start))
            lo, hi = (first - start, last - start) if mapped else (b - a, b - a)
            pool[a:a + lo] = data[a + shift:a + shift + lo]
            pool[a + hi:b] = data[a + shift + hi:b + shift]
    return pool
