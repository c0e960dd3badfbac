"""View-models of the GGUF inspector: one module per panel (and per partial template under
templates/partials/gguf/), each computed from an engine GGUFReader.

Mirrors nothing in ggml itself: they arrange what `gguf_init_from_file` reads (header, key-value
pairs, tensor infos, where every item lies in the file) for the pages, and explain quantized
blocks with `engine.quants.explain`. Tensor values are only read for a bounded sample (evenly
spaced rows, at most sample.SAMPLE_VALUES values) and the pages say so; the overview reads no
values. Leaves out: editing files, and values of types the engine cannot convert to float.
"""
