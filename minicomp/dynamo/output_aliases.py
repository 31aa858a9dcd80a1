"""Graph outputs that share memory in eager share it compiled too.

`y = x + 1; return y, y.view(-1)` returns two aliases of one tensor: writing into one changes
the other. AOTAutograd rebuilds an output aliasing a graph input from the real input, and one
aliasing an intermediate when both need gradients; otherwise it relies on the compiled graph
returning real aliases, as eager does. A plan computes each output into memory of its own, so
each group of outputs whose ATen-graph values share a storage (and no input's) is moved into
one fresh storage after the plan ran, each output at eager's strides and offset in it.

An output aliasing a graph input AOTAutograd rebuilds from the real input: it replays the
views recorded while tracing, but when their arguments are symbolic (dynamic shapes) it calls
`input.as_strided` with the size, stride and storage offset of the tensor the compiled graph
returned. A plan's own output starts at offset 0 of memory of its own, so AOTAutograd would
read the input from its start: such an output is returned as a view of the real input at
eager's size, strides and offset instead (see `InputView`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch.multiprocessing.reductions import StorageWeakRef

from minicomp.dynamo.symbolic import shape_of
from minicomp.ir.symbols import compile_dims, free_symbols


@dataclass(frozen=True)
class SharedStorage:
    """Outputs sharing one storage in eager: positions, and each one's size, stride and
    storage offset (in its own elements), with the storage's bytes."""

    positions: tuple[int, ...]
    dims: Callable[[dict], tuple]  # binding -> (nbytes, *size, *stride, offset, ...)
    ranks: tuple[int, ...]


def shared_output_storages(gm: torch.fx.GraphModule) -> list[SharedStorage]:
    """The groups of two or more outputs of the ATen graph `gm` sharing a storage that no
    input of it shares."""
    nodes = list(gm.graph.nodes)
    inputs = {_storage(n.meta.get("val")) for n in nodes if n.op == "placeholder"}
    (out_node,) = [n for n in nodes if n.op == "output"]
    outs = out_node.args[0] if isinstance(out_node.args[0], (list, tuple)) else [out_node.args[0]]
    groups: dict[Any, list[tuple[int, torch.Tensor]]] = {}
    for pos, arg in enumerate(outs):
        val = arg.meta.get("val") if isinstance(arg, torch.fx.Node) else None
        key = _storage(val)
        if key is not None and key not in inputs:
            groups.setdefault(key, []).append((pos, val))
    shared = []
    for members in groups.values():
        if len(members) < 2:
            continue
        dims: list = [members[0][1].untyped_storage().nbytes()]
        for _, val in members:
            dims += [*val.shape, *val.stride(), val.storage_offset()]
        shared.append(
            SharedStorage(
                tuple(pos for pos, _ in members),
                compile_dims(shape_of(dims)),
                tuple(val.dim() for _, val in members),
            )
        )
    return shared


def _storage(val: Any) -> StorageWeakRef | None:
    if not isinstance(val, torch.Tensor) or val.layout != torch.strided:
        return None
    return StorageWeakRef(val.untyped_storage())


def share_storages(outs: list, groups: Sequence[SharedStorage], env: dict) -> list:
    """`outs` with each group moved into one new storage, laid out as in eager, views of one
    base (a group the plan already returns so, as aliases of one ATen result, stays as it
    is)."""
    for group in groups:
        nbytes, *rest = group.dims(env)
        layouts = []
        for rank in group.ranks:
            size, stride, offset = rest[:rank], rest[rank : 2 * rank], rest[2 * rank]
            layouts.append((tuple(size), tuple(stride), offset))
            rest = rest[2 * rank + 1 :]
        members = [outs[pos] for pos in group.positions]
        if _laid_out_as(members, layouts) and len({id(_base(o)) for o in members}) == 1:
            continue
        # Each output a view of one tensor per dtype over the new storage: AOTAutograd, handed
        # aliases as inputs of a later graph it writes into, wants them to share their ._base,
        # as eager's do (a view(dtype) to another element size has no ._base: made once).
        storage = torch.empty(nbytes, dtype=torch.uint8, device=members[0].device)
        typed: dict[torch.dtype, torch.Tensor] = {}
        for pos, (size, stride, offset) in zip(group.positions, layouts):
            out = outs[pos]
            whole = typed.setdefault(out.dtype, storage.view(out.dtype))
            outs[pos] = whole.as_strided(size, stride, offset).copy_(out)
    return outs


