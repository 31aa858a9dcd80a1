"""Fused attention on the CUDA targets (schedule/templates/attention.py, passes/graph/attention.py):
scaled_dot_product_attention compiled by torch.compile on cuda-emu against float64 PyTorch, in
f16 and bf16, head dims 64 and 128, with causal and additive masks, Sq != Sk, transposed,
misaligned and strided inputs, grouped-query heads, symbolic lengths and training; the calls
minicomp leaves to ATen and why; the tuning hook; and every level-1 candidate compiled by
NVRTC for sm_80 and sm_90 without spills."""

import dataclasses
import math

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from helpers import attention_problem_of, check_compiled

import minicomp
from minicomp.dynamo.backend import recording
from minicomp.ir.func import Module
from minicomp.ir.graph import ExternOp, KernelOp
from minicomp.passes.graph.attention import sdpa_ops, tune_attention
from minicomp.schedule.templates import attention as template

TARGET = "cuda-emu"
TOLERANCE = {
    torch.float16: {"rtol": 5e-3, "atol": 5e-3},
    torch.bfloat16: {"rtol": 3e-2, "atol": 3e-2},
}
DTYPES = {"f16": torch.float16, "bf16": torch.bfloat16}


def attention_nodes(records) -> list:
    """(kind of node, reason) of every attention node of the compiled graphs."""
    ops = set(sdpa_ops())
    found = []
    for r in records:
        for n in r.graph.nodes:
            template = n.function.attrs.template if isinstance(n, KernelOp) else None
            if template and template.startswith("attention"):
                found.append(("kernel", template))
            elif isinstance(n, ExternOp) and n.target in ops:
                found.append(("aten", n.reason))
    return found


def run(fn, *args, dtype=torch.float16, **tolerance) -> list:
    """Compile `fn` for cuda-emu without gradients, compare with float64 PyTorch, return the
    attention nodes of the compiled graph."""
    records: list = []
    with recording(records), torch.no_grad():
        check_compiled(
            fn, *args, target=TARGET, reference_dtype=torch.float64, **TOLERANCE[dtype], **tolerance
        )
    return attention_nodes(records)


def fused(nodes: list) -> bool:
    return len(nodes) == 1 and nodes[0][0] == "kernel"


def qkv(b, h, sq, sk, d, dtype, hk=None):
    hk = h if hk is None else hk
    return (
        torch.randn(b, h, sq, d, dtype=dtype),
        torch.randn(b, hk, sk, d, dtype=dtype),
        torch.randn(b, hk, sk, d, dtype=dtype),
    )


def sdpa(**kwargs):
    return lambda q, k, v: F.scaled_dot_product_attention(q, k, v, **kwargs)


def sdpa_masked(**kwargs):
    return lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, attn_mask=m, **kwargs)


# ---- the masks, lengths and types ----

CASES = {
    # name: (dtype, head dim, Sq, Sk, causal)
    "f16-d64-40": ("f16", 64, 40, 40, False),
    "bf16-d128-72": ("bf16", 128, 72, 72, False),
    "f16-d64-causal-72": ("f16", 64, 72, 72, True),
    "bf16-d128-causal-40": ("bf16", 128, 40, 40, True),
    "f16-d128-40x72": ("f16", 128, 40, 72, False),
    "bf16-d64-causal-72x40": ("bf16", 64, 72, 40, True),
    "f16-d64-causal-40x72": ("f16", 64, 40, 72, True),
    "f16-d96-40x72": ("f16", 96, 40, 72, False),
    "bf16-d256-causal-72": ("bf16", 256, 72, 72, True),
}


def sdpas(calls: list[dict]):
    """A function of len(calls) (q, k, v[, mask]) groups: sdpa of each, with calls[i]'s
    keyword arguments (a mask when `mask` is true)."""

    def f(*args):
        outs, at = [], 0
        for kwargs in calls:
            kw = {k: v for k, v in kwargs.items() if k != "mask"}
            n = 4 if kwargs.get("mask") else 3
            q, k, v, *mask = args[at : at + n]
            outs.append(F.scaled_dot_product_attention(q, k, v, *mask, **kw))
            at += n
        return tuple(outs)

    return f


