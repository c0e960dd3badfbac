"""gemma3: a real language model — Gemma 3 270M (Q4_K_M) reads a prompt and picks its next token.

The weights (236 tensors, 253 MB) come from the GGUF file with gguf_init_from_file; the tokens
from the file's SentencePiece vocabulary. A second context is the KV cache: per layer an F16 K
and an F16 V of 256 cells. Each pass is a compute context and graph built as llama.cpp builds
Gemma 3: the token rows (Q8_0, dequantized by get_rows) scaled by sqrt(640); per layer an RMS
norm, Q/K/V (Q5_0 and Q8_0 weights), an RMS norm of each head of Q and K, rope (NeoX; base 10000
on sliding-window layers, 1e6 on every 6th, global, layer), Q scaled by 1/sqrt(256), the new K
and V written into the cache by ggml_set_rows, attention over all 256 cells (the cells past the
tokens, and on sliding-window layers those 512 or more positions back, masked), the output
projection, its RMS norm and the residual; then an RMS norm, a GELU-gated feed-forward, its RMS
norm and the residual. Only the last position goes through the final norm and the output head
(the token table again, tied): 262,144 logits, whose softmax gives the next token. Each token in
`then` is one more pass of one token, reading everything before it from the cache.

`flash_attn` is llama.cpp's -fa ("on", "off" or "auto"; auto is on, as llama.cpp decides on the
CPU). On, attention is what llama.cpp's build_attn_mha builds with flash attention: one
FLASH_ATTN_EXT node per layer over Q, the K cache [256, 1, 256] and the V cache stored cell by
cell as K is, with an F16 mask of 256 cells per token (llama.cpp pads the cells attention reads
to 256, not the tokens) and F32 precision. Off, the path without it: KQ = K·Q (MUL_MAT), its
masked softmax (SOFT_MAX), KQV = V·softmax (MUL_MAT) over a V cache stored transposed, one row
of cells per head element.
Unlike llama.cpp's default, the weights stay where gguf_init_from_file put them, in the file's
own layout: none is repacked into CPU_REPACK's interleaved blocks (llama.cpp's -nr). So this
program computes what llama.cpp computes with -nr and GGML_CPU_TILED_MM=0 (its plain kernels).
engine/models/gemma3.py builds the same graph for any Gemma 3 GGUF.
"""

import math

import numpy as np

import engine.libm as libm
from engine.ggml import *  # noqa: F403
from engine.models.params import ContextParams
from engine.models.spm import SentencePiece
from engine.models.tokenize import file_tokenizer
from engine.resources import bundled_model_path

PROMPT = "The capital of France is"
N_CELLS = 256  # the KV cache: llama.cpp pads the cells attention reads to 256


def cb(t, name: str, il: int):
    """Name a node as llama.cpp's graph callback does ("ffn_out-3")."""
    return ggml_format_name(t, "%s-%d", name, il) if il >= 0 else ggml_set_name(t, name)


def tokenizer(path: str) -> SentencePiece:
    """The vocabulary the file carries (its metadata only: no context is made; read once per file)."""
    return file_tokenizer(path, SentencePiece.from_model_file)


