"""Traces: run a ggml program once under the recorder (recorder.py) and keep every step as an
immutable record (steps.py), the pools' changes as patches (pools.py), states rebuilt from them,
steps grouped like the program (groups.py). The app reads traces through this face."""

from engine.trace.recorder import record  # noqa: F401
from engine.trace.states import State, Trace  # noqa: F401
from engine.trace.steps import ComputePlan, FieldWrite, Step, StepKind  # noqa: F401
