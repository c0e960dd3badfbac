"""ggml-cpu's extra buffer type CPU_REPACK: weights rewritten into interleaved blocks as they load.

llama.cpp's default CPU path asks the CPU device for its extra buffer types
(`ggml_backend_dev_get_extra_bufts`, through the registry's proc address) and tries them before
the plain CPU buffer type for every weight (llama_model_loader's select_weight_buft): a weight goes
to the first buffer type whose device supports the op the weight is used in. CPU_REPACK supports
only MUL_MAT of a 2-D weight and MUL_MAT_ID of a 3-D one (a MoE layer's experts) of a type the
build repacks, with F32 activations in host memory (`supports_op`); any other weight stays in the
CPU buffer (`placement` says why).

A CPU_REPACK buffer is a CPU buffer with three callbacks changed (ggml-cpu/repack.cpp):
init_tensor records the layout ggml chose for the tensor (ggml_repack_get_optimal_repack_type,
engine/quants/repack.py) in the tensor's `extra` field; set_tensor takes the whole tensor at once
and writes its bytes repacked (ggml's repack walks all of the tensor's rows in the layout's
groups: an expert tensor's experts one after another, no group straddling two, ne[1] being a
multiple of the group); get_tensor is absent (the bytes in the buffer are no longer the tensor's
plain blocks). Its buffers are not host buffers (is_host is NULL), though the CPU reads
them: the CPU device's supports_buft accepts them by name.
"""

from __future__ import annotations

import numpy as np

from engine.backend.buffer import TENSOR_ALIGNMENT, Buffer, BufferType, HostStruct, tensor_buffer, tensor_bytes
from engine.core.api import query, writes
from engine.core.errors import GGMLAssertionError, ggml_assert, ggml_assert_not_null
from engine.core.optable import GGMLOp
from engine.core.tensor import Tensor, ggml_n_dims, ggml_nbytes
from engine.core.types import GGMLType, TYPE_TRAITS
from engine.quants.repack import LAYOUTS, RepackLayout, optimal_layout

# the ops llama.cpp tests a weight with, by its name's last part before ".weight" (LLM_TENSOR_INFOS):
# the token, position and token-type tables are read by GET_ROWS; the experts of a MoE layer (3-D)
# by MUL_MAT_ID; every other quantized weight the engine's models load is a MUL_MAT operand (norms
# and SSM parameters are F32); a ".bias" is added (ADD; an experts' bias ADD_ID)
GET_ROWS_WEIGHTS = frozenset({"token_embd", "position_embd", "token_types"})
MUL_MAT_ID_WEIGHTS = frozenset({"ffn_gate_exps", "ffn_up_exps", "ffn_down_exps", "ffn_gate_up_exps",
                                "ffn_gate_chexps", "ffn_up_chexps", "ffn_down_chexps"})
# the dimensions CPU_REPACK's supports_op asks of the weight, by op
REPACK_DIMS: dict[int, int] = {GGMLOp.MUL_MAT: 2, GGMLOp.MUL_MAT_ID: 3}


class RepackBufferType(BufferType):
    """The CPU_REPACK buffer type (ggml_backend_cpu_repack_buffer_type)."""

    def __init__(self) -> None:
        super().__init__("CPU_REPACK", TENSOR_ALIGNMENT, is_host=False)
        self._traits: dict[tuple[int, str], HostStruct] = {}  # each layout's tensor_traits object

    def init_tensor(self, buf: Buffer, t: Tensor) -> int:
        """tensor->extra = the tensor_traits of ggml's layout for it (NULL where none fits)."""
        layout = optimal_layout(t.type, t.ne)
        assert t.data is not None  # (placed in the buffer before its init_tensor)
        buf.tensor_extra[int(t.data)] = layout
        t._r["extra"] = 0 if layout is None else self._traits_struct(buf, layout).base
        return 0

    def set_tensor(self, buf: Buffer, t: Tensor, src: np.ndarray, offset: int, size: int) -> None:
        """The whole tensor at once, written repacked (its layout's pack)."""
        fn = "ggml_backend_cpu_repack_buffer_set_tensor"
        ggml_assert(offset == 0, "offset == 0", fn)
        ggml_assert(size == ggml_nbytes(t), "size == ggml_nbytes(tensor)", fn)
        layout = ggml_assert_not_null(_layout_of(buf, t), "OK == 0", fn, f"{t.name}: no repacked layout for "
                                      f"{TYPE_TRAITS[t.type].type_name} with ne[1] = {int(t.ne[1])}")
        rows = src[:size].reshape(-1, int(t.nb[1]))
        layout.pack(rows, tensor_bytes(t, 0, size, fn))  # (straight into the buffer)

    def get_tensor(self, buf: Buffer, t: Tensor, offset: int, size: int) -> bytes:
        raise GGMLAssertionError("buf->iface.get_tensor != NULL", "ggml_backend_tensor_get",
                                 "a CPU_REPACK buffer cannot be read back: its bytes are repacked")

    def _traits_struct(self, buf: Buffer, layout: RepackLayout) -> HostStruct:
        key = (id(buf.space), layout.name)
        if key not in self._traits:
            self._traits[key] = HostStruct()
        return self._traits[key]


