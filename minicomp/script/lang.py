"""The primitives of the script language: importable names that the parser gives meaning to.

Outside a script they do nothing useful (calling one raises TypeError, except `max`, `min`
and `abs`, which fall back to Python's own so that `from minicomp.script import *` leaves
ordinary code working); they exist so that scripts read as Python and linters are quiet.
"""

from __future__ import annotations

import builtins
import dataclasses
from collections.abc import Callable

from minicomp.ir.expr import MATH_FUNCTIONS
from minicomp.ir.func import LaunchAttrs


class ScriptFunctionBase:
    """A script function as the language sees it, in a script's scope or called from one: its
    `signature()`, and `_state`, what its views share (parsed once). ScriptFunction
    (minicomp.script.function), which also renders CUDA C and launches kernels, is the one
    kind; this base lets the parser know it without importing it."""

    def signature(self):
        """The function's Signature (minicomp.script.signature), from its annotations."""
        raise NotImplementedError


class Primitive:
    """A function of the script language, known to the parser by `name`."""

    __slots__ = ("name", "python")

    def __init__(self, name: str, python: Callable | None = None):
        self.name = name
        self.python = python

    def __call__(self, *args, **kwargs):
        if self.python is not None:
            return self.python(*args, **kwargs)
        raise TypeError(f"{self.name}() can only be used inside a @minicomp.script function")

    def __repr__(self) -> str:
        return f"<script primitive {self.name}>"


class Macro:
    """A Python function a script calls at parse time (`@macro`): it gets its arguments as
    kernel-IR expressions (or compile-time values, tensors as TensorRefs) and returns an IR
    expression (the call's value), or IR statements (a statement or a list: the call is a
    statement), or None. Templates take their fused prologues and epilogues this way."""

    __slots__ = ("fn", "name")

    def __init__(self, fn: Callable):
        self.fn = fn
        self.name = getattr(fn, "__name__", "macro")

    def __call__(self, *args, **kwargs):
        return self.fn(*args, **kwargs)

    def __repr__(self) -> str:
        return f"<script macro {self.name}>"


def macro(fn: Callable) -> Macro:
    """Decorator: `fn`, called from scripts, is expanded at parse time (see Macro)."""
    return Macro(fn)


class LaunchIndex:
    """`threadIdx`, `blockIdx`, `blockDim` or `gridDim`; `.x`, `.y`, `.z` are i32 values."""

    __slots__ = ("name", "intrinsic")

    def __init__(self, name: str, intrinsic: str):
        self.name = name
        self.intrinsic = intrinsic  # the kernel-IR intrinsic prefix, like "thread_idx"

    def __repr__(self) -> str:
        return f"<script primitive {self.name}>"


class Attrs:
    """`attrs` inside a kernel: `attrs.grid_dim = (x, y, z)`, `attrs.block_dim = ...`,
    `attrs.dynamic_smem = bytes`, `attrs.launch_bounds = max threads`,
    `attrs.min_blocks = blocks per SM`, `attrs.template = "name[config]"`: the fields of the
    kernel's minicomp.ir.func.LaunchAttrs, which documents them."""

    NAMES = tuple(f.name for f in dataclasses.fields(LaunchAttrs))

    def __setattr__(self, name, value):
        raise TypeError("attrs can only be set inside a @minicomp.script kernel")

    def __repr__(self) -> str:
        return "<script primitive attrs>"


class Dims:
    """`dim.n` in a tensor annotation (`f32[dim.n, 4]`): the runtime size given by the int
    parameter `n`. It is the string "n", spelled so that linters see no undefined name."""

    def __getattr__(self, name: str) -> str:
        if name.startswith("__"):
            raise AttributeError(name)
        return name

    def __repr__(self) -> str:
        return "<script primitive dim>"


dim = Dims()
threadIdx = LaunchIndex("threadIdx", "thread_idx")
blockIdx = LaunchIndex("blockIdx", "block_idx")
blockDim = LaunchIndex("blockDim", "block_dim")
gridDim = LaunchIndex("gridDim", "grid_dim")
attrs = Attrs()

syncthreads = Primitive("syncthreads")
threadfence = Primitive("threadfence")
shfl_down_sync = Primitive("shfl_down_sync")
shfl_xor_sync = Primitive("shfl_xor_sync")
shfl_sync = Primitive("shfl_sync")
atomic_add = Primitive("atomic_add")
atomic_max = Primitive("atomic_max")
shared_tensor = Primitive("shared_tensor")
dynamic_shared_tensor = Primitive("dynamic_shared_tensor")
register_tensor = Primitive("register_tensor")
printf = Primitive("printf")
comment = Primitive("comment")
unroll = Primitive("unroll")
load_vec = Primitive("load_vec")
store_vec = Primitive("store_vec")
is_aligned = Primitive("is_aligned")
mma_sync_m16n8k16 = Primitive("mma_sync_m16n8k16")
mma_sync_m16n8k32 = Primitive("mma_sync_m16n8k32")
ldmatrix_x1 = Primitive("ldmatrix_x1")
ldmatrix_x2 = Primitive("ldmatrix_x2")
ldmatrix_x4 = Primitive("ldmatrix_x4")
ldmatrix_x1_trans = Primitive("ldmatrix_x1_trans")
ldmatrix_x2_trans = Primitive("ldmatrix_x2_trans")
ldmatrix_x4_trans = Primitive("ldmatrix_x4_trans")
cp_async = Primitive("cp_async")
cp_async_commit = Primitive("cp_async_commit")
cp_async_wait = Primitive("cp_async_wait")
cp_async_wait_all = Primitive("cp_async_wait_all")
max = Primitive("max", builtins.max)  # noqa: A001 - the script's max, Python's outside
min = Primitive("min", builtins.min)  # noqa: A001
abs = Primitive("abs", builtins.abs)  # noqa: A001
pow = Primitive("pow", builtins.pow)  # noqa: A001

# Every math function of the kernel IR, as a primitive of the same name.
MATH = {name: Primitive(name) for name in MATH_FUNCTIONS if name != "abs"}
MATH["abs"] = abs
globals().update({name: p for name, p in MATH.items() if name != "abs"})

# Python builtins a script may use, with their meaning in the script.
BUILTINS = {"max": max, "min": min, "abs": abs, "pow": pow, "range": builtins.range, "len": len}
