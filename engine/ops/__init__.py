"""Op constructors by family: each records a result tensor's shape, op, op_params and sources, as
ggml.c's ggml_<op> functions do; none computes (engine/compute does). `base` holds the recording
steps every family uses; the families are views (view and shape ops, copies), math (arithmetic,
reductions, norms), matmul (matrix products, the triangular solve), unary (activations, GLU),
rope, conv, nn (rows, softmax, pooling, padding, attention), ssm (state-space and linear
attention), backward (gradients, optimizer steps) and custom (user ops). engine/ggml.py is the
door."""
