"""Op constructors by family: each records a result tensor's shape, op, op_params and sources, as
ggml.c's ggml_<op> functions do; none computes (engine/compute does). `base` holds the recording
helpers every family uses; engine/ggml.py is the door."""