CPU_REPACK_BUFT = RepackBufferType()


@writes()
def ggml_backend_cpu_repack_buffer_type() -> BufferType:
    return CPU_REPACK_BUFT


@query
def ggml_backend_dev_get_extra_bufts(dev) -> list[BufferType]:
    """The CPU device's extra buffer types, in ggml's order: CPU_REPACK (the build has no AMX,
    KleidiAI or other accelerator buffer types)."""
    return [CPU_REPACK_BUFT]


def is_extra_buffer_type(buft: BufferType) -> bool:
    """ggml_backend_cpu_is_extra_buffer_type."""
    return buft is CPU_REPACK_BUFT


def _layout_of(buf: Buffer, t: Tensor) -> RepackLayout | None:
    """The layout init_tensor chose for t in buf (tensor->extra), by t's data."""
    layout = buf.tensor_extra.get(int(t.data)) if t.data is not None else None
    assert layout is None or isinstance(layout, RepackLayout)  # (what init_tensor keeps)
    return layout


def repacked_layout(t: Tensor) -> RepackLayout | None:
    """The layout t's bytes lie in, when t lives in a CPU_REPACK buffer (else None)."""
    buf = tensor_buffer(t)
    if buf is None or buf.buft is not CPU_REPACK_BUFT or t.data is None:
        return None
    return _layout_of(buf, t)


def supports_op(op: Tensor) -> bool:
    """CPU_REPACK's supports_op: MUL_MAT of a 2-D weight it has a layout for (MUL_MAT_ID of a
    3-D one), with F32 activations in host memory; nothing else."""
    want = REPACK_DIMS.get(op.op)
    if want is None:
        return False
    src0, src1 = op.source(0), op.source(1)
    if ggml_n_dims(src0) != want or optimal_layout(src0.type, src0.ne) is None:
        return False
    buf1 = tensor_buffer(src1)
    if buf1 is not None and not buf1.buft.is_host:
        return False
    return src1.type == GGMLType.F32


def weight_op(name: str) -> GGMLOp:
    """The op llama.cpp tests a weight with when it picks its buffer type (LLM_TENSOR_INFOS; a
    bias: ADD, or ADD_ID for the experts')."""
    parts = name.split(".")
    base = parts[-2] if len(parts) >= 2 and parts[-1] in ("weight", "bias") else parts[-1]
    if parts[-1] == "bias":
        return GGMLOp.ADD_ID if base in MUL_MAT_ID_WEIGHTS else GGMLOp.ADD
    if base in GET_ROWS_WEIGHTS:
        return GGMLOp.GET_ROWS
    return GGMLOp.MUL_MAT_ID if base in MUL_MAT_ID_WEIGHTS else GGMLOp.MUL_MAT


def placement(name: str, type_: int, ne) -> tuple[str, str]:
    """(buffer type, why) for a model weight on llama.cpp's default CPU path (extra buffer types
    on): CPU_REPACK where its supports_op takes the weight's op (MUL_MAT of a 2-D weight,
    MUL_MAT_ID of a 3-D one: a MoE layer's experts, each expert's matrix repacked), else CPU,
    with the reason."""
    tname = TYPE_TRAITS[type_].type_name
    op = weight_op(name)
    want = REPACK_DIMS.get(op)
    if want is None:
        return "CPU", f"used by {op.name}: CPU_REPACK takes only MUL_MAT and MUL_MAT_ID"
    n_dims = max((i + 1 for i, n in enumerate(ne) if int(n) != 1), default=1)
    if n_dims != want:
        return "CPU", f"{n_dims}-D: CPU_REPACK takes {op.name} of {want}-D weights"
    layout = optimal_layout(type_, ne)
    if layout is None:
        if GGMLType(type_) in LAYOUTS:
            return "CPU", f"ne[1] = {int(ne[1])} is not a multiple of the layout's rows"
        return "CPU", f"{tname}: this build has no repacked layout for it"
    return "CPU_REPACK", f"{tname} -> {layout.name}"
