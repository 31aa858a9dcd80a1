"""The op table the generator draws from; importing this package registers every op."""

from minicomp.fuzz.ops import creation, elementwise, index, inplace, matmul, reduce, shape
from minicomp.fuzz.ops.table import FAMILIES, FAMILY_WEIGHTS, TABLE, OpDef, ops_of

__all__ = [
    "FAMILIES",
    "FAMILY_WEIGHTS",
    "TABLE",
    "OpDef",
    "ops_of",
    "creation",
    "elementwise",
    "index",
    "inplace",
    "matmul",
    "reduce",
    "shape",
]
