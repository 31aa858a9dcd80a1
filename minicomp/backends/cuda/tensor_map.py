"""TMA tensor maps on the host: checking a tensor against a map's requirements and encoding the
map's 128 bytes for a launch.

On the GPU (`cuda` target) the bytes are the driver's CUtensorMap, made by
`cuTensorMapEncodeTiled` (cuda-python's cuda.bindings.driver) from `driver_arguments`, which
needs no GPU and is what the tests check. On `cuda-emu` they are minicomp's own description of
the same size (`emulator_bytes`; emu_tma.h's TmaDesc reads it): base address, element size,
rank, swizzle, then sizes, byte strides and box, innermost dimension first as in the driver's
arrays, and the out-of-bounds fill (0: zeros).

`check_tensor` raises TensorMapError saying what the driver would refuse: the data 16-byte
aligned, the innermost stride 1 element and the others multiples of 16 bytes (under 2^40), the
sizes 1 to 2^32, the element type the map's.

Compiled kernels (`TensorMapArgument`): a template reading an operand by TMA (matmul_hopper)
declares a tensor-map parameter for it and says which of its buffers the map describes, as a
view (LaunchAttrs.tensor_maps: base, shape, strides in elements; the shape and strides may be
expressions of the kernel's size parameters, a symbolic M). Whoever launches it (the plan, a
tuner's runner) encodes the bytes from the buffer's tensor and the sizes at each launch: its
address changes from call to call (a fresh input, the workspace), and so may its view. A view
with no elements gets zero bytes: the kernel has nothing to load from it (TMA has no map of an
empty dimension). CPU tensors
(cuda-emu) get the emulator's description, CUDA tensors the driver's CUtensorMap, cached per
address (a CUDA-graph replay reuses the bytes its capture encoded; a static plan finds its
inputs at a few addresses).
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import Any

from minicomp.ir.expr import Dim
from minicomp.ir.func import Function
from minicomp.ir.symbols import compile_dims
from minicomp.ir.types import DataType, PointerType, TensorMapType, to_torch

MAX_RANK = 5
MAP_BYTES = 128
_MAGIC = 0x4D54434D  # "MCTM", emu_tma.h's TMA_MAGIC
# Element types by size where the driver has no type of their own: bits are copied.
_DATA_TYPES = {
    "float16": 6,
    "bfloat16": 9,
    "float32": 7,
    "float64": 8,
    "int32": 3,
    "int64": 5,
    "uint32": 2,
    "uint64": 4,
}
_BY_SIZE = {1: 0, 2: 1}  # CU_TENSOR_MAP_DATA_TYPE_UINT8, _UINT16
_SWIZZLES = {0: 0, 32: 1, 64: 2, 128: 3}  # CU_TENSOR_MAP_SWIZZLE_NONE, _32B, _64B, _128B
L2_PROMOTION_128B = 2  # CU_TENSOR_MAP_L2_PROMOTION_L2_128B


class TensorMapError(ValueError):
    """A tensor cannot be described by a tensor map as its kernel declares it."""


def check_tensor(name: str, t: Any, m: TensorMapType) -> None:
    """Raise TensorMapError, naming parameter `name`, when torch tensor `t` cannot back map `m`."""
    what = f"tensor map {name}"
    if t.dtype != to_torch(m.elem):
        raise TensorMapError(
            f"{what} holds {m.elem.name} elements, got a {str(t.dtype)[6:]} tensor"
        )
    if t.dim() != m.rank:
        raise TensorMapError(f"{what} has {m.rank} dimensions, got a tensor of {t.dim()}")
    size = t.element_size()
    if t.data_ptr() % 16:
        raise TensorMapError(
            f"{what}: the tensor's data at {t.data_ptr():#x} is not 16-byte aligned (TMA needs it)"
        )
    for k, n in enumerate(t.shape):
        if not 1 <= n <= 2**32:
            raise TensorMapError(f"{what}: dimension {k} has {n} elements; TMA takes 1 to 2^32")
    if t.stride(-1) != 1:
        raise TensorMapError(
            f"{what}: the innermost dimension has stride {t.stride(-1)}; TMA needs 1 (pass "
            "t.contiguous())"
        )
    for k in range(m.rank - 1):
        nbytes = t.stride(k) * size
        if nbytes % 16 or not 0 < nbytes < 2**40:
            raise TensorMapError(
                f"{what}: dimension {k} has a stride of {nbytes} bytes ({t.stride(k)} elements); "
                "TMA needs a positive multiple of 16 bytes (pad the rows)"
            )


def _innermost_first(t: Any) -> tuple[list[int], list[int]]:
    """The tensor's sizes and byte strides, innermost dimension first."""
    size = t.element_size()
    dims = [int(n) for n in reversed(t.shape)]
    strides = [int(s) * size for s in reversed(t.stride())]
    return dims, strides


