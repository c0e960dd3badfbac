"""The ggml.h facade: ggml's names, signatures and constants, so a program reads like its C twin.

    from engine.ggml import *

    ctx = ggml_init(ggml_init_params(mem_size=16 * 1024 * 1024))
    x = ggml_new_tensor_1d(ctx, GGML_TYPE_F32, 1)      # a 1-element tensor: 368 bytes of header,
    ggml_set_name(x, "x")                              # struct and padding, then 16 of data
    a = ggml_new_tensor_1d(ctx, GGML_TYPE_F32, 1)
    b = ggml_new_tensor_1d(ctx, GGML_TYPE_F32, 1)
    x2 = ggml_mul(ctx, x, x)                           # records the op, computes nothing
    f = ggml_add(ctx, ggml_mul(ctx, a, x2), b)         # f(x) = a*x^2 + b

    print(format_tensor(f))                            # as gdb's `p *f` prints the struct

Differences from C, all forced by Python: out-pointers become return values; `ctx.pool` holds
the bytes a `void *` would point at (pointers themselves are simulated addresses); strings are str.
"""

from __future__ import annotations

from engine.core.api import query as _query  # (the debugger's marker, not a name of ggml.h)
from engine.core.layout import (
    GGML_MAX_DIMS, GGML_MAX_NAME, GGML_MAX_OP_PARAMS, GGML_MAX_SRC, GGML_MEM_ALIGN,
    GGML_OBJECT_SIZE, GGML_PAD, GGML_TENSOR_SIZE,
)
from engine.core.errors import (
    GGMLAssertionError, GGMLNotSupportedError, GGMLPoolError, ggml_assert,
)
from engine.core.types import (
    GGMLType, GGML_TYPE_COUNT, ggml_blck_size, ggml_is_quantized, ggml_row_size, ggml_type_name,
    ggml_type_size,
)
from engine.core.context import (
    Context, GGML_OBJECT_TYPE_GRAPH, GGML_OBJECT_TYPE_TENSOR, GGML_OBJECT_TYPE_WORK_BUFFER,
    ggml_free, ggml_get_mem_buffer, ggml_get_mem_size, ggml_get_no_alloc, ggml_init,
    ggml_init_params, ggml_new_buffer, ggml_new_object, ggml_print_object, ggml_print_objects, ggml_reset,
    ggml_set_no_alloc, ggml_tensor_overhead, ggml_used_mem,
)
from engine.core.tensor import (
    GGML_TENSOR_FLAG_COMPUTE, GGML_TENSOR_FLAG_INPUT, GGML_TENSOR_FLAG_LOSS,
    GGML_TENSOR_FLAG_OUTPUT, GGML_TENSOR_FLAG_PARAM, Tensor, ggml_are_same_shape,
    ggml_are_same_stride, ggml_can_repeat, ggml_can_repeat_rows, ggml_dup_tensor,
    ggml_element_size, ggml_format_name, ggml_get_name, ggml_is_3d, ggml_is_contiguous,
    ggml_is_contiguous_0, ggml_is_contiguous_1, ggml_is_contiguous_2, ggml_is_contiguous_channels,
    ggml_is_contiguous_rows, ggml_is_contiguously_allocated, ggml_is_empty, ggml_is_matrix,
    ggml_is_permuted, ggml_is_scalar, ggml_is_transposed, ggml_is_vector, ggml_n_dims, ggml_nbytes,
    ggml_nbytes_pad, ggml_nelements, ggml_new_tensor, ggml_new_tensor_1d, ggml_new_tensor_2d,
    ggml_new_tensor_3d, ggml_new_tensor_4d, ggml_new_tensor_impl, ggml_nrows, ggml_set_input,
    ggml_set_loss, ggml_set_name, ggml_set_output, ggml_set_param, ggml_view_tensor,
)
from engine.core.tensor_list import (
    ggml_get_first_tensor, ggml_get_max_tensor_size, ggml_get_next_tensor, ggml_get_tensor,
)
from engine.core.tensor_data import (
    data_bytes, ggml_get_data_f32, ggml_get_f32_1d, ggml_get_i32_1d, ggml_new_f32, ggml_new_i32,
    ggml_set_f32, ggml_set_f32_1d, ggml_set_i32, ggml_set_i32_1d, set_data, to_numpy,
)
from engine.ops.base import (
    ggml_get_op_params_f32, ggml_get_op_params_i32, ggml_set_op_params, ggml_set_op_params_f32,
    ggml_set_op_params_i32,
)
from engine.ops.views import (
    ggml_cast, ggml_cont, ggml_cont_1d, ggml_cont_2d, ggml_cont_3d, ggml_cont_4d, ggml_cpy,
    ggml_dup, ggml_dup_inplace, ggml_permute, ggml_reshape, ggml_reshape_1d, ggml_reshape_2d,
    ggml_reshape_3d, ggml_reshape_4d, ggml_transpose, ggml_view_1d, ggml_view_2d, ggml_view_3d,
    ggml_view_4d,
)
from engine.ops.math import (
    ggml_acc, ggml_acc_inplace, ggml_add, ggml_add1, ggml_add1_inplace, ggml_add_cast, ggml_add_id,
    ggml_add_inplace, ggml_arange, ggml_argmax, ggml_argsort, ggml_argsort_top_k, ggml_concat,
    ggml_count_equal, ggml_cross_entropy_loss, ggml_cumsum, ggml_diag, ggml_div, ggml_div_inplace,
    ggml_fill, ggml_fill_inplace, ggml_group_norm, ggml_group_norm_inplace, ggml_is_padded_1d,
    ggml_l2_norm, ggml_l2_norm_inplace, ggml_mean, ggml_mul, ggml_mul_inplace, ggml_norm,
    ggml_norm_inplace, ggml_repeat, ggml_repeat_4d, ggml_rms_norm, ggml_rms_norm_inplace,
    ggml_scale, ggml_scale_bias, ggml_scale_bias_inplace, ggml_scale_inplace, ggml_set, ggml_set_1d,
    ggml_set_1d_inplace, ggml_set_2d, ggml_set_2d_inplace, ggml_set_inplace, GGML_SORT_ORDER_ASC,
    GGML_SORT_ORDER_DESC, ggml_sub, ggml_sub_inplace, ggml_sum, ggml_sum_rows, ggml_top_k, ggml_tri,
    GGML_TRI_TYPE_LOWER, GGML_TRI_TYPE_LOWER_DIAG, GGML_TRI_TYPE_UPPER, GGML_TRI_TYPE_UPPER_DIAG,
)
from engine.ops.matmul import (
    ggml_can_mul_mat, ggml_can_out_prod, GGML_HINT_NONE, GGML_HINT_SRC0_IS_HADAMARD, ggml_mul_mat,
    ggml_mul_mat_id, ggml_mul_mat_set_hint, ggml_mul_mat_set_prec, ggml_out_prod, GGML_PREC_DEFAULT,
    GGML_PREC_F32, ggml_solve_tri,
)
from engine.ops.unary import (
    ggml_abs, ggml_abs_inplace, ggml_ceil, ggml_ceil_inplace, ggml_clamp, ggml_cos,
    ggml_cos_inplace, ggml_elu, ggml_elu_inplace, ggml_exp, ggml_exp_inplace, ggml_expm1,
    ggml_expm1_inplace, ggml_floor, ggml_floor_inplace, ggml_geglu, ggml_geglu_erf,
    ggml_geglu_erf_split, ggml_geglu_erf_swapped, ggml_geglu_quick, ggml_geglu_quick_split,
    ggml_geglu_quick_swapped, ggml_geglu_split, ggml_geglu_swapped, ggml_gelu, ggml_gelu_erf,
    ggml_gelu_erf_inplace, ggml_gelu_inplace, ggml_gelu_quick, ggml_gelu_quick_inplace, ggml_glu,
    ggml_glu_split, ggml_hardsigmoid, ggml_hardswish, ggml_leaky_relu, ggml_log, ggml_log_inplace,
    ggml_neg, ggml_neg_inplace, ggml_reglu, ggml_reglu_split, ggml_reglu_swapped, ggml_relu,
    ggml_relu_inplace, ggml_round, ggml_round_inplace, ggml_sgn, ggml_sgn_inplace, ggml_sigmoid,
    ggml_sigmoid_inplace, ggml_silu, ggml_silu_inplace, ggml_sin, ggml_sin_inplace, ggml_softplus,
    ggml_softplus_inplace, ggml_sqr, ggml_sqr_inplace, ggml_sqrt, ggml_sqrt_inplace, ggml_step,
    ggml_step_inplace, ggml_swiglu, ggml_swiglu_oai, ggml_swiglu_split, ggml_swiglu_swapped,
    ggml_tanh, ggml_tanh_inplace, ggml_trunc, ggml_trunc_inplace, ggml_unary, ggml_unary_inplace,
    ggml_xielu,
)
from engine.ops.rope import (
    GGML_MROPE_SECTIONS, ggml_rope, ggml_rope_custom, ggml_rope_custom_inplace, ggml_rope_ext,
    ggml_rope_ext_back, ggml_rope_ext_inplace, ggml_rope_inplace, ggml_rope_multi,
    ggml_rope_multi_back, ggml_rope_multi_inplace, GGML_ROPE_TYPE_IMROPE, GGML_ROPE_TYPE_MROPE,
    GGML_ROPE_TYPE_NEOX, GGML_ROPE_TYPE_NORMAL, GGML_ROPE_TYPE_VISION, ggml_rope_yarn_corr_dims,
)
from engine.ops.conv import (
    ggml_col2im_1d, ggml_conv_1d, ggml_conv_1d_dw, ggml_conv_1d_dw_ph, ggml_conv_1d_ph,
    ggml_conv_2d, ggml_conv_2d_direct, ggml_conv_2d_dw, ggml_conv_2d_dw_direct, ggml_conv_2d_s1_ph,
    ggml_conv_2d_sk_p0, ggml_conv_3d, ggml_conv_3d_direct, ggml_conv_transpose_1d,
    ggml_conv_transpose_2d_p0, ggml_im2col, ggml_im2col_3d,
)
from engine.ops.nn import (
    ggml_add_rel_pos, ggml_add_rel_pos_inplace, ggml_diag_mask_inf, ggml_diag_mask_inf_inplace,
    ggml_diag_mask_zero, ggml_diag_mask_zero_inplace, ggml_flash_attn_ext,
    ggml_flash_attn_ext_add_sinks, ggml_flash_attn_ext_get_prec, ggml_flash_attn_ext_set_prec,
    ggml_get_rel_pos, ggml_get_rows, ggml_interpolate, GGML_OP_POOL_AVG, GGML_OP_POOL_COUNT,
    GGML_OP_POOL_MAX, ggml_pad, ggml_pad_circular, ggml_pad_ext, ggml_pad_ext_circular,
    ggml_pad_reflect_1d, ggml_pool_1d, ggml_pool_2d, ggml_roll, GGML_SCALE_FLAG_ALIGN_CORNERS,
    GGML_SCALE_FLAG_ANTIALIAS, GGML_SCALE_MODE_BICUBIC, GGML_SCALE_MODE_BILINEAR,
    GGML_SCALE_MODE_COUNT, GGML_SCALE_MODE_NEAREST, ggml_set_rows, ggml_soft_max,
    ggml_soft_max_add_sinks, ggml_soft_max_ext, ggml_soft_max_ext_inplace, ggml_soft_max_inplace,
    ggml_timestep_embedding, ggml_upscale, ggml_upscale_ext, ggml_win_part, ggml_win_unpart,
)
from engine.ops.backward import (
    ggml_cross_entropy_loss_back, ggml_flash_attn_back, ggml_get_rows_back, ggml_im2col_back,
    ggml_opt_step_adamw, ggml_opt_step_sgd, ggml_pool_2d_back, ggml_repeat_back, ggml_rms_norm_back,
    ggml_silu_back, ggml_soft_max_ext_back, ggml_soft_max_ext_back_inplace,
)
from engine.ops.custom import (
    ggml_custom_4d, ggml_custom_inplace, ggml_map_custom1, ggml_map_custom1_inplace,
    ggml_map_custom2, ggml_map_custom2_inplace, ggml_map_custom3, ggml_map_custom3_inplace,
    GGML_N_TASKS_MAX,
)
from engine.ops.ssm import (
    ggml_gated_delta_net, ggml_gated_linear_attn, ggml_rwkv_wkv6, ggml_rwkv_wkv7, ggml_ssm_conv,
    ggml_ssm_scan,
)
from engine.compute.kernels.floatmath import ggml_compute_softplus_f32
from engine.core.optable import (
    GGMLGluOp, GGMLOp, GGMLUnaryOp, GGML_GLU_OP_COUNT, GGML_OP_COUNT, GGML_UNARY_OP_COUNT,
    ggml_glu_op_name, ggml_op_name, ggml_op_symbol, ggml_unary_op_name,
)
from engine.core.graph import (
    GGML_DEFAULT_GRAPH_SIZE, GGML_HASHSET_ALREADY_EXISTS, GGML_HASHSET_FULL, Graph,
    ggml_build_forward_expand, ggml_build_forward_select, ggml_graph_add_node, ggml_graph_clear,
    ggml_graph_cpy, ggml_graph_dump_dot, ggml_graph_get_grad, ggml_graph_get_grad_acc,
    ggml_graph_get_tensor, ggml_graph_n_nodes, ggml_graph_nbytes, ggml_graph_node,
    ggml_graph_overhead, ggml_graph_overhead_custom, ggml_graph_print, ggml_graph_size,
    ggml_graph_view, ggml_hash_size, ggml_new_graph, ggml_new_graph_custom,
)
from engine.autodiff import (
    ggml_build_backward_expand, ggml_graph_dup, ggml_graph_reset, ggml_set_zero,
)
from engine.ggml_util import (
    GGML_COMMIT, GGML_FTYPE_ALL_F32, GGML_FTYPE_MOSTLY_BF16, GGML_FTYPE_MOSTLY_F16,
    GGML_FTYPE_MOSTLY_IQ1_M, GGML_FTYPE_MOSTLY_IQ1_S, GGML_FTYPE_MOSTLY_IQ2_S,
    GGML_FTYPE_MOSTLY_IQ2_XS, GGML_FTYPE_MOSTLY_IQ2_XXS, GGML_FTYPE_MOSTLY_IQ3_S,
    GGML_FTYPE_MOSTLY_IQ3_XXS, GGML_FTYPE_MOSTLY_IQ4_NL, GGML_FTYPE_MOSTLY_IQ4_XS,
    GGML_FTYPE_MOSTLY_MXFP4, GGML_FTYPE_MOSTLY_NVFP4, GGML_FTYPE_MOSTLY_Q1_0,
    GGML_FTYPE_MOSTLY_Q2_K, GGML_FTYPE_MOSTLY_Q3_K, GGML_FTYPE_MOSTLY_Q4_0, GGML_FTYPE_MOSTLY_Q4_1,
    GGML_FTYPE_MOSTLY_Q4_1_SOME_F16, GGML_FTYPE_MOSTLY_Q4_K, GGML_FTYPE_MOSTLY_Q5_0,
    GGML_FTYPE_MOSTLY_Q5_1, GGML_FTYPE_MOSTLY_Q5_K, GGML_FTYPE_MOSTLY_Q6_K, GGML_FTYPE_MOSTLY_Q8_0,
    GGML_FTYPE_UNKNOWN, GGML_LOG_LEVEL_CONT,
    GGML_LOG_LEVEL_DEBUG, GGML_LOG_LEVEL_ERROR, GGML_LOG_LEVEL_INFO, GGML_LOG_LEVEL_NONE,
    GGML_LOG_LEVEL_WARN, GGML_STATUS_ALLOC_FAILED, GGML_STATUS_FAILED, GGML_VERSION, ggml_abort,
    ggml_bf16_to_fp32, ggml_bf16_to_fp32_row, ggml_commit, ggml_cycles, ggml_cycles_per_ms,
    ggml_fp16_to_fp32, ggml_fp16_to_fp32_row, ggml_fp32_to_bf16, ggml_fp32_to_bf16_row,
    ggml_fp32_to_bf16_row_ref, ggml_fp32_to_fp16, ggml_fp32_to_fp16_row, ggml_ftype_to_ggml_type,
    ggml_get_data, ggml_get_glu_op, ggml_get_unary_op, ggml_graph_nodes, ggml_guid_matches,
    ggml_is_view, ggml_log_get, ggml_log_set, ggml_op_desc,
    ggml_quantize_free, ggml_quantize_init, ggml_set_abort_callback, ggml_status_to_string,
    ggml_time_init, ggml_time_ms, ggml_time_us, ggml_type_sizef, ggml_unravel_index,
    ggml_validate_row_data, ggml_version,
)
from engine.compute import (
    CPlan, GGML_STATUS_ABORTED, GGML_STATUS_SUCCESS, ggml_get_n_tasks, ggml_graph_compute,
    ggml_graph_compute_with_ctx, ggml_graph_plan,
)
from engine.quants import (
    ggml_get_type_traits, ggml_quantize_chunk, ggml_quantize_requires_imatrix,
)
from engine.gguf.api import (
    GGUF_DEFAULT_ALIGNMENT, GGUF_KEY_GENERAL_ALIGNMENT, GGUF_MAGIC, GGUF_TYPE_ARRAY, GGUF_TYPE_BOOL,
    GGUF_TYPE_COUNT, GGUF_TYPE_FLOAT32, GGUF_TYPE_FLOAT64, GGUF_TYPE_INT16, GGUF_TYPE_INT32,
    GGUF_TYPE_INT64, GGUF_TYPE_INT8, GGUF_TYPE_STRING, GGUF_TYPE_UINT16, GGUF_TYPE_UINT32,
    GGUF_TYPE_UINT64, GGUF_TYPE_UINT8, GGUF_VERSION, gguf_add_tensor, gguf_find_key,
    gguf_find_tensor, gguf_free, gguf_get_alignment, gguf_get_arr_data, gguf_get_arr_n,
    gguf_get_arr_str, gguf_get_arr_type, gguf_get_data_offset, gguf_get_key, gguf_get_kv_type,
    gguf_get_meta_data, gguf_get_meta_size, gguf_get_n_kv, gguf_get_n_tensors, gguf_get_tensor_name,
    gguf_get_tensor_ne, gguf_get_tensor_offset, gguf_get_tensor_size, gguf_get_tensor_type,
    gguf_get_val_bool, gguf_get_val_data, gguf_get_val_f32, gguf_get_val_f64, gguf_get_val_i16,
    gguf_get_val_i32, gguf_get_val_i64, gguf_get_val_i8, gguf_get_val_str, gguf_get_val_u16,
    gguf_get_val_u32, gguf_get_val_u64, gguf_get_val_u8, gguf_get_version, gguf_init_empty,
    gguf_init_from_buffer, gguf_init_from_callback, gguf_init_from_file, gguf_init_params,
    gguf_remove_key, gguf_set_arr_data, gguf_set_arr_str, gguf_set_kv, gguf_set_tensor_data,
    gguf_set_tensor_type, gguf_set_val_bool, gguf_set_val_f32, gguf_set_val_f64, gguf_set_val_i16,
    gguf_set_val_i32, gguf_set_val_i64, gguf_set_val_i8, gguf_set_val_str, gguf_set_val_u16,
    gguf_set_val_u32, gguf_set_val_u64, gguf_set_val_u8, gguf_type_name, gguf_type_size,
    gguf_write_to_file,
)

