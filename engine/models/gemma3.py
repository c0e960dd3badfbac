"""Gemma 3: next-token logits with a KV cache, built the way llama.cpp builds its graph.

Mirrors llama.cpp's `gemma3` architecture (src/models/gemma3.cpp) with its tensor, key and node
names. Its graph is Gemma 2's (engine/models/gemma2.py: embeddings scaled by sqrt(n_embd),
post-attention and post-FFW norms, a GELU-gated feed-forward, sliding-window attention) with these
differences: an RMS norm of each head of Q and of K before rope (QK norms); no attention logit
soft-capping; a sliding window only when the file names one (attention.sliding_window), on five
layers of every six (layers 5, 11, 17, ... are global), whose rope base is rope.freq_base_swa
(10000 by default); output.weight as the head when the file has it (else the token embeddings);
the final logit soft-capping only when the file asks for it; the 27B model (62 layers) scaling Q by
1/sqrt(n_embd / n_head).
Flash attention, a quantized cache and ubatches as Gemma 2's (ContextParams).
Leaves out: vision inputs, the dense projections of embedding models, the separate small cache
llama.cpp keeps for sliding-window layers without swa_full (here every layer caches all
positions; the window is in the mask).
"""

from __future__ import annotations

from .gemma2 import Gemma2


class Gemma3(Gemma2):
    """A Gemma 3 GGUF opened for decoding: Gemma 2's frame with QK norms."""

    ARCH = "gemma3"
    N_SWA = 0  # no sliding window unless the file names one
    SWA_PATTERN = 6  # llama.cpp's default for gemma3: layers 5, 11, 17, ... are global
    FREQ_BASE_SWA = 10000.0  # llama_hparams::rope_freq_base_train_swa's default
    ATTN_SOFTCAP = None
    FINAL_SOFTCAP = 0.0
    N_LAYER_27B = 62
    QK_NORM = True
    OUTPUT_WEIGHT = True
    LAYER_OF_POST_FFW = True
