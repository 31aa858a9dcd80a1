"""Eager's output strides where PyTorch's fake tensors get them wrong.

minicomp writes every graph output with the strides of the ATen graph's fake tensors. Those
come from meta functions and Python references that do not always lay out results the way
eager's kernels do: `torch.copysign` is a composition of `where`, `signbit` and `abs` whose
strides drift from TensorIterator's for broadcast inputs, `a // b` with a 0-d `b` comes out
row-major, `index`'s meta leaves out the index tensors TensorIterator sorts dimensions by,
`roll` decomposes to a row-major `index_select` where eager's kernel concatenates two
slices in their memory format, and batch norm's meta keeps the input's strides where eager's kernel
allocates in the input's suggested memory format.

`restride_like_eager` walks the graph once and gives those ops eager's strides, computed by
a port of TensorIterator's layout rules (`tensor_iterator_strides`) or the kernel's own
allocation (`RULES`), then recomputes the strides of everything downstream of a changed value
with the op's fake implementation, so `(a // b).relu()` follows too.
"""

from __future__ import annotations

import contextlib
import operator
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.fx
from torch.utils import _pytree as pytree

aten = torch.ops.aten


def _contiguous(shape: Sequence) -> list:
    out, acc = [], 1
    for d in reversed(shape):
        out.append(acc)
        acc = acc * d
    return out[::-1]


def _channels_last(shape: Sequence, ndims: tuple = (4, 5)) -> list | None:
    if len(shape) not in ndims:
        return None
    order = [0, *range(2, len(shape)), 1]  # outermost to innermost
    strides, acc = [0] * len(shape), 1
    for d in reversed(order):
        strides[d] = acc
        acc = acc * shape[d]
    return strides


def _is_contiguous(shape: Sequence, strides: Sequence) -> bool:
    return _same_where_sized(shape, strides, _contiguous(shape))


def _is_channels_last(shape: Sequence, strides: Sequence, ndims: tuple = (4, 5)) -> bool:
    want = _channels_last(shape, ndims)
    return want is not None and _same_where_sized(shape, strides, want)


def _same_where_sized(shape: Sequence, strides: Sequence, want: Sequence) -> bool:
    # c10's is_contiguous: size-1 dims may have any stride, an empty tensor is contiguous.
    if any(d == 0 for d in shape):
        return True
    return all(d == 1 or s == w for d, s, w in zip(shape, strides, want))


def _is_non_overlapping_and_dense(t: torch.Tensor) -> bool:
    from torch._prims_common import is_non_overlapping_and_dense_or_false

    return is_non_overlapping_and_dense_or_false(t)


def tensor_iterator_strides(shape: Sequence, inputs: Sequence[torch.Tensor]) -> list | None:
    """The strides a TensorIterator (the machinery behind eager's pointwise kernels) gives its
    output of `shape` for these inputs, in operand order: a port of its fast setup (all
    inputs of one shape, contiguous, channels-last or sharing dense strides) and of
    reorder_dimensions' sort of dimensions by the inputs' strides. None when an input does
    not broadcast to `shape`."""
    ndim = len(shape)
    if not inputs or ndim == 0:
        return _contiguous(shape)
    if all(tuple(t.shape) == tuple(shape) for t in inputs):
        sizes = [tuple(t.stride()) for t in inputs]
        if all(_is_contiguous(shape, s) for s in sizes):
            return _contiguous(shape)
        # MemoryFormat::ChannelsLast: 4-d only (5-d is ChannelsLast3d, not checked).
        if all(_is_channels_last(shape, s, (4,)) for s in sizes):
            return _channels_last(shape)
        if all(_is_non_overlapping_and_dense(t) for t in inputs) and len(set(sizes)) == 1:
            return list(sizes[0])
    if ndim == 1:
        return [1]
    # Broadcast strides: 0 where an input's dim of size 1 (or a missing one) is expanded.
    operands = []
    for t in inputs:
        lead = ndim - t.dim()
        if lead < 0:
            return None
        strides = [0] * lead
        for d, s, out in zip(t.shape, t.stride(), shape[lead:]):
            if d == out:
                strides.append(s)
            elif d == 1:
                strides.append(0)
            else:
                return None
        operands.append(strides)

    def should_swap(dim0: int, dim1: int) -> int:
        for strides in operands:
            s0, s1 = strides[dim0], strides[dim1]
            if s0 == 0 or s1 == 0:
                continue
            if s0 < s1:
                return -1
            if s0 > s1:
                return 1
            if shape[dim0] > shape[dim1]:
                return 1
        return 0

    perm = list(reversed(range(ndim)))  # perm[0] is the fastest-moving dim
    for i in range(1, ndim):
        dim1 = i
        for dim0 in reversed(range(i)):
            c = should_swap(perm[dim0], perm[dim1])
            if c > 0:
                perm[dim0], perm[dim1] = perm[dim1], perm[dim0]
                dim1 = dim0
            elif c < 0:
                break
    out, acc = [0] * ndim, 1
    for d in perm:
        out[d] = acc
        acc = acc * shape[d]
    return out