__all__ = [  # the enum constants are added below
    "CPlan", "Context", "GGMLAssertionError", "GGMLGluOp", "GGMLNotSupportedError", "GGMLOp",
    "GGMLPoolError", "GGMLType", "GGMLUnaryOp", "GGML_COMMIT", "GGML_DEFAULT_GRAPH_SIZE",
    "GGML_FTYPE_ALL_F32", "GGML_FTYPE_MOSTLY_BF16", "GGML_FTYPE_MOSTLY_F16",
    "GGML_FTYPE_MOSTLY_IQ1_M", "GGML_FTYPE_MOSTLY_IQ1_S", "GGML_FTYPE_MOSTLY_IQ2_S",
    "GGML_FTYPE_MOSTLY_IQ2_XS", "GGML_FTYPE_MOSTLY_IQ2_XXS", "GGML_FTYPE_MOSTLY_IQ3_S",
    "GGML_FTYPE_MOSTLY_IQ3_XXS", "GGML_FTYPE_MOSTLY_IQ4_NL", "GGML_FTYPE_MOSTLY_IQ4_XS",
    "GGML_FTYPE_MOSTLY_MXFP4", "GGML_FTYPE_MOSTLY_NVFP4", "GGML_FTYPE_MOSTLY_Q1_0",
    "GGML_FTYPE_MOSTLY_Q2_K", "GGML_FTYPE_MOSTLY_Q3_K", "GGML_FTYPE_MOSTLY_Q4_0",
    "GGML_FTYPE_MOSTLY_Q4_1", "GGML_FTYPE_MOSTLY_Q4_1_SOME_F16", "GGML_FTYPE_MOSTLY_Q4_K",
    "GGML_FTYPE_MOSTLY_Q5_0", "GGML_FTYPE_MOSTLY_Q5_1", "GGML_FTYPE_MOSTLY_Q5_K",
    "GGML_FTYPE_MOSTLY_Q6_K", "GGML_FTYPE_MOSTLY_Q8_0", "GGML_FTYPE_UNKNOWN", "GGML_GLU_OP_COUNT",
    "GGML_HASHSET_ALREADY_EXISTS", "GGML_HASHSET_FULL", "GGML_HINT_NONE",
    "GGML_HINT_SRC0_IS_HADAMARD", "GGML_LOG_LEVEL_CONT", "GGML_LOG_LEVEL_DEBUG",
    "GGML_LOG_LEVEL_ERROR", "GGML_LOG_LEVEL_INFO", "GGML_LOG_LEVEL_NONE", "GGML_LOG_LEVEL_WARN",
    "GGML_MAX_DIMS", "GGML_MAX_NAME", "GGML_MAX_OP_PARAMS", "GGML_MAX_SRC", "GGML_MEM_ALIGN",
    "GGML_MROPE_SECTIONS", "GGML_N_TASKS_MAX", "GGML_OBJECT_SIZE", "GGML_OBJECT_TYPE_GRAPH",
    "GGML_OBJECT_TYPE_TENSOR", "GGML_OBJECT_TYPE_WORK_BUFFER", "GGML_OP_COUNT", "GGML_OP_POOL_AVG",
    "GGML_OP_POOL_COUNT", "GGML_OP_POOL_MAX", "GGML_PAD", "GGML_PREC_DEFAULT", "GGML_PREC_F32",
    "GGML_ROPE_TYPE_IMROPE", "GGML_ROPE_TYPE_MROPE", "GGML_ROPE_TYPE_NEOX", "GGML_ROPE_TYPE_NORMAL",
    "GGML_ROPE_TYPE_VISION", "GGML_SCALE_FLAG_ALIGN_CORNERS", "GGML_SCALE_FLAG_ANTIALIAS",
    "GGML_SCALE_MODE_BICUBIC", "GGML_SCALE_MODE_BILINEAR", "GGML_SCALE_MODE_COUNT",
    "GGML_SCALE_MODE_NEAREST", "GGML_SORT_ORDER_ASC", "GGML_SORT_ORDER_DESC", "GGML_STATUS_ABORTED",
    "GGML_STATUS_ALLOC_FAILED", "GGML_STATUS_FAILED", "GGML_STATUS_SUCCESS",
    "GGML_TENSOR_FLAG_COMPUTE", "GGML_TENSOR_FLAG_INPUT", "GGML_TENSOR_FLAG_LOSS",
    "GGML_TENSOR_FLAG_OUTPUT", "GGML_TENSOR_FLAG_PARAM", "GGML_TENSOR_SIZE", "GGML_TRI_TYPE_LOWER",
    "GGML_TRI_TYPE_LOWER_DIAG", "GGML_TRI_TYPE_UPPER", "GGML_TRI_TYPE_UPPER_DIAG",
    "GGML_TYPE_COUNT", "GGML_UNARY_OP_COUNT", "GGML_VERSION", "GGUF_DEFAULT_ALIGNMENT",
    "GGUF_KEY_GENERAL_ALIGNMENT", "GGUF_MAGIC", "GGUF_TYPE_ARRAY", "GGUF_TYPE_BOOL",
    "GGUF_TYPE_COUNT", "GGUF_TYPE_FLOAT32", "GGUF_TYPE_FLOAT64", "GGUF_TYPE_INT16",
    "GGUF_TYPE_INT32", "GGUF_TYPE_INT64", "GGUF_TYPE_INT8", "GGUF_TYPE_STRING", "GGUF_TYPE_UINT16",
    "GGUF_TYPE_UINT32", "GGUF_TYPE_UINT64", "GGUF_TYPE_UINT8", "GGUF_VERSION", "Graph", "Tensor",
    "data_bytes", "format_tensor", "ggml_abort", "ggml_abs", "ggml_abs_inplace", "ggml_acc",
    "ggml_acc_inplace", "ggml_add", "ggml_add1", "ggml_add1_inplace", "ggml_add_cast",
    "ggml_add_id", "ggml_add_inplace", "ggml_add_rel_pos", "ggml_add_rel_pos_inplace",
    "ggml_arange", "ggml_are_same_shape", "ggml_are_same_stride", "ggml_argmax", "ggml_argsort",
    "ggml_argsort_top_k", "ggml_assert", "ggml_bf16_to_fp32", "ggml_bf16_to_fp32_row",
    "ggml_blck_size", "ggml_build_backward_expand", "ggml_build_forward_expand",
    "ggml_build_forward_select", "ggml_can_mul_mat", "ggml_can_out_prod", "ggml_can_repeat",
    "ggml_can_repeat_rows", "ggml_cast", "ggml_ceil", "ggml_ceil_inplace", "ggml_clamp",
    "ggml_col2im_1d", "ggml_commit", "ggml_compute_softplus_f32", "ggml_concat", "ggml_cont",
    "ggml_cont_1d", "ggml_cont_2d", "ggml_cont_3d", "ggml_cont_4d", "ggml_conv_1d",
    "ggml_conv_1d_dw", "ggml_conv_1d_dw_ph", "ggml_conv_1d_ph", "ggml_conv_2d",
    "ggml_conv_2d_direct", "ggml_conv_2d_dw", "ggml_conv_2d_dw_direct", "ggml_conv_2d_s1_ph",
    "ggml_conv_2d_sk_p0", "ggml_conv_3d", "ggml_conv_3d_direct", "ggml_conv_transpose_1d",
    "ggml_conv_transpose_2d_p0", "ggml_cos", "ggml_cos_inplace", "ggml_count_equal", "ggml_cpy",
    "ggml_cross_entropy_loss", "ggml_cross_entropy_loss_back", "ggml_cumsum", "ggml_custom_4d",
    "ggml_custom_inplace", "ggml_cycles", "ggml_cycles_per_ms", "ggml_diag", "ggml_diag_mask_inf",
    "ggml_diag_mask_inf_inplace", "ggml_diag_mask_zero", "ggml_diag_mask_zero_inplace", "ggml_div",
    "ggml_div_inplace", "ggml_dup", "ggml_dup_inplace", "ggml_dup_tensor", "ggml_element_size",
    "ggml_elu", "ggml_elu_inplace", "ggml_exp", "ggml_exp_inplace", "ggml_expm1",
    "ggml_expm1_inplace", "ggml_fill", "ggml_fill_inplace", "ggml_flash_attn_back", "ggml_flash_attn_ext",
    "ggml_flash_attn_ext_add_sinks", "ggml_flash_attn_ext_get_prec", "ggml_flash_attn_ext_set_prec",
    "ggml_floor", "ggml_floor_inplace", "ggml_format_name", "ggml_fp16_to_fp32",
    "ggml_fp16_to_fp32_row", "ggml_fp32_to_bf16", "ggml_fp32_to_bf16_row",
    "ggml_fp32_to_bf16_row_ref", "ggml_fp32_to_fp16", "ggml_fp32_to_fp16_row", "ggml_free",
    "ggml_ftype_to_ggml_type", "ggml_gated_delta_net", "ggml_gated_linear_attn", "ggml_geglu",
    "ggml_geglu_erf", "ggml_geglu_erf_split", "ggml_geglu_erf_swapped", "ggml_geglu_quick",
    "ggml_geglu_quick_split", "ggml_geglu_quick_swapped", "ggml_geglu_split", "ggml_geglu_swapped",
    "ggml_gelu", "ggml_gelu_erf", "ggml_gelu_erf_inplace", "ggml_gelu_inplace", "ggml_gelu_quick",
    "ggml_gelu_quick_inplace", "ggml_get_data", "ggml_get_data_f32", "ggml_get_f32_1d",
    "ggml_get_first_tensor", "ggml_get_glu_op", "ggml_get_i32_1d", "ggml_get_max_tensor_size",
    "ggml_get_mem_buffer", "ggml_get_mem_size", "ggml_get_n_tasks", "ggml_get_name",
    "ggml_get_next_tensor", "ggml_get_no_alloc", "ggml_get_op_params_f32", "ggml_get_op_params_i32",
    "ggml_get_rel_pos", "ggml_get_rows", "ggml_get_rows_back", "ggml_get_tensor",
    "ggml_get_type_traits", "ggml_get_unary_op", "ggml_glu", "ggml_glu_op_name", "ggml_glu_split",
    "ggml_graph_add_node", "ggml_graph_clear", "ggml_graph_compute", "ggml_graph_compute_with_ctx",
    "ggml_graph_cpy", "ggml_graph_dump_dot", "ggml_graph_dup", "ggml_graph_get_grad",
    "ggml_graph_get_grad_acc", "ggml_graph_get_tensor", "ggml_graph_n_nodes", "ggml_graph_nbytes",
    "ggml_graph_node", "ggml_graph_nodes", "ggml_graph_overhead", "ggml_graph_overhead_custom",
    "ggml_graph_plan", "ggml_graph_print", "ggml_graph_reset", "ggml_graph_size", "ggml_graph_view",
    "ggml_group_norm", "ggml_group_norm_inplace", "ggml_guid_matches", "ggml_hardsigmoid",
    "ggml_hardswish", "ggml_hash_size", "ggml_im2col", "ggml_im2col_3d", "ggml_im2col_back",
    "ggml_init", "ggml_init_params", "ggml_interpolate", "ggml_is_3d", "ggml_is_contiguous",
    "ggml_is_contiguous_0", "ggml_is_contiguous_1", "ggml_is_contiguous_2",
    "ggml_is_contiguous_channels", "ggml_is_contiguous_rows", "ggml_is_contiguously_allocated",
    "ggml_is_empty", "ggml_is_matrix", "ggml_is_padded_1d", "ggml_is_permuted", "ggml_is_quantized",
    "ggml_is_scalar", "ggml_is_transposed", "ggml_is_vector", "ggml_is_view", "ggml_l2_norm",
    "ggml_l2_norm_inplace", "ggml_leaky_relu", "ggml_log", "ggml_log_get", "ggml_log_inplace",
    "ggml_log_set", "ggml_map_custom1", "ggml_map_custom1_inplace", "ggml_map_custom2",
    "ggml_map_custom2_inplace", "ggml_map_custom3", "ggml_map_custom3_inplace", "ggml_mean",
    "ggml_mul", "ggml_mul_inplace", "ggml_mul_mat", "ggml_mul_mat_id", "ggml_mul_mat_set_hint",
    "ggml_mul_mat_set_prec", "ggml_n_dims", "ggml_nbytes", "ggml_nbytes_pad", "ggml_neg",
    "ggml_neg_inplace", "ggml_nelements", "ggml_new_buffer", "ggml_new_f32", "ggml_new_graph",
    "ggml_new_graph_custom", "ggml_new_i32", "ggml_new_object", "ggml_new_tensor",
    "ggml_new_tensor_1d", "ggml_new_tensor_2d", "ggml_new_tensor_3d", "ggml_new_tensor_4d",
    "ggml_new_tensor_impl", "ggml_norm", "ggml_norm_inplace", "ggml_nrows", "ggml_op_desc",
    "ggml_op_name", "ggml_op_symbol", "ggml_opt_step_adamw", "ggml_opt_step_sgd", "ggml_out_prod",
    "ggml_pad", "ggml_pad_circular", "ggml_pad_ext", "ggml_pad_ext_circular", "ggml_pad_reflect_1d",
    "ggml_permute", "ggml_pool_1d", "ggml_pool_2d", "ggml_pool_2d_back", "ggml_print_object",
    "ggml_print_objects", "ggml_quantize_chunk", "ggml_quantize_free", "ggml_quantize_init",
    "ggml_quantize_requires_imatrix", "ggml_reglu", "ggml_reglu_split", "ggml_reglu_swapped",
    "ggml_relu", "ggml_relu_inplace", "ggml_repeat", "ggml_repeat_4d", "ggml_repeat_back",
    "ggml_reset", "ggml_reshape", "ggml_reshape_1d", "ggml_reshape_2d", "ggml_reshape_3d",
    "ggml_reshape_4d", "ggml_rms_norm", "ggml_rms_norm_back", "ggml_rms_norm_inplace", "ggml_roll",
    "ggml_rope", "ggml_rope_custom", "ggml_rope_custom_inplace", "ggml_rope_ext",
    "ggml_rope_ext_back", "ggml_rope_ext_inplace", "ggml_rope_inplace", "ggml_rope_multi",
    "ggml_rope_multi_back", "ggml_rope_multi_inplace", "ggml_rope_yarn_corr_dims", "ggml_round",
    "ggml_round_inplace", "ggml_row_size", "ggml_rwkv_wkv6", "ggml_rwkv_wkv7", "ggml_scale",
    "ggml_scale_bias", "ggml_scale_bias_inplace", "ggml_scale_inplace", "ggml_set", "ggml_set_1d",
    "ggml_set_1d_inplace", "ggml_set_2d", "ggml_set_2d_inplace", "ggml_set_abort_callback",
    "ggml_set_f32", "ggml_set_f32_1d", "ggml_set_i32", "ggml_set_i32_1d", "ggml_set_inplace",
    "ggml_set_input", "ggml_set_loss", "ggml_set_name", "ggml_set_no_alloc", "ggml_set_op_params",
    "ggml_set_op_params_f32", "ggml_set_op_params_i32", "ggml_set_output", "ggml_set_param",
    "ggml_set_rows", "ggml_set_zero", "ggml_sgn", "ggml_sgn_inplace", "ggml_sigmoid",
    "ggml_sigmoid_inplace", "ggml_silu", "ggml_silu_back", "ggml_silu_inplace", "ggml_sin",
    "ggml_sin_inplace", "ggml_soft_max", "ggml_soft_max_add_sinks", "ggml_soft_max_ext",
    "ggml_soft_max_ext_back", "ggml_soft_max_ext_back_inplace", "ggml_soft_max_ext_inplace",
    "ggml_soft_max_inplace", "ggml_softplus", "ggml_softplus_inplace", "ggml_solve_tri", "ggml_sqr",
    "ggml_sqr_inplace", "ggml_sqrt", "ggml_sqrt_inplace", "ggml_ssm_conv", "ggml_ssm_scan",
    "ggml_status_to_string", "ggml_step", "ggml_step_inplace", "ggml_sub", "ggml_sub_inplace",
    "ggml_sum", "ggml_sum_rows", "ggml_swiglu", "ggml_swiglu_oai", "ggml_swiglu_split",
    "ggml_swiglu_swapped", "ggml_tanh", "ggml_tanh_inplace", "ggml_tensor_overhead",
    "ggml_time_init", "ggml_time_ms", "ggml_time_us", "ggml_timestep_embedding", "ggml_top_k",
    "ggml_transpose", "ggml_tri", "ggml_trunc", "ggml_trunc_inplace", "ggml_type_name",
    "ggml_type_size", "ggml_type_sizef", "ggml_unary", "ggml_unary_inplace", "ggml_unary_op_name",
    "ggml_unravel_index", "ggml_upscale", "ggml_upscale_ext", "ggml_used_mem",
    "ggml_validate_row_data", "ggml_version", "ggml_view_1d", "ggml_view_2d", "ggml_view_3d",
    "ggml_view_4d", "ggml_view_tensor", "ggml_win_part", "ggml_win_unpart", "ggml_xielu",
    "gguf_add_tensor", "gguf_find_key", "gguf_find_tensor", "gguf_free", "gguf_get_alignment",
    "gguf_get_arr_data", "gguf_get_arr_n", "gguf_get_arr_str", "gguf_get_arr_type",
    "gguf_get_data_offset", "gguf_get_key", "gguf_get_kv_type", "gguf_get_meta_data",
    "gguf_get_meta_size", "gguf_get_n_kv", "gguf_get_n_tensors", "gguf_get_tensor_name",
    "gguf_get_tensor_ne", "gguf_get_tensor_offset", "gguf_get_tensor_size", "gguf_get_tensor_type",
    "gguf_get_val_bool", "gguf_get_val_data", "gguf_get_val_f32", "gguf_get_val_f64",
    "gguf_get_val_i16", "gguf_get_val_i32", "gguf_get_val_i64", "gguf_get_val_i8",
    "gguf_get_val_str", "gguf_get_val_u16", "gguf_get_val_u32", "gguf_get_val_u64",
    "gguf_get_val_u8", "gguf_get_version", "gguf_init_empty", "gguf_init_from_buffer",
    "gguf_init_from_callback", "gguf_init_from_file", "gguf_init_params", "gguf_remove_key",
    "gguf_set_arr_data", "gguf_set_arr_str", "gguf_set_kv", "gguf_set_tensor_data",
    "gguf_set_tensor_type", "gguf_set_val_bool", "gguf_set_val_f32", "gguf_set_val_f64",
    "gguf_set_val_i16", "gguf_set_val_i32", "gguf_set_val_i64", "gguf_set_val_i8",
    "gguf_set_val_str", "gguf_set_val_u16", "gguf_set_val_u32", "gguf_set_val_u64",
    "gguf_set_val_u8", "gguf_type_name", "gguf_type_size", "gguf_write_to_file", "set_data",
    "to_numpy",
]

