"""ggml's enums as the engine declares them (engine/core/optable.py, engine/core/types.py): each
member under its C spelling in the facade, which writes the constants out one by one."""

import engine.ggml as ggml
from engine.core.optable import GGMLGluOp, GGMLOp, GGMLUnaryOp
from engine.core.types import GGMLType

ENUMS = ((GGMLType, "GGML_TYPE_"), (GGMLOp, "GGML_OP_"), (GGMLUnaryOp, "GGML_UNARY_OP_"),
         (GGMLGluOp, "GGML_GLU_OP_"))


def test_every_member_has_its_c_name_in_the_facade():
    missing = [prefix + m.name for enum, prefix in ENUMS for m in enum
               if getattr(ggml, prefix + m.name, None) is not m or prefix + m.name not in ggml.__all__]
    assert missing == []
