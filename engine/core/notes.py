"""The plain-words notes the recorder and the kernels write: data (a template's key and the values
that fill it), told in words only at the edge.

A step carries its notes as a tuple of `Note` records, and so does each thread's share of a node.
The English templates are here, in one table (`TEMPLATES`); `tell` fills them and joins the parts
with "; " (the command line, JSON, the trace's hash), and the app tells the same notes through its
gettext catalogue (app/i18n.py). ggml's own words (a GGML_ASSERT's condition, an error message) are
a `VERBATIM` note, shown as they are in every language.
"""

from __future__ import annotations

import operator
import string
from dataclasses import dataclass
from typing import Callable, Iterable

TEMPLATES: dict[str, str] = {
    # --- what a call reserved and set (engine/trace/steps.py describe_changes) ---------------------
    "reserved_many": ("{fn} made {n} objects from offset {first} to {end}: {tensors} tensor structs of {struct} "
                      "bytes (each behind a {header}-byte object header) with {data} bytes of their data, {graphs} "
                      "graphs and {work} work buffers"),
    "reserved_tensor": "{fn} reserved {header} bytes of header, {struct} of tensor struct and {data} of data at "
                       "offset {offset}",
    "reserved_tensor_no_data": "{fn} reserved {header} bytes of header, {struct} of tensor struct and no data at "
                               "offset {offset}",
    "reserved_graph": "{fn} reserved a {size}-byte graph object at offset {offset}",
    "reserved_work": "{fn} reserved a {size}-byte work buffer at offset {offset}",
    "set_field": "set {field} of '{tensor}' from {old} to {new}",
    "more_fields": "and {n} more fields",
    "wrote": "wrote {n} bytes",
    "nothing": "{fn} changed nothing in the pools",
    # --- the recorder (engine/trace/recorder.py) -------------------------------------------------------
    "wrote_data": "{fn} wrote the data of {name}: {n} bytes at {addr}",  # name: 'a', or a (unnamed)
    "init": "ggml_init allocated a pool of {size} bytes at {addr} (context {id})",
    "init_no_alloc": "ggml_init allocated a pool of {size} bytes at {addr} (context {id}), no_alloc",
    "build_forward": "ggml_build_forward_expand walks the sources of the tensor depth first, then records it",
    "visit_leaf": "{name} ({op}) is new to the graph: hash slot {slot}, appended as a leaf",  # name: 'a', a (unnamed)
    "visit_node": "{name} ({op}) is new to the graph: hash slot {slot}, appended as a node",
    "planned": "planned {n} thread(s), a work buffer of {size} bytes",
    "walk_together": "all threads now walk the nodes together",
    "computed": "computed {desc} on {n} thread(s), then the barrier",
    "returned": "the program returned",
    # --- ggml-alloc and the scheduler (engine/trace/backend.py) -------------------------------
    "where": "buffer {id} ({name}), chunk {chunk}, offset {offset}",
    "gallocr_gets": "gallocr: '{name}' gets {size} bytes at {where}",  # where: a "where" note
    "gallocr_inplace": ("gallocr: '{name}' reuses the bytes of '{parent}' in place ({op} can overwrite its "
                        "source, and '{parent}' has no other child) at {where}"),
    "gallocr_frees": "gallocr: '{name}' had its last child: its {size} bytes at {where} are free again",
    "sched_pass": "ggml_backend_sched pass {title}: {counts}",  # title: a pass_N note; counts: pass_count notes
    "pass_count": "{n} to backend {b} ({name})",
    "pass_1": "1: tensors in buffers, graph inputs, ops with weights",
    "pass_2": "2: expand the accelerators down and up, then every backend",
    "pass_3": "3: upgrade to higher-priority backends, and unassigned nodes to the backend with most inputs",
    "pass_4": "4: sources and views follow their nodes",
    "pass_5": "5: splits, and copies of the inputs each split's backend cannot read",
    "split": "split {i}: nodes {first}..{last} run on backend {b} ({name})",
    "split_inputs": "inputs copied in: {inputs}",
    "split_no_inputs": "inputs copied in: none",
    "copied": "the scheduler copied '{name}' ({size} bytes) from {src} to {dst} as '{copy}'",
    # --- the groups of the step list (engine/trace/groups.py) --------------------------------
    "group_layer": "layer {layer}",
    "group_outside": "outside the layers",
    "group_steps": "steps",
    "group_pass": "forward pass at n_past = {n_past}",
    "group_setup": "setting up",
    # --- each thread's share of a node (engine/compute/kernels) ------------------------------
    "fa_tiled": "{nchunk} chunks of {dr} q rows, tiled path",
    "fa_one_chunk": "{nchunk} chunks of {dr} q rows, one_chunk path",
    "fa_kv": "KV chunk for every head, then merges heads {heads}",
    "rows_i01": "rows i01 of every (i02, i03)",
    "input_channels": "input channels",
    "conv_patches": "patches of each batch of {n} (im2col and scatter)",
    "conv_gemm": "ggml splits the GEMM between them as mul_mat does",
    "rows_src0": "rows of src0 dim 1, for every i2, i3",
    "mm_chunks": "{n0}x{n1} chunks of {d0}x{d1}",
    "mm_chunks_tinyblas": "{n0}x{n1} chunks of {d0}x{d1} (values: llamafile's tinyBLAS)",
    "repack_chunks": "{n0}x{n1} chunks of {d0} weight rows (repacked {layout}: gemm for each 4 rows "
                     "of src1, gemv for the rest)",
    "rows_src1_after_copy": "rows of src1 (thread 0 first copied src0 into dst)",
    "rows_src1": "rows of src1",
    "flat_rows": "flat rows",
    "i2_of_every_i3": "i2 of every i3",
    "dst_rows": "dst rows (i1, i2, i3)",
    "zeroed_dst": "thread 0 first zeroed dst",
    "elements": "elements",
    "rows_i1": "rows i1 of every (i2, i3)",
    "channel_groups": "groups of channels",
    "adds_counts": "then thread 0 adds the other threads' counts",
    "adds_sums": "then thread 0 adds the threads' partial sums",
    "dst_planes": "dst planes i2, for every i3",
    "frequencies": "frequencies j (and j + half), every timestep",
    "index_rows": "flat elements of src1 (one index, one row each)",
    "rows_j": "rows j of every matrix",
}
VERBATIM = "verbatim"  # ggml's own words (a condition, an error's message): {text}, never translated