def _base(t: torch.Tensor) -> torch.Tensor:
    """The tensor `t` is a view of (PyTorch's ._base, never itself a view), or `t`."""
    return t if t._base is None else t._base


def _laid_out_as(outs: list, layouts: list) -> bool:
    """Whether `outs` share one storage, each at its (size, stride, offset) of `layouts`."""
    ptr = outs[0].untyped_storage().data_ptr()
    return all(
        o.untyped_storage().data_ptr() == ptr
        and (tuple(o.shape), tuple(o.stride()), o.storage_offset()) == layout
        for o, layout in zip(outs, layouts)
    )


@dataclass(frozen=True)
class InputView:
    """A user output that AOTAutograd rebuilds from graph input `input`: its position among
    the graph's outputs, and its size, stride and storage offset relative to the input's
    (in elements), of a symbol binding."""

    position: int
    input: int
    rank: int
    dims: Callable[[dict], tuple]  # binding -> (*size, *stride, offset - input's offset)
    symbols: frozenset[str]


def input_views(gm: torch.fx.GraphModule, meta: Any) -> list[InputView]:
    """The outputs of the ATen graph `gm` that AOTAutograd's metadata `meta` (None outside
    AOTAutograd) says alias a graph input, with the input of the same storage and dtype.

    Only user outputs: a value saved for the backward stays a copy, as an input mutated
    after the forward must not change it."""
    if meta is None:
        return []
    from torch._functorch._aot_autograd.schemas import OutputType

    nodes = list(gm.graph.nodes)
    placeholders = [n.meta.get("val") for n in nodes if n.op == "placeholder"]
    (out_node,) = [n for n in nodes if n.op == "output"]
    outs = out_node.args[0] if isinstance(out_node.args[0], (list, tuple)) else [out_node.args[0]]
    first = meta.num_mutated_inp_runtime_indices
    views = []
    for j, info in enumerate(meta.output_info):
        pos = first + j
        if info.output_type != OutputType.alias_of_input or pos >= len(outs):
            continue
        arg = outs[pos]
        val = arg.meta.get("val") if isinstance(arg, torch.fx.Node) else None
        key = _storage(val)
        if key is None or val.is_complex():
            continue
        inputs = [
            k
            for k, p in enumerate(placeholders)
            if _storage(p) is not None and _storage(p) == key and p.dtype == val.dtype
        ]
        if len(inputs) != 1:
            continue
        base = placeholders[inputs[0]]
        dims = shape_of([*val.shape, *val.stride(), val.storage_offset() - base.storage_offset()])
        views.append(
            InputView(pos, inputs[0], val.dim(), compile_dims(dims), frozenset(free_symbols(dims)))
        )
    return views


def view_inputs(outs: list, views: Sequence[InputView], args: Sequence, env: dict) -> list:
    """`outs` with each of `views` replaced by its view of the real input in `args`. One
    whose sizes use a symbol the binding lacks (an unbacked one) is left as computed."""
    for v in views:
        if not v.symbols <= env.keys():
            continue
        dims = v.dims(env)
        size, stride, offset = dims[: v.rank], dims[v.rank : 2 * v.rank], dims[2 * v.rank]
        base = args[v.input]
        outs[v.position] = base.as_strided(size, stride, base.storage_offset() + offset)
    return outs
