"""View-models of the walkthrough debugger: one module per panel (and per partial template under
templates/partials/debugger/), each built from a state the trace rebuilt at a step.

Panels only show what the engine computed: the pools rebuilt from the trace at this step, the
tensor structs read from those pools, the step's own record of what it changed.
"""