def all_fused(nodes: list, count: int) -> bool:
    return len(nodes) == count and all(kind == "kernel" for kind, _ in nodes)


@pytest.mark.parametrize("dt", list(DTYPES))
def test_attention(dt):
    """The cases of one type (head dims, lengths, causal), one sdpa each, in one graph."""
    dtype = DTYPES[dt]
    cases = [c for c in CASES.values() if c[0] == dt]
    args = [t for _, d, sq, sk, _ in cases for t in qkv(2, 2, sq, sk, d, dtype)]
    nodes = run(sdpas([{"is_causal": c[4]} for c in cases]), *args, dtype=dtype)
    assert all_fused(nodes, len(cases)), nodes


LEVEL1 = list(template._LEVEL1)


def test_every_level1_config(monkeypatch):
    """Each candidate tiling computes the same attention (partial query and key tiles, a
    mask or the causal diagonal), whatever the heuristic would pick: one call per config,
    told apart by its batch size, in one graph."""
    by_batch = {2 + i: c for i, c in enumerate(LEVEL1)}
    monkeypatch.setattr(template, "heuristic", lambda problem: by_batch[problem.batch])
    fixed = dataclasses.replace(
        template.TEMPLATE, heuristic=lambda problem: by_batch[problem.batch]
    )
    monkeypatch.setattr(template, "TEMPLATE", fixed)
    calls, args = [], []
    for i, b in enumerate(by_batch):
        args += qkv(b, 2, 72, 88, 64, torch.float16)
        if i % 2:
            args.append(torch.randn(72, 88, dtype=torch.float16))
            calls.append({"mask": True})
        else:
            calls.append({"is_causal": True})
    nodes = run(sdpas(calls), *args)
    assert sorted(nodes) == sorted(("kernel", f"attention[{c}]") for c in LEVEL1), nodes


def force_configs(monkeypatch, by_batch: dict) -> None:
    """Make the template pick by_batch[batch size] whatever the heuristic would."""
    pick = lambda problem: by_batch[problem.batch]  # noqa: E731
    monkeypatch.setattr(template, "heuristic", pick)
    monkeypatch.setattr(
        template, "TEMPLATE", dataclasses.replace(template.TEMPLATE, heuristic=pick)
    )


W32 = {
    "d64": template.AttnConfig(128, 64, 2, False, 32),
    "d128": template.AttnConfig(128, 32, 2, False, 32),
}
TWO_TILE_CASES = [
    # (dtype, head dim, Sq, Sk, causal, mask, config): 32 query rows a warp, two m16 tiles
    ("f16", 64, 72, 88, True, False, W32["d64"]),
    ("bf16", 128, 72, 72, True, False, W32["d128"]),
    ("f16", 128, 40, 72, False, False, W32["d128"]),
    ("bf16", 64, 72, 40, True, False, W32["d64"]),
    ("f16", 64, 1, 88, False, False, W32["d64"]),  # decode
    ("f16", 64, 72, 100, False, True, template.AttnConfig(128, 32, 2, False, 32)),
    ("bf16", 128, 130, 100, True, False, template.AttnConfig(64, 32, 3, False, 32)),
]


@pytest.mark.parametrize("dt", list(DTYPES))
def test_two_m_tiles_a_warp(dt, monkeypatch):
    """Warps of 32 query rows (each K and V fragment feeding two mma): causal, masked,
    partial query and key tiles, Sq above and below Sk, decode, head dims 64 and 128; one
    call per case, told apart by its batch size, in one graph."""
    cases = [c for c in TWO_TILE_CASES if c[0] == dt]
    dtype = DTYPES[dt]
    force_configs(monkeypatch, {2 + i: c[-1] for i, c in enumerate(cases)})
    calls, args = [], []
    for i, (_, d, sq, sk, causal, mask, _cfg) in enumerate(cases):
        args += qkv(2 + i, 2, sq, sk, d, dtype)
        if mask:
            args.append(torch.randn(sq, sk, dtype=dtype))
            calls.append({"mask": True})
        else:
            calls.append({"is_causal": causal})
    nodes = run(sdpas(calls), *args, dtype=dtype)
    assert sorted(nodes) == sorted(("kernel", f"attention[{c[-1]}]") for c in cases), nodes


