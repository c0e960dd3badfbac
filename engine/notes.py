"""The plain-words notes the recorder and the kernels write, as templates.

A step's note and a thread's share note are English text made from these templates (parts joined
by "; "). They are kept here, in one list, so the app can tell a note in another language: it
matches each part against the templates and fills the translated template with the same values
(app/i18n.py). A test records every walkthrough and checks that each note part is one of these.
"""

from __future__ import annotations

import re

# --- what a call reserved and set (engine/steps.py describe_changes) -------------------------
RESERVED_MANY = ("{fn} made {n} objects from offset {first} to {end}: {tensors} tensor structs of {struct} bytes "
                 "(each behind a {header}-byte object header) with {data} bytes of their data, {graphs} graphs and "
                 "{work} work buffers")
RESERVED_TENSOR = "{fn} reserved {header} bytes of header, {struct} of tensor struct and {data} of data at offset {offset}"
RESERVED_TENSOR_NO_DATA = "{fn} reserved {header} bytes of header, {struct} of tensor struct and no data at offset {offset}"
RESERVED_GRAPH = "{fn} reserved a {size}-byte graph object at offset {offset}"
RESERVED_WORK = "{fn} reserved a {size}-byte work buffer at offset {offset}"
SET_FIELD = "set {field} of '{tensor}' from {old} to {new}"
MORE_FIELDS = "and {n} more fields"
WROTE = "wrote {n} bytes"
NOTHING = "{fn} changed nothing in the pools"

# --- the recorder (engine/trace.py) ------------------------------------------------------------
WROTE_DATA = "{fn} wrote the data of {name}: {n} bytes at {addr}"  # name: 'a', or a (unnamed)
UNNAMED = "(unnamed)"
INIT = "ggml_init allocated a pool of {size} bytes at {addr} (context {id})"
INIT_NO_ALLOC = "ggml_init allocated a pool of {size} bytes at {addr} (context {id}), no_alloc"
BUILD_FORWARD = "ggml_build_forward_expand walks the sources of the tensor depth first, then records it"
VISIT_LEAF = "{name} ({op}) is new to the graph: hash slot {slot}, appended as a leaf"  # name: 'a', a (unnamed)
VISIT_NODE = "{name} ({op}) is new to the graph: hash slot {slot}, appended as a node"
PLANNED = "planned {n} thread(s), a work buffer of {size} bytes"
WALK_TOGETHER = "all threads now walk the nodes together"
COMPUTED = "computed {desc} on {n} thread(s), then the barrier"
RETURNED = "the program returned"

# --- ggml-alloc and the scheduler (engine/trace_backend.py) ------------------------------------
WHERE = "buffer {id} ({name}), chunk {chunk}, offset {offset}"
GALLOCR_GETS = "gallocr: '{name}' gets {size} bytes at {where}"
GALLOCR_INPLACE = ("gallocr: '{name}' reuses the bytes of '{parent}' in place ({op} can overwrite its "
                   "source, and '{parent2}' has no other child) at {where}")
GALLOCR_FREES = "gallocr: '{name}' had its last child: its {size} bytes at {where} are free again"
SCHED_PASS = "ggml_backend_sched pass {title}: {counts}"
PASS_COUNT = "{n} to backend {b} ({name})"  # the counts of a pass, joined by ", "
PASS_1 = "1: tensors in buffers, graph inputs, ops with weights"
PASS_2 = "2: expand the accelerators down and up, then every backend"
PASS_3 = "3: upgrade to higher-priority backends, and unassigned nodes to the backend with most inputs"
PASS_4 = "4: sources and views follow their nodes"
PASS_5 = "5: splits, and copies of the inputs each split's backend cannot read"
SPLIT = "split {i}: nodes {first}..{last} run on backend {b} ({name})"
SPLIT_INPUTS = "inputs copied in: {inputs}"
SPLIT_NO_INPUTS = "inputs copied in: none"
COPIED = "the scheduler copied '{name}' ({size} bytes) from {src} to {dst} as '{copy}'"

# --- the groups of the step list (engine/trace_groups.py) -------------------------------------
GROUP_LAYER = "layer {layer}"
GROUP_OUTSIDE = "outside the layers"
GROUP_STEPS = "steps"
GROUP_PASS = "forward pass at n_past = {n_past}"
GROUP_SETUP = "setting up"

# --- each thread's share of a node (engine/compute/kernels) -----------------------------------
SHARES = (
    "{nchunk} chunks of {dr} q rows, tiled path",
    "{nchunk} chunks of {dr} q rows, one_chunk path",
    "KV chunk for every head, then merges heads {heads}",
    "rows i01 of every (i02, i03)",
    "input channels",
    "patches of each batch of {n} (im2col and scatter)",
    "ggml splits the GEMM between them as mul_mat does",
    "rows of src0 dim 1, for every i2, i3",
    "{n0}x{n1} chunks of {d0}x{d1}",
    "{n0}x{n1} chunks of {d0}x{d1} (values: llamafile's tinyBLAS)",
    "rows of src1 (thread 0 first copied src0 into dst)",
    "rows of src1",
    "flat rows",
    "i2 of every i3",
    "dst rows (i1, i2, i3)",
    "thread 0 first zeroed dst",
    "elements",
    "rows i1 of every (i2, i3)",
    "groups of channels",
    "then thread 0 adds the other threads' counts",
    "then thread 0 adds the threads' partial sums",
    "dst planes i2, for every i3",
    "frequencies j (and j + half), every timestep",
    "flat elements of src1 (one index, one row each)",
    "rows j of every matrix",
)

TEMPLATES = (
    RESERVED_MANY, RESERVED_TENSOR, RESERVED_TENSOR_NO_DATA, RESERVED_GRAPH, RESERVED_WORK, SET_FIELD, MORE_FIELDS,
    WROTE, NOTHING, WROTE_DATA, INIT, INIT_NO_ALLOC, BUILD_FORWARD, VISIT_LEAF, VISIT_NODE, PLANNED,
    WALK_TOGETHER, COMPUTED, RETURNED, WHERE, GALLOCR_GETS, GALLOCR_INPLACE, GALLOCR_FREES, SCHED_PASS,
    PASS_COUNT, GROUP_LAYER, GROUP_OUTSIDE, GROUP_STEPS, GROUP_PASS, GROUP_SETUP, PASS_1, PASS_2, PASS_3, PASS_4, PASS_5,
    SPLIT, SPLIT_INPUTS, SPLIT_NO_INPUTS, COPIED, *SHARES,
)
NESTED = frozenset({"where", "title"})  # values that are notes themselves, told in the same language
LISTS = frozenset({"counts"})  # values that are notes joined by ", "


def _pattern(template: str) -> re.Pattern:
    regex, pos = "", 0
    for m in re.finditer(r"\{(\w+)\}", template):
        regex += re.escape(template[pos:m.start()]) + f"(?P<{m.group(1)}>.*?)"
        pos = m.end()
    return re.compile(regex + re.escape(template[pos:]), re.S)


# the most specific templates first: the longest fixed text wins
_PATTERNS = sorted(((t, _pattern(t)) for t in TEMPLATES), key=lambda tp: -len(re.sub(r"\{\w+\}", "", tp[0])))


def parse(part: str) -> tuple[str, dict[str, str]] | None:
    """The template a note part was made from, and the values that filled it (None if none)."""
    for template, pattern in _PATTERNS:
        m = pattern.fullmatch(part)
        if m:
            return template, m.groupdict()
    return None
