"""The whole-graph cache: an ATen graph compiled before, in this process or an earlier one,
is linked from what was kept of it, without importing it, running passes, tuning or
scheduling (the kernels' binaries come from the build cache, as always).

The key is a digest of everything the lowering reads: the graph's code, every node's fake
value (shapes or symbolic sizes with their ranges and hints, strides, dtypes, devices, which
values share storage), the constants it holds (by content), the kind of graph, the inputs with
stable addresses, the options that change compiled code, the GPU when there is one, and the
versions of PyTorch and of minicomp's own source (a digest of the package's files, so an
edited pass never meets an entry it did not make). What is kept is the compiler's `Lowered`:
the final graph with its constants and the kernel functions, pickled, in
`<cache_dir>/graphs/<key[:2]>/<key>/` with the build cache's integrity checks (see
backends/cache.py); `minicomp cache` lists, prunes and clears it with the builds.

Not kept: graphs with frozen weights (the folded constants are the weights' values: keying on
them would hash and store every weight), graphs launching script kernels (their key would have
to cover the user's kernel source), and entries above MAX_ENTRY_BYTES.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import io
import json
import logging
import os
import pickle
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.utils._pytree as pytree
from torch.multiprocessing.reductions import StorageWeakRef

from minicomp.backends import cache as build_cache
from minicomp.config import Options
from minicomp.ir.graph import KernelOp

if TYPE_CHECKING:
    from minicomp.compiler import Lowered

log = logging.getLogger(__name__)

KIND = "graphs"
"""The cache root's folder of compiled graphs."""
PRODUCT = "lowered.pkl"
"""The file of an entry holding the pickled CachedGraph."""
MAX_ENTRY_BYTES = 64 << 20
"""Entries bigger than this (large constants) are not kept: reading them back could cost more
than compiling again."""
FORMAT_VERSION = "1"

# Options that change what is printed or where things go, never the compiled graph.
_IRRELEVANT_OPTIONS = frozenset(
    {"verbose", "cache_dir", "parallel_compile", "graph_cache", "debug_dir"}
)


@dataclasses.dataclass(frozen=True)
class CachedGraph:
    """What a compile keeps for the next: the lowered graph and the warnings it gave (ATen
    calls standing in for kernels that failed to build), which a hit gives again."""

    lowered: Lowered
    warnings: tuple[str, ...] = ()


def graph_key(
    gm: torch.fx.GraphModule,
    options: Options,
    kind: str,
    static_inputs: Sequence[int],
    device_index: int | None,
) -> str:
    """The key of an ATen graph's compiled form; raises Uncacheable when it has none."""
    try:
        return build_cache.digest(_key_parts(gm, options, kind, static_inputs, device_index))
    except Uncacheable:
        raise
    except Exception as err:  # noqa: BLE001 - a value the description does not know
        raise Uncacheable(f"its key cannot be computed ({type(err).__name__}: {err})") from err


def _key_parts(
    gm: torch.fx.GraphModule,
    options: Options,
    kind: str,
    static_inputs: Sequence[int],
    device_index: int | None,
) -> list[str]:
    return [
        FORMAT_VERSION,
        torch.__version__,
        source_digest(),
        kind,
        repr(tuple(static_inputs)),
        _options_text(options),
        _device_text(device_index),
        str(torch.get_default_dtype()),
        *_graph_text(gm),
    ]


class Uncacheable(Exception):
    """A graph the whole-graph cache does not keep; the message says why."""


def load(options: Options, key: str) -> CachedGraph | None:
    """The verified entry of `key`, or None (a damaged one is quarantined, see lookup)."""
    root = build_cache.trusted_root(options.cache_dir)
    folder = build_cache.entry_dir(root, KIND, key)
    if build_cache.lookup(root, folder, PRODUCT) is None:
        return None
    try:
        with open(os.path.join(folder, PRODUCT), "rb") as f:
            kept = _Unpickler(f).load()
    except Exception as err:  # noqa: BLE001 - an op or class gone since: compile again
        log.info("minicomp: graph cache entry %s unreadable (%s); compiling", key[:12], err)
        return None
    if not isinstance(kept, CachedGraph):
        return None
    os.utime(folder)  # prune removes the least recently used first
    return kept