def test_two_m_tiles_logsumexp_and_grouped_heads(monkeypatch):
    """The logsumexp of each of a warp's four rows (training reads it) and grouped-query
    heads, with 32 query rows a warp."""
    force_configs(monkeypatch, {2: W32["d128"]})
    q, k, v = (t.requires_grad_() for t in qkv(2, 4, 72, 40, 128, torch.float16, hk=2))
    f = sdpa(is_causal=True, enable_gqa=True)
    torch._dynamo.reset()
    compiled = torch.compile(f, backend="minicomp", options={"target": TARGET, "fallback": "error"})
    records: list = []
    with recording(records):
        out = compiled(q, k, v)
        grad = torch.randn_like(out)
        out.backward(grad)
    ref = [t.detach().double().requires_grad_() for t in (q, k, v)]
    expected = f(*ref)
    expected.backward(grad.double())
    torch.testing.assert_close(out, expected.half(), **TOLERANCE[torch.float16])
    tol = {"rtol": 1e-2, "atol": 1e-2}
    for t, r in zip((q, k, v), ref):
        torch.testing.assert_close(t.grad, r.grad.half(), **tol)
    forward = [r for r in records if r.kind == "forward"]
    (node,) = [n for n in forward[0].graph.nodes if isinstance(n, KernelOp)]
    assert node.function.attrs.template == f"attention[{W32['d128']}]"
    assert len(node.outputs) == 2


@pytest.mark.parametrize("dt", list(DTYPES))
def test_additive_mask(dt):
    """Masks of the whole (Sq, Sk), per batch, and per key (broadcast rows), in one graph."""
    dtype = DTYPES[dt]
    d = 64 if dt == "f16" else 128
    shapes = [(40, 72), (2, 1, 40, 72), (2, 2, 1, 72)]
    args = [t for s in shapes for t in (*qkv(2, 2, 40, 72, d, dtype), torch.randn(s, dtype=dtype))]
    nodes = run(sdpas([{"mask": True}] * len(shapes)), *args, dtype=dtype)
    assert all_fused(nodes, len(shapes)), nodes


def test_boolean_mask_and_masked_rows():
    """A boolean mask (PyTorch turns it into an additive one) with a row of no keys: that row
    gives 0, as in PyTorch."""
    mask = torch.rand(40, 72) > 0.4
    mask[3] = False
    nodes = run(sdpa_masked(), *qkv(2, 2, 40, 72, 64, torch.float16), mask)
    assert fused(nodes), nodes


def test_float32_mask_on_half_inputs():
    mask = torch.randn(2, 2, 40, 40).clamp(max=1.0)
    nodes = run(sdpa_masked(scale=0.3), *qkv(2, 2, 40, 40, 64, torch.float16), mask.half())
    assert fused(nodes), nodes


@pytest.mark.parametrize("dt", list(DTYPES))
def test_transposed_projections(dt):
    """(B, S, H, D) tensors seen as (B, H, S, D), as a projection gives them: read in place."""
    dtype = DTYPES[dt]
    q, k, v = (torch.randn(2, s, 2, 64, dtype=dtype).transpose(1, 2) for s in (40, 72, 72))
    nodes = run(sdpa(is_causal=True), q, k, v, dtype=dtype)
    assert fused(nodes), nodes


def test_grouped_query_heads():
    nodes = run(sdpa(enable_gqa=True), *qkv(2, 4, 40, 72, 64, torch.float16, hk=2))
    assert fused(nodes), nodes


def run_in_place(fn, *args, dtype=torch.float16) -> list:
    """Like `run`, on the tensors themselves (check_compiled's copies would be contiguous
    and aligned)."""
    torch._dynamo.reset()
    compiled = torch.compile(
        fn, backend="minicomp", options={"target": TARGET, "fallback": "error"}
    )
    records: list = []
    with recording(records), torch.no_grad():
        actual = compiled(*args)
        expected = fn(*(a.double() for a in args))
    torch.testing.assert_close(actual, expected.to(dtype), **TOLERANCE[dtype])
    return attention_nodes(records)


