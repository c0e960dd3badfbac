"""ggml-opt (ggml-opt.cpp): datasets (dataset.py), parameters (params.py), the optimization context
and its graphs (context.py), results (results.py) and the training loops (loops.py).
`engine.ggml_opt` is the header's facade."""