@contextlib.contextmanager
def compiling(options: Options, key: str) -> Iterator[None]:
    """Hold the lock of `key`'s entry while compiling the graph: processes sharing the cache
    (a job's ranks) compile a graph once, the others wait, then link it from the entry."""
    root = build_cache.trusted_root(options.cache_dir)
    with build_cache.build_lock(root, build_cache.entry_dir(root, KIND, key)):
        yield


def compiled_by(options: Options, key: str) -> str:
    """Who compiled `key`'s entry, in words (see backends.cache.describe_builder)."""
    root = build_cache.trusted_root(options.cache_dir)
    try:
        with open(os.path.join(build_cache.entry_dir(root, KIND, key), build_cache.META_NAME)) as f:
            return build_cache.describe_builder(json.load(f).get("built_by"))
    except (OSError, ValueError, AttributeError):
        return build_cache.describe_builder(None)


def store(options: Options, key: str, kept: CachedGraph, summary: dict) -> None:
    """Keep a compiled graph under `key`, with `summary` (what `minicomp cache graphs` shows)
    in its meta.json; raises Uncacheable when it cannot be kept."""
    if any(isinstance(n, KernelOp) for n in kept.lowered.graph.nodes):
        raise Uncacheable("it launches script kernels")
    data = io.BytesIO()
    try:
        _Pickler(data, protocol=pickle.HIGHEST_PROTOCOL).dump(kept)
    except Exception as err:  # noqa: BLE001 - whatever a graph holds that cannot pickle
        raise Uncacheable(f"it holds what cannot be pickled ({err})") from None
    if data.tell() > MAX_ENTRY_BYTES:
        raise Uncacheable(f"its entry would take {data.tell() >> 20} MiB")
    root = build_cache.trusted_root(options.cache_dir)
    with build_cache.build_dir(root, f"graph-{key[:16]}") as tmp:
        with open(os.path.join(tmp, PRODUCT), "wb") as f:
            f.write(data.getbuffer())
        build_cache.publish(tmp, build_cache.entry_dir(root, KIND, key), {"graph": summary})


def entries(cache_dir: str) -> list[dict]:
    """The summary of every kept graph (with its key, bytes and when last used), newest first;
    entries being removed or unreadable are left out."""
    found = []
    root = os.path.join(cache_dir, KIND)
    for folder in sorted(Path(root).glob("*/*")) if os.path.isdir(root) else ():
        try:
            meta = json.loads((folder / build_cache.META_NAME).read_text())
            size = sum(f.stat().st_size for f in folder.iterdir())
            used = folder.stat().st_mtime
        except (OSError, ValueError):
            continue
        found.append({"key": folder.name, **meta.get("graph", {}), "bytes": size, "used": used})
    return sorted(found, key=lambda e: -e["used"])


@functools.lru_cache(maxsize=1)
def source_digest() -> str:
    """A digest of every source file of the minicomp package: a changed pass, template or
    runtime header makes every earlier entry unreachable."""
    package = Path(__file__).resolve().parents[1]
    h = hashlib.sha256()
    for path in sorted(package.rglob("*")):
        if path.suffix in (".py", ".h", ".c", ".cu", ".cuh") and path.is_file():
            h.update(str(path.relative_to(package)).encode() + b"\0")
            h.update(hashlib.sha256(path.read_bytes()).digest())
    return h.hexdigest()


def _options_text(options: Options) -> str:
    fields = dataclasses.fields(options)
    return repr(
        [(f.name, getattr(options, f.name)) for f in fields if f.name not in _IRRELEVANT_OPTIONS]
    )


def _device_text(device_index: int | None) -> str:
    """The GPU the graph's kernels are scheduled for (its SMs size the grids)."""
    if device_index is None:
        return "no cuda device"
    p = torch.cuda.get_device_properties(device_index)
    return f"{p.name} sm_{p.major}{p.minor} {p.multi_processor_count} SMs"


