"""The ctypes type of each kernel parameter, for the targets that call kernels through ctypes."""

from __future__ import annotations

import ctypes
from typing import Any

from minicomp.ir.types import PointerType, TensorMapType

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


class TensorMapBytes(ctypes.Structure):
    """A tensor-map kernel parameter: 128 bytes by value, set from a bytes object (`value`, as
    a scalar's ctypes value is set)."""

    _fields_ = [("opaque", ctypes.c_uint64 * 16)]

    def __init__(self, value: bytes | None = None):
        super().__init__()
        if value is not None:
            self.value = value

    @property
    def value(self) -> bytes:
        return bytes(self)

    @value.setter
    def value(self, data: bytes) -> None:
        if len(data) != ctypes.sizeof(self):
            raise ValueError(f"a tensor map is {ctypes.sizeof(self)} bytes, not {len(data)}")
        ctypes.memmove(ctypes.addressof(self), data, len(data))


def param_ctype(param) -> Any:
    """The ctypes type of a kernel parameter: c_void_p (an integer address) for pointers,
    TensorMapBytes for tensor maps."""
    if isinstance(param.type, TensorMapType):
        return TensorMapBytes
    if isinstance(param.type, PointerType):
        return ctypes.c_void_p
    return SCALAR_CTYPES[param.type.name]
