"""Tiny Gemma files with a small sliding window, for the KV panel's tests: llama.cpp's llama-spm
vocabulary (SentencePiece: prompts are text), random F32 weights, a window of WINDOW positions.
A `gemma3` file (run by the gemma3 walkthrough) has 6 layers, the sixth global (llama.cpp's
default pattern for gemma3); a `gemma2` file (run by the model walkthrough) 4, every second
global (its default)."""

from __future__ import annotations

from pathlib import Path

from engine.core.types import GGMLType
from tests.support.tiny_models import TinyFile
from tests.support.vocab import vocab_files

WINDOW = 4  # attention.sliding_window: the positions a sliding-window layer sees
LAYERS = {"gemma3": 6, "gemma2": 4}


def write_tiny_gemma(path: Path, arch: str = "gemma3", window: int = WINDOW,
                     context: int = 2048) -> None:
    vocab = next(p for p in vocab_files() if p.name == "ggml-vocab-llama-spm.gguf")
    e, n_head, n_kv, n_ff, hd, n_layer = 32, 2, 1, 64, 16, LAYERS[arch]
    with TinyFile(path, arch, GGMLType.F32, seed=5, vocab=vocab) as f:
        assert f.n_vocab is not None
        f.decoder_keys(context, e, n_layer, n_ff, n_head, n_kv, f.n_vocab, rms_eps=1e-6,
                       freq_base=1e6 if arch == "gemma3" else 1e4)
        f.w.add_key_length(hd)
        f.w.add_value_length(hd)
        f.w.add_sliding_window(window)
        gemma_weights(f, arch, e, n_layer, n_ff, n_head, n_kv, hd, f.n_vocab)


def gemma_weights(f: TinyFile, arch: str, e: int, n_layer: int, n_ff: int, n_head: int, n_kv: int,
                  hd: int, n_vocab: int) -> None:
    """A Gemma 2 or 3 file's weights as its converter lays them out (gemma3: QK norms too),
    its head tied to the token table."""
    f.mat("token_embd.weight", e, n_vocab)
    for i in range(n_layer):
        b = f"blk.{i}."
        f.vec(b + "attn_norm.weight", e)
        f.mat(b + "attn_q.weight", e, hd * n_head)
        f.mat(b + "attn_k.weight", e, hd * n_kv)
        f.mat(b + "attn_v.weight", e, hd * n_kv)
        if arch == "gemma3":
            f.vec(b + "attn_q_norm.weight", hd)
            f.vec(b + "attn_k_norm.weight", hd)
        f.mat(b + "attn_output.weight", hd * n_head, e)
        f.vec(b + "post_attention_norm.weight", e)
        f.vec(b + "ffn_norm.weight", e)
        f.mat(b + "ffn_gate.weight", e, n_ff)
        f.mat(b + "ffn_up.weight", e, n_ff)
        f.mat(b + "ffn_down.weight", n_ff, e)
        f.vec(b + "post_ffw_norm.weight", e)
    f.vec("output_norm.weight", e)
