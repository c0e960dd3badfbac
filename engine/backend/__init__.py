"""ggml-backend and ggml-alloc, lowest layer first: buffer types and buffers (buffer.py), backends,
devices and the registry (device.py), a simulated accelerator with memory of its own (accel.py),
the tensor and graph allocators (alloc.py), graph copies between backends (graph_copy.py) and the
scheduler that splits a graph between backends (sched.py). `engine.ggml_backend` and
`engine.ggml_alloc` are the headers' facades."""

from engine.backend.buffer import *  # noqa: F401,F403
from engine.backend.device import *  # noqa: F401,F403
