"""Real llama.cpp's eval callback, formatted like llama-eval-callback: the oracle for dumps.

llama-cpp-python has no option for the callback, so `llama_cpp_dump` sets `cb_eval` in the
context parameters llama_cpp.Llama asks for, reads each computed tensor from llama.cpp's own
memory (the ggml_tensor struct has the layout engine/core/layout.py describes; names of ops and types
come from llama.cpp's libggml-base), and formats it with engine.trace.evaldump.format_node.
"""

from __future__ import annotations

import ctypes
from pathlib import Path

import numpy as np

from engine.trace.evaldump import NodeFields, format_node
from engine.core.layout import TENSOR
from engine.core.types import TYPE_TRAITS, GGMLType


def _lib(llama_cpp):
    lib = ctypes.CDLL(str(Path(llama_cpp.__file__).parent / "lib" / "libggml-base.so"))
    lib.ggml_op_desc.restype = ctypes.c_char_p
    lib.ggml_op_desc.argtypes = [ctypes.c_void_p]
    lib.ggml_type_name.restype = ctypes.c_char_p
    lib.ggml_type_name.argtypes = [ctypes.c_int]
    return lib


def _struct(ptr: int) -> np.void:
    return np.frombuffer(ctypes.string_at(ptr, TENSOR.itemsize), TENSOR)[0]


def _name(r) -> str:
    return bytes(r["name"]).split(b"\0")[0].decode()


def _fields(lib, ptr: int) -> NodeFields:
    by_name = {tr.type_name: GGMLType(i) for i, tr in enumerate(TYPE_TRAITS) if tr is not None}
    r = _struct(ptr)
    t = by_name[lib.ggml_type_name(int(r["type"])).decode()]
    ne, nb = tuple(int(x) for x in r["ne"]), tuple(int(x) for x in r["nb"])
    srcs = []
    for k in (0, 1):
        p = int(r["src"][k])
        srcs.append((_name(_struct(p)), tuple(int(x) for x in _struct(p)["ne"])) if p else None)
    tr = TYPE_TRAITS[t]
    data = b""
    if not tr.is_quantized and int(r["data"]):  # CPU buffers: host memory
        data = ctypes.string_at(int(r["data"]), tr.type_size + sum((ne[i] - 1) * nb[i]
                                                                  for i in range(4)))
    return NodeFields(_name(r), int(t), ne, nb, lib.ggml_op_desc(ptr).decode(), srcs[0],
                      srcs[1], data)


def watch_nodes(llama_cpp, out: list[str]):
    """From now on, every llama_cpp.Llama made in this process appends each node its context
    computes to `out`, formatted as llama-eval-callback prints it. Returns what undoes it."""
    import llama_cpp.llama as llama_module

    lib = _lib(llama_cpp)

    @llama_cpp.ggml_backend_sched_eval_callback
    def callback(t, ask, user_data):
        if not ask:
            out.append(format_node(_fields(lib, t)))
        return True

    original = llama_module.llama_cpp.llama_context_default_params

    def with_callback():
        p = original()
        p.cb_eval = callback
        return p

    llama_module.llama_cpp.llama_context_default_params = with_callback

    def undo() -> None:
        llama_module.llama_cpp.llama_context_default_params = original
    undo.callback = callback  # (ctypes keeps no reference of its own: the caller keeps undo)
    return undo


def llama_cpp_embed_dump(llama_cpp, model: Path, text: str, n_threads: int) -> str:
    """The eval-callback dump of llama.cpp embedding `text` with `model`."""
    out: list[str] = []
    undo = watch_nodes(llama_cpp, out)
    try:
        llm = llama_cpp.Llama(str(model), embedding=True, n_threads=n_threads, n_ctx=512,
                              verbose=False)
    finally:
        undo()
    out.clear()  # nothing from loading
    llm.embed(text)
    llm.close()
    return "".join(out)
