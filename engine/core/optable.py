"""ggml's operators as data: `enum ggml_op`, `enum ggml_unary_op`, `enum ggml_glu_op`.

Mirrors GGML_OP_NAME and GGML_OP_SYMBOL in ggml.c at the oracle's version (ggml 0.15.3: 97 ops;
newer ggml adds LIGHTNING_INDEXER and the DSV4_* ops before UNARY, which shifts UNARY..GLU by 4).
The enums are declared in ggml's order, and the symbol table is keyed by op, its size asserted
as ggml asserts GGML_OP_COUNT after GGML_OP_SYMBOL; OP_TABLE reads both, so they cannot disagree.
"""

from __future__ import annotations

import enum

from engine.core.api import query


class GGMLOp(enum.IntEnum):
    """enum ggml_op, in ggml's order."""

    NONE = 0
    DUP = 1
    ADD = 2
    ADD_ID = 3
    ADD1 = 4
    ACC = 5
    SUB = 6
    MUL = 7
    DIV = 8
    SQR = 9
    SQRT = 10
    LOG = 11
    SIN = 12
    COS = 13
    SUM = 14
    SUM_ROWS = 15
    CUMSUM = 16
    MEAN = 17
    ARGMAX = 18
    COUNT_EQUAL = 19
    REPEAT = 20
    REPEAT_BACK = 21
    CONCAT = 22
    SILU_BACK = 23
    NORM = 24
    RMS_NORM = 25
    RMS_NORM_BACK = 26
    GROUP_NORM = 27
    L2_NORM = 28
    MUL_MAT = 29
    MUL_MAT_ID = 30
    OUT_PROD = 31
    SCALE = 32
    SET = 33
    CPY = 34
    CONT = 35
    RESHAPE = 36
    VIEW = 37
    PERMUTE = 38
    TRANSPOSE = 39
    GET_ROWS = 40
    GET_ROWS_BACK = 41
    SET_ROWS = 42
    DIAG = 43
    DIAG_MASK_INF = 44
    DIAG_MASK_ZERO = 45
    SOFT_MAX = 46
    SOFT_MAX_BACK = 47
    ROPE = 48
    ROPE_BACK = 49
    CLAMP = 50
    CONV_TRANSPOSE_1D = 51
    IM2COL = 52
    IM2COL_BACK = 53
    IM2COL_3D = 54
    COL2IM_1D = 55
    CONV_2D = 56
    CONV_3D = 57
    CONV_2D_DW = 58
    CONV_TRANSPOSE_2D = 59
    POOL_1D = 60
    POOL_2D = 61
    POOL_2D_BACK = 62
    UPSCALE = 63
    PAD = 64
    PAD_REFLECT_1D = 65
    ROLL = 66
    ARANGE = 67
    TIMESTEP_EMBEDDING = 68
    ARGSORT = 69
    TOP_K = 70
    LEAKY_RELU = 71
    TRI = 72
    FILL = 73
    FLASH_ATTN_EXT = 74
    FLASH_ATTN_BACK = 75
    SSM_CONV = 76
    SSM_SCAN = 77
    WIN_PART = 78
    WIN_UNPART = 79
    GET_REL_POS = 80
    ADD_REL_POS = 81
    RWKV_WKV6 = 82
    GATED_LINEAR_ATTN = 83
    RWKV_WKV7 = 84
    SOLVE_TRI = 85
    GATED_DELTA_NET = 86
    UNARY = 87
    MAP_CUSTOM1 = 88
    MAP_CUSTOM2 = 89
    MAP_CUSTOM3 = 90
    CUSTOM = 91
    CROSS_ENTROPY_LOSS = 92
    CROSS_ENTROPY_LOSS_BACK = 93
    OPT_STEP_ADAMW = 94
    OPT_STEP_SGD = 95
    GLU = 96


