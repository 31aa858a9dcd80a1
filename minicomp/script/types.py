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


class TensorMapType:
    """The annotation `tensor_map(dtype[dims], box=(...), swizzle=0)`: a TMA tensor map of a
    contiguous row-major tensor of that shape, copied in boxes of `box` elements (one size a
    dimension, outermost first) whose shared copies are swizzled by `swizzle` bytes (0, 32,
    64 or 128). The caller passes the tensor; the launch encodes the map."""

    __slots__ = ("tensor", "box", "swizzle")

    def __init__(self, tensor: TensorType, box: tuple[int, ...], swizzle: int):
        self.tensor = tensor
        self.box = box
        self.swizzle = swizzle

    @property
    def dtype(self) -> DataType:
        return self.tensor.dtype

    def __repr__(self) -> str:
        return f"tensor_map({self.tensor!r}, box={self.box!r}, swizzle={self.swizzle})"


TMA_SWIZZLES = (0, 32, 64, 128)
TMA_MAX_RANK = 5
TMA_MAX_BOX = 256


def tensor_map(tensor: TensorType | ScalarType, box=None, swizzle: int = 0) -> TensorMapType:
    """A tensor-map parameter annotation (see TensorMapType). Python evaluates annotations when
    the function is defined; the script's signature checks them (`check_tensor_map`), so that
    a bad box is an error at the script's line."""
    if isinstance(tensor, ScalarType):
        tensor = TensorType(tensor, ())
    if isinstance(box, int) and not isinstance(box, bool):
        box = (box,)
    return TensorMapType(tensor, tuple(box) if isinstance(box, tuple | list) else box, swizzle)


def check_tensor_map(m: TensorMapType) -> None:
    """Raise ValueError naming what the driver would refuse of a tensor map's box or swizzle."""
    tensor, box, swizzle = m.tensor, m.box, m.swizzle
    if not isinstance(tensor, TensorType):
        raise ValueError(f"tensor_map() takes a tensor type such as f16[m, k], not {tensor!r}")
    if not isinstance(box, tuple) or not 1 <= len(box) <= TMA_MAX_RANK:
        raise ValueError(f"the box of tensor_map() is a tuple of 1 to {TMA_MAX_RANK} sizes")
    for b in box:
        if isinstance(b, bool) or not isinstance(b, int) or not 1 <= b <= TMA_MAX_BOX:
            raise ValueError(
                f"the box of tensor_map() has sizes 1 to {TMA_MAX_BOX} (compile-time ints), "
                f"not {b!r}"
            )
    if tensor.shape and len(tensor.shape) != len(box):
        raise ValueError(
            f"the box of tensor_map() has {len(box)} sizes; the tensor {tensor!r} has "
            f"{len(tensor.shape)} dimensions"
        )
    if swizzle not in TMA_SWIZZLES or isinstance(swizzle, bool):
        raise ValueError(f"the swizzle of tensor_map() is 0, 32, 64 or 128 bytes, not {swizzle!r}")
    inner = box[-1] * tensor.dtype.nbytes
    if inner % 16:
        raise ValueError(
            f"the box's inner dimension is {inner} bytes ({box[-1]} {tensor.dtype}); TMA needs "
            "a multiple of 16"
        )
    if swizzle and inner > swizzle:
        raise ValueError(
            f"the box's inner dimension is {inner} bytes ({box[-1]} {tensor.dtype}), over the "
            f"{swizzle}-byte swizzle span"
        )
