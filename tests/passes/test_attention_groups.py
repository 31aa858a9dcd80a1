"""Grouped-query attention reads the un-repeated K/V (passes/graph/attention_groups.py): the
pass's rewrite of a repeat over heads, and sdpa over repeat_interleave'd, expanded and tiled
K/V caches compiled for cpu and cuda-emu against float64 eager, with the repeat copies gone."""

import pytest
import torch
import torch.nn.functional as F
from helpers import check_compiled
from helpers_graph import PassGraphBuilder, assert_graph_equal

from minicomp.dynamo.backend import recording
from minicomp.ir import types as T
from minicomp.ir.graph import ArgRef, ExternOp, FusedOp, KernelOp
from minicomp.passes.graph.attention import sdpa_ops
from minicomp.passes.graph.attention_groups import group_query_attention

aten = torch.ops.aten
CPU_FLASH = aten._scaled_dot_product_flash_attention_for_cpu.default


def attention_graph(repeat, sdpa_op=CPU_FLASH, also_returned: bool = False):
    """q [1, 4, 3, 8] attending to k and v [1, 2, 6, 8] read through `repeat` (h, s -> the
    element of the cache read for head h, row s) by `sdpa_op`."""
    b = PassGraphBuilder()
    q, k, v = (
        b.input(n, s, T.bf16)
        for n, s in (("q", (1, 4, 3, 8)), ("k", (1, 2, 6, 8)), ("v", (1, 2, 6, 8)))
    )
    kr = b.compute("kr", (1, 4, 6, 8), lambda i, h, s, d: repeat(k, i, h, s, d))
    vr = b.compute("vr", (1, 4, 6, 8), lambda i, h, s, d: repeat(v, i, h, s, d))
    out = b.extern(
        "o", sdpa_op, [q, kr, vr], (1, 4, 3, 8), T.bf16, args=(ArgRef(0), ArgRef(1), ArgRef(2))
    )
    b.output(out)
    if also_returned:
        b.output(kr)
    return b.build()


