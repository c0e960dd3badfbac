"""CPU compute: the plan, the thread pool, and the kernels (one compute_forward_<op> per op)."""

from engine.compute.plan import CPlan, ggml_get_n_tasks, ggml_graph_plan  # noqa: F401
from engine.compute.shares import ThreadShare  # noqa: F401
from engine.compute.threadpool import GGML_STATUS_ABORTED, GGML_STATUS_SUCCESS, ComputeParams, \
    ggml_graph_compute, ggml_graph_compute_with_ctx  # noqa: F401
