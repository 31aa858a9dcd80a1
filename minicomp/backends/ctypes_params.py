"""The ctypes type of each kernel parameter, for the targets that call kernels through ctypes."""

from __future__ import annotations

import ctypes
from typing import Any

from minicomp.ir.types import PointerType

# Half-precision and float8 scalars travel as their bit patterns, as the kernels store them.
SCALAR_CTYPES = {
    "float32": ctypes.c_float,
    "float64": ctypes.c_double,
    "float16": ctypes.c_uint16,
    "bfloat16": ctypes.c_uint16,
    "float8_e4m3fn": ctypes.c_uint8,
    "float8_e5m2": ctypes.c_uint8,
    "float8_e4m3fnuz": ctypes.c_uint8,
    "float8_e5m2fnuz": ctypes.c_uint8,
    "bool": ctypes.c_bool,
    "int8": ctypes.c_int8,
    "int16": ctypes.c_int16,
    "int32": ctypes.c_int32,
    "int64": ctypes.c_int64,
    "uint8": ctypes.c_uint8,
    "uint16": ctypes.c_uint16,
    "uint32": ctypes.c_uint32,
    "uint64": ctypes.c_uint64,
}


def param_ctype(param) -> Any:
    """The ctypes type of a kernel parameter: c_void_p (an integer address) for pointers."""
    if isinstance(param.type, PointerType):
        return ctypes.c_void_p
    return SCALAR_CTYPES[param.type.name]