def driver_arguments(t: Any, m: TensorMapType) -> dict[str, Any]:
    """The keyword arguments of cuTensorMapEncodeTiled for tensor `t` under map `m` (enums as
    their integer values)."""
    dims, strides = _innermost_first(t)
    elem = m.elem
    data_type = _DATA_TYPES.get(elem.name, _BY_SIZE.get(elem.nbytes))
    if data_type is None:
        raise TensorMapError(f"TMA cannot copy {elem.name} elements")
    return {
        "tensorDataType": data_type,
        "tensorRank": m.rank,
        "globalAddress": t.data_ptr(),
        "globalDim": dims,
        "globalStrides": strides[1:],  # the innermost one is the element's size
        "boxDim": list(reversed(m.box)),
        "elementStrides": [1] * m.rank,
        "interleave": 0,  # CU_TENSOR_MAP_INTERLEAVE_NONE
        "swizzle": _SWIZZLES[m.swizzle],
        "l2Promotion": L2_PROMOTION_128B,
        "oobFill": 0,  # CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE: zeros
    }


def driver_call(t: Any, m: TensorMapType) -> tuple:
    """The positional arguments of cuda-python's cuTensorMapEncodeTiled for tensor `t` under map
    `m`: driver_arguments in the bindings' types (building them needs no GPU)."""
    from cuda.bindings import driver

    a = driver_arguments(t, m)
    u64, u32 = driver.cuuint64_t, driver.cuuint32_t
    return (
        driver.CUtensorMapDataType(a["tensorDataType"]),
        a["tensorRank"],
        a["globalAddress"],
        [u64(n) for n in a["globalDim"]],
        [u64(n) for n in a["globalStrides"]],
        [u32(n) for n in a["boxDim"]],
        [u32(n) for n in a["elementStrides"]],
        driver.CUtensorMapInterleave(a["interleave"]),
        driver.CUtensorMapSwizzle(a["swizzle"]),
        driver.CUtensorMapL2promotion(a["l2Promotion"]),
        driver.CUtensorMapFloatOOBfill(a["oobFill"]),
    )


def driver_bytes(t: Any, m: TensorMapType) -> bytes:
    """The CUtensorMap of CUDA tensor `t` under map `m`, encoded by the CUDA driver."""
    from cuda.bindings import driver

    from minicomp.backends.cuda.driver import CudaDriverError, ensure_context

    ensure_context(t.device.index)  # the driver initialised, its context current
    err, tensor_map = driver.cuTensorMapEncodeTiled(*driver_call(t, m))
    if err != driver.CUresult.CUDA_SUCCESS:
        raise CudaDriverError(
            f"cuTensorMapEncodeTiled failed: {err.name} for {driver_arguments(t, m)}"
        )
    return struct.pack("<16Q", *(int(v) for v in tensor_map.opaque))


class MapBytes(bytes):
    """A map's bytes with the tensor they describe (`described`), which they keep alive."""

    described: Any = None


class EmulatorMap(MapBytes):
    """The emulator's map bytes, with the tensor they describe (`described`): a counted launch
    (the performance lens) counts the copies through the map against that tensor's memory."""


def emulator_bytes(t: Any, m: TensorMapType) -> bytes:
    """minicomp's own 128-byte description of tensor `t` under map `m` (emu_tma.h's TmaDesc),
    an EmulatorMap remembering `t`."""
    dims, strides = _innermost_first(t)
    pad = MAX_RANK - m.rank
    box = list(reversed(m.box))
    head = struct.pack("<QIIII", t.data_ptr(), _MAGIC, m.elem.nbytes, m.rank, m.swizzle)
    body = struct.pack("<5Q5Q5II", *dims, *[0] * pad, *strides, *[0] * pad, *box, *[0] * pad, 0)
    data = EmulatorMap(head + body)
    data.described = t
    assert len(data) == MAP_BYTES
    return data


def encode(name: str, t: Any, m: TensorMapType, emulated: bool) -> bytes:
    """The 128 bytes a kernel's tensor-map parameter `name` gets for tensor `t`: checked, then
    encoded for the emulator or by the driver."""
    check_tensor(name, t, m)
    return emulator_bytes(t, m) if emulated else driver_bytes(t, m)


CACHED = 64
"""Driver encodings a map keeps (by address) before it starts over."""