def _like(t: torch.Tensor) -> list:
    """empty_like(t)'s strides (preserve_format): t's own when dense, else TensorIterator's."""
    if _is_non_overlapping_and_dense(t):
        return list(t.stride())
    return tensor_iterator_strides(t.shape, [t])


def _channels_last_like(shape: Sequence, strides: Sequence) -> bool:
    """c10's is_channels_last_strides_2d/3d: strides ordered like channels-last (4-d or 5-d)."""
    if len(shape) == 4:
        order = (1, 3, 2, 0)
    elif len(shape) == 5:
        order = (1, 4, 3, 2, 0)
    else:
        return False
    if strides[1] == 0:
        return False
    low = 0
    for d in order:
        if shape[d] == 0 or strides[d] < low:
            return False
        if d == 0 and low == strides[1]:
            return False  # ambiguous (N111): contiguous
        low = strides[d] * shape[d] if shape[d] > 1 else strides[d]
    return True


def _suggested_format(shape: Sequence, strides: Sequence) -> list:
    """Row-major in Tensor.suggest_memory_format(): channels-last where strides are so ordered."""
    if _channels_last_like(shape, strides):
        return _channels_last(shape)
    return _contiguous(shape)


def _pointwise(n: torch.fx.Node, args: tuple, kwargs: dict, val: Any) -> Any:
    tensors = [a for a in pytree.tree_leaves((args, kwargs)) if isinstance(a, torch.Tensor)]
    return tensor_iterator_strides(val.shape, tensors)


def _index(n: torch.fx.Node, args: tuple, kwargs: dict, val: Any) -> Any:
    """index.Tensor: a TensorIterator over the source restrided to the result's shape (0 in
    the indexed dims) and the index tensors viewed to span the indexed dims (AdvancedIndex)."""
    self, indices = args[0], list(args[1])
    if any(i is not None and i.dtype in (torch.bool, torch.uint8) for i in indices):
        return None  # masks turn into nonzero's results first
    indices += [None] * (self.dim() - len(indices))
    present = [k for k, i in enumerate(indices) if i is not None]
    if not present:
        return None
    index_shape = tuple(torch.broadcast_shapes(*(indices[k].shape for k in present)))
    if present != list(range(present[0], present[-1] + 1)):
        # Not adjacent: the indexed dims move to the front.
        order = present + [k for k in range(self.dim()) if k not in present]
        self = self.permute(order)
        indices = [indices[k] for k in order]
        present = list(range(len(present)))
    before = list(self.shape[: present[0]])
    after = list(self.shape[present[-1] + 1 :])
    shape = [*before, *index_shape, *after]
    if tuple(shape) != tuple(val.shape):
        return None
    strides = list(self.stride())
    src_strides = strides[: len(before)] + [0] * len(index_shape) + strides[present[-1] + 1 :]
    src = self.as_strided(shape, src_strides)
    views = []
    for k in present:
        # AdvancedIndex's reshape_indexer: size-1 dims around the index's own.
        view = [1] * len(before) + list(index_shape) + [1] * len(after)
        views.append(indices[k].expand(index_shape).reshape(view))
    return tensor_iterator_strides(shape, [src, *views])


def _first_like(n: torch.fx.Node, args: tuple, kwargs: dict, val: Any) -> Any:
    return _like(args[0])