# the names each template's values fill (a note's args name exactly these)
FIELDS = {key: frozenset(f for _, f, _, _ in string.Formatter().parse(t) if f)
          for key, t in {**TEMPLATES, VERBATIM: "{text}"}.items()}


@dataclass(frozen=True, slots=True)
class Note:
    """One part of a note: a template's key and its values. A value is a number, a string, a note
    (told in the same language) or a tuple of notes (told as a list); a nested note holds no notes."""

    key: str  # in TEMPLATES, or VERBATIM
    args: tuple[tuple[str, str | int | float | Note | tuple[Note, ...]], ...] = ()

    def __post_init__(self) -> None:
        # the rules a note read from a sandbox's worker is held to too (msgspec runs this)
        if self.key not in FIELDS:
            raise ValueError(f"a note's key is one of engine/core/notes.py's templates, not {self.key[:40]!r}")
        if {k for k, _ in self.args} != FIELDS[self.key] or len(self.args) != len(FIELDS[self.key]):
            raise ValueError(f"the note {self.key!r} fills {sorted(FIELDS[self.key])}, not "
                             f"{[k[:40] for k, _ in self.args][:12]}")
        kinds = (str,) if self.key == VERBATIM else (str, int, float, Note)
        for _, v in self.args:
            for x in v if isinstance(v, tuple) else (v,):  # a tuple: a list of notes
                if isinstance(x, bool) or not isinstance(x, Note if isinstance(v, tuple) else kinds):
                    raise TypeError(f"the note {self.key!r} has a value of type {type(x).__name__}")
                if isinstance(x, Note) and any(isinstance(y, (Note, tuple)) for _, y in x.args):
                    raise ValueError(f"the note {self.key!r} nests a note that holds notes")

    @classmethod
    def of(cls, key: str, **args: str | int | float | Note | tuple[Note, ...]) -> Note:
        """Note.of("wrote", n=32); numpy's integers are taken as Python's."""
        return cls(key, tuple((k, v if isinstance(v, (str, float, Note, tuple)) else operator.index(v))
                              for k, v in args.items()))

    @classmethod
    def verbatim(cls, text: str) -> Note:
        return cls(VERBATIM, (("text", text),))


def tell(notes: Iterable[Note], translate: Callable[[str], str] = str, comma: str = ", ") -> str:
    """Notes in words, joined by "; ": each template (through `translate`: the app's gettext; English
    by default) filled with its values, a nested note told the same way, a list's joined by `comma`."""
    return "; ".join(_tell(n, translate, comma) for n in notes)


def _tell(n: Note, translate: Callable[[str], str], comma: str) -> str:
    if n.key == VERBATIM:
        text = n.args[0][1]
        assert isinstance(text, str)  # __post_init__ holds a verbatim note to one string
        return text
    values = {k: _tell(v, translate, comma) if isinstance(v, Note)
              else comma.join(_tell(x, translate, comma) for x in v) if isinstance(v, tuple) else v
              for k, v in n.args}
    return translate(TEMPLATES[n.key]).format(**values)
