"""Launching script kernels with torch tensors: argument checks, runtime sizes, builds.

Tensor arguments must match their annotation exactly (dtype, number of dimensions, static
sizes, contiguity) and sit on one device; runtime sizes bind from the tensors' shapes (a size
parameter may be left out of the call, or given and then checked). CUDA tensors run on the
`cuda` target, CPU tensors in the emulator, unless the kernel's target says otherwise.
A launch whose grid has no block (an empty tensor) does nothing. The dynamic shared memory
(`attrs.dynamic_smem`) is evaluated per launch; a block over `attrs.launch_bounds` threads,
or over 227 KiB of dynamic shared memory, is refused. With the `emu_checks` option, the
emulator checks every access to a tensor argument against its bounds (an
`emu.OutOfBoundsError` names the kernel, the tensor, the index and the thread). With the
`lens` option, the emulator counts each launch for the open lens sessions (minicomp.lens:
`minicomp profile`), as it does a compiled graph's kernels.
A tensor-map parameter takes a tensor of its annotation's type and shape, contiguous or not
(minicomp.backends.cuda.tensor_map says what TMA needs of it); each launch encodes its map for
the target (the driver's CUtensorMap on the GPU, minicomp's description on cuda-emu).
"""

from __future__ import annotations

import math
import operator
from collections.abc import Sequence
from typing import Any

import torch

from minicomp import config
from minicomp.backends.c_like import narrow_bits
from minicomp.backends.cuda.emu import MAX_DYNAMIC_SHARED
from minicomp.backends.cuda.module import dynamic_shared_bytes
from minicomp.backends.cuda.tensor_map import TensorMapError, encode
from minicomp.ir import expr as E
from minicomp.ir.symbols import compile_dims, launch_dims
from minicomp.ir.types import fits, is_narrow_float, to_torch
from minicomp.script.errors import ScriptError
from minicomp.script.function import ScriptFunction, set_launcher
from minicomp.script.signature import Param, Signature


def _size_symbol(d) -> str | None:
    """The parameter a size stands for, when it is one parameter (possibly widened)."""
    if isinstance(d, E.Cast):
        d = d.a
    return d.name if isinstance(d, E.Var) else None


class Binder:
    """Turns the Python arguments of a kernel call into the IR parameters' values."""

    def __init__(self, sf: ScriptFunction):
        self.sig: Signature = sf.signature()
        self.filename = sf._state.source.filename
        f = sf.ir
        self.order = [p.name for p in f.params]
        self.function = f
        self.dims = launch_dims(f)
        shared = dynamic_shared_bytes(f)
        self.shared = shared if callable(shared) else lambda args: shared
        by_name = {p.name: p for p in self.sig.params}
        self.maps = [
            (i, by_name[name])
            for i, name in enumerate(self.order)
            if name in by_name and by_name[name].kind == "tensor_map"
        ]

    def error(self, p: Param | None, reason: str) -> ScriptError:
        line = p.lineno if p is not None else self.sig.lineno
        return ScriptError(reason, self.filename, line)

    def bind(self, args: Sequence, kwargs: dict) -> tuple[list, Any]:
        """(IR argument values in IR order, tensors as given, the tensors' device or None)."""
        sig = self.sig
        params = {p.name: p for p in sig.params}
        if len(args) > len(params):
            n = len(params)
            raise self.error(None, f"{sig.py_name}() takes {n} arguments, {len(args)} given")
        given = dict(zip(params, args))
        for key, value in kwargs.items():
            if key not in params:
                raise self.error(None, f"{sig.py_name}() has no parameter {key!r}")
            if key in given:
                raise self.error(None, f"{sig.py_name}() got two values for argument {key!r}")
            given[key] = value
        values: dict[str, Any] = {}
        sizes: dict[str, int] = {}
        for p in sig.params:
            if p.kind == "scalar" and p.name in given:
                values[p.name] = self.scalar(p, given[p.name])
                if p.dtype.is_integer:
                    sizes[p.name] = values[p.name]
        device, checks = None, []
        for p in sig.params:
            if p.kind == "scalar":
                continue
            if p.name not in given:
                raise self.error(p, f"{sig.py_name}() is missing the argument {p.name}")
            values[p.name], dev = self.tensor(p, given[p.name], sizes, checks)
            if dev is not None:
                if device is not None and dev != device:
                    raise self.error(
                        p, f"argument {p.name} is on {dev}, the kernel's other tensors on {device}"
                    )
                device = dev
        for p in sig.params:
            if p.kind == "scalar" and p.name not in values:
                if p.name not in sizes:
                    raise self.error(p, f"{sig.py_name}() is missing the argument {p.name}")
                values[p.name] = sizes[p.name]
        for p, k, d, actual in checks:
            expected = compile_dims([d])(sizes)[0]
            if expected != actual:
                raise self.error(p, self.shape_message(p, f"dimension {k} is {actual}", sizes))
        return [values[name] for name in self.order], device

    def encode_maps(self, values: list, emulated: bool) -> list:
        """`values` with each tensor-map argument's tensor replaced by its map's bytes."""
        values = list(values)
        for i, p in self.maps:
            try:
                values[i] = encode(p.name, values[i], p.var.type, emulated)
            except TensorMapError as e:
                raise self.error(p, f"argument {p.name}: {e}") from None
        return values

    def scalar(self, p: Param, value) -> Any:
        dt = p.dtype
        what = f"argument {p.name} is a {dt} scalar"
        if dt.is_bool:
            if not isinstance(value, bool):
                raise self.error(p, f"{what}, not {_kind(value)}")
            return value
        if dt.is_integer:
            if isinstance(value, bool):
                raise self.error(p, f"{what}, not a bool")
            try:
                v = operator.index(value)
            except TypeError:
                raise self.error(p, f"{what}, not {_kind(value)}") from None
            if not fits(v, dt):
                raise self.error(p, f"{what}; {v} does not fit")
            return v
        if isinstance(value, bool) or not isinstance(value, int | float):
            try:
                value = float(value)
            except (TypeError, ValueError):
                raise self.error(p, f"{what}, not {_kind(value)}") from None
        if is_narrow_float(dt):
            return narrow_bits(float(value), dt)
        return float(value)

    def tensor(self, p: Param, t, sizes: dict, checks: list) -> tuple[Any, Any]:
        if p.kind == "pointer" and isinstance(t, int) and not isinstance(t, bool):
            return t, None
        if not isinstance(t, torch.Tensor):
            raise self.error(p, f"argument {p.name} is a {p.dtype} tensor, not {_kind(t)}")
        if t.dtype != to_torch(p.dtype):
            raise self.error(
                p, f"argument {p.name} is a {p.dtype.name} tensor, got {str(t.dtype)[6:]}"
            )
        if t.device.type not in ("cpu", "cuda"):
            raise self.error(p, f"argument {p.name} is on {t.device}; kernels take cpu or cuda")
        if p.kind == "pointer":
            return t, t.device
        if p.kind == "tensor_map" and p.shape is None:
            if t.dim() != p.var.type.rank:
                rank = p.var.type.rank
                raise self.error(p, f"argument {p.name} has {t.dim()} dimensions, not {rank}")
            return t, t.device
        if t.dim() != len(p.shape):
            raise self.error(
                p, self.shape_message(p, f"it has {t.dim()} dimensions, not {len(p.shape)}", sizes)
            )
        for k, (d, actual) in enumerate(zip(p.shape, t.shape)):
            if isinstance(d, int):
                if d != actual:
                    raise self.error(p, self.shape_message(p, f"dimension {k} is {actual}", sizes))
                continue
            name = _size_symbol(d)
            if name is None:
                checks.append((p, k, d, actual))
            elif name not in sizes:
                sizes[name] = actual
            elif sizes[name] != actual:
                reason = f"dimension {k} is {actual}, but {name} is {sizes[name]}"
                raise self.error(p, self.shape_message(p, reason, sizes))
        if p.kind == "tensor" and not t.is_contiguous():
            raise self.error(p, f"argument {p.name} is not contiguous; pass t.contiguous()")
        return t, t.device

    def shape_message(self, p: Param, reason: str, sizes: dict) -> str:
        dims = ", ".join(str(d) if isinstance(d, int) else _dim_text(d) for d in p.shape)
        return f"argument {p.name} must have the shape ({dims}): {reason}"


