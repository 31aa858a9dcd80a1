"""Data types of the IRs: scalar types, pointer types and tensor types."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class DataType:
    """A scalar type; `name` is PyTorch's name for it (float32, bfloat16, bool...)."""

    name: str
    short: str
    nbytes: int
    kind: str  # "float", "int", "uint" or "bool"

    @property
    def is_float(self) -> bool:
        return self.kind == "float"

    @property
    def is_integer(self) -> bool:
        return self.kind in ("int", "uint")

    @property
    def is_bool(self) -> bool:
        return self.kind == "bool"

    def __repr__(self) -> str:
        return self.short


@dataclass(frozen=True)
class PointerType:
    """A pointer to elements of `elem`, living in global, shared or local memory."""

    elem: DataType
    space: str = "global"

    @property
    def short(self) -> str:
        return f"{self.elem.short}*"

    def __repr__(self) -> str:
        return self.short


@dataclass(frozen=True)
class TensorMapType:
    """A TMA tensor map (a kernel parameter only): a `rank`-dimensional global tensor of
    `elem` read and written in boxes of `box` elements (outermost first) whose shared copies
    are swizzled by `swizzle` bytes (0, 32, 64 or 128). The launch encodes it into 128 bytes
    (minicomp.backends.cuda.tensor_map)."""

    elem: DataType
    box: tuple[int, ...]
    swizzle: int = 0

    @property
    def rank(self) -> int:
        return len(self.box)

    @property
    def box_bytes(self) -> int:
        n = self.elem.nbytes
        for b in self.box:
            n *= b
        return n

    @property
    def shared_alignment(self) -> int:
        """The alignment TMA needs of a box in shared memory: 128 bytes, 1024 under a 128-byte
        swizzle."""
        return 1024 if self.swizzle == 128 else 128

    @property
    def short(self) -> str:
        return f"tensor_map({self.elem.short})"

    def __repr__(self) -> str:
        return self.short


f16 = DataType("float16", "f16", 2, "float")
bf16 = DataType("bfloat16", "bf16", 2, "float")
f32 = DataType("float32", "f32", 4, "float")
f64 = DataType("float64", "f64", 8, "float")
i8 = DataType("int8", "i8", 1, "int")
i16 = DataType("int16", "i16", 2, "int")
i32 = DataType("int32", "i32", 4, "int")
i64 = DataType("int64", "i64", 8, "int")
u8 = DataType("uint8", "u8", 1, "uint")
u16 = DataType("uint16", "u16", 2, "uint")
u32 = DataType("uint32", "u32", 4, "uint")
u64 = DataType("uint64", "u64", 8, "uint")
boolean = DataType("bool", "bool", 1, "bool")
# The float8 formats: one byte of storage, arithmetic in float32 (PyTorch upcasts too).
# e4m3fn and e4m3fnuz have no infinity; the fnuz ones have no negative zero (0x80 is NaN).
f8e4m3fn = DataType("float8_e4m3fn", "f8e4m3fn", 1, "float")
f8e5m2 = DataType("float8_e5m2", "f8e5m2", 1, "float")
f8e4m3fnuz = DataType("float8_e4m3fnuz", "f8e4m3fnuz", 1, "float")
f8e5m2fnuz = DataType("float8_e5m2fnuz", "f8e5m2fnuz", 1, "float")

FLOAT8_TYPES = (f8e4m3fn, f8e5m2, f8e4m3fnuz, f8e5m2fnuz)
NARROW_FLOATS = (f16, bf16, *FLOAT8_TYPES)
"""The float types stored as bit patterns narrower than float32 and computed in float32."""

ALL_TYPES = (f16, bf16, f32, f64, i8, i16, i32, i64, u8, u16, u32, u64, boolean, *FLOAT8_TYPES)
_BY_NAME = {t.name: t for t in ALL_TYPES} | {t.short: t for t in ALL_TYPES}

Type = DataType | PointerType | TensorMapType


def dtype(name: str | DataType) -> DataType:
    """The data type called `name` (PyTorch's name or the short one)."""
    if isinstance(name, DataType):
        return name
    try:
        return _BY_NAME[name]
    except KeyError:
        raise ValueError(f"unknown data type {name!r}") from None


def from_torch(torch_dtype) -> DataType:
    """The data type of a torch.dtype; ones minicomp cannot compute with are "opaque"."""
    name = str(torch_dtype).removeprefix("torch.")
    if name in _BY_NAME:
        return _BY_NAME[name]
    # Complex, quantized, float8_e8m0fnu...: values of these types only flow between ATen calls.
    return DataType(name, name, torch_dtype.itemsize, "opaque")


def to_torch(dt: DataType):
    """The torch.dtype of a data type."""
    import torch

    return getattr(torch, dt.name)


def is_narrow_float(dt: DataType) -> bool:
    """Whether values of `dt` are bit patterns narrower than float32, computed in float32:
    float16, bfloat16 and the float8 formats."""
    return dt in NARROW_FLOATS


def is_float8(dt: DataType) -> bool:
    """Whether `dt` is one of the float8 formats."""
    return dt in FLOAT8_TYPES


def fits(value: int, dt: DataType) -> bool:
    """Whether the integer `value` is representable in integer type `dt`."""
    bits = 8 * dt.nbytes
    if dt.kind == "uint":
        return 0 <= value < 2**bits
    return -(2 ** (bits - 1)) <= value < 2 ** (bits - 1)


_FLOAT_ORDER = (*FLOAT8_TYPES, f16, bf16, f32, f64)
_INT_ORDER = (u8, i8, i16, i32, i64)


def promote(a: DataType, b: DataType) -> DataType:
    """The common type of two scalar types, following PyTorch's promotion lattice."""
    if a == b:
        return a
    if a.is_bool:
        return b
    if b.is_bool:
        return a
    if a.is_float and b.is_float:
        # Mixed half or float8 formats: PyTorch refuses to promote float8 with anything (the
        # graph never mixes them); inside the IR, float32 holds both exactly.
        if {a, b} == {f16, bf16} or is_float8(a) and is_float8(b):
            return f32
        return max(a, b, key=_FLOAT_ORDER.index)
    if a.is_float:
        return a
    if b.is_float:
        return b
    if {a, b} == {u8, i8}:
        return i16
    if a in _INT_ORDER and b in _INT_ORDER:
        return max(a, b, key=_INT_ORDER.index)
    return a if a.nbytes >= b.nbytes else b
