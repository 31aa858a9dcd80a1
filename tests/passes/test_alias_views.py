"""Zero-copy views: remappings read by ATen calls become strided aliases when they are."""

import torch
from helpers import check_compiled
from helpers_graph import PassGraphBuilder, assert_graph_equal

import minicomp
from minicomp.ir import types as T
from minicomp.ir.expr import cast
from minicomp.ir.graph import ArgRef
from minicomp.passes.graph.alias_views import alias_views, strided_view
from minicomp.runtime.plan_builder import escaping_values

aten = torch.ops.aten
VIEW = "a view of its input's memory"


def alias(b: PassGraphBuilder, name: str, src, shape, strides, offset):
    """What the pass makes of view `name`: an as_strided alias of `src`, named after it."""
    args = (ArgRef(0), shape, strides, offset)
    op = f"{name} (zero-copy view)"
    return b.extern(
        name, strided_view, [src], shape, args=args, op=op, strides=strides, reason=VIEW
    )


def test_transpose_read_by_an_aten_call_becomes_an_alias():
    b = PassGraphBuilder()
    x, y = b.input("x", (6, 4)), b.input("y", (6, 5))
    xt = b.compute("xt", (4, 6), lambda i, j: x[j, i])
    b.output(b.extern("mm", aten.mm.default, [xt, y], (4, 5)))

    e = PassGraphBuilder()
    x, y = e.input("x", (6, 4)), e.input("y", (6, 5))
    xt = alias(e, "xt", x, (4, 6), (1, 4), 0)
    e.output(e.extern("mm", aten.mm.default, [xt, y], (4, 5)))
    assert_graph_equal(alias_views(b.build()), e.build())


def test_slice_with_offset_becomes_an_alias_with_that_offset():
    b = PassGraphBuilder()
    x = b.input("x", (8, 4))
    tail = b.compute("tail", (3, 4), lambda i, j: x[i + 5, j])
    b.output(b.extern("neg", aten.neg.default, [tail], (3, 4)))

    e = PassGraphBuilder()
    x = e.input("x", (8, 4))
    tail = alias(e, "tail", x, (3, 4), (4, 1), 20)
    e.output(e.extern("neg", aten.neg.default, [tail], (3, 4)))
    assert_graph_equal(alias_views(b.build()), e.build())


def test_a_view_of_a_strided_input_composes_the_strides():
    # A column-major input (a transposed tensor handed in): its transpose is row-major.
    b = PassGraphBuilder()
    x = b.input("x", (6, 4), strides=(1, 6))
    cols = b.compute("cols", (4, 3), lambda i, j: x[j + 2, i])
    b.output(b.extern("neg", aten.neg.default, [cols], (4, 3)))

    e = PassGraphBuilder()
    x = e.input("x", (6, 4), strides=(1, 6))
    cols = alias(e, "cols", x, (4, 3), (6, 1), 2)
    e.output(e.extern("neg", aten.neg.default, [cols], (4, 3)))
    assert_graph_equal(alias_views(b.build()), e.build())


