"""ggml-backend: buffer types and buffers (buffer.py), backends, devices and the registry
(device.py), a simulated accelerator with memory of its own (accel.py) and the scheduler that
splits a graph between backends (sched.py). `engine.ggml_backend` is the header's facade."""

from engine.backend.buffer import *  # noqa: F401,F403
from engine.backend.buffer import _CPU_BUFT, buffer_field, tensor_buffer  # noqa: F401
from engine.backend.device import *  # noqa: F401,F403