def test_repeat_interleave_read_by_cpu_flash_becomes_its_source():
    graph = attention_graph(lambda t, i, h, s, d: t[i, h // 2, s, d])
    e = PassGraphBuilder()
    q, k, v = (
        e.input(n, s, T.bf16)
        for n, s in (("q", (1, 4, 3, 8)), ("k", (1, 2, 6, 8)), ("v", (1, 2, 6, 8)))
    )
    e.compute("kr", (1, 4, 6, 8), lambda i, h, s, d: k[i, h // 2, s, d])
    e.compute("vr", (1, 4, 6, 8), lambda i, h, s, d: v[i, h // 2, s, d])
    e.output(
        e.extern(
            "o", CPU_FLASH, [q, k, v], (1, 4, 3, 8), T.bf16, args=(ArgRef(0), ArgRef(1), ArgRef(2))
        )
    )
    # The repeats are dead now: the next dead-code elimination drops them.
    assert_graph_equal(group_query_attention(graph), e.build())


@pytest.mark.parametrize(
    "repeat",
    [
        lambda t, i, h, s, d: t[i, h % 2, s, d],  # tiled (k.repeat(1, 2, 1, 1)): h reads h % 2
        lambda t, i, h, s, d: t[i, h // 2, (s + h) % 6, d],  # the heads' rows differ
    ],
    ids=["tiled", "rows-per-head"],
)
def test_other_head_maps_stay(repeat):
    graph = attention_graph(repeat)
    assert group_query_attention(graph) is graph


def test_a_query_that_is_the_repeat_stays():
    """sdpa(x, x, x) over a repeated x: its query must keep all the heads."""
    b = PassGraphBuilder()
    k = b.input("k", (1, 2, 6, 8), T.bf16)
    kr = b.compute("kr", (1, 4, 6, 8), lambda i, h, s, d: k[i, h // 2, s, d])
    args = (ArgRef(0), ArgRef(0), ArgRef(0))
    b.output(b.extern("o", CPU_FLASH, [kr], (1, 4, 6, 8), T.bf16, args=args))
    graph = b.build()
    assert group_query_attention(graph) is graph


def test_memory_efficient_attention_keeps_its_repeat():
    """CUDA's memory-efficient attention rejects fewer key heads than query heads."""
    graph = attention_graph(
        lambda t, i, h, s, d: t[i, h // 2, s, d],
        aten._scaled_dot_product_efficient_attention.default,
    )
    assert group_query_attention(graph) is graph


# ---- compiled, against float64 eager ----

B, HEADS, D = 2, 8, 64
TOLERANCE = {"rtol": 3e-2, "atol": 3e-2}


def attentions(q1, k1, v1, mask, q2, k2, v2, q3, k3, v3, q4, k4, v4):
    """Four attention calls over smaller K/V caches: a decode step (one query row) over a
    cache repeated 4 times with a boolean mask, a causal prefill over one repeated twice
    (whose repeated key the function also returns), multi-query attention over a cache
    expanded and reshaped, and a cache tiled with `repeat` (head h reads h % 2, not grouped)."""
    o1 = F.scaled_dot_product_attention(
        q1, k1.repeat_interleave(4, dim=1), v1.repeat_interleave(4, dim=1), attn_mask=mask
    )
    k2r = k2.repeat_interleave(2, dim=1)
    o2 = F.scaled_dot_product_attention(q2, k2r, v2.repeat_interleave(2, dim=1), is_causal=True)
    b, _, s, d = k3.shape
    k3r = k3[:, :, None].expand(b, 1, HEADS, s, d).reshape(b, HEADS, s, d)
    v3r = v3[:, :, None].expand(b, 1, HEADS, s, d).reshape(b, HEADS, s, d)
    o3 = F.scaled_dot_product_attention(q3, k3r, v3r)
    o4 = F.scaled_dot_product_attention(q4, k4.repeat(1, 2, 1, 1), v4.repeat(1, 2, 1, 1))
    return o1, o2, k2r, o3, o4


def inputs(dtype: torch.dtype) -> tuple:
    def t(*shape):
        return torch.randn(*shape, dtype=dtype)

    mask = torch.arange(24) <= 17  # a cache filled up to position 17
    return (
        *(t(B, HEADS, 1, D), t(B, 2, 24, D), t(B, 2, 24, D), mask.view(1, 1, 1, 24)),
        *(t(1, 4, 40, D), t(1, 2, 40, D), t(1, 2, 40, D)),
        *(t(1, HEADS, 16, D), t(1, 1, 24, D), t(1, 1, 24, D)),
        *(t(1, 4, 8, D), t(1, 2, 32, D), t(1, 2, 32, D)),
    )


@pytest.fixture(scope="module", params=["cpu", "cuda-emu"])
def compiled(request):
    """(target, records) of `attentions` compiled for the target, checked against float64
    eager on fresh random inputs."""
    dtype = torch.bfloat16 if request.param == "cpu" else torch.float16
    torch._dynamo.reset()
    records: list = []
    with recording(records), torch.no_grad():
        check_compiled(
            attentions,
            *inputs(dtype),
            target=request.param,
            reference_dtype=torch.float64,
            **TOLERANCE,
        )
    assert len(records) == 1
    return request.param, records[0].graph


def attention_nodes(graph) -> list:
    ops = set(sdpa_ops())
    return [
        n
        for n in graph.nodes
        if isinstance(n, ExternOp)
        and n.target in ops
        or isinstance(n, KernelOp)
        and n.function.attrs.template.startswith("attention")
    ]


def test_attention_reads_the_caches_unrepeated(compiled):
    target, graph = compiled
    nodes = attention_nodes(graph)
    kinds = {type(n) for n in nodes}
    assert kinds == ({ExternOp} if target == "cpu" else {KernelOp}), nodes
    key_heads = [n.inputs[1].shape[1] for n in nodes]
    # Decode (8 over 2), prefill (4 over 2), multi-query (8 over 1); the tiled one reads its copy.
    assert key_heads == [2, 2, 1, 4], key_heads


def test_no_kernel_writes_a_repeated_cache(compiled):
    """The only repeats left: the returned one and the tiled cache (its key and value)."""
    _, graph = compiled
    repeated = {(B, HEADS, 24, D), (1, 4, 40, D), (1, HEADS, 24, D), (1, 4, 32, D)}
    written = sorted(
        tuple(v.shape)
        for n in graph.nodes
        if isinstance(n, FusedOp)
        for v in n.outputs
        if tuple(v.shape) in repeated
    )
    assert written == [(1, 4, 32, D), (1, 4, 32, D), (1, 4, 40, D)], written


# ---- CUDA's memory-efficient attention: its launch reads the caches un-repeated ----


def compile_aten(fn, *args):
    """`fn`, calling ATen ops, traced with fake tensors (CUDA-only ops trace on a CPU) and
    compiled for cuda-emu: (the compiled graph, its plan)."""
    from torch.fx.experimental.proxy_tensor import make_fx

    from minicomp import config
    from minicomp.compiler import compile_graph
    from minicomp.dynamo.importer import import_graph
    from minicomp.record import CompileRecord

    gm = make_fx(fn, tracing_mode="fake")(*args)
    record = CompileRecord()
    plan = compile_graph(import_graph(gm), config.resolve({"target": "cuda-emu"}), record)
    return record.graph, plan


def efficient_over_repeats(q, k, v, bias):
    kr, vr = k.repeat_interleave(4, dim=1), v.repeat_interleave(4, dim=1)
    return aten._scaled_dot_product_efficient_attention(q, kr, vr, bias, False)[0]


def test_memory_efficient_launch_reads_the_caches_unrepeated():
    q, k, v = torch.randn(2, 8, 3, D), torch.randn(2, 2, 24, D), torch.randn(2, 2, 24, D)
    q, k, v = (t.to(torch.float16) for t in (q, k, v))
    bias = torch.randn(2, 1, 3, 24)
    graph, plan = compile_aten(efficient_over_repeats, q, k, v, bias)
    (launch,) = graph.nodes  # no repeat kernels beside it
    assert isinstance(launch, KernelOp) and launch.inputs[1].shape[1] == 2, graph
    (out,) = plan(q, k, v, bias)
    expected = F.scaled_dot_product_attention(
        q.double(), *(t.double().repeat_interleave(4, dim=1) for t in (k, v)), bias.double()
    )
    torch.testing.assert_close(out, expected.half(), rtol=5e-3, atol=5e-3)


def test_memory_efficient_call_left_to_aten_keeps_its_repeats():
    """f32 inputs: the template refuses, and PyTorch's kernel needs the repeated heads."""
    q, k, v = torch.randn(2, 8, 3, D), torch.randn(2, 2, 24, D), torch.randn(2, 2, 24, D)
    graph, _ = compile_aten(efficient_over_repeats, q, k, v, torch.randn(2, 1, 3, 24))
    (call,) = [n for n in graph.nodes if isinstance(n, ExternOp) and n.target in sdpa_ops()]
    assert [t.shape[1] for t in call.inputs[1:3]] == [8, 8], graph