def run(n_threads: int = 1, path: str | None = None, prompt: str = PROMPT,
        then: tuple[int, ...] = (), flash_attn: str = "auto") -> dict:
    path = path or bundled_model_path()  # the bundled model by default
    flash = ContextParams(flash_attn=flash_attn).resolve_flash_attn("gemma3")  # auto: on
    vocab = tokenizer(path)
    ids = vocab.encode_prompt(prompt)  # <bos> and its pieces (special tokens read as in a chat)
    if not 1 <= len(ids) + len(then) <= N_CELLS:
        raise ValueError(f"prompt and appended tokens must fit {N_CELLS} cells")
    if any(not 0 <= t < len(vocab.tokens) for t in then):
        raise ValueError(f"appended token ids must lie in [0, {len(vocab.tokens)})")

    gguf, ctx_w = gguf_init_from_file(path, gguf_init_params(no_alloc=False, ctx=True))
    key = lambda k: gguf_find_key(gguf, f"gemma3.{k}")  # noqa: E731
    n_layer = gguf_get_val_u32(gguf, key("block_count"))  # 18
    n_embd = gguf_get_val_u32(gguf, key("embedding_length"))  # 640
    n_head = gguf_get_val_u32(gguf, key("attention.head_count"))  # 4
    n_head_kv = gguf_get_val_u32(gguf, key("attention.head_count_kv"))  # 1
    head_dim = gguf_get_val_u32(gguf, key("attention.key_length"))  # 256
    eps = gguf_get_val_f32(gguf, key("attention.layer_norm_rms_epsilon"))
    window = gguf_get_val_u32(gguf, key("attention.sliding_window"))  # 512
    freq_base = gguf_get_val_f32(gguf, key("rope.freq_base"))  # 1e6, global layers
    n_ctx_train = gguf_get_val_u32(gguf, key("context_length"))
    n_kv_embd = head_dim * n_head_kv
    w = lambda name: ggml_get_tensor(ctx_w, name)  # noqa: E731

    # the KV cache, kept across passes: cells hold K rows; V the same with flash attention,
    # else stored transposed (one row of 256 cells per element of a V row)
    ctx_kv = ggml_init(ggml_init_params(mem_size=2 * n_layer * (ggml_tensor_overhead()
                                        + N_CELLS * n_kv_embd * 2), mem_buffer=None, no_alloc=False))
    cache_k, cache_v = [], []
    for il in range(n_layer):
        cache_k.append(ggml_new_tensor_2d(ctx_kv, GGML_TYPE_F16, n_kv_embd, N_CELLS))
        cache_v.append(ggml_new_tensor_2d(ctx_kv, GGML_TYPE_F16, n_kv_embd, N_CELLS))
        ggml_format_name(cache_k[il], "cache_k_l%d", il)
        ggml_format_name(cache_v[il], "cache_v_l%d", il)
        set_data(cache_k[il], np.zeros(N_CELLS * n_kv_embd, dtype=np.float32))
        set_data(cache_v[il], np.zeros(N_CELLS * n_kv_embd, dtype=np.float32))

    swa_layers = [il % 6 < 5 for il in range(n_layer)]  # five sliding-window layers, one global
    # the prompt's pieces; for the debugger's KV panel the cells, the window, the sliding layers
    outputs: dict = {"prompt_tokens": [vocab.piece_text(i) for i in ids], "kv_n_ctx": N_CELLS,
                     "kv_n_swa": window, "kv_swa_layers": swa_layers}
    n_past, batch = 0, ids
    for step in range(1 + len(then)):
        n = len(batch)
        ctx = ggml_init(ggml_init_params(mem_size=(4 + 2 * n) * 1024 * 1024, mem_buffer=None,
                                         no_alloc=False))
        gf = ggml_new_graph_custom(ctx, 2048, False)
        inp = ggml_new_tensor_1d(ctx, GGML_TYPE_I32, n)
        ggml_set_name(inp, "inp_tokens")
        set_data(inp, np.array(batch, dtype=np.int32))
        pos = ggml_new_tensor_1d(ctx, GGML_TYPE_I32, n)
        ggml_set_name(pos, "inp_pos")
        set_data(pos, np.arange(n_past, n_past + n, dtype=np.int32))
        k_idxs = ggml_new_tensor_1d(ctx, GGML_TYPE_I64, n)  # the cell each new token goes to
        ggml_set_name(k_idxs, "attn_inp_k_idxs")
        set_data(k_idxs, np.arange(n_past, n_past + n, dtype=np.int64))
        # the cell each new V row goes to, or (V transposed) each new value's element
        v_idxs = ggml_new_tensor_1d(ctx, GGML_TYPE_I64, n if flash else n * n_kv_embd)
        ggml_set_name(v_idxs, "attn_inp_v_idxs")
        set_data(v_idxs, np.arange(n_past, n_past + n, dtype=np.int64) if flash else
                 (np.arange(n_kv_embd)[None, :] * N_CELLS
                  + np.arange(n_past, n_past + n)[:, None]).reshape(-1).astype(np.int64))
        q_pos, k_pos = np.arange(n_past, n_past + n)[:, None], np.arange(N_CELLS)[None, :]
        masks = {}  # [256 cells, n tokens]: F16 for flash attention, F32 for the softmax
        for name, far in (("attn_inp_kq_mask", k_pos > q_pos),
                          ("attn_inp_kq_mask_swa", (k_pos > q_pos) | (q_pos - k_pos >= window))):
            masks[name] = ggml_new_tensor_2d(ctx, GGML_TYPE_F16 if flash else GGML_TYPE_F32,
                                             N_CELLS, n)  # -inf: not seen
            ggml_set_name(masks[name], name)
            set_data(masks[name], np.where(far, -np.inf, 0.0).astype(np.float32))
        out_ids = ggml_new_tensor_1d(ctx, GGML_TYPE_I32, 1)  # only the last position's logits
        ggml_set_name(out_ids, "inp_out_ids")
        set_data(out_ids, np.array([n - 1], dtype=np.int32))

        x = cb(ggml_get_rows(ctx, w("token_embd.weight"), inp), "inp_embd", -1)  # [640, n]
        x = cb(ggml_scale(ctx, x, np.sqrt(n_embd)), "inp_scaled", -1)
        for il in range(n_layer):
            b = lambda name: w(f"blk.{il}.{name}.weight")  # noqa: E731
            swa = swa_layers[il]
            rope = (head_dim, GGML_ROPE_TYPE_NEOX, n_ctx_train, 10000.0 if swa else freq_base, 1.0,
                    0.0, 1.0, 32.0, 1.0)
            cur = cb(ggml_mul(ctx, ggml_rms_norm(ctx, x, eps), b("attn_norm")), "attn_norm", il)
            q = ggml_reshape_3d(ctx, cb(ggml_mul_mat(ctx, b("attn_q"), cur), "Qcur", il),
                                head_dim, n_head, n)
            k = ggml_reshape_3d(ctx, cb(ggml_mul_mat(ctx, b("attn_k"), cur), "Kcur", il),
                                head_dim, n_head_kv, n)
            v = ggml_reshape_3d(ctx, cb(ggml_mul_mat(ctx, b("attn_v"), cur), "Vcur", il),
                                head_dim, n_head_kv, n)
            q = cb(ggml_mul(ctx, ggml_rms_norm(ctx, q, eps), b("attn_q_norm")), "Qcur_normed", il)
            q = cb(ggml_rope_ext(ctx, q, pos, None, *rope), "Qcur", il)
            k = cb(ggml_mul(ctx, ggml_rms_norm(ctx, k, eps), b("attn_k_norm")), "Kcur_normed", il)
            k = cb(ggml_rope_ext(ctx, k, pos, None, *rope), "Kcur", il)
            q = ggml_scale(ctx, q, 1.0 / np.sqrt(head_dim))
            ggml_build_forward_expand(gf, q)
            ggml_build_forward_expand(gf, v)
            ggml_build_forward_expand(gf, k)

            mask = masks["attn_inp_kq_mask_swa" if swa else "attn_inp_kq_mask"]
            if flash:
                cur = flash_attention(ctx, gf, q, k, v, cache_k[il], cache_v[il], k_idxs, v_idxs,
                                      mask, il)
            else:
                cur = attention(ctx, gf, q, k, v, cache_k[il], cache_v[il], k_idxs, v_idxs, mask,
                                il)
            cur = cb(ggml_mul_mat(ctx, b("attn_output"), cur), "attn_out", il)
            if il == n_layer - 1:  # from here on only the last position matters
                cur, x = ggml_get_rows(ctx, cur, out_ids), ggml_get_rows(ctx, x, out_ids)
            cur = cb(ggml_mul(ctx, ggml_rms_norm(ctx, cur, eps), b("post_attention_norm")),
                     "attn_post_norm", il)
            sa_out = cb(ggml_add(ctx, cur, x), "sa_out", il)  # residual

            cur = cb(ggml_mul(ctx, ggml_rms_norm(ctx, sa_out, eps), b("ffn_norm")), "ffn_norm", il)
            up = cb(ggml_mul_mat(ctx, b("ffn_up"), cur), "ffn_up", il)  # [2048, n]
            gate = cb(ggml_mul_mat(ctx, b("ffn_gate"), cur), "ffn_gate", il)
            cur = cb(ggml_geglu_split(ctx, gate, up), "ffn_geglu", il)  # gelu(gate) * up
            cur = cb(ggml_mul_mat(ctx, b("ffn_down"), cur), "ffn_out", il)
            cur = cb(ggml_mul(ctx, ggml_rms_norm(ctx, cur, eps), b("post_ffw_norm")),
                     "ffn_post_norm", il)
            x = cb(ggml_add(ctx, cur, sa_out), "l_out", il)  # residual

        x = cb(ggml_mul(ctx, ggml_rms_norm(ctx, x, eps), w("output_norm.weight")), "result_norm", -1)
        logits = cb(ggml_mul_mat(ctx, w("token_embd.weight"), x), "result_output", -1)  # [262144]
        ggml_build_forward_expand(gf, logits)
        ggml_graph_compute_with_ctx(ctx, gf, n_threads)

        probs = softmax(to_numpy(logits).reshape(-1))  # (odds to show: not a ggml result)
        top = np.argsort(-probs, kind="stable")[:10]
        outputs[f"logits_{step}"] = logits
        outputs[f"top10_{step}"] = [(int(i), vocab.piece_text(int(i)), float(probs[i])) for i in top]
        n_past += n
        batch = [then[step]] if step < len(then) else []
    outputs["next_token"] = outputs[f"top10_{len(then)}"][0]
    return outputs