def test_misaligned_and_padded_inputs():
    """Q, K and V one element into their storage (misaligned for 16-byte copies, found at run
    time), and K with rows 132 elements apart (not a multiple of 8, known when compiling):
    the block copies them element by element."""

    def shifted(shape):
        return torch.randn(math.prod(shape) + 1, dtype=torch.float16)[1:].view(shape)

    q, v = shifted((2, 2, 40, 64)), shifted((2, 2, 72, 64))
    k = torch.randn(2 * 72 * 132 * 2, dtype=torch.float16).as_strided(
        (2, 2, 72, 64), (2 * 72 * 132, 72 * 132, 132, 1)
    )
    assert q.data_ptr() % 16 and v.data_ptr() % 16
    nodes = run_in_place(sdpa(is_causal=True), q, k, v)
    assert fused(nodes), nodes


def test_symbolic_lengths():
    """Sequence lengths as symbols: one compiled plan for two lengths."""
    f = sdpa(is_causal=True)
    torch._dynamo.reset()
    opts = {"target": TARGET, "fallback": "error"}
    compiled = torch.compile(f, backend="minicomp", options=opts)
    records: list = []
    with recording(records), torch.no_grad():
        for sq, sk in ((40, 48), (72, 80)):
            q = torch.randn(2, sq, 2, 64, dtype=torch.float16).transpose(1, 2)
            k, v = qkv(2, 2, sk, sk, 64, torch.float16)[1:]
            for t in (q, k, v):
                torch._dynamo.mark_dynamic(t, 2)
            expected = f(q.double(), k.double(), v.double())
            torch.testing.assert_close(compiled(q, k, v), expected.half(), **TOLERANCE[q.dtype])
    assert len(records) == 1, "a new length recompiled"
    assert fused(attention_nodes(records))


# ---- models ----