def _roll(n: torch.fx.Node, args: tuple, kwargs: dict, val: Any) -> Any:
    """roll_cpu: a cat of two narrows of self along the dim (one roll per dim, in turn), in
    the memory format both pieces suggest (contiguous unless both are channels-last-like; an
    empty piece, at a shift that is a multiple of the size, is not)."""
    if val.device.type != "cpu":
        return None  # roll_cuda's result is contiguous; not checked here
    self, shifts = args[0], list(args[1])
    dims = list(args[2] if len(args) > 2 else kwargs.get("dims", ()))
    if not dims or len(dims) != len(shifts) or self.numel() == 0:
        return None if dims and len(dims) != len(shifts) else _contiguous(self.shape)
    shape, strides = list(self.shape), list(self.stride())
    for shift, dim in zip(shifts, dims):
        size = shape[dim]
        start = (size - shift) % size
        pieces = []
        for length in (size - start, start):
            piece = list(shape)
            piece[dim] = length
            pieces.append(_channels_last_like(piece, strides))
        strides = _channels_last(shape) if all(pieces) else _contiguous(shape)
    return strides


def _batch_norm(n: torch.fx.Node, args: tuple, kwargs: dict, val: Any) -> Any:
    # batch_norm_cpu allocates the first result in the input's suggested memory format (the
    # others are per-channel vectors).
    if val[0].device.type != "cpu":
        return None
    x = args[0]
    return (_suggested_format(x.shape, x.stride()),) + tuple(None for _ in val[1:])


def _contiguous_result(n: torch.fx.Node, args: tuple, kwargs: dict, val: Any) -> Any:
    return _contiguous(val.shape)


def _unknown(n: torch.fx.Node, args: tuple, kwargs: dict, val: Any) -> Any:
    return None


Rule = Callable[[torch.fx.Node | None, tuple, dict, Any], Any]

RULES: dict[Any, Rule] = {
    aten.index.Tensor: _index,
    aten.roll.default: _roll,
    # Pointwise in name only: eager's kernels allocate empty_like(self) ...
    aten.hardtanh.default: _first_like,
    aten.nan_to_num.default: _first_like,
    aten.deg2rad.default: _first_like,
    aten.rad2deg.default: _first_like,
    # ... or a contiguous clone of the broadcast self they fill in place ...
    aten.masked_fill.Scalar: _contiguous_result,
    aten.masked_fill.Tensor: _contiguous_result,
    # ... or compose other kernels.
    aten.conj_physical.default: _unknown,
    aten.ldexp.Tensor: _unknown,
    aten._native_batch_norm_legit_no_training.default: _batch_norm,
    aten._native_batch_norm_legit.default: _batch_norm,
    aten._native_batch_norm_legit.no_stats: _batch_norm,
    aten._native_batch_norm_legit_functional.default: _batch_norm,
    aten.native_batch_norm.default: _batch_norm,
}


def _rule(fn: Any) -> Rule | None:
    rule = RULES.get(fn)
    if rule is not None:
        return rule
    if not isinstance(fn, torch._ops.OpOverload) or torch.Tag.pointwise not in fn.tags:
        return None
    schema = fn._schema
    if any(a.name == "memory_format" for a in schema.arguments):
        return None  # clone, _to_copy: the argument says
    if any(r.alias_info is not None for r in schema.returns):
        return None  # in-place and views return their input
    return _pointwise


def eager_strides_of(target: Any, args: tuple, kwargs: dict, val: Any, probe: bool = False) -> Any:
    """Eager's strides for the result(s) `val` of `target` on `args` (tensors with eager's
    strides): a tuple of strides, a tuple of them (None entries: keep) for ops with several
    results, or None where minicomp has no rule and the fake tensor's strides stand. With
    `probe`, only whether there is a rule."""
    rule = _rule(target)
    if rule is None or rule is _unknown or probe:
        return rule is not None and rule is not _unknown if probe else None
    if isinstance(val, torch.Tensor) and val.layout != torch.strided:
        return None
    if isinstance(val, torch.Tensor) and any(isinstance(d, int) and d == 0 for d in val.shape):
        return None  # an empty result: eager's kernels keep what the fake tensor says
    with contextlib.suppress(Exception):
        out = rule(None, args, kwargs, val)
        if isinstance(val, torch.Tensor):
            return tuple(out) if out is not None else None
        return out
    return None