# ggml.h's enum constants under their C spelling (engine/ggml_enums.py)
from engine.ggml_enums import *  # noqa: E402,F403

__all__ += [
    "GGML_TYPE_F32", "GGML_TYPE_F16", "GGML_TYPE_Q4_0", "GGML_TYPE_Q4_1", "GGML_TYPE_Q4_2",
    "GGML_TYPE_Q4_3", "GGML_TYPE_Q5_0", "GGML_TYPE_Q5_1", "GGML_TYPE_Q8_0", "GGML_TYPE_Q8_1",
    "GGML_TYPE_Q2_K", "GGML_TYPE_Q3_K", "GGML_TYPE_Q4_K", "GGML_TYPE_Q5_K", "GGML_TYPE_Q6_K",
    "GGML_TYPE_Q8_K", "GGML_TYPE_IQ2_XXS", "GGML_TYPE_IQ2_XS", "GGML_TYPE_IQ3_XXS",
    "GGML_TYPE_IQ1_S", "GGML_TYPE_IQ4_NL", "GGML_TYPE_IQ3_S", "GGML_TYPE_IQ2_S",
    "GGML_TYPE_IQ4_XS", "GGML_TYPE_I8", "GGML_TYPE_I16", "GGML_TYPE_I32", "GGML_TYPE_I64",
    "GGML_TYPE_F64", "GGML_TYPE_IQ1_M", "GGML_TYPE_BF16", "GGML_TYPE_Q4_0_4_4",
    "GGML_TYPE_Q4_0_4_8", "GGML_TYPE_Q4_0_8_8", "GGML_TYPE_TQ1_0", "GGML_TYPE_TQ2_0",
    "GGML_TYPE_IQ4_NL_4_4", "GGML_TYPE_IQ4_NL_4_8", "GGML_TYPE_IQ4_NL_8_8", "GGML_TYPE_MXFP4",
    "GGML_TYPE_NVFP4", "GGML_TYPE_Q1_0", "GGML_OP_NONE", "GGML_OP_DUP", "GGML_OP_ADD",
    "GGML_OP_ADD_ID", "GGML_OP_ADD1", "GGML_OP_ACC", "GGML_OP_SUB", "GGML_OP_MUL",
    "GGML_OP_DIV", "GGML_OP_SQR", "GGML_OP_SQRT", "GGML_OP_LOG", "GGML_OP_SIN", "GGML_OP_COS",
    "GGML_OP_SUM", "GGML_OP_SUM_ROWS", "GGML_OP_CUMSUM", "GGML_OP_MEAN", "GGML_OP_ARGMAX",
    "GGML_OP_COUNT_EQUAL", "GGML_OP_REPEAT", "GGML_OP_REPEAT_BACK", "GGML_OP_CONCAT",
    "GGML_OP_SILU_BACK", "GGML_OP_NORM", "GGML_OP_RMS_NORM", "GGML_OP_RMS_NORM_BACK",
    "GGML_OP_GROUP_NORM", "GGML_OP_L2_NORM", "GGML_OP_MUL_MAT", "GGML_OP_MUL_MAT_ID",
    "GGML_OP_OUT_PROD", "GGML_OP_SCALE", "GGML_OP_SET", "GGML_OP_CPY", "GGML_OP_CONT",
    "GGML_OP_RESHAPE", "GGML_OP_VIEW", "GGML_OP_PERMUTE", "GGML_OP_TRANSPOSE",
    "GGML_OP_GET_ROWS", "GGML_OP_GET_ROWS_BACK", "GGML_OP_SET_ROWS", "GGML_OP_DIAG",
    "GGML_OP_DIAG_MASK_INF", "GGML_OP_DIAG_MASK_ZERO", "GGML_OP_SOFT_MAX",
    "GGML_OP_SOFT_MAX_BACK", "GGML_OP_ROPE", "GGML_OP_ROPE_BACK", "GGML_OP_CLAMP",
    "GGML_OP_CONV_TRANSPOSE_1D", "GGML_OP_IM2COL", "GGML_OP_IM2COL_BACK", "GGML_OP_IM2COL_3D",
    "GGML_OP_COL2IM_1D", "GGML_OP_CONV_2D", "GGML_OP_CONV_3D", "GGML_OP_CONV_2D_DW",
    "GGML_OP_CONV_TRANSPOSE_2D", "GGML_OP_POOL_1D", "GGML_OP_POOL_2D", "GGML_OP_POOL_2D_BACK",
    "GGML_OP_UPSCALE", "GGML_OP_PAD", "GGML_OP_PAD_REFLECT_1D", "GGML_OP_ROLL",
    "GGML_OP_ARANGE", "GGML_OP_TIMESTEP_EMBEDDING", "GGML_OP_ARGSORT", "GGML_OP_TOP_K",
    "GGML_OP_LEAKY_RELU", "GGML_OP_TRI", "GGML_OP_FILL", "GGML_OP_FLASH_ATTN_EXT",
    "GGML_OP_FLASH_ATTN_BACK", "GGML_OP_SSM_CONV", "GGML_OP_SSM_SCAN", "GGML_OP_WIN_PART",
    "GGML_OP_WIN_UNPART", "GGML_OP_GET_REL_POS", "GGML_OP_ADD_REL_POS", "GGML_OP_RWKV_WKV6",
    "GGML_OP_GATED_LINEAR_ATTN", "GGML_OP_RWKV_WKV7", "GGML_OP_SOLVE_TRI",
    "GGML_OP_GATED_DELTA_NET", "GGML_OP_UNARY", "GGML_OP_MAP_CUSTOM1", "GGML_OP_MAP_CUSTOM2",
    "GGML_OP_MAP_CUSTOM3", "GGML_OP_CUSTOM", "GGML_OP_CROSS_ENTROPY_LOSS",
    "GGML_OP_CROSS_ENTROPY_LOSS_BACK", "GGML_OP_OPT_STEP_ADAMW", "GGML_OP_OPT_STEP_SGD",
    "GGML_OP_GLU", "GGML_UNARY_OP_ABS", "GGML_UNARY_OP_SGN", "GGML_UNARY_OP_NEG",
    "GGML_UNARY_OP_STEP", "GGML_UNARY_OP_TANH", "GGML_UNARY_OP_ELU", "GGML_UNARY_OP_RELU",
    "GGML_UNARY_OP_SIGMOID", "GGML_UNARY_OP_GELU", "GGML_UNARY_OP_GELU_QUICK",
    "GGML_UNARY_OP_SILU", "GGML_UNARY_OP_HARDSWISH", "GGML_UNARY_OP_HARDSIGMOID",
    "GGML_UNARY_OP_EXP", "GGML_UNARY_OP_EXPM1", "GGML_UNARY_OP_SOFTPLUS",
    "GGML_UNARY_OP_GELU_ERF", "GGML_UNARY_OP_XIELU", "GGML_UNARY_OP_FLOOR",
    "GGML_UNARY_OP_CEIL", "GGML_UNARY_OP_ROUND", "GGML_UNARY_OP_TRUNC", "GGML_GLU_OP_REGLU",
    "GGML_GLU_OP_GEGLU", "GGML_GLU_OP_SWIGLU", "GGML_GLU_OP_SWIGLU_OAI",
    "GGML_GLU_OP_GEGLU_ERF", "GGML_GLU_OP_GEGLU_QUICK"
]