class SelfAttention(nn.Module):
    """A transformer block's attention: one QKV projection, heads, causal sdpa, output
    projection."""

    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x):
        b, s, e = x.shape
        q, k, v = self.qkv(x).view(b, s, 3, self.heads, e // self.heads).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(b, s, e))


def test_transformer_attention_block_explain():
    torch.manual_seed(0)
    block = SelfAttention(128, 2).half()
    x = torch.randn(2, 40, 128, dtype=torch.float16)
    records: list = []
    with recording(records), torch.no_grad():
        check_compiled(block, x, target=TARGET, **TOLERANCE[torch.float16])
    assert fused(attention_nodes(records))
    torch._dynamo.reset()
    with torch.no_grad():
        report = minicomp.explain(block, x, options={"target": TARGET})
    (record,) = report.records
    kernels = [n for n in record.graph.nodes if isinstance(n, KernelOp)]
    assert len(kernels) == 1 and kernels[0].strided
    assert not any(isinstance(n, ExternOp) and n.target in sdpa_ops() for n in record.graph.nodes)
    # Q, K and V are read in place from the projection: no copy feeds the launch.
    producers = record.graph.producers()
    assert all(isinstance(producers.get(v), ExternOp) for v in kernels[0].inputs)
    text = report.report()
    assert "attention[" in text and "_scaled_dot_product_flash_attention_for_cpu" in text


def test_multihead_attention_module():
    torch.manual_seed(0)
    mha = nn.MultiheadAttention(128, 2, batch_first=True).half().eval()
    x = torch.randn(2, 40, 128, dtype=torch.float16)

    def f(x):
        return mha(x, x, x, need_weights=False, is_causal=True, attn_mask=_causal(40))[0]

    records: list = []
    with recording(records), torch.no_grad():
        check_compiled(f, x, target=TARGET, **TOLERANCE[torch.float16])
    assert fused(attention_nodes(records)), attention_nodes(records)


def _causal(n: int) -> torch.Tensor:
    return torch.triu(torch.full((n, n), -math.inf, dtype=torch.float16), 1)


@pytest.mark.parametrize("dt", list(DTYPES))
def test_training(dt):
    """The forward launches the template, which writes the logsumexp too; the backward is
    PyTorch's, reading both."""
    dtype = DTYPES[dt]
    q, k, v = (t.requires_grad_() for t in qkv(2, 2, 40, 72, 64, dtype))
    mask = torch.randn(40, 72, dtype=dtype)
    f = sdpa_masked()
    torch._dynamo.reset()
    compiled = torch.compile(f, backend="minicomp", options={"target": TARGET, "fallback": "error"})
    records: list = []
    with recording(records):
        out = compiled(q, k, v, mask)
        grad = torch.randn_like(out)
        out.backward(grad)
    ref = [t.detach().double().requires_grad_() for t in (q, k, v)]
    expected = f(*ref, mask.double())
    expected.backward(grad.double())
    tol = {"rtol": 2 * TOLERANCE[dtype]["rtol"], "atol": 2 * TOLERANCE[dtype]["atol"]}
    torch.testing.assert_close(out, expected.to(dtype), **TOLERANCE[dtype])
    for t, r in zip((q, k, v), ref):
        torch.testing.assert_close(t.grad, r.grad.to(dtype), **tol)
    forward = [r for r in records if r.kind == "forward"]
    (node,) = [n for n in forward[0].graph.nodes if isinstance(n, KernelOp)]
    assert len(node.outputs) == 2  # the attention and its logsumexp


# ---- the fused ops of CUDA tensors ----

aten = torch.ops.aten


def compile_aten(fn, *args):
    """`fn`, calling ATen ops, traced with fake tensors (so ops with CUDA kernels only trace
    on a CPU) and compiled for cuda-emu: (its outputs on `args`, the compiled graph)."""
    from torch.fx.experimental.proxy_tensor import make_fx

    from minicomp import config
    from minicomp.compiler import compile_graph
    from minicomp.dynamo.importer import import_graph
    from minicomp.record import CompileRecord

    gm = make_fx(fn, tracing_mode="fake")(*args)
    record = CompileRecord()
    plan = compile_graph(import_graph(gm), config.resolve({"target": TARGET}), record)
    return plan(*args), record.graph


def reference_lse(q, k, mask=None, causal=False):
    scores = (q.double() @ k.double().transpose(-1, -2)) / math.sqrt(q.shape[-1])
    if mask is not None:
        scores = scores + mask.double()
    if causal:
        scores = scores.masked_fill(torch.ones_like(scores).triu(1).bool(), -math.inf)
    return torch.logsumexp(scores, -1)


def test_cuda_flash_op():
    """_scaled_dot_product_flash_attention (CUDA f16/bf16 without a mask): the attention and
    its logsumexp from the template; its max lengths (ints) beside the tensors import."""
    q, k, v = qkv(2, 2, 40, 72, 64, torch.float16)

    def fn(q, k, v):
        out = aten._scaled_dot_product_flash_attention(q, k, v, 0.0, True)
        return out[0], out[1], out[4] + out[5]

    (out, lse, lengths), graph = compile_aten(fn, q, k, v)
    assert [type(n).__name__ for n in graph.nodes] == ["KernelOp"]
    expected = sdpa(is_causal=True)(q.double(), k.double(), v.double())
    torch.testing.assert_close(out, expected.half(), **TOLERANCE[torch.float16])
    torch.testing.assert_close(lse, reference_lse(q, k, causal=True).float(), rtol=1e-3, atol=1e-3)
    assert lengths == 40 + 72


@pytest.mark.parametrize("op", ["efficient", "cudnn"])
def test_cuda_attention_ops_with_bias(op):
    q, k, v = qkv(2, 2, 40, 72, 64, torch.bfloat16)
    bias = torch.randn(2, 2, 40, 72, dtype=torch.bfloat16)

    def fn(q, k, v, bias):
        if op == "efficient":
            return aten._scaled_dot_product_efficient_attention(q, k, v, bias, False)[0]
        return aten._scaled_dot_product_cudnn_attention(q, k, v, bias, False)[0]

    (out,), graph = compile_aten(fn, q, k, v, bias)
    assert [type(n).__name__ for n in graph.nodes] == ["KernelOp"]
    expected = sdpa_masked()(q.double(), k.double(), v.double(), bias.double())
    torch.testing.assert_close(out, expected.bfloat16(), **TOLERANCE[torch.bfloat16])


def test_cuda_training_forward_stays_aten():
    """A CUDA training graph saves the flash kernel's RNG state for its backward: the call
    stays PyTorch's (the template has no such state to give)."""
    from torch.fx.experimental.proxy_tensor import make_fx

    from minicomp.dynamo.importer import import_graph
    from minicomp.passes.graph.attention import lower_attention

    q, k, v = qkv(2, 2, 40, 40, 64, torch.float16)

    def fn(q, k, v):
        out = aten._scaled_dot_product_flash_attention(q, k, v, 0.0, False)
        return out[0], out[1], out[6], out[7]

    graph = lower_attention(import_graph(make_fx(fn, tracing_mode="fake")(q, k, v)))
    (call,) = graph.nodes
    assert isinstance(call, ExternOp) and "RNG state" in call.reason


# ---- what stays an ATen call ----


@pytest.mark.parametrize(
    "case,why",
    [
        ("f32", "float32 inputs"),
        ("head-dim-40", "head dim 40"),
        ("value-dim", None),
    ],
)
def test_stays_aten(case, why):
    if case == "f32":
        args = qkv(2, 2, 40, 40, 64, torch.float32)
    elif case == "head-dim-40":
        args = qkv(2, 2, 40, 40, 40, torch.float16)
    else:  # a value head dim unlike the query's: PyTorch decomposes it (no fused op)
        q, k, _ = qkv(2, 2, 40, 40, 64, torch.float16)
        args = (q, k, torch.randn(2, 2, 40, 32, dtype=torch.float16))
    records: list = []
    with recording(records), torch.no_grad():
        check_compiled(sdpa(), *args, target=TARGET, rtol=1e-2, atol=1e-2)
    nodes = attention_nodes(records)
    if why is None:
        assert nodes == []
    else:
        assert len(nodes) == 1 and nodes[0][0] == "aten" and why in nodes[0][1], nodes


def test_cpu_target_calls_aten_whole():
    """The cpu target keeps the one ATen node (its kernel is PyTorch's)."""
    records: list = []
    with recording(records), torch.no_grad():
        check_compiled(sdpa(is_causal=True), *qkv(2, 2, 40, 40, 64, torch.float16), target="cpu")
    nodes = attention_nodes(records)
    assert len(nodes) == 1 and nodes[0][0] == "aten", nodes


# ---- the search space and the tuning hook ----


def test_problem_strides_and_signature():
    q = torch.randn(2, 40, 2, 64, dtype=torch.float16).transpose(1, 2)
    k, v = qkv(2, 2, 72, 72, 64, torch.float16)[1:]
    p = attention_problem_of(sdpa(is_causal=True), q, k, v)
    assert (p.batch, p.heads, p.seq_q, p.seq_k, p.head_dim) == (2, 2, 40, 72, 64)
    assert p.q.strides == (40 * 2 * 64, 64, 2 * 64, 1)
    assert p.k.strides == (2 * 72 * 64, 72 * 64, 64, 1)
    assert p.causal and math.isclose(p.scale, 64**-0.5)
    assert "s=40,72" in p.signature() and "causal=1" in p.signature()


def test_space_and_heuristic():
    for d in (64, 128, 256):
        small = attention_problem_of(sdpa(), *qkv(1, 2, 16, 16, d, torch.float16))
        p = dataclasses.replace(small, batch=8, heads=16, seq_q=1024, seq_k=1024)
        level1, level2 = template.space(p, 1), template.space(p, 2)
        assert len(level1) >= 4 and len(level2) > len(level1)
        assert all(template.valid(p, c) for c in level2)
        assert all(template.shared_bytes(p, c) <= template.MAX_SHARED for c in level2)
        best = template.heuristic(p)
        assert template.valid(p, best)
        assert best.bm == (128 if d <= 128 else 64)
        assert best.wm == (32 if d <= 128 else 16)
        # Few (batch, head) pairs: smaller blocks, so that every SM has one.
        few = dataclasses.replace(p, batch=1, heads=2, seq_q=256, seq_k=256)
        assert template.heuristic(few).bm <= 64


def test_tuning_hook_reinstantiates_and_reverts():
    """tune_attention asks the chooser for each launch's config: a different config gives a
    new kernel of that config; ATen measured faster gives the ATen call back."""
    from minicomp.tune.tuner import Choice

    args = qkv(2, 2, 40, 72, 64, torch.float16)
    torch._dynamo.reset()
    with torch.no_grad():
        report = minicomp.explain(sdpa(), *args, options={"target": TARGET})
    graph = report.records[0].graph
    other = template.AttnConfig(32, 32, 2, False)
    asked = []

    def choose(tmpl, problem, op, aten=None, why=""):
        asked.append((tmpl.name, problem.head_dim, aten is not None))
        return Choice(other, "tuned")

    tuned = tune_attention(graph, choose)
    assert asked == [("attention", 64, True)]
    (node,) = [n for n in tuned.nodes if isinstance(n, KernelOp)]
    assert node.function.attrs.template == f"attention[{other}]"

    def prefer_aten(tmpl, problem, op, aten=None, why=""):
        return Choice(other, "tuned", aten=True, time_us=20.0, aten_time_us=10.0)

    reverted = tune_attention(tuned, prefer_aten)
    assert not any(isinstance(n, KernelOp) for n in reverted.nodes)
    (call,) = [n for n in reverted.nodes if isinstance(n, ExternOp)]
    assert "measured faster" in call.reason and call.outputs == node.outputs


# ---- NVRTC ----


def _nvrtc():
    from minicomp.backends.cuda import nvrtc

    try:
        nvrtc.nvrtc_version()
    except nvrtc.NvrtcUnavailableError as err:  # pragma: no cover - depends on the machine
        pytest.skip(f"NVRTC unavailable: {err}")
    return nvrtc


def _nvrtcattention_problem_of(case: str):
    h = torch.float16
    if case == "d64-mask":
        q = torch.randn(4, 8, 512, 64, dtype=h)
        return attention_problem_of(sdpa_masked(), q, q, q, torch.randn(512, 512, dtype=h))
    if case == "d128-causal":
        q = torch.randn(4, 8, 512, 128, dtype=torch.bfloat16)
        return attention_problem_of(sdpa(is_causal=True), q, q, q)
    if case == "d128-mask":
        q = torch.randn(4, 8, 500, 128, dtype=h)
        return attention_problem_of(sdpa_masked(), q, q, q, torch.randn(4, 1, 500, 500, dtype=h))
    if case == "d256":
        q = torch.randn(4, 8, 512, 256, dtype=h)
        return attention_problem_of(sdpa(), q, q, q)
    raise ValueError(case)


def _check_level1_space(case: str, tmp_path) -> None:
    from minicomp.backends.cuda.codegen import render_module

    nvrtc = _nvrtc()
    problem = _nvrtcattention_problem_of(case)
    configs = template.space(problem, 1)
    assert len(configs) >= 4
    for config in configs:
        kernel = template.instantiate(problem, config)
        source = render_module(Module(kernel.name, (kernel,)))
        for arch in ("sm_80", "sm_90"):
            binary = nvrtc.compile_cuda(source, arch=arch, name=case, cache_dir=str(tmp_path))
            usage = binary.resources[kernel.name]
            what = (case, str(config), arch, usage)
            assert usage.registers > 0, binary.log
            assert usage.spill_stores == 0 and usage.spill_loads == 0, what
            assert usage.stack_bytes == 0, what


@pytest.mark.parametrize("case", ["d64-mask", "d128-causal"])
def test_level1_space_compiles_with_nvrtc(case, tmp_path):
    _check_level1_space(case, tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize("case", ["d128-mask", "d256"])
def test_more_level1_spaces_compile_with_nvrtc(case, tmp_path):
    _check_level1_space(case, tmp_path)
