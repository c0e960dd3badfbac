"""Which functions of ggml-alloc.h and ggml-backend.h (CPU) the engine's facades provide.

The oracle's exported functions are read from ggml-python (every bound function has ctypes
argtypes). ggml-alloc.h must be complete. For ggml-backend.h, functions of other backends are
excluded with a reason; what the engine has not built yet is listed exactly in NOT_BUILT, so the
test fails both when a facade loses a function and when one is built without updating the list.
"""

from __future__ import annotations

import ggml as real

from engine import ggml_alloc, ggml_backend


def oracle_functions(prefixes):
    return {n for n in dir(real) if n.startswith(prefixes) and hasattr(getattr(real, n), "argtypes")}


OTHER_BACKENDS = {  # prefix -> reason
    **{f"ggml_backend_{b}_": "a GPU/accelerator backend the engine does not emulate"
       for b in ("blas", "cann", "cuda", "hexagon", "metal", "opencl", "openvino", "sycl", "vk", "webgpu",
                 "zdnn", "zendnn", "virtgpu")},
    "ggml_backend_rpc_": "the RPC backend talks to other machines",
    "ggml_backend_meta_": "the meta backend splits tensors across devices",
    "ggml_backend_is_": "asks whether a backend is one of the other backends (ggml_backend_is_cpu is kept)",
    "ggml_backend_buft_is_openvino": "OpenVINO buffer types",
    "ggml_backend_buffer_is_openvino": "OpenVINO buffers",
    "ggml_backend_i_": "callback types of struct ggml_backend_i (ggml-backend-impl.h), not functions",
    "ggml_backend_buffer_i_": "callback types of struct ggml_backend_buffer_i (ggml-backend-impl.h)",
    "ggml_backend_buffer_type_i_": "callback types of struct ggml_backend_buffer_type_i (ggml-backend-impl.h)",
    "ggml_backend_eval_callback": "a callback type, not a function",
    "ggml_backend_sched_eval_callback": "a callback type, not a function",
    "ggml_backend_cpu_": "ggml-cpu.h, not ggml-backend.h (the CPU names the facade has are counted there)",
    "ggml_backend_load": "loads a backend from a shared library (.so); the engine's backends are built in "
                         "(ggml_backend_load_all is kept: it says so)",
    "ggml_backend_unload": "unloads a backend's shared library",
    "ggml_backend_buffer_init": "for backend implementers: makes a buffer from a C interface table "
                                "(struct ggml_backend_buffer_i) and a context pointer",
}
KEEP_PREFIXED = {"ggml_backend_load_all"}
RENAMED = {"ggml_backend_graph_copy_": "ggml_backend_graph_copy"}  # ggml-python: its struct took the C name
KEEP = {"ggml_backend_is_cpu"}

NOT_BUILT: set[str] = set()  # ggml-backend.h functions still missing from engine.ggml_backend


def test_ggml_alloc_h_is_complete():
    oracle = oracle_functions(("ggml_tallocr_", "ggml_gallocr_", "ggml_backend_alloc_ctx_tensors"))
    assert len(oracle) == 13
    assert oracle - set(ggml_alloc.__all__) == set()


def test_ggml_backend_h_cpu_coverage():
    oracle = {RENAMED.get(n, n) for n in oracle_functions(("ggml_backend_",))
              if n in KEEP | KEEP_PREFIXED or not any(n.startswith(p) for p in OTHER_BACKENDS)}
    oracle -= oracle_functions(("ggml_backend_alloc_ctx_tensors",))  # ggml-alloc.h
    missing = oracle - set(ggml_backend.__all__)
    assert missing == NOT_BUILT, (sorted(missing - NOT_BUILT), sorted(NOT_BUILT - missing))