def _restrided(t: torch.Tensor, strides: Sequence) -> torch.Tensor:
    if tuple(t.stride()) == tuple(strides):
        return t
    return t.as_strided(t.shape, tuple(strides), t.storage_offset())


def _tensors_agree(a: Any, b: Any, same: Callable[[torch.Tensor, torch.Tensor], bool]) -> bool:
    """Whether `a` and `b` have tensors at the same places, each pair `same`."""
    la, lb = pytree.tree_leaves(a), pytree.tree_leaves(b)
    if len(la) != len(lb):
        return False
    for x, y in zip(la, lb):
        if isinstance(x, torch.Tensor) != isinstance(y, torch.Tensor):
            return False
        if isinstance(x, torch.Tensor) and not same(x, y):
            return False
    return True


def _same_strides(a: Any, b: Any) -> bool:
    return _tensors_agree(
        a, b, lambda x, y: x.layout != torch.strided or tuple(x.stride()) == tuple(y.stride())
    )


_RESTRIDED = "minicomp_restrided"


def restride_like_eager(gm: torch.fx.GraphModule) -> None:
    """Give the fake tensors of `gm`'s nodes (node.meta["val"]) eager's strides where a rule
    knows them better (see the module's doc), and recompute those of the nodes that read a
    changed value by running their fake implementation again."""
    from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols

    if gm.meta.get(_RESTRIDED):
        return  # once: the backend restrides before keying the graph cache, then imports
    gm.meta[_RESTRIDED] = True
    changed: dict[torch.fx.Node, Any] = {}
    fake_mode = _fake_mode(gm)
    if fake_mode is None:
        return
    guards = fake_mode.shape_env.suppress_guards() if fake_mode.shape_env else None
    with fake_mode, guards or contextlib.nullcontext():
        for n in gm.graph.nodes:
            if n.op != "call_function":
                continue
            val = n.meta.get("val")
            if n.target is operator.getitem:
                src = n.args[0]
                if src in changed and isinstance(changed[src], (list, tuple)):
                    new = changed[src][n.args[1]]
                    if isinstance(new, torch.Tensor) and isinstance(val, torch.Tensor):
                        changed[n] = _restrided(val, new.stride())
                continue
            if not isinstance(n.target, torch._ops.OpOverload):
                continue

            def fake(a: Any) -> Any:
                if isinstance(a, torch.fx.Node):
                    return changed.get(a, a.meta.get("val"))
                return a

            args, kwargs = pytree.tree_map(fake, (n.args, n.kwargs))
            new = val
            reads_changed = any(a in changed for a in n.all_input_nodes)
            if reads_changed and not free_unbacked_symbols(val):
                with contextlib.suppress(Exception):
                    rerun = n.target(*args, **kwargs)
                    if _same_shapes(rerun, val):
                        new = _adopt_strides(val, rerun)
            strides = eager_strides_of(n.target, args, kwargs, val)
            if strides is not None:
                with contextlib.suppress(Exception):
                    new = _apply(new, strides)
            if new is not val and not _same_strides(new, val):
                changed[n] = new
    for n, new in changed.items():
        n.meta["val"] = new


def _fake_mode(gm: torch.fx.GraphModule) -> Any:
    for n in gm.graph.nodes:
        for v in pytree.tree_leaves(n.meta.get("val")):
            mode = getattr(v, "fake_mode", None)
            if mode is not None:
                return mode
    return None


def _same_shapes(a: Any, b: Any) -> bool:
    return _tensors_agree(a, b, lambda x, y: x.dtype == y.dtype and x.shape == y.shape)


def _adopt_strides(val: Any, rerun: Any) -> Any:
    if isinstance(val, torch.Tensor):
        if val.layout != torch.strided:
            return val
        return _restrided(val, rerun.stride())
    if isinstance(val, (list, tuple)):
        return type(val)(_adopt_strides(v, r) for v, r in zip(val, rerun))
    return val


def _apply(val: Any, strides: Any) -> Any:
    if isinstance(val, torch.Tensor):
        return _restrided(val, strides)
    return type(val)(
        v if s is None or not isinstance(v, torch.Tensor) else _restrided(v, s)
        for v, s in zip(val, strides)
    )