def test_views_that_are_no_strided_alias_are_left_as_they_are():
    b = PassGraphBuilder()
    s = b.symbol("s")
    x = b.input("x", (4, 6))
    h = b.input("h", (4, 6), T.f16)
    d = b.input("d", (s, 6))
    # Flattening a transpose reads storage in an order no single stride per dim gives.
    flat = b.compute("flat", (24,), lambda k: x[k % 4, k // 4])
    # Strided, but with a negative stride, which as_strided refuses.
    flipped = b.compute("flipped", (4, 6), lambda i, j: x[i, 5 - j])
    widened = b.compute("widened", (4, 6), lambda i, j: cast(h[i, j], T.f32))  # no view
    dt = b.compute("dt", (6, s), lambda i, j: d[j, i])  # symbolic sizes
    returned = b.compute("returned", (6, 4), lambda i, j: x[j, i])  # the graph returns it
    views = (flat, flipped, widened, dt, returned)
    b.output(*(b.extern(f"neg_{v.name}", aten.neg.default, [v], v.shape) for v in views))
    b.output(returned)
    g = b.build()
    assert alias_views(g) is g


def test_remap_only_kernels_read_is_left_to_fusion():
    b = PassGraphBuilder()
    x = b.input("x", (6, 4))
    xt = b.compute("xt", (4, 6), lambda i, j: x[j, i])
    b.output(b.compute("y", (4, 6), lambda i, j: xt[i, j] * 2.0))
    g = b.build()
    assert alias_views(g) is g


def test_views_feeding_matmuls_match_eager_and_copy_nothing(target):
    def f(x, w):
        h = x.view(-1, x.shape[-1]) @ w
        return h.t() @ x.view(-1, x.shape[-1])[:, 2:5]

    x, w = torch.randn(2, 6, 8), torch.randn(8, 6)
    with torch.no_grad():
        check_compiled(f, x, w, target=target)
        report = minicomp.explain(f, x, w, options={"target": target})
    if target == "cpu":
        # ATen's GEMM reads the views in place.
        assert report.kernel_count == 0
        assert any("zero-copy" in name for name in report.fallbacks)
    else:
        # CUDA computes the products itself, reading the views through their index maps:
        # one kernel a product, no copy.
        assert report.kernel_count == 2 and not report.fallbacks


def test_readers_read_the_alias_value():
    # The alias's strides differ from the compute's on a size-1 dim, so it is a new Value;
    # a reader left on the old one loses its producer (fusion once ordered it first).
    b = PassGraphBuilder()
    x = b.input("x", (2, 64))
    q = b.compute("q", (2, 8, 1), lambda i, j, k: x[i, j])
    b.output(b.extern("bmm", aten.bmm.default, [q, q], (2, 8, 8)))

    e = PassGraphBuilder()
    x = e.input("x", (2, 64))
    q = alias(e, "q", x, (2, 8, 1), (64, 1, 1), 0)
    e.output(e.extern("bmm", aten.bmm.default, [q, q], (2, 8, 8)))
    assert_graph_equal(alias_views(b.build()), e.build())


def test_attention_on_a_slice_feeding_back_into_its_source(target):
    # LeViT's last stage: a sequence of length 1 whose scores join a late reader of the
    # value the queries were sliced from.
    def f(x, w):
        h = x * 2.0 + 1.0
        q = h.view(2, 1, 2, 32)[..., :8].permute(0, 2, 1, 3)
        s = torch.matmul(q, q.transpose(-1, -2))
        return h + (s.reshape(2, 2) @ w).repeat(1, 32)

    check_compiled(f, torch.randn(2, 64), torch.randn(2, 2), target=target, rtol=1e-5, atol=1e-5)


def test_a_flip_read_by_an_aten_call_matches_eager(target):
    # The pass leaves a flip a kernel (the left-alone test above): the product reads a copy.
    check_compiled(lambda x: torch.flip(x, dims=(1,)) @ x.mT, torch.randn(2, 3, 4), target=target)


# --- returned views --------------------------------------------------------------------------


def shared(graph, *groups):
    """`graph` with eager's memory sharing: the values of each group share one storage."""
    return graph.replace(storages={v: k for k, names in enumerate(groups) for v in names})


def test_a_returned_transpose_of_an_input_is_an_alias_where_eager_returns_one():
    # A training forward saving the transposed weight for its backward.
    b = PassGraphBuilder()
    w, x = b.input("w", (6, 4)), b.input("x", (3, 4))
    wt = b.compute("wt", (4, 6), lambda i, j: w[j, i])
    b.output(b.extern("mm", aten.mm.default, [x, wt], (3, 6)), wt)

    e = PassGraphBuilder()
    w, x = e.input("w", (6, 4)), e.input("x", (3, 4))
    wt = alias(e, "wt", w, (4, 6), (1, 4), 0)
    e.output(e.extern("mm", aten.mm.default, [x, wt], (3, 6)), wt)
    got = alias_views(shared(b.build(), ("w", "wt")))
    assert_graph_equal(got, e.build())


def test_a_returned_view_of_an_aten_result_is_an_alias():
    # The LM head: the matmul's rows seen at the batch's shape.
    b = PassGraphBuilder()
    x, w = b.input("x", (6, 4)), b.input("w", (4, 5))
    mm = b.extern("mm", aten.mm.default, [x, w], (6, 5))
    b.output(b.compute("logits", (2, 3, 5), lambda i, j, k: mm[i * 3 + j, k]))

    e = PassGraphBuilder()
    x, w = e.input("x", (6, 4)), e.input("w", (4, 5))
    mm = e.extern("mm", aten.mm.default, [x, w], (6, 5))
    e.output(alias(e, "logits", mm, (2, 3, 5), (15, 5, 1), 0))
    assert_graph_equal(alias_views(shared(b.build(), ("mm", "logits"))), e.build())


def test_a_returned_alias_keeps_eagers_stride_on_a_size_one_dim():
    # Any stride indexes a size-1 dim; a returned tensor still shows eager's.
    b = PassGraphBuilder()
    x, w = b.input("x", (6, 4)), b.input("w", (4, 5))
    mm = b.extern("mm", aten.mm.default, [x, w], (6, 5))
    b.output(b.compute("logits", (1, 6, 5), lambda i, j, k: mm[j, k], strides=(30, 5, 1)))

    e = PassGraphBuilder()
    x, w = e.input("x", (6, 4)), e.input("w", (4, 5))
    mm = e.extern("mm", aten.mm.default, [x, w], (6, 5))
    e.output(alias(e, "logits", mm, (1, 6, 5), (30, 5, 1), 0))
    assert_graph_equal(alias_views(shared(b.build(), ("mm", "logits"))), e.build())


def test_a_returned_view_stays_a_copy_where_eagers_is_one():
    b = PassGraphBuilder()
    x = b.input("x", (6, 4))
    b.output(b.compute("copied", (4, 6), lambda i, j: x[j, i]))  # eager: a contiguous copy
    g = b.build()
    assert alias_views(g) is g


def test_a_returned_view_of_a_kernels_result_is_an_alias_and_keeps_it_out_of_the_workspace():
    # A loss gradient's rows seen at the batch's shape: the kernel writes h, the view shows it.
    b = PassGraphBuilder()
    x = b.input("x", (6, 4))
    h = b.compute("h", (6, 4), lambda i, j: x[i, j] * 2.0)
    b.output(b.compute("rows", (2, 3, 4), lambda i, j, k: h[i * 3 + j, k]))

    e = PassGraphBuilder()
    x = e.input("x", (6, 4))
    h = e.compute("h", (6, 4), lambda i, j: x[i, j] * 2.0)
    e.output(alias(e, "rows", h, (2, 3, 4), (12, 4, 1), 0))
    got = alias_views(shared(b.build(), ("h", "rows")))
    assert_graph_equal(got, e.build())
    assert {v.name for v in escaping_values(got)} == {"h", "rows"}


def test_a_returned_view_of_a_kernels_result_matches_eager_across_calls(target):
    from helpers import assert_same, compile_minicomp

    def f(x):
        rows = torch.softmax(x, -1) * 3.0  # a reduction kernel's output
        return rows.view(2, 3, 5)

    from minicomp.dynamo.backend import recording

    compiled = compile_minicomp(f, target)
    first_x = torch.randn(6, 5)
    records: list = []
    with recording(records):
        first = compiled(first_x)
    second = compiled(torch.randn(6, 5))
    (record,) = records
    (out,) = record.graph.outputs
    assert record.graph.producers()[out].target is strided_view  # no copy kernel
    assert_same(first, f(first_x))  # not overwritten by the second call
    assert second.data_ptr() != first.data_ptr()
    assert first.untyped_storage().nbytes() == 30 * 4  # its own memory, not a workspace's


def test_a_returned_view_whose_alias_would_not_show_eagers_strides_stays_a_copy():
    # The source laid out otherwise than in eager: an alias would return other strides.
    b = PassGraphBuilder()
    x = b.input("x", (6, 4))
    b.output(b.compute("xt", (4, 6), lambda i, j: x[j, i], strides=(6, 1)))
    g = shared(b.build(), ("x", "xt"))
    assert alias_views(g) is g


def test_a_returned_view_of_an_input_the_graph_mutates_stays_a_copy():
    b = PassGraphBuilder()
    x = b.input("x", (6, 4))
    xt = b.compute("xt", (4, 6), lambda i, j: x[j, i])
    b.output(xt, b.extern("added", aten.add_.Scalar, [x], (6, 4), args=(ArgRef(0), 1.0)))
    g = shared(b.build(), ("x", "xt", "added"))
    assert alias_views(g) is g


def test_a_training_step_saves_the_tied_weight_without_copying_it(target):
    # GPT-2's tied LM head: the forward returns weight.t() for the backward. Eager's is a view
    # of the weight; a kernel copying it once cost 75% of a CPU training step.
    torch.manual_seed(0)
    emb = torch.nn.Embedding(50, 16)
    idx = torch.randint(0, 50, (2, 5))

    def step(model_emb):
        logits = model_emb(idx) @ model_emb.weight.t()
        logits.logsumexp(-1).sum().backward()
        return logits

    import copy

    from helpers import assert_same, compile_minicomp

    from minicomp.dynamo.backend import recording

    ours = copy.deepcopy(emb)
    records: list = []
    with recording(records):
        got = compile_minicomp(step, target)(ours)
    expected = step(emb)
    assert_same(got, expected, rtol=1e-5, atol=1e-5)
    assert_same(ours.weight.grad, emb.weight.grad, rtol=1e-5, atol=1e-5)
    forward = next(r for r in records if r.kind == "forward")
    (saved,) = [v for v in forward.graph.outputs if v is not None and v.shape == (16, 50)]
    producer = forward.graph.producers()[saved]
    assert producer.target is strided_view and producer.inputs[0].shape == (50, 16)


def test_returned_views_share_memory_exactly_where_eagers_do(target):
    from helpers import assert_same, compile_minicomp

    def f(x, w):
        y = x @ w
        return x.t().contiguous(), x.t(), y.view(2, 3, 5), y.t()

    x, w = torch.randn(6, 4), torch.randn(4, 5)
    got, expected = compile_minicomp(f, target)(x, w), f(x, w)
    assert_same(got, expected)
    storage = [t.untyped_storage().data_ptr() for t in got]
    assert storage[0] != x.untyped_storage().data_ptr()  # eager's copy stays a copy
    assert storage[1] == x.untyped_storage().data_ptr()
    assert storage[2] == storage[3]  # two views of one product


def test_a_returned_view_sees_the_graphs_mutation_of_its_input(target):
    from helpers import assert_same, compile_minicomp

    def f(x):
        y = x.t()
        x.mul_(2.0)
        return y, y + 1.0

    x = torch.randn(4, 3)
    mine = x.clone()
    got, expected = compile_minicomp(f, target)(mine), f(x)
    assert_same(got, expected)
    assert_same(mine, x)