# GGML_OP_SYMBOL: what ggml_op_symbol returns (the short form ggml_graph_dump_dot prints)
GGML_OP_SYMBOL: dict[GGMLOp, str] = {
    GGMLOp.NONE: 'none',
    GGMLOp.DUP: 'x',
    GGMLOp.ADD: 'x+y',
    GGMLOp.ADD_ID: 'x[i]+y',
    GGMLOp.ADD1: 'x+y',
    GGMLOp.ACC: 'view(x,nb,offset)+=y->x',
    GGMLOp.SUB: 'x-y',
    GGMLOp.MUL: 'x*y',
    GGMLOp.DIV: 'x/y',
    GGMLOp.SQR: 'x^2',
    GGMLOp.SQRT: '√x',
    GGMLOp.LOG: 'log(x)',
    GGMLOp.SIN: 'sin(x)',
    GGMLOp.COS: 'cos(x)',
    GGMLOp.SUM: 'Σx',
    GGMLOp.SUM_ROWS: 'Σx_k',
    GGMLOp.CUMSUM: 'cumsum(x)',
    GGMLOp.MEAN: 'Σx/n',
    GGMLOp.ARGMAX: 'argmax(x)',
    GGMLOp.COUNT_EQUAL: 'count_equal(x)',
    GGMLOp.REPEAT: 'repeat(x)',
    GGMLOp.REPEAT_BACK: 'repeat_back(x)',
    GGMLOp.CONCAT: 'concat(x, y)',
    GGMLOp.SILU_BACK: 'silu_back(x)',
    GGMLOp.NORM: 'norm(x)',
    GGMLOp.RMS_NORM: 'rms_norm(x)',
    GGMLOp.RMS_NORM_BACK: 'rms_norm_back(x)',
    GGMLOp.GROUP_NORM: 'group_norm(x)',
    GGMLOp.L2_NORM: 'l2_norm(x)',
    GGMLOp.MUL_MAT: 'X*Y',
    GGMLOp.MUL_MAT_ID: 'X[i]*Y',
    GGMLOp.OUT_PROD: 'X*Y',
    GGMLOp.SCALE: 'x*v',
    GGMLOp.SET: 'y-\\>view(x)',
    GGMLOp.CPY: 'x-\\>y',
    GGMLOp.CONT: 'cont(x)',
    GGMLOp.RESHAPE: 'reshape(x)',
    GGMLOp.VIEW: 'view(x)',
    GGMLOp.PERMUTE: 'permute(x)',
    GGMLOp.TRANSPOSE: 'transpose(x)',
    GGMLOp.GET_ROWS: 'get_rows(x)',
    GGMLOp.GET_ROWS_BACK: 'get_rows_back(x)',
    GGMLOp.SET_ROWS: 'set_rows(x)',
    GGMLOp.DIAG: 'diag(x)',
    GGMLOp.DIAG_MASK_INF: 'diag_mask_inf(x)',
    GGMLOp.DIAG_MASK_ZERO: 'diag_mask_zero(x)',
    GGMLOp.SOFT_MAX: 'soft_max(x)',
    GGMLOp.SOFT_MAX_BACK: 'soft_max_back(x)',
    GGMLOp.ROPE: 'rope(x)',
    GGMLOp.ROPE_BACK: 'rope_back(x)',
    GGMLOp.CLAMP: 'clamp(x)',
    GGMLOp.CONV_TRANSPOSE_1D: 'conv_transpose_1d(x)',
    GGMLOp.IM2COL: 'im2col(x)',
    GGMLOp.IM2COL_BACK: 'im2col_back(x)',
    GGMLOp.IM2COL_3D: 'im2col_3d(x)',
    GGMLOp.COL2IM_1D: 'col2im_1d(x)',
    GGMLOp.CONV_2D: 'conv_2d(x)',
    GGMLOp.CONV_3D: 'conv_3d(x)',
    GGMLOp.CONV_2D_DW: 'conv_2d_dw(x)',
    GGMLOp.CONV_TRANSPOSE_2D: 'conv_transpose_2d(x)',
    GGMLOp.POOL_1D: 'pool_1d(x)',
    GGMLOp.POOL_2D: 'pool_2d(x)',
    GGMLOp.POOL_2D_BACK: 'pool_2d_back(x)',
    GGMLOp.UPSCALE: 'upscale(x)',
    GGMLOp.PAD: 'pad(x)',
    GGMLOp.PAD_REFLECT_1D: 'pad_reflect_1d(x)',
    GGMLOp.ROLL: 'roll(x)',
    GGMLOp.ARANGE: 'arange(start, stop, step)',
    GGMLOp.TIMESTEP_EMBEDDING: 'timestep_embedding(timesteps, dim, max_period)',
    GGMLOp.ARGSORT: 'argsort(x)',
    GGMLOp.TOP_K: 'top_k(x)',
    GGMLOp.LEAKY_RELU: 'leaky_relu(x)',
    GGMLOp.TRI: 'tri(x)',
    GGMLOp.FILL: 'fill(x, c)',
    GGMLOp.FLASH_ATTN_EXT: 'flash_attn_ext(x)',
    GGMLOp.FLASH_ATTN_BACK: 'flash_attn_back(x)',
    GGMLOp.SSM_CONV: 'ssm_conv(x)',
    GGMLOp.SSM_SCAN: 'ssm_scan(x)',
    GGMLOp.WIN_PART: 'win_part(x)',
    GGMLOp.WIN_UNPART: 'win_unpart(x)',
    GGMLOp.GET_REL_POS: 'get_rel_pos(x)',
    GGMLOp.ADD_REL_POS: 'add_rel_pos(x)',
    GGMLOp.RWKV_WKV6: 'rwkv_wkv6(k, v, r, tf, td, s)',
    GGMLOp.GATED_LINEAR_ATTN: 'gated_linear_attn(k, v, q, gate, s)',
    GGMLOp.RWKV_WKV7: 'rwkv_wkv7(r, w, k, v, a, b, s)',
    GGMLOp.SOLVE_TRI: 'A X = B, A triangular, solve X',
    GGMLOp.GATED_DELTA_NET: 'gated_delta_net(q, k, v, g, beta, s)',
    GGMLOp.UNARY: 'unary(x)',
    GGMLOp.MAP_CUSTOM1: 'map_custom(x)',
    GGMLOp.MAP_CUSTOM2: 'map_custom(x,y)',
    GGMLOp.MAP_CUSTOM3: 'map_custom(x,y,z)',
    GGMLOp.CUSTOM: 'custom(x)',
    GGMLOp.CROSS_ENTROPY_LOSS: 'cross_entropy_loss(x,y)',
    GGMLOp.CROSS_ENTROPY_LOSS_BACK: 'cross_entropy_loss_back(x,y)',
    GGMLOp.OPT_STEP_ADAMW: 'adamw(x)',
    GGMLOp.OPT_STEP_SGD: 'sgd(x)',
    GGMLOp.GLU: 'glu(x)',
}
assert list(GGML_OP_SYMBOL) == list(GGMLOp)  # one symbol per op, in order

