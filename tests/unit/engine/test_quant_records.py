"""One record per quantized type (engine/quants' QuantKind): the C lanes' types, sizes and vec_dot
partners are the records' (engine/c/types.h is written from them, and the compiled module
takes exactly those sizes), and every bit-exact vec_dot a record declares has the rules and the
decoder kernels/vecdot.py's quant_dot reads.

Like test_twins.py, a C module that is not built is a failure here, not a skip."""

from __future__ import annotations

import numpy as np
import pytest

import engine.compute.kernels  # noqa: F401 (registers the kernels' twins)
from engine.compute.kernels.vecdot import ACTIVATIONS, EXACT_QUANT, LANE_RULES, MIN_RULES, \
    decode_weights, vec_dot_of
from engine.core.types import GGMLType, traits
from engine.lanes import TWINS, compiled
from engine.quants import QUANT_KINDS, types_c
from engine.quants.common import Lanes, Mins

C = compiled()


def test_lanes_types_header():
    """engine/c/types.h (the C lanes' enum, block sizes and vec_dot partners) is the records',
    as engine/quants/types_c.py writes it."""
    assert types_c.HEADER.read_text() == types_c.header(), "run python -m engine.quants.types_c"


def test_header_names_every_record():
    """Every record's type is in the header's enum with its ggml_type id and block size, and the
    exact ones with their vec_dot partner."""
    sizes, partners = types_c.header().split("lanes_vec_dot_type")
    for t, kind in QUANT_KINDS.items():
        assert f"    {t.name} = {int(t)}," in sizes
        assert f"    case {t.name}: return {traits(t).type_size};" in sizes
        assert (f"    case {t.name}: return " in partners) == kind.exact, t.name
        if kind.exact:
            assert f"    case {t.name}: return {traits(t).vec_dot_type.name};" in partners


def quant_dot_args(type_: GGMLType, wsize: int, ysize: int) -> tuple:
    """quant_dot's arguments for one weight row and one activation row of one block, the rows
    wsize and ysize bytes long (and apart)."""
    w, x = np.zeros(max(wsize, 1), np.uint8), np.zeros(max(ysize, 1), np.uint8)
    return int(type_), w, wsize, x, ysize, np.zeros(1, np.float32), 1, 1, 1


@pytest.mark.parametrize("type_", sorted(QUANT_KINDS), ids=lambda t: t.name)
def test_compiled_quant_dot_takes_the_records_sizes(type_: GGMLType):
    """The compiled engine._lanes.quant_dot takes a type when its record has a bit-exact vec_dot,
    with blocks of exactly the record's size and its vec_dot partner's (a byte less is refused),
    and refuses every other type; so does its twin."""
    kind = QUANT_KINDS[type_]
    assert C is not None, "engine._lanes is not built"
    if not kind.exact:
        for fn in (C.quant_dot, TWINS["quant_dot"]):
            with pytest.raises(ValueError):
                fn(*quant_dot_args(type_, kind.type_size, 292))
        return
    ysize = traits(kind.vec_dot_type).type_size
    for fn in (C.quant_dot, TWINS["quant_dot"]):
        fn(*quant_dot_args(type_, kind.type_size, ysize))
    for wsize, xsize in ((kind.type_size - 1, ysize), (kind.type_size, ysize - 1)):
        with pytest.raises(ValueError):
            C.quant_dot(*quant_dot_args(type_, wsize, xsize))


@pytest.mark.parametrize("type_", sorted(EXACT_QUANT), ids=lambda t: t.name)
def test_exact_records_are_complete(type_: GGMLType):
    """A bit-exact record's vec_dot partner is an activation type quant_dot reads, its Lanes and
    Mins rules exist, and its decoder makes a block's integers as DotBlocks says: int16 q of
    the block's elements, float32 d, and what its rules read apart."""
    kind, vd = QUANT_KINDS[type_], vec_dot_of(type_)
    assert kind.vec_dot_type in ACTIVATIONS
    assert vd.lanes in LANE_RULES and (vd.mins is Mins.NONE or vd.mins in MIN_RULES)
    raw = np.random.default_rng(int(type_)).integers(0, 256, (2, 3, kind.type_size), np.uint8)
    with np.errstate(all="ignore"):
        dec = decode_weights(type_, raw)
    assert dec.q.dtype == np.int16 and dec.q.shape == (2, 3, kind.blck_size)
    assert dec.d.dtype == np.float32 and dec.d.shape == (2, 3)
    needs_aux = vd.run_scales or vd.lanes is Lanes.LESS_32 or vd.mins in (
        Mins.IN_ACC, Mins.FOUR_LANES, Mins.SUMMED, Mins.SHIFTS)
    assert (dec.aux is not None) == needs_aux, type_.name
    needs_dmin = vd.mins in (Mins.OFFSETS, Mins.IN_ACC, Mins.FOUR_LANES, Mins.SUMMED)
    assert (dec.dmin is not None) == needs_dmin, type_.name


def test_every_rule_is_used():
    """Each Lanes and Mins rule is some record's (a rule no type uses is dead code)."""
    used = {vec_dot_of(t).lanes for t in EXACT_QUANT} | {vec_dot_of(t).mins for t in EXACT_QUANT}
    assert set(Lanes) | set(Mins) == used
    assert set(LANE_RULES) == set(Lanes) and set(MIN_RULES) == set(Mins) - {Mins.NONE}


def test_exact_quant_is_the_records():
    """EXACT_QUANT, what mul_mat emulates bit for bit, is read from the records: the types with a
    vec_dot, every one of them with a CPU vec_dot_type in ggml's traits."""
    assert EXACT_QUANT == {t for t, k in QUANT_KINDS.items() if k.vec_dot is not None}
    assert all(traits(t).vec_dot_type is not None for t in EXACT_QUANT)
    with pytest.raises(ValueError, match="no bit-exact vec_dot"):
        vec_dot_of(GGMLType.IQ2_XXS)
