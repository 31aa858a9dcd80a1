"""The decomposition table: PyTorch's core-ATen decompositions, minus ops lowered whole."""

from __future__ import annotations

import functools

import torch

aten = torch.ops.aten

# Ops minicomp lowers better whole than decomposed: a single-pass row kernel each, and the
# fused attention ops `scaled_dot_product_attention` dispatches to (PyTorch picks one for the
# inputs' device, dtype and arguments; the math fallback it picks otherwise still
# decomposes). Each stays one ATen node: the cuda targets launch the attention template for
# it (passes/graph/attention.py), the cpu target calls it, and a training graph's backward
# calls its ATen backward, which reads the forward's output and logsumexp.
_FUSED_ATTENTION = (
    "_scaled_dot_product_flash_attention_for_cpu",
    "_scaled_dot_product_flash_attention",
    "_scaled_dot_product_efficient_attention",
    "_scaled_dot_product_cudnn_attention",
)
KEEP_WHOLE = (
    # PyTorch's decomposition is a `where` that promotes: an int64 tensor scattered with a
    # float32 slice came out float32, where eager copies the slice into the int64 tensor.
    aten.select_scatter.default,
    aten._softmax.default,
    aten._log_softmax.default,
    aten.softmax.int,
    aten.log_softmax.int,
    aten.native_layer_norm.default,
    aten.layer_norm.default,
) + tuple(getattr(aten, name).default for name in _FUSED_ATTENTION if hasattr(aten, name))


@functools.cache
def decomposition_table() -> dict:
    """The table AOTAutograd traces with. Decompositions of ops whose eager strides minicomp
    knows (eager_strides.eager_strides_of) give their results those strides."""
    from torch._decomp import core_aten_decompositions

    from minicomp.dynamo.eager_strides import eager_strides_of

    table = dict(core_aten_decompositions())
    for op in KEEP_WHOLE:
        table.pop(op, None)
    table[aten._weight_norm_interface.default] = _weight_norm_interface
    for op, fn in table.items():
        if eager_strides_of(op, (), {}, None, probe=True):
            table[op] = _with_eager_strides(op, fn)
    return table


def _weight_norm_interface(v, g, dim=0):
    """w = v * g / |v| (the norm over every dim but `dim`), and the norms, which eager's
    kernel keeps in float32 for 16-bit inputs: its backward, which stays whole in a training
    graph, refuses float16 norms. PyTorch's decomposition keeps them so for bfloat16 only."""
    over = [d for d in range(v.dim()) if d != dim]
    wide = torch.float32 if g.dtype in (torch.float16, torch.bfloat16) else None
    norms = torch.linalg.vector_norm(v, 2, over, keepdim=True, dtype=wide)
    return v * (g / norms.to(g.dtype)), norms


def _with_eager_strides(op, fn):
    """`fn`, a decomposition of `op`, with its result copied into eager's strides where they
    differ: `roll` decomposes to a row-major index_select where eager's kernel keeps a
    channels-last input so, masked_fill to a `where` laid out like its inputs where eager's
    result is contiguous. The copy stays one only where the result is a graph output."""
    from minicomp.dynamo.eager_strides import eager_strides_of

    @functools.wraps(fn)
    def decomposed(*args, **kwargs):
        out = fn(*args, **kwargs)
        if not isinstance(out, torch.Tensor) or out.layout != torch.strided:
            return out
        strides = eager_strides_of(op, args, kwargs, out)
        if strides is None or tuple(out.stride()) == tuple(strides):
            return out
        dst = aten.empty_strided.default(out.shape, strides, dtype=out.dtype, device=out.device)
        return aten.copy.default(dst, out)

    return decomposed
