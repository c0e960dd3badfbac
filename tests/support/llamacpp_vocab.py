"""Real llama.cpp's tokenizer in a process of its own (as tests/support/llamacpp_run.py runs its
models: llama-cpp-python's ggml must not share a process with ggml-python's).

`ask(vocab_path, texts, pieces)`: `texts` are (text, add_special, parse_special) triples, answered
with llama_tokenize's ids; `pieces` are token ids, answered with llama_token_to_piece(special=True).
Bytes travel as latin-1 text.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

TIMEOUT = 600


def ask(vocab: Path, texts: list[tuple[bytes, bool, bool]], pieces: list[int]) -> dict:
    request = {"texts": [[t.decode("latin-1"), a, s] for t, a, s in texts], "pieces": pieces}
    done = subprocess.run([sys.executable, "-m", "tests.support.llamacpp_vocab", str(vocab)],
                          input=json.dumps(request), capture_output=True, text=True,
                          timeout=TIMEOUT, cwd=Path(__file__).resolve().parents[2])
    if done.returncode != 0:
        raise RuntimeError(f"llama.cpp failed: {done.stderr[-2000:]}")
    answer = json.loads(done.stdout)
    answer["pieces"] = [p.encode("latin-1") for p in answer["pieces"]]
    return answer


def _serve(path: str, request: dict) -> dict:
    import ctypes

    import llama_cpp

    llm = llama_cpp.Llama(path, vocab_only=True, verbose=False)
    vocab = llama_cpp.llama_model_get_vocab(llm._model.model)
    tokens = [llm.tokenize(t.encode("latin-1"), add_bos=a, special=s)
              for t, a, s in request["texts"]]
    buf = ctypes.create_string_buffer(1024)
    pieces = []
    for token in request["pieces"]:
        n = llama_cpp.llama_token_to_piece(vocab, token, buf, len(buf), 0, True)
        pieces.append(buf.raw[:max(n, 0)].decode("latin-1"))
    return {"tokens": tokens, "pieces": pieces}


if __name__ == "__main__":
    print(json.dumps(_serve(sys.argv[1], json.loads(sys.stdin.read()))))