def _graph_text(gm: torch.fx.GraphModule) -> Iterator[str]:
    """The code of `gm` and of the graph modules it holds, every node's value, the symbols'
    ranges and hints, and the constants' contents."""
    storages: dict[Any, int] = {}
    symbols: set = set()
    for n in gm.graph.nodes:
        yield f"{n.op} {n.name} {_target_text(n.target)} {n.args!r} {n.kwargs!r}"
        yield _value_text(n.meta.get("val"), storages, symbols)
        bindings = n.meta.get("unbacked_bindings")
        if bindings:
            yield f"binds {sorted((str(k), str(v)) for k, v in bindings.items())}"
        if n.op == "get_attr":
            yield from _attribute_text(gm, n.target)
    yield from _symbols_text(symbols)


def _target_text(target: Any) -> str:
    if isinstance(target, str):
        return target
    if isinstance(target, torch._ops.OpOverload):
        return str(target)
    return f"{getattr(target, '__module__', '?')}.{getattr(target, '__qualname__', target)}"


def _value_text(val: Any, storages: dict, symbols: set) -> str:
    leaves, spec = pytree.tree_flatten(val)
    texts = [str(spec)]
    for leaf in leaves:
        if isinstance(leaf, torch.Tensor):
            if leaf.layout != torch.strided:
                texts.append(f"tensor {leaf.layout} {leaf.dtype} {tuple(leaf.shape)}")
                continue
            # Which values share memory decides the plan's aliasing: number storages in order.
            ref = StorageWeakRef(leaf.untyped_storage())
            store = storages.setdefault(ref, len(storages))
            texts.append(
                f"tensor {leaf.dtype} {leaf.device} {tuple(map(str, leaf.shape))} "
                f"{tuple(map(str, leaf.stride()))} +{leaf.storage_offset()} storage {store} "
                f"grad {leaf.requires_grad}"
            )
            for d in (*leaf.shape, *leaf.stride(), leaf.storage_offset()):
                _note_symbols(d, symbols)
        elif isinstance(leaf, (torch.SymInt, torch.SymFloat, torch.SymBool)):
            texts.append(f"{type(leaf).__name__} {leaf}")
            _note_symbols(leaf, symbols)
        else:
            texts.append(f"{type(leaf).__name__} {leaf!r}")
    return " | ".join(texts)


def _note_symbols(d: Any, symbols: set) -> None:
    node = getattr(d, "node", None)
    if node is not None:
        symbols.update((node.shape_env, s) for s in node.expr.free_symbols)


def _symbols_text(symbols: set) -> Iterator[str]:
    """Each size symbol's range and hint: passes that size for the hint (a split, a tile)
    compile another graph for another one."""
    for env, s in sorted(symbols, key=lambda p: str(p[1])):
        hints = getattr(env, "backed_var_to_val", None)  # var_to_val before torch 2.13
        hints = env.var_to_val if hints is None else hints
        yield f"{s}: range {env.var_to_range.get(s)} hint {hints.get(s)}"


def _attribute_text(gm: torch.fx.GraphModule, target: str) -> Iterator[str]:
    value = gm
    for atom in target.split("."):
        value = getattr(value, atom)
    if isinstance(value, torch.fx.GraphModule):
        yield from _graph_text(value)
    elif type(value) in (torch.Tensor, torch.nn.Parameter) and value.layout == torch.strided:
        data = value.detach().cpu().contiguous().reshape(-1).view(torch.uint8)
        yield f"{target}: {value.dtype} {tuple(value.shape)} {tuple(value.stride())}"
        yield hashlib.sha256(data.numpy().tobytes()).hexdigest()
    else:
        raise Uncacheable(f"it holds a {type(value).__name__} ({target}) the key cannot describe")


class _Pickler(pickle.Pickler):
    """Pickles ATen operators by name (they hold C++ handles that do not pickle)."""

    def persistent_id(self, obj: Any) -> Any:
        if isinstance(obj, torch._ops.OpOverload):
            return ("op", obj._schema.name, obj._overloadname)
        return None


class _Unpickler(pickle.Unpickler):
    def persistent_load(self, pid: Any) -> Any:
        _, name, overload = pid
        namespace, op = name.split("::")
        packet = getattr(getattr(torch.ops, namespace), op)
        return getattr(packet, overload or "default")