def _gdb_array(values: list[str]) -> str:
    """gdb's array printing: runs of 10 or more equal elements collapse to '<repeats N times>'."""
    parts, i = [], 0
    while i < len(values):
        j = i
        while j < len(values) and values[j] == values[i]:
            j += 1
        run = j - i
        if run >= 10:
            parts.append(f"{values[i]} <repeats {run} times>")
        else:
            parts.extend(values[i:j])
        i = j
    return "{" + ", ".join(parts) + "}"


def _gdb_name(raw: bytes) -> str:
    text, _, rest = raw.partition(b"\0")
    shown = '"' + text.decode("utf-8", errors="backslashreplace") + '"'
    rest = b"\0" + rest  # the NUL and everything after it
    if rest.strip(b"\0"):
        return shown + ", " + '"' + "".join(f"\\{b:03o}" if b < 32 or b > 126 else chr(b)
                                            for b in rest) + '"'
    return shown + (f", '\\000' <repeats {len(rest) - 1} times>" if len(rest) > 1 else "")


@_query
def format_tensor(t: Tensor) -> str:
    """The tensor struct as gdb prints `p *t` (with `set print pretty on`)."""
    ptr = lambda a: f"{a:#x}" if a else "0x0"  # noqa: E731
    r = t._r[0]
    op = GGMLOp(t.op).name
    fields = [
        ("type", "GGML_TYPE_" + GGMLType(t.type).name),
        ("buffer", ptr(int(r["buffer"]))),
        ("ne", _gdb_array([str(int(x)) for x in t.ne])),
        ("nb", _gdb_array([str(int(x)) for x in t.nb])),
        ("op", "GGML_OP_" + op),
        ("op_params", _gdb_array([str(int(x)) for x in t.op_params])),
        ("flags", str(t.flags)),
        ("src", _gdb_array([ptr(int(a)) for a in r["src"]])),
        ("view_src", ptr(int(r["view_src"]))),
        ("view_offs", str(t.view_offs)),
        ("data", ptr(int(r["data"]))),
        ("name", _gdb_name(t.ctx.pool[t.offs + 256:t.offs + 256 + GGML_MAX_NAME].tobytes())),
        ("extra", ptr(t.extra)),
        ("padding", '"' + "\\000" * 7 + '"'),
    ]
    body = ",\n".join(f"  {k} = {v}" for k, v in fields)
    return "{\n" + body + "\n}"
