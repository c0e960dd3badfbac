"""A minimal PNG encoder: enough for a small heatmap sent as a data: URI."""

from __future__ import annotations

import struct
import zlib

import numpy as np


def png_rgb(rgb: np.ndarray) -> bytes:
    """An 8-bit RGB image (h, w, 3) as a PNG: one IDAT, no filter."""
    h, w, _ = rgb.shape
    raw = b"".join(b"\x00" + row.tobytes() for row in rgb.astype(np.uint8))

    def chunk(tag: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + tag + data + \
            struct.pack(">I", zlib.crc32(tag + data) & 0xFFFFFFFF)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(raw, 6)) + chunk(b"IEND", b""))
