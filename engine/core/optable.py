"""ggml's operators as data: `enum ggml_op`, `enum ggml_unary_op`, `enum ggml_glu_op`.

Mirrors GGML_OP_NAME and GGML_OP_SYMBOL in ggml.c at the oracle's version (ggml 0.15.3: 97 ops;
newer ggml adds LIGHTNING_INDEXER and the DSV4_* ops before UNARY, which shifts UNARY..GLU by 4).
One table in ggml's order; the enums are built from it so the two cannot disagree.
"""

from __future__ import annotations

import enum

from engine.core.api import query

# (NAME, symbol) in enum order
OP_TABLE: tuple[tuple[str, str], ...] = (
    ('NONE', 'none'),
    ('DUP', 'x'),
    ('ADD', 'x+y'),
    ('ADD_ID', 'x[i]+y'),
    ('ADD1', 'x+y'),
    ('ACC', 'view(x,nb,offset)+=y->x'),
    ('SUB', 'x-y'),
    ('MUL', 'x*y'),
    ('DIV', 'x/y'),
    ('SQR', 'x^2'),
    ('SQRT', '√x'),
    ('LOG', 'log(x)'),
    ('SIN', 'sin(x)'),
    ('COS', 'cos(x)'),
    ('SUM', 'Σx'),
    ('SUM_ROWS', 'Σx_k'),
    ('CUMSUM', 'cumsum(x)'),
    ('MEAN', 'Σx/n'),
    ('ARGMAX', 'argmax(x)'),
    ('COUNT_EQUAL', 'count_equal(x)'),
    ('REPEAT', 'repeat(x)'),
    ('REPEAT_BACK', 'repeat_back(x)'),
    ('CONCAT', 'concat(x, y)'),
    ('SILU_BACK', 'silu_back(x)'),
    ('NORM', 'norm(x)'),
    ('RMS_NORM', 'rms_norm(x)'),
    ('RMS_NORM_BACK', 'rms_norm_back(x)'),
    ('GROUP_NORM', 'group_norm(x)'),
    ('L2_NORM', 'l2_norm(x)'),
    ('MUL_MAT', 'X*Y'),
    ('MUL_MAT_ID', 'X[i]*Y'),
    ('OUT_PROD', 'X*Y'),
    ('SCALE', 'x*v'),
    ('SET', 'y-\\>view(x)'),
    ('CPY', 'x-\\>y'),
    ('CONT', 'cont(x)'),
    ('RESHAPE', 'reshape(x)'),
    ('VIEW', 'view(x)'),
    ('PERMUTE', 'permute(x)'),
    ('TRANSPOSE', 'transpose(x)'),
    ('GET_ROWS', 'get_rows(x)'),
    ('GET_ROWS_BACK', 'get_rows_back(x)'),
    ('SET_ROWS', 'set_rows(x)'),
    ('DIAG', 'diag(x)'),
    ('DIAG_MASK_INF', 'diag_mask_inf(x)'),
    ('DIAG_MASK_ZERO', 'diag_mask_zero(x)'),
    ('SOFT_MAX', 'soft_max(x)'),
    ('SOFT_MAX_BACK', 'soft_max_back(x)'),
    ('ROPE', 'rope(x)'),
    ('ROPE_BACK', 'rope_back(x)'),
    ('CLAMP', 'clamp(x)'),
    ('CONV_TRANSPOSE_1D', 'conv_transpose_1d(x)'),
    ('IM2COL', 'im2col(x)'),
    ('IM2COL_BACK', 'im2col_back(x)'),
    ('IM2COL_3D', 'im2col_3d(x)'),
    ('COL2IM_1D', 'col2im_1d(x)'),
    ('CONV_2D', 'conv_2d(x)'),
    ('CONV_3D', 'conv_3d(x)'),
    ('CONV_2D_DW', 'conv_2d_dw(x)'),
    ('CONV_TRANSPOSE_2D', 'conv_transpose_2d(x)'),
    ('POOL_1D', 'pool_1d(x)'),
    ('POOL_2D', 'pool_2d(x)'),
    ('POOL_2D_BACK', 'pool_2d_back(x)'),
    ('UPSCALE', 'upscale(x)'),
    ('PAD', 'pad(x)'),
    ('PAD_REFLECT_1D', 'pad_reflect_1d(x)'),
    ('ROLL', 'roll(x)'),
    ('ARANGE', 'arange(start, stop, step)'),
    ('TIMESTEP_EMBEDDING', 'timestep_embedding(timesteps, dim, max_period)'),
    ('ARGSORT', 'argsort(x)'),
    ('TOP_K', 'top_k(x)'),
    ('LEAKY_RELU', 'leaky_relu(x)'),
    ('TRI', 'tri(x)'),
    ('FILL', 'fill(x, c)'),
    ('FLASH_ATTN_EXT', 'flash_attn_ext(x)'),
    ('FLASH_ATTN_BACK', 'flash_attn_back(x)'),
    ('SSM_CONV', 'ssm_conv(x)'),
    ('SSM_SCAN', 'ssm_scan(x)'),
    ('WIN_PART', 'win_part(x)'),
    ('WIN_UNPART', 'win_unpart(x)'),
    ('GET_REL_POS', 'get_rel_pos(x)'),
    ('ADD_REL_POS', 'add_rel_pos(x)'),
    ('RWKV_WKV6', 'rwkv_wkv6(k, v, r, tf, td, s)'),
    ('GATED_LINEAR_ATTN', 'gated_linear_attn(k, v, q, gate, s)'),
    ('RWKV_WKV7', 'rwkv_wkv7(r, w, k, v, a, b, s)'),
    ('SOLVE_TRI', 'A X = B, A triangular, solve X'),
    ('GATED_DELTA_NET', 'gated_delta_net(q, k, v, g, beta, s)'),
    ('UNARY', 'unary(x)'),
    ('MAP_CUSTOM1', 'map_custom(x)'),
    ('MAP_CUSTOM2', 'map_custom(x,y)'),
    ('MAP_CUSTOM3', 'map_custom(x,y,z)'),
    ('CUSTOM', 'custom(x)'),
    ('CROSS_ENTROPY_LOSS', 'cross_entropy_loss(x,y)'),
    ('CROSS_ENTROPY_LOSS_BACK', 'cross_entropy_loss_back(x,y)'),
    ('OPT_STEP_ADAMW', 'adamw(x)'),
    ('OPT_STEP_SGD', 'sgd(x)'),
    ('GLU', 'glu(x)'),
)

GGMLOp = enum.IntEnum("GGMLOp", [(name, i) for i, (name, _) in enumerate(OP_TABLE)])
GGML_OP_COUNT = len(OP_TABLE)
assert GGML_OP_COUNT == 97  # the oracle's GGML_OP_COUNT

UNARY_OPS = ("ABS", "SGN", "NEG", "STEP", "TANH", "ELU", "RELU", "SIGMOID", "GELU", "GELU_QUICK",
             "SILU", "HARDSWISH", "HARDSIGMOID", "EXP", "EXPM1", "SOFTPLUS", "GELU_ERF", "XIELU",
             "FLOOR", "CEIL", "ROUND", "TRUNC")
GGMLUnaryOp = enum.IntEnum("GGMLUnaryOp", [(name, i) for i, name in enumerate(UNARY_OPS)])
GGML_UNARY_OP_COUNT = len(UNARY_OPS)

GLU_OPS = ("REGLU", "GEGLU", "SWIGLU", "SWIGLU_OAI", "GEGLU_ERF", "GEGLU_QUICK")
GGMLGluOp = enum.IntEnum("GGMLGluOp", [(name, i) for i, name in enumerate(GLU_OPS)])
GGML_GLU_OP_COUNT = len(GLU_OPS)

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
