"""Which functions of ggml.h, gguf.h, ggml-alloc.h, ggml-backend.h (CPU) and ggml-opt.h the engine's facades provide.

The oracle's exported functions are read from ggml-python (every bound function has ctypes
argtypes). ggml-alloc.h must be complete. For ggml-backend.h, functions of other backends are
excluded with a reason; what the engine has not built yet is listed exactly in NOT_BUILT, so the
test fails both when a facade loses a function and when one is built without updating the list.
"""

from __future__ import annotations

import ctypes
import pathlib

import ggml as real

from engine import ggml, ggml_alloc, ggml_backend, ggml_cpu, ggml_opt


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


def test_ggml_opt_h_is_complete():
    """Every ggml-opt.h function, and no name the header lacks (OPT_STEP_* ops are ggml.h's)."""
    oracle = oracle_functions(("ggml_opt_",)) - {"ggml_opt_step_adamw", "ggml_opt_step_sgd"}
    oracle -= {"ggml_opt_epoch_callback"}  # a callback type, not a function
    assert len(oracle) == 37
    assert oracle - set(ggml_opt.__all__) == set()
    assert {n for n in ggml_opt.__all__ if n.startswith("ggml_opt_") and n not in dir(real)} == set()


def test_ggml_backend_h_cpu_coverage():
    oracle = {RENAMED.get(n, n) for n in oracle_functions(("ggml_backend_",))
              if n in KEEP | KEEP_PREFIXED or not any(n.startswith(p) for p in OTHER_BACKENDS)}
    oracle -= oracle_functions(("ggml_backend_alloc_ctx_tensors",))  # ggml-alloc.h
    missing = oracle - set(ggml_backend.__all__)
    assert missing == NOT_BUILT, (sorted(missing - NOT_BUILT), sorted(NOT_BUILT - missing))


# --- ggml.h and gguf.h: engine.ggml --------------------------------------------------------------

def base_library_functions() -> set[str]:
    """The ggml.h/gguf.h/ggml-backend.h/ggml-alloc.h/ggml-opt.h functions of the oracle: names
    ggml-python binds whose symbol libggml-base.so exports."""
    lib = ctypes.CDLL(str(pathlib.Path(real.__file__).parent / "lib" / "libggml-base.so"))
    return {n for n in dir(real) if n.startswith(("ggml_", "gguf_")) and hasattr(lib, n)}


OTHER_HEADERS = ("ggml_backend_", "ggml_gallocr_", "ggml_tallocr_", "ggml_opt_")  # their own facades
OUT_OF_SCOPE = {  # ggml.h/gguf.h functions the engine leaves out on purpose
    "ggml_fopen": "opens a C FILE* (Windows UTF-8 paths); Python opens files itself",
    "gguf_init_from_file_ptr": "reads from a C FILE*; gguf_init_from_file takes the path",
    "gguf_write_to_file_ptr": "writes to a C FILE*; gguf_write_to_file takes the path",
    "ggml_print_backtrace": "prints the C call stack of a crash; a Python traceback does that",
}
NOT_BUILT_GGML_H: set[str] = set()  # ggml.h/gguf.h functions still missing from engine.ggml
OTHER_ISSUE: dict[str, str] = {}  # ggml.h functions another piece of work builds
ENGINE_ONLY = {  # facade functions with no exported twin in the oracle
    "ggml_assert": "GGML_ASSERT, a macro in C",
    "ggml_can_mul_mat": "static in ggml.c; the facade names the rule its asserts quote",
    "ggml_can_out_prod": "static in ggml.c",
    "ggml_can_repeat_rows": "static in ggml.c",
    "ggml_is_padded_1d": "static in ggml.c",
    "ggml_new_object": "static in ggml.c; the arena's allocator, shown step by step",
    "ggml_new_tensor_impl": "static in ggml.c; every ggml_new_tensor_* goes through it",
    "ggml_compute_softplus_f32": "static inline in ggml-impl.h (ggml_xielu stores its values)",
    "ggml_get_op_params_f32": "static inline in ggml-impl.h",
    "ggml_get_op_params_i32": "static inline in ggml-impl.h",
    "ggml_set_op_params": "static inline in ggml-impl.h",
    "ggml_set_op_params_f32": "static inline in ggml-impl.h",
    "ggml_set_op_params_i32": "static inline in ggml-impl.h",
    "ggml_hash_size": "ggml-impl.h: the graph's hash-set size",
    "ggml_graph_nbytes": "static in ggml.c: the bytes a graph object takes",
    "ggml_get_n_tasks": "static in ggml-cpu.c: each node's thread count in ggml_graph_plan",
    "gguf_type_size": "gguf.cpp's internal size table (GGUF_TYPE_SIZE)",
    "gguf_get_tensor_ne": "the shape of a GGUF tensor info, which C reads from the struct",
}


def _functions(module) -> set[str]:
    return {n for n in module.__all__ if n.startswith(("ggml_", "gguf_"))
            and callable(getattr(module, n)) and not isinstance(getattr(module, n), type)}


def test_ggml_facade_lists_every_name_it_has():
    public = {n for n in dir(ggml) if not n.startswith("_")} - {"annotations"}
    assert public == set(ggml.__all__)
    assert len(ggml.__all__) == len(set(ggml.__all__))


def test_ggml_h_and_gguf_h_coverage():
    oracle = {n for n in base_library_functions() if not n.startswith(OTHER_HEADERS)}
    assert len(oracle) >= 400
    missing = oracle - set(ggml.__all__) - set(ggml_cpu.__all__) - set(OUT_OF_SCOPE) - set(OTHER_ISSUE)
    assert missing == NOT_BUILT_GGML_H, (sorted(missing - NOT_BUILT_GGML_H),
                                          sorted(NOT_BUILT_GGML_H - missing))
    assert set(OUT_OF_SCOPE) <= oracle


def test_ggml_facade_functions_are_ggml_functions():
    """Every function the facade offers is one of the oracle's, or is in ENGINE_ONLY with a reason."""
    theirs = {n for n in dir(real) if n.startswith(("ggml_", "gguf_"))}
    assert _functions(ggml) - theirs == set(ENGINE_ONLY)


def test_ggml_constants_equal_the_oracle():
    shared = [n for n in ggml.__all__ if n.startswith(("GGML_", "GGUF_")) and isinstance(getattr(real, n, None), int)]
    assert len(shared) >= 200
    assert [n for n in shared if int(getattr(ggml, n)) != getattr(real, n)] == []


def test_every_op_type_and_unary_op_of_the_oracle_is_in_the_engine():
    """ggml's enums (ops, unary and GLU ops, types) name the same members with the same values."""
    for prefix in ("GGML_OP_", "GGML_UNARY_OP_", "GGML_GLU_OP_", "GGML_TYPE_"):
        theirs = {n: getattr(real, n) for n in dir(real) if n.startswith(prefix) and isinstance(getattr(real, n), int)
                  and not n.startswith(("GGML_OP_POOL_", "GGML_OP_HINT"))}
        assert len(theirs) >= 5, prefix
        assert {n: int(getattr(ggml, n)) for n in theirs if hasattr(ggml, n)} == theirs, prefix
