"""GGUF: ggml's model file format — a validating memory-mapped reader, a writer, gguf.h's API.

Mirrors gguf.h/gguf.cpp of ggml 0.15.3. `GGUFReader` parses and checks a file and keeps every
item's byte range; `GGUFBuilder` writes files the way ggml does; `api` holds the C-named facade
(gguf_init_from_file, gguf_get_val_u32, ...); `loader` lays a file out in a ggml context;
`inspect` renders a report for the CLI. Every malformed input raises GGUFError.
"""

from .format import (GGUF_DEFAULT_ALIGNMENT, GGUF_MAGIC, GGUF_VERSION, GGUFError,
                     GGUFValueType)
from .reader import KV, GGUFReader, Span, StringArray, TensorInfo

__all__ = ["GGUF_DEFAULT_ALIGNMENT", "GGUF_MAGIC", "GGUF_VERSION", "GGUFError", "GGUFValueType",
           "KV", "GGUFReader", "Span", "StringArray", "TensorInfo"]