def flash_attention(ctx, gf, q, k, v, cache_k, cache_v, k_idxs, v_idxs, mask, il: int):
    """llama.cpp's build_attn_mha with flash attention: the new K and V rows into their cells
    (V cell by cell, as K), then one FLASH_ATTN_EXT over every cell. q [256, 4, n] (scaled
    already: kq_scale 1), the caches' views [256, 1, 256] permuted to [256 dims, 256 cells, 1
    head]; the result [256, 4 heads, n] (heads and tokens swapped: a reshape, no permute)."""
    head_dim, n_head_kv, n = int(k.ne[0]), int(k.ne[1]), int(k.ne[2])
    n_kv_embd = head_dim * n_head_kv
    ggml_build_forward_expand(gf, ggml_set_rows(
        ctx, cache_k, ggml_view_2d(ctx, k, n_kv_embd, n, k.nb[2], 0), k_idxs))
    ggml_build_forward_expand(gf, ggml_set_rows(
        ctx, cache_v, ggml_view_2d(ctx, v, n_kv_embd, n, v.nb[2], 0), v_idxs))
    k_all = ggml_view_3d(ctx, cache_k, head_dim, n_head_kv, N_CELLS, head_dim * 2, n_kv_embd * 2, 0)
    v_all = ggml_view_3d(ctx, cache_v, head_dim, n_head_kv, N_CELLS, head_dim * 2, n_kv_embd * 2, 0)
    cur = ggml_flash_attn_ext(ctx, ggml_permute(ctx, q, 0, 2, 1, 3),
                              ggml_permute(ctx, k_all, 0, 2, 1, 3),
                              ggml_permute(ctx, v_all, 0, 2, 1, 3), mask, 1.0, 0.0, 0.0)
    ggml_flash_attn_ext_set_prec(cur, GGML_PREC_F32)  # [256, 4, n]
    return cb(ggml_reshape_2d(ctx, cur, head_dim * int(cur.ne[1]), n), "kqv_out", il)