# (NAME, symbol) in enum order: GGML_OP_NAME and GGML_OP_SYMBOL side by side
OP_TABLE: tuple[tuple[str, str], ...] = tuple((op.name, GGML_OP_SYMBOL[op]) for op in GGMLOp)
GGML_OP_COUNT = len(OP_TABLE)
assert GGML_OP_COUNT == 97  # the oracle's GGML_OP_COUNT
assert [int(op) for op in GGMLOp] == list(range(GGML_OP_COUNT))  # numbered as C numbers them


class GGMLUnaryOp(enum.IntEnum):
    """enum ggml_unary_op."""

    ABS = 0
    SGN = 1
    NEG = 2
    STEP = 3
    TANH = 4
    ELU = 5
    RELU = 6
    SIGMOID = 7
    GELU = 8
    GELU_QUICK = 9
    SILU = 10
    HARDSWISH = 11
    HARDSIGMOID = 12
    EXP = 13
    EXPM1 = 14
    SOFTPLUS = 15
    GELU_ERF = 16
    XIELU = 17
    FLOOR = 18
    CEIL = 19
    ROUND = 20
    TRUNC = 21


UNARY_OPS = tuple(op.name for op in GGMLUnaryOp)
GGML_UNARY_OP_COUNT = len(UNARY_OPS)
assert [int(op) for op in GGMLUnaryOp] == list(range(GGML_UNARY_OP_COUNT))


class GGMLGluOp(enum.IntEnum):
    """enum ggml_glu_op."""

    REGLU = 0
    GEGLU = 1
    SWIGLU = 2
    SWIGLU_OAI = 3
    GEGLU_ERF = 4
    GEGLU_QUICK = 5


GLU_OPS = tuple(op.name for op in GGMLGluOp)
GGML_GLU_OP_COUNT = len(GLU_OPS)
assert [int(op) for op in GGMLGluOp] == list(range(GGML_GLU_OP_COUNT))

# ops that only reinterpret their source's memory: compute skips them without a barrier
VIEW_OPS = frozenset({GGMLOp.NONE, GGMLOp.RESHAPE, GGMLOp.VIEW, GGMLOp.PERMUTE, GGMLOp.TRANSPOSE})


@query
def ggml_op_name(op: int) -> str:
    """ggml_op_name."""
    return OP_TABLE[op][0]


@query
def ggml_op_symbol(op: int) -> str:
    """ggml_op_symbol: the short form ggml_graph_dump_dot prints."""
    return OP_TABLE[op][1]


@query
def ggml_unary_op_name(op: int) -> str:
    """ggml_unary_op_name."""
    return UNARY_OPS[op]


@query
def ggml_glu_op_name(op: int) -> str:
    """ggml_glu_op_name."""
    return GLU_OPS[op]
