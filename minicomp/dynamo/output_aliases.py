"""Graph outputs that share memory in eager share it compiled too.

`y = x + 1; return y, y.view(-1)` returns two aliases of one tensor: writing into one changes
the other. AOTAutograd rebuilds an output aliasing a graph input from the real input, and one
aliasing an intermediate when both need gradients; otherwise it relies on the compiled graph
returning real aliases, as eager does. A plan computes each output into memory of its own, so
each group of outputs whose ATen-graph values share a storage (and no input's) is moved into
one fresh storage after the plan ran, each output at eager's strides and offset in it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch.multiprocessing.reductions import StorageWeakRef

from minicomp.dynamo.symbolic import shape_of
from minicomp.runtime.symbols import compile_dims


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
    """`outs` with each group moved into one new storage, laid out as in eager."""
    for group in groups:
        nbytes, *rest = group.dims(env)
        first = outs[group.positions[0]]
        storage = torch.empty(nbytes, dtype=torch.uint8, device=first.device)
        for pos, rank in zip(group.positions, group.ranks):
            size, stride, offset = rest[:rank], rest[rank : 2 * rank], rest[2 * rank]
            rest = rest[2 * rank + 1 :]
            out = outs[pos]
            view = storage.view(out.dtype).as_strided(size, stride, offset)
            outs[pos] = view.copy_(out)
    return outs
