"""Horizontal fusion: products sharing their input and reading constant weights become one
product over the concatenated weights, sliced; anything else is left alone."""

import os

import pytest
import torch
from graph_builder import GraphBuilder
from helpers import assert_same, clone_inputs
from helpers_graph import PassGraphBuilder, assert_graph_equal, run_graph

from minicomp.dynamo.backend import recording
from minicomp.ir.contraction import match_contraction
from minicomp.ir.graph import ExternOp, FusedOp, Graph
from minicomp.passes.graph.horizontal import fuse_matmuls_sharing_input
from minicomp.passes.graph.onednn_calls import MklPackedLinear, PackedLinear, linear

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # configs are built here; nothing is downloaded

aten = torch.ops.aten
TOLERANCE = {"rtol": 1e-4, "atol": 1e-4}


def transposed(b: GraphBuilder, name: str, w: torch.Tensor):
    """A constant weight [N, K] read as [K, N] through a transpose, as `linear` reads it."""
    c = b.constant(name, w)
    n, k = w.shape
    return b.compute(f"{name}_t", (k, n), lambda i, j: c[j, i])


def products(graph: Graph) -> list[ExternOp]:
    """The matrix products the graph calls: ATen's, oneDNN's linear (prepacked or not), MKL's."""
    return [
        n
        for n in graph.nodes
        if isinstance(n, ExternOp)
        and (
            "mm" in str(n.target)
            or isinstance(n.target, (PackedLinear, MklPackedLinear))
            or n.target is linear
        )
    ]


MM = "matrix product"  # the reason an importer gives its ATen calls
FUSED = "matrix product; one product for {} products sharing their input"


def test_projections_with_bias_become_one_product_over_k_major_weights():
    # Query, key and value projections (grouped heads: key and value narrower).
    torch.manual_seed(0)
    weights = [torch.randn(n, 16) for n in (8, 4, 4)]
    biases = [torch.randn(n) for n in (8, 4, 4)]
    b = PassGraphBuilder()
    x = b.input("x", (6, 16))
    outs = []
    for q, (w, bias) in enumerate(zip(weights, biases)):
        wt = transposed(b, f"w{q}", w)
        bq = b.constant(f"b{q}", bias)
        outs.append(b.extern(f"y{q}", aten.addmm.default, [bq, x, wt], (6, len(bias)), reason=MM))
    b.output(*outs)
    g = b.build()

    # One addmm over the weights concatenated along N, laid out K-major as each transpose
    # reads its weight (one [16, 16] block, strides (1, 16)), then a slice per projection.
    # The transposes stay for dead-code elimination.
    e = PassGraphBuilder()
    x = e.input("x", (6, 16))
    for q, bias in enumerate(biases):
        e.constant(f"b{q}", bias)
    transposed(e, "w0", weights[0])
    bias = e.constant("y0_hbias", torch.cat(biases), strides=(1,))
    weight = e.constant("y0_hweight", torch.cat(weights).t(), strides=(1, 16))
    wide = e.extern(
        "y0_hcat", aten.addmm.default, [bias, x, weight], (6, 16),
        op="y0", strides=(16, 1), reason=FUSED.format(3),
    )  # fmt: skip
    y0 = e.compute("y0", (6, 8), lambda i, j: wide[i, j], op="slice")
    y1 = e.compute("y1", (6, 4), lambda i, j: wide[i, j + 8], op="slice")
    y2 = e.compute("y2", (6, 4), lambda i, j: wide[i, j + 12], op="slice")
    transposed(e, "w1", weights[1])
    transposed(e, "w2", weights[2])
    e.output(y0, y1, y2)

    fused = fuse_matmuls_sharing_input(g)
    assert_graph_equal(fused, e.build())
    inputs = {"x": torch.randn(6, 16)}
    for got, want in zip(run_graph(fused, inputs), run_graph(g, inputs)):
        torch.testing.assert_close(got, want)