def _dim_text(d) -> str:
    name = _size_symbol(d)
    return name if name is not None else repr(d)


def _kind(value) -> str:
    return f"a {type(value).__name__}"


def _address(value) -> Any:
    return value.data_ptr() if hasattr(value, "data_ptr") else value


def launch(sf: ScriptFunction, args: Sequence, kwargs: dict) -> None:
    """Run kernel `sf` with Python arguments."""
    state = sf._state
    sig = sf.signature()
    if sig.kind != "kernel":
        raise ScriptError(
            f"{sig.py_name} is a device function (it sets no attrs.grid_dim); call it from a "
            "script kernel",
            state.source.filename,
            sig.lineno,
        )
    with state.lock:
        if state.launcher is None:
            state.launcher = Binder(sf)
        binder = state.launcher
    values, device = binder.bind(args, kwargs)
    options = config.resolve()
    # Lazy for import cost: the targets bring the schedulers, templates and backends, which
    # importing minicomp.script (and so this launcher) does not need.
    from minicomp.targets import script_target

    target = script_target(sf.target, device, options)
    if device is not None and device.type != target.device:
        where = "CUDA tensors" if target.device == "cuda" else "CPU tensors"
        raise ScriptError(
            f"the {target.name} target runs {sig.py_name} on {where}, but its tensors are on "
            f"{device}",
            state.source.filename,
            sig.lineno,
        )
    checks = target.emulated and options.emu_checks
    key = (target.name, device.index if device is not None and device.type == "cuda" else None)
    key += (checks, target.emulated and options.lens)
    with state.lock:
        run = state.builds.get(key)
        if run is None:
            run = state.builds[key] = target.build_script(
                sf.module, binder.function, options, device, checks
            )
    if binder.maps:
        values = binder.encode_maps(values, target.emulated)
    addresses = [_address(v) for v in values]
    grid, block = binder.dims(addresses)
    shared = binder.shared(addresses)
    _check_block(sf, binder.function, math.prod(block), shared)
    if 0 in grid:
        return
    run(values, grid, block, shared)


def _check_block(sf: ScriptFunction, f, threads: int, shared: int) -> None:
    """Refuse a block over the kernel's launch bounds or the dynamic shared memory limit."""
    sig = sf.signature()
    bound = f.attrs.launch_bounds
    if bound is not None and threads > bound:
        raise ScriptError(
            f"kernel {sig.py_name} is launched with {threads} threads a block, over its "
            f"attrs.launch_bounds ({bound})",
            sf._state.source.filename,
            sig.lineno,
        )
    if not 0 <= shared <= MAX_DYNAMIC_SHARED:
        raise ScriptError(
            f"kernel {sig.py_name} is launched with {shared} bytes of dynamic shared memory; a "
            f"block may have at most {MAX_DYNAMIC_SHARED} ({MAX_DYNAMIC_SHARED // 1024} KiB)",
            sf._state.source.filename,
            sig.lineno,
        )


set_launcher(launch)
