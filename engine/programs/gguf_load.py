"""gguf-load: what gguf_init_from_file does to a ggml context, call by call.

It reads the file's header, keys and tensor infos, sizes a context for every tensor plus one blob
for the whole data section, reads the data into the blob in one go, then (with no_alloc switched on)
creates one 368-byte tensor per info whose data pointer points into the blob. The same steps ggml
runs inside gguf_init_from_file, written out here so each one is a step; the last call does it all
at once in a second context, for comparison.
"""

import numpy as np

from engine.ggml import *  # noqa: F403
from engine.resources import fixture_path


def run(n_threads: int = 1, path: str | None = None) -> dict:
    path = path or fixture_path("minilm-q8_0.gguf")
    gguf = gguf_init_from_file(path, gguf_init_params(no_alloc=True, ctx=False))  # metadata only
    n_tensors = gguf_get_n_tensors(gguf)
    data_size = sum(GGML_PAD(gguf_get_tensor_size(gguf, i), gguf_get_alignment(gguf))
                    for i in range(n_tensors))

    mem_size = (n_tensors + 1) * ggml_tensor_overhead() + data_size
    ctx = ggml_init(ggml_init_params(mem_size=mem_size, mem_buffer=None, no_alloc=False))

    blob = ggml_new_tensor_1d(ctx, GGML_TYPE_I8, data_size)
    ggml_set_name(blob, "GGUF tensor data binary blob")
    with open(path, "rb") as f:  # fseek to the data section, then fread(blob->data, 1, data_size, file)
        f.seek(gguf_get_data_offset(gguf))
        raw = np.frombuffer(f.read(data_size), dtype=np.int8)
    set_data(blob, raw)

    ggml_set_no_alloc(ctx, True)  # the tensors below get only their struct: data is in the blob
    for i in range(n_tensors):
        name = gguf_get_tensor_name(gguf, i)
        ne = gguf_get_tensor_ne(gguf, i)  # gguf.cpp reads info.t.ne
        cur = ggml_new_tensor(ctx, gguf_get_tensor_type(gguf, i), 4, ne)
        cur.data = blob.data + gguf_get_tensor_offset(gguf, i)  # points into the blob
        ggml_set_name(cur, name)
    ggml_set_no_alloc(ctx, False)

    # the same, in one call: the context gguf_init_from_file makes when asked for one
    gguf2, ctx2 = gguf_init_from_file(path, gguf_init_params(no_alloc=False, ctx=True))
    first = gguf_get_tensor_name(gguf, 0)
    return {"used_mem": ggml_used_mem(ctx), "used_mem_by_gguf": ggml_used_mem(ctx2),
            "first_tensor": first, "n_tensors": n_tensors}