def test_products_without_bias_over_n_major_weights():
    # GPT-2's Conv1D keeps its weight as [K, N]: the product reads it as it is.
    w1, w2 = torch.randn(16, 5), torch.randn(16, 7)
    b = PassGraphBuilder()
    x = b.input("x", (6, 16))
    c1, c2 = b.constant("w1", w1), b.constant("w2", w2)
    y1 = b.extern("y1", aten.mm.default, [x, c1], (6, 5), reason=MM)
    y2 = b.extern("y2", aten.mm.default, [x, c2], (6, 7), reason=MM)
    b.output(b.compute("y", (6, 5), lambda i, j: y1[i, j] * y2[i, j + 2]))
    g = b.build()

    e = PassGraphBuilder()
    x = e.input("x", (6, 16))
    e.constant("w1", w1)
    e.constant("w2", w2)
    weight = e.constant("y1_hweight", torch.cat([w1, w2], 1), strides=(12, 1))
    wide = e.extern(
        "y1_hcat", aten.mm.default, [x, weight], (6, 12),
        op="y1", strides=(12, 1), reason=FUSED.format(2),
    )  # fmt: skip
    y1 = e.compute("y1", (6, 5), lambda i, j: wide[i, j], op="slice")
    y2 = e.compute("y2", (6, 7), lambda i, j: wide[i, j + 5], op="slice")
    e.output(e.compute("y", (6, 5), lambda i, j: y1[i, j] * y2[i, j + 2]))

    fused = fuse_matmuls_sharing_input(g)
    assert_graph_equal(fused, e.build())
    inputs = {"x": torch.randn(6, 16)}
    torch.testing.assert_close(run_graph(fused, inputs)[0], run_graph(g, inputs)[0])


