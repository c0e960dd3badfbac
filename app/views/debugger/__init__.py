"""View-models of the walkthrough debugger: one module per panel (and per partial template under
templates/partials/debugger/), each built from a state the trace rebuilt at a step. panels.py is
the table of panels: where the page shows each, its partial, the view-models it reads and the
functions that build them, a tab's label.

Panels only show what the engine computed: the pools rebuilt from the trace at this step, the
tensor structs read from those pools, the step's own record of what it changed.
"""