class TensorMapArgument:
    """Tensor-map parameter `param` (of `type`) of kernel `kernel`: buffer argument `buffer`
    (its index among the kernel's pointer arguments) viewed from element `base` with `shape`
    and `strides`, sizes of the kernel's scalar parameters `symbols` (their names, in order)."""

    def __init__(
        self,
        kernel: str,
        param: str,
        type: TensorMapType,
        buffer: int,
        base: int,
        shape: tuple[Dim, ...],
        strides: tuple[Dim, ...],
        symbols: tuple[str, ...] = (),
    ):
        self.kernel, self.param, self.type, self.buffer = kernel, param, type, buffer
        self.base, self.shape, self.strides, self.symbols = base, shape, strides, symbols
        self._dims = compile_dims([*shape, *strides])
        self._cache: dict[tuple, bytes] = {}

    def view(self, t: Any, scalars: Sequence[int] = ()) -> Any:
        """The view of buffer tensor `t` the map describes, for the launch's size arguments
        `scalars` (the kernel's scalar parameters, in order)."""
        dims = self._dims(dict(zip(self.symbols, scalars)))
        rank = len(self.shape)
        return t.as_strided(dims[:rank], dims[rank:], t.storage_offset() + self.base)

    def encode(self, t: Any, scalars: Sequence[int] = ()) -> bytes:
        """The map's bytes for buffer tensor `t` and size arguments `scalars` (a TensorMapError
        naming the kernel and the parameter when TMA cannot read it). A view whose data is not
        16-byte aligned (an input at an odd offset into its storage) is read from an aligned
        copy, which the bytes keep alive (`described`) through the launch."""
        view = self.view(t, scalars)
        if view.numel() == 0:
            return bytes(MAP_BYTES)
        if view.data_ptr() % 16:
            copy = aligned_copy(view)
            data = MapBytes(self._encode(copy, emulated=t.device.type == "cpu"))
            data.described = copy
            return data
        if t.device.type == "cpu":  # the emulator's: cheap, and it remembers its tensor
            return self._encode(view, emulated=True)
        key = (t.device.index, view.data_ptr())
        hit = self._cache.get(key)
        if hit is None:
            if len(self._cache) >= CACHED:
                self._cache.clear()
            hit = self._cache[key] = self._encode(view, emulated=False)
        return hit

    def _encode(self, view: Any, emulated: bool) -> bytes:
        try:
            return encode(self.param, view, self.type, emulated)
        except TensorMapError as e:
            raise TensorMapError(f"kernel {self.kernel}: {e}") from None


def aligned_copy(view: Any) -> Any:
    """A copy of `view` with its strides in fresh memory (PyTorch's allocators align it)."""
    span = 1 + sum((n - 1) * s for n, s in zip(view.shape, view.stride()))
    fresh = view.new_empty(span).as_strided(view.shape, view.stride())
    return fresh.copy_(view)


def tensor_map_arguments(f: Function) -> tuple[TensorMapArgument, ...]:
    """The tensor-map parameters of kernel `f` (its attrs.tensor_maps, which come first among
    its parameters), each with the index of its buffer among the pointer parameters."""
    entries = f.attrs.tensor_maps
    if not entries:
        return ()
    params = {p.name: p for p in f.params}
    pointers = [p.name for p in f.params if isinstance(p.type, PointerType)]
    symbols = tuple(p.name for p in f.params if isinstance(p.type, DataType))
    leading = [p.name for p in f.params[: len(entries)]]
    if leading != [e[0] for e in entries]:
        raise ValueError(
            f"kernel {f.name}: its tensor-map parameters {[e[0] for e in entries]} must come "
            f"first, in that order, not {leading}"
        )
    out = []
    for param, buffer, base, shape, strides in entries:
        t = params[param].type
        if not isinstance(t, TensorMapType) or buffer not in pointers or len(shape) != t.rank:
            raise ValueError(
                f"kernel {f.name}: tensor map {param} must be a rank-{len(shape)} tensor-map "
                f"parameter viewing a pointer parameter ({buffer})"
            )
        out.append(
            TensorMapArgument(
                f.name, param, t, pointers.index(buffer), base, shape, strides, symbols
            )
        )
    return tuple(out)


def encoded_maps(
    maps: Sequence[TensorMapArgument], buffers: Sequence[Any], scalars: Sequence[int] = ()
) -> list[bytes]:
    """The bytes of each of `maps` for a launch whose pointer arguments are the tensors
    `buffers` (the arguments that follow them) and size arguments `scalars`."""
    return [m.encode(buffers[m.buffer], scalars) for m in maps]