def test_equal_views_of_one_activation_count_as_one_input():
    # Each linear of a 3-D input flattens it with a view of its own.
    w1, w2 = torch.randn(16, 4), torch.randn(16, 4)
    b = PassGraphBuilder()
    x = b.input("x", (2, 3, 16))
    outs = []
    for q, w in ((1, w1), (2, w2)):
        flat = b.compute(f"flat{q}", (6, 16), lambda i, k: x[i // 3, i % 3, k])
        wq = b.constant(f"w{q}", w)
        outs.append(b.extern(f"y{q}", aten.mm.default, [flat, wq], (6, 4), reason=MM))
    b.output(*outs)
    g = b.build()

    # The product reads the first view; the second is left unread.
    e = PassGraphBuilder()
    x = e.input("x", (2, 3, 16))
    e.constant("w1", w1)
    e.constant("w2", w2)
    flat1 = e.compute("flat1", (6, 16), lambda i, k: x[i // 3, i % 3, k])
    weight = e.constant("y1_hweight", torch.cat([w1, w2], 1), strides=(8, 1))
    wide = e.extern(
        "y1_hcat", aten.mm.default, [flat1, weight], (6, 8),
        op="y1", strides=(8, 1), reason=FUSED.format(2),
    )  # fmt: skip
    y1 = e.compute("y1", (6, 4), lambda i, j: wide[i, j], op="slice")
    y2 = e.compute("y2", (6, 4), lambda i, j: wide[i, j + 4], op="slice")
    e.compute("flat2", (6, 16), lambda i, k: x[i // 3, i % 3, k])
    e.output(y1, y2)
    assert_graph_equal(fuse_matmuls_sharing_input(g), e.build())


def test_left_alone_unless_constant_weights_share_input_dtype_and_scaling():
    b = GraphBuilder()
    x, z = b.input("x", (6, 16)), b.input("z", (6, 16))
    w_in = b.input("w_in", (16, 4))  # a weight given at run time
    w32, w16 = b.constant("w32", torch.randn(16, 4)), b.constant("w16", torch.randn(16, 4).half())
    bias = b.constant("bias", torch.randn(4))
    outs = [
        b.extern("runtime_weight", aten.mm.default, [x, w_in], (6, 4)),
        b.extern("other_dtype", aten.mm.default, [x, w16], (6, 4)),
        b.extern("other_input", aten.mm.default, [z, w32], (6, 4)),
        b.extern("scaled", aten.addmm.default, [bias, x, w32], (6, 4), kwargs=(("beta", 0.5),)),
        b.extern("unscaled", aten.addmm.default, [bias, x, w32], (6, 4)),  # fuses with none
        b.extern("plain", aten.mm.default, [x, w32], (6, 4)),
    ]
    b.output(*outs)
    g = b.build()
    assert fuse_matmuls_sharing_input(g) is g


class Attention(torch.nn.Module):
    """Self-attention with separate query, key and value projections."""

    def __init__(self, dim: int = 32, heads: int = 2):
        super().__init__()
        self.heads = heads
        self.q, self.k, self.v, self.o = (torch.nn.Linear(dim, dim) for _ in range(4))

    def forward(self, x):
        b, s, d = x.shape

        def split(t):
            return t.view(b, s, self.heads, d // self.heads).transpose(1, 2)

        q, k, v = split(self.q(x)), split(self.k(x)), split(self.v(x))
        y = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o(y.transpose(1, 2).reshape(b, s, d))


def compiled_record(fn, *inputs, target: str, freeze: bool = True):
    """Compile `fn`, compare it with eager, return the forward graph's CompileRecord."""
    records: list = []
    options = {"target": target, "freeze": freeze, "fallback": "error"}
    torch._dynamo.reset()
    with torch.no_grad(), recording(records):
        expected = fn(*clone_inputs(inputs))
        actual = torch.compile(fn, backend="minicomp", options=options)(*clone_inputs(inputs))
    assert_same(actual, expected, **TOLERANCE)
    (record,) = records
    return record


def product_count(graph: Graph) -> int:
    """Matrix products the plan runs: ATen calls on the cpu target, matmul kernels (fused
    contractions) on the CUDA targets."""
    calls = len(products(graph))
    kernels = sum(1 for n in graph.nodes if isinstance(n, FusedOp) and match_contraction(n))
    return calls + kernels


def test_attention_projections_become_one_product(target):
    torch.manual_seed(0)
    model = Attention().eval()
    x = torch.randn(2, 8, 32)
    frozen = compiled_record(model, x, target=target)
    assert product_count(frozen.graph) == 2  # query/key/value, then the output projection
    # Weights given at run time are not concatenated (it would copy them on every call).
    unfrozen = compiled_record(model, x, target=target, freeze=False)
    assert product_count(unfrozen.graph) == 4


def test_gated_mlp_and_grouped_query_projections_in_llama(target):
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        hidden_size=32, num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2,
        intermediate_size=64, vocab_size=64, max_position_embeddings=32,
        bos_token_id=0, eos_token_id=0, pad_token_id=0,
    )  # fmt: skip
    model = transformers.LlamaForCausalLM(config).eval()

    def logits(input_ids):
        return model(input_ids=input_ids, use_cache=False).logits

    ids = torch.randint(0, 64, (2, 8), generator=torch.Generator().manual_seed(1))
    record = compiled_record(logits, ids, target=target)
    # q, k and v (k and v narrower: grouped heads) become one product, gate and up another:
    # then o_proj, down_proj and the head, 5 instead of 8.
    assert product_count(record.graph) == 5


def test_gpt2_projections_are_already_one_product():
    # GPT-2 computes q, k and v with one Conv1D, and its MLP's two products read different
    # inputs: nothing to fuse, and the model still matches eager.
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.GPT2Config(
        n_layer=1, n_head=2, n_embd=32, vocab_size=64, n_positions=32,
        bos_token_id=0, eos_token_id=0,
    )  # fmt: skip
    model = transformers.GPT2LMHeadModel(config).eval()

    def logits(input_ids):
        return model(input_ids=input_ids, use_cache=False).logits

    ids = torch.randint(0, 64, (2, 8), generator=torch.Generator().manual_seed(1))
    record = compiled_record(logits, ids, target="cpu")
    assert product_count(record.graph) == 5  # c_attn, c_proj, c_fc, mlp.c_proj, the head
