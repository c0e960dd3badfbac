"""Loading a GGUF file into a ggml context, as the tail of `gguf_init_from_reader` does.

Mirrors gguf.cpp step by step: mem_size = n_tensors * ggml_tensor_overhead() (no_alloc), or
(n_tensors + 1) * overhead + the data section's padded size; when allocating, one I8 tensor named
"GGUF tensor data binary blob" holds the whole data section, read in one go; then, with no_alloc
switched on, one tensor per info in file order (4 dims, named), whose data points into the blob.
So the pool holds the blob once and each tensor costs only its 368-byte header and struct.

Where ggml reads the data section into the pool, a big one here is mapped instead: the pool's
pages there are the file's, copy-on-write (engine/core/pages.py). The bytes are the same; a model's
hundreds of MB are neither copied nor faulted in before a kernel reads them, and a recorder knows
they are the file's (`Context.read_from`).
Leaves out: nothing of that path; backends and mmap-ed weights are llama.cpp's business.
"""

from __future__ import annotations


import numpy as np

# the layers below the facade (engine.ggml imports this package)
from engine.core.context import (Context, FileBytes, ggml_free, ggml_init, ggml_init_params,
                                 ggml_set_no_alloc, ggml_tensor_overhead)
from engine.core.layout import GGML_OBJECT_SIZE, GGML_TENSOR_SIZE
from engine.core.pages import pool_over_file
from engine.core.tensor import ggml_new_tensor, ggml_new_tensor_1d, ggml_set_name
from engine.core.tensor_data import data_bytes
from engine.core.types import GGMLType

from .format import SIZE_MAX, GGUFError
from .reader import GGUFReader

BLOB_NAME = "GGUF tensor data binary blob"


def gguf_mem_size(n_tensors: int, data_size: int, no_alloc: bool) -> int:
    """The mem_size gguf_init_from_reader asks ggml_init for."""
    n = n_tensors if no_alloc else n_tensors + 1
    mem_size = n * ggml_tensor_overhead() + (0 if no_alloc else data_size)
    if mem_size > SIZE_MAX:
        raise GGUFError("n_tensors", 8, "memory size overflow while allocating ggml context")
    return mem_size


def load_into_context(r: GGUFReader, no_alloc: bool) -> Context:
    """gguf_init_from_file with params.ctx set: the ggml context it creates for r's tensors."""
    ctx = ggml_init(ggml_init_params(mem_size=gguf_mem_size(r.n_tensors, r.data_size, no_alloc),
                                     mem_buffer=None, no_alloc=no_alloc))
    blob = None
    if not no_alloc:
        # the data section's place in the pool: the blob's data, after the first header and struct
        fb = None if r.path is None else \
            FileBytes(GGML_OBJECT_SIZE + GGML_TENSOR_SIZE, r.data_size, r.path, r.data_offset)
        mapped = fb is not None and r.data_size >= MAPPED_DATA and r.data_offset + r.data_size <= r.size
        if fb is not None and mapped:
            ctx.pool = pool_over_file(ctx.mem_size, fb.path, fb.offset - fb.start,
                                      [(fb.start, fb.start + fb.size)], np.frombuffer(r._buf, np.uint8))
        blob = ggml_new_tensor_1d(ctx, GGMLType.I8, r.data_size)
        ggml_set_name(blob, BLOB_NAME)
        if r.data_offset + r.data_size > r.size:
            ggml_free(ctx)
            raise GGUFError("data section", r.data_offset, f"failed to read tensor data binary "
                            f"blob: it needs {r.data_size} bytes (every tensor padded to "
                            f"{r.alignment}) but the file ends after "
                            f"{r.size - r.data_offset}")
        if r.data_size:  # an empty blob gets no data pointer (NULL), as in C
            assert blob.data is not None and (fb is None or fb.start == ctx.offset(blob.data))
            if not mapped:
                data_bytes(blob)[:] = np.frombuffer(r._buf, dtype=np.uint8, count=r.data_size,
                                                    offset=r.data_offset)
            ctx.read_from = fb
    ggml_set_no_alloc(ctx, True)
    for info in r.tensors:
        cur = ggml_new_tensor(ctx, info.type, 4, info.ne)
        ggml_set_name(cur, info.name)
        if blob is not None:
            cur.data = (blob.data or 0) + info.offset
    ggml_set_no_alloc(ctx, no_alloc)
    return ctx


MAPPED_DATA = 1 << 20  # a data section from this size up is mapped (pool_over_file), not read