def attention(ctx, gf, q, k, v, cache_k, cache_v, k_idxs, v_idxs, mask, il: int):
    """build_attn_mha without flash attention: the new K rows into their cells, the new V values
    into the transposed V (one element a row), then KQ = K·Q [256 cells, n, 4 heads] (the one K
    head shared by the four), its masked softmax, KQV = V·softmax [256, n, 4], permuted and
    made contiguous as [1024, n]."""
    head_dim, n_head_kv, n = int(k.ne[0]), int(k.ne[1]), int(k.ne[2])
    n_kv_embd = head_dim * n_head_kv
    ggml_build_forward_expand(gf, ggml_set_rows(
        ctx, cache_k, ggml_view_2d(ctx, k, n_kv_embd, n, k.nb[2], 0), k_idxs))
    ggml_build_forward_expand(gf, ggml_set_rows(
        ctx, ggml_reshape_2d(ctx, cache_v, 1, n_kv_embd * N_CELLS),
        ggml_reshape_2d(ctx, v, 1, n_kv_embd * n), v_idxs))
    k_all = ggml_view_3d(ctx, cache_k, head_dim, n_head_kv, N_CELLS, head_dim * 2, n_kv_embd * 2, 0)
    v_all = ggml_view_3d(ctx, cache_v, N_CELLS, n_head_kv, head_dim, N_CELLS * head_dim * 2,
                         N_CELLS * 2, 0)
    kq = cb(ggml_mul_mat(ctx, ggml_permute(ctx, k_all, 0, 2, 1, 3),
                         ggml_permute(ctx, q, 0, 2, 1, 3)), "kq", il)  # [256, n, 4]
    kq = cb(ggml_soft_max_ext(ctx, kq, mask, 1.0, 0.0), "kq_soft_max", il)
    kqv = cb(ggml_mul_mat(ctx, ggml_permute(ctx, v_all, 0, 2, 1, 3), kq), "kqv", il)
    return cb(ggml_cont_2d(ctx, ggml_permute(ctx, kqv, 0, 2, 1, 3), head_dim * int(q.ne[1]), n),
              "kqv_out", il)


def softmax(logits: np.ndarray) -> np.ndarray:
    """The probabilities the logits give, in double precision (through libm's expf: the same
    on every CPU)."""
    e = libm.expf(logits - logits.max()).astype(np.float64)
    return e / math.fsum(e)
