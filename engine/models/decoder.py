"""What every decoder-only model shares: feeding tokens through the graph with a KV cache.

A model (engine/models/llama.py, gemma3.py) builds llama.cpp's graph for n new tokens after n_past
cached ones (`build`) and says its hyperparameters; `Decoder` runs it the way llama_decode does:
the inputs (token ids, positions, the attention masks), one compute context per pass sized by a
measuring pass, the cache growing by the tokens decoded, and greedy or sampled generation.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Iterator

import numpy as np

from engine.compute.plan import llamafile_build
from engine.ggml import Tensor, ggml_free, ggml_graph_compute_with_ctx, set_data, to_numpy

from .common import ModelError, compute_context, measure


# texts llama.cpp's vocabulary loader takes as end-of-generation tokens (llama-vocab.cpp)
END_OF_TURN = ("<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>",
               "<|end_of_text|>", "<EOT>", "<|eom_id|>", "<end_of_utterance>")


@dataclass(frozen=True, slots=True)
class Decoded:
    token_ids: list[int]
    logits: np.ndarray  # [n_outputs, n_vocab]: every position, or only the last
    seconds: float


KV_PAD = 256  # llama_kv_cache::get_n_kv pads the cells attention reads to a multiple of this


def kv_cells(n_used: int, n_ctx: int) -> int:
    """How many cache cells the attention reads when n_used hold tokens: llama.cpp pads it to a
    multiple of 256 (at least 256, at most the cache), so one graph shape serves many batches;
    the cells past the tokens are masked out."""
    return min(n_ctx, max(KV_PAD, -(-n_used // KV_PAD) * KV_PAD))


def causal_mask(n: int, n_past: int, window: int | None = None,
                n_kv: int | None = None) -> np.ndarray:
    """[n queries, n_kv keys] (n_kv: n_past + n unless given): 0 where a query at position
    n_past + q may look at key k (k <= its position, and for a sliding window q_pos - k <
    window), -inf elsewhere."""
    q_pos = np.arange(n_past, n_past + n)[:, None]
    k_pos = np.arange(n_past + n if n_kv is None else n_kv)[None, :]
    masked = k_pos > q_pos
    if window is not None:
        masked |= q_pos - k_pos >= window  # llama_hparams::is_masked_swa (standard)
    return np.where(masked, -np.inf, 0.0).astype(np.float32)


class Decoder:
    """A model with a KV cache: subclasses set hp (n_vocab, ...), cache, n_ctx and build()."""

    hp: object
    n_ctx: int
    tokenizer: object | None  # SentencePiece, or None: token ids in, token ids out
    windows: dict[str, int | None] = {"attn_inp_kq_mask": None}  # mask input -> its window

    def __init__(self) -> None:
        self._mem: dict[tuple, int] = {}

    def graph_size(self) -> int:
        raise NotImplementedError

    def build(self, ctx, n_tokens: int, n_past: int, all_logits: bool = True):
        raise NotImplementedError

    def set_inputs(self, inputs: dict[str, Tensor], token_ids: list[int], n_past: int) -> None:
        n = len(token_ids)
        set_data(inputs["inp_tokens"], np.asarray(token_ids, dtype=np.int32))
        set_data(inputs["inp_pos"], np.arange(n_past, n_past + n, dtype=np.int32))
        for name, window in self.windows.items():
            set_data(inputs[name], causal_mask(n, n_past, window, self.n_kv(n_past + n)))
        if "inp_out_ids" in inputs:
            set_data(inputs["inp_out_ids"], np.array([n - 1], dtype=np.int32))

    def n_kv(self, n_used: int) -> int:
        return kv_cells(n_used, self.cache.n_ctx)

    def encode(self, text: str, parse_special: bool = False) -> list[int]:
        """The prompt's token ids, BOS first when the vocabulary asks for it."""
        if self.tokenizer is None:
            model = self.file.reader.get("tokenizer.ggml.model") or "none"
            raise ModelError(f"{self.file.path}: its tokenizer ('{model}') is not built here, "
                             "only SentencePiece ('llama'); give the prompt as token ids")
        return self.tokenizer.encode(text, True, parse_special)

    def end_of_generation(self) -> set[int]:
        """llama_vocab_is_eog's tokens: EOS, EOT and EOM by their keys, and the end-of-turn
        tokens llama.cpp recognises by their text (Gemma's <end_of_turn>, ChatML's <|im_end|>)."""
        key = self.file.reader.get
        ids = {key(f"tokenizer.ggml.{k}_token_id") for k in ("eos", "eot", "eom")}
        if self.tokenizer is not None:
            ids |= {self.tokenizer.ids[t] for t in END_OF_TURN if t in self.tokenizer.ids}
        return {int(i) for i in ids if i is not None}

    def reset(self) -> None:
        """Forget the cached tokens (llama_memory_clear)."""
        self.cache.n_past = 0

    def decode(self, token_ids: list[int], n_threads: int = 1, all_logits: bool = True) -> Decoded:
        """Run the new tokens through the model after what the cache holds; their logits."""
        ids = [int(i) for i in token_ids]
        n_past = self.cache.n_past
        if not ids:
            raise ModelError("nothing to decode: no tokens")
        if any(not 0 <= i < self.hp.n_vocab for i in ids):
            raise ModelError(f"token ids must lie in [0, {self.hp.n_vocab})")
        if n_past + len(ids) > self.n_ctx:
            raise ModelError(f"{n_past} cached + {len(ids)} new tokens do not fit this "
                             f"model's context of {self.n_ctx} tokens")
        key = (len(ids), self.n_kv(n_past + len(ids)), all_logits, n_threads)
        if key not in self._mem:
            self._mem[key] = measure(lambda c: self.build(c, len(ids), n_past, all_logits)[0],
                                     self.graph_size(), n_threads)
        ctx = compute_context(self._mem[key])
        try:
            gf, inputs, logits = self.build(ctx, len(ids), n_past, all_logits)
            self.set_inputs(inputs, ids, n_past)
            t0 = time.perf_counter()
            with llamafile_build():  # llama.cpp's ggml: float products >= 2 rows by tinyBLAS
                ggml_graph_compute_with_ctx(ctx, gf, n_threads)
            seconds = time.perf_counter() - t0
            out = np.array(to_numpy(logits), dtype=np.float32).reshape(-1, self.hp.n_vocab)
        finally:
            ggml_free(ctx)
        self.cache.n_past += len(ids)
        return Decoded(ids, out, seconds)

    def stream(self, prompt: list[int], n_new: int, n_threads: int = 1,
               pick: Callable[[np.ndarray], int] | None = None,
               stop: set[int] | None = None) -> Iterator[int]:
        """Decode the prompt, then yield n_new tokens, each chosen by `pick` from the last
        logits (the most likely by default) and fed back (one token per graph)."""
        self.reset()
        if len(prompt) + n_new > self.n_ctx + 1:
            raise ModelError(f"{len(prompt)} prompt + {n_new} new tokens do not fit this "
                             f"model's context of {self.n_ctx} tokens")
        pick = pick or (lambda logits: int(np.argmax(logits)))
        logits = self.decode(prompt, n_threads, all_logits=False).logits[-1]
        for k in range(n_new):
            token = pick(logits)
            yield token
            if stop and token in stop:
                return
            if k + 1 < n_new:
                logits = self.decode([token], n_threads, all_logits=False).logits[-1]

    def generate(self, prompt: list[int], n_new: int, n_threads: int = 1) -> list[int]:
        """Greedy generation: the n_new most likely tokens, one after another."""
        return list(self.stream(prompt, n_new, n_threads))
