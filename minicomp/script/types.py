"""Type annotations of scripts: scalar types (also casts), tensors of a shape, raw pointers."""

from __future__ import annotations

from minicomp.ir import types as T
from minicomp.ir.types import DataType


class ScalarType:
    """A scalar type of the script language, like `f32`.

    As a parameter annotation it is a scalar parameter; `f32[m, k]` is a row-major contiguous
    tensor parameter of that shape (ints: static sizes; names, or strings naming int parameters
    of the same kernel: runtime sizes); inside a script `f32(x)` converts x.
    """

    __slots__ = ("dtype",)

    def __init__(self, dtype: DataType):
        self.dtype = dtype

    def __getitem__(self, dims) -> TensorType:
        return TensorType(self, dims if isinstance(dims, tuple) else (dims,))

    def __call__(self, value):
        raise TypeError(f"{self!r}(...) converts values inside @minicomp.script functions only")

    def __repr__(self) -> str:
        return self.dtype.short if self.dtype != T.boolean else "boolean"


class TensorType:
    """The annotation `dtype[dims]`: a contiguous row-major tensor passed as a pointer."""

    __slots__ = ("scalar", "shape")

    def __init__(self, scalar: ScalarType, shape: tuple):
        self.scalar = scalar
        self.shape = shape

    @property
    def dtype(self) -> DataType:
        return self.scalar.dtype

    def __repr__(self) -> str:
        return f"{self.scalar!r}[{', '.join(str(d) for d in self.shape)}]"


class PointerType:
    """The annotation `ptr(dtype)`: a raw pointer parameter (a tensor's data or an address)."""

    __slots__ = ("scalar",)

    def __init__(self, scalar: ScalarType):
        self.scalar = scalar

    @property
    def dtype(self) -> DataType:
        return self.scalar.dtype

    def __repr__(self) -> str:
        return f"ptr({self.scalar!r})"


def ptr(scalar: ScalarType) -> PointerType:
    """A raw pointer to elements of `scalar`, for parameters."""
    if not isinstance(scalar, ScalarType):
        raise TypeError(f"ptr() takes a scalar type such as f32, not {scalar!r}")
    return PointerType(scalar)


f16 = ScalarType(T.f16)
bf16 = ScalarType(T.bf16)
f32 = ScalarType(T.f32)
f64 = ScalarType(T.f64)
i8 = ScalarType(T.i8)
i16 = ScalarType(T.i16)
i32 = ScalarType(T.i32)
i64 = ScalarType(T.i64)
u8 = ScalarType(T.u8)
u16 = ScalarType(T.u16)
u32 = ScalarType(T.u32)
u64 = ScalarType(T.u64)
boolean = ScalarType(T.boolean)
# The float8 formats: one byte each, stored as its bit pattern; scripts spell them PyTorch's
# way (float8_e4m3fn) or the short way the printer writes (f8e4m3fn).
f8e4m3fn = float8_e4m3fn = ScalarType(T.f8e4m3fn)
f8e5m2 = float8_e5m2 = ScalarType(T.f8e5m2)
f8e4m3fnuz = float8_e4m3fnuz = ScalarType(T.f8e4m3fnuz)
f8e5m2fnuz = float8_e5m2fnuz = ScalarType(T.f8e5m2fnuz)

SCALAR_TYPES = (f16, bf16, f32, f64, i8, i16, i32, i64, u8, u16, u32, u64, boolean)
SCALAR_TYPES += (f8e4m3fn, f8e5m2, f8e4m3fnuz, f8e5m2fnuz)
