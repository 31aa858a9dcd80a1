"""Kernel IR prints as script DSL that parses back to the same IR: print a Function
(minicomp.ir.printer.function_str), parse the text (minicomp.script.text.parse_function), and
compare the two structurally.

The comparison is exact but for one normalisation: a local variable (declared scalar, array or
loop variable) of the parsed function may carry a `_<k>` suffix where the original's has none.
The IR may reuse one name for variables of sibling blocks (the auto-scheduler's `vk` loops of
a vectorised kernel, `r0` declared in three row loops), while the script parser names every
new variable apart. The comparison binds each variable at its declaration, so it checks that
each use refers to the corresponding declaration (alpha-equivalence), with the names equal up
to that suffix. Everything else compares with ==: parameters, launch attributes, constants
with their types, casts, statement structure, loop kinds.

Covered: every kernel minicomp compiles for a GPT-2 block on cuda-emu (f32 with eager
attention, f16 with SDPA, and f32 compiled with dynamic shapes), the matmul_simt, matmul_tc,
matmul_hopper (its tensor maps' attribute too) and attention templates over several problems
and configs each, and script kernels using the
rest of the language. What the DSL cannot say (the cpu target's loops, the auto-scheduler's
checked integer division, `|` on bools without short-circuit, index checks) prints as calls
the parser refuses, which the last tests pin down.
"""

import itertools
import math
import re

import pytest
import torch
import torch.nn.functional as F
from helpers import attention_bwd_problem, attention_problem_of

import minicomp
from minicomp.dynamo.backend import recording
from minicomp.ir import expr as E
from minicomp.ir import stmt as S
from minicomp.ir import types as T
from minicomp.ir.error_flag import checked_index
from minicomp.ir.func import Function, LaunchAttrs
from minicomp.ir.functor import collect, substitute
from minicomp.ir.graph import FusedOp, KernelOp
from minicomp.ir.node import Node
from minicomp.ir.printer import function_str, module_str
from minicomp.passes.graph.layout import layouts_for
from minicomp.schedule.templates import (
    attention,
    attention_hopper_bwd,
    matmul_hopper,
    matmul_problem,
    matmul_simt,
    matmul_tc,
)
from minicomp.script import (
    ScriptError,
    atomic_add,
    atomic_max,
    attrs,
    blockDim,
    blockIdx,
    boolean,
    comment,
    dim,
    dynamic_shared_tensor,
    exp2,
    f16,
    f32,
    f64,
    i32,
    i64,
    isnan,
    printf,
    register_tensor,
    repeat,
    script,
    shared_tensor,
    shfl_down_sync,
    spatial,
    syncthreads,
    threadIdx,
    u8,
    unroll,
)
from minicomp.script.text import parse_function, parse_module

# ---- the comparison -----------------------------------------------------------------------


class Mismatch(AssertionError):
    """Two functions differ; the message names the first difference and where it is."""


class _Compare:
    """Walks two kernel-IR functions side by side. Each declaration (Declare, DeclareArray, a
    For's variable) binds its two variables to one new site for the rest of its block; a
    variable use must refer to the same site on both sides, or be the same free variable (a
    parameter)."""

    def __init__(self, name: str):
        self.sites = itertools.count()
        self.left: dict = {}
        self.right: dict = {}
        self.path = [name]

    def fail(self, what: str, a, b) -> None:
        raise Mismatch(f"{what} at {' > '.join(self.path)}:\n  {a!r}\n  {b!r}")

    def bind(self, a: E.Var, b: E.Var) -> None:
        if a.type != b.type:
            self.fail("variable types differ", a.type, b.type)
        if b.name != a.name and not re.fullmatch(re.escape(a.name) + r"_\d+", b.name):
            self.fail("variable names differ", a.name, b.name)
        site = next(self.sites)
        self.left[a], self.right[b] = site, site

    def nested(self, a, b) -> None:
        saved = dict(self.left), dict(self.right)
        self.same(a, b)
        self.left, self.right = saved

    def same(self, a, b) -> None:
        if type(a) is not type(b):
            self.fail("different kinds of values", a, b)
        if isinstance(a, E.Var):
            sa, sb = self.left.get(a), self.right.get(b)
            if sa is None and sb is None and a != b or sa != sb:
                self.fail("different variables", a, b)
        elif isinstance(a, E.Const):
            if a != b:  # equality of constants: same type and value (-0.0 != 0.0, nan == nan)
                self.fail("different constants", a, b)
        elif isinstance(a, tuple):
            if len(a) != len(b):
                self.fail("different lengths", a, b)
            for x, y in zip(a, b):
                self.same(x, y)
        elif isinstance(a, Node):
            self.path.append(type(a).__name__)
            getattr(self, f"same_{type(a).__name__}", self.fields)(a, b)
            self.path.pop()
        elif a != b:
            self.fail("different values", a, b)

    def fields(self, a: Node, b: Node) -> None:
        for f in a._field_names:
            self.same(getattr(a, f), getattr(b, f))

    def same_Declare(self, a: S.Declare, b: S.Declare) -> None:
        self.same(a.init, b.init)
        self.bind(a.var, b.var)

    def same_DeclareArray(self, a: S.DeclareArray, b: S.DeclareArray) -> None:
        self.same((a.dtype, a.size, a.scope), (b.dtype, b.size, b.scope))
        self.bind(a.var, b.var)

    def same_For(self, a: S.For, b: S.For) -> None:
        self.same((a.extent, a.kind, a.reductions), (b.extent, b.kind, b.reductions))
        saved = dict(self.left), dict(self.right)
        self.bind(a.var, b.var)
        self.same(a.body, b.body)
        self.left, self.right = saved

    def same_While(self, a: S.While, b: S.While) -> None:
        self.same(a.cond, b.cond)
        self.nested(a.body, b.body)

    def same_If(self, a: S.If, b: S.If) -> None:
        self.same(a.cond, b.cond)
        self.nested(a.then, b.then)
        self.nested(a.orelse, b.orelse)

    def same_Function(self, a: Function, b: Function) -> None:
        self.same(
            (a.name, a.kind, a.ret, a.params, a.attrs), (b.name, b.kind, b.ret, b.params, b.attrs)
        )
        self.same(a.body, b.body)


def assert_same_function(original: Function, parsed: Function) -> None:
    """`parsed` is `original` up to the names of its locals (see the module docstring)."""
    _Compare(original.name).same(original, parsed)


def round_trip(f: Function) -> Function:
    """`f` printed and parsed back, checked against `f`; the parsed function."""
    text = function_str(f)
    try:
        parsed = parse_function(text)
        assert_same_function(f, parsed)
    except (ScriptError, Mismatch) as err:
        numbered = "\n".join(f"{k:4d}  {line}" for k, line in enumerate(text.splitlines(), 1))
        raise AssertionError(f"{f.name} does not round-trip: {err}\n{numbered}") from None
    return parsed


def round_trip_all(kernels: list[Function]) -> None:
    """Every kernel of `kernels` round-trips; the failures are reported together."""
    failures = []
    for k in kernels:
        try:
            round_trip(k)
        except AssertionError as err:
            failures.append(str(err))
    assert not failures, "\n\n".join(failures)


# ---- GPT-2 blocks ---------------------------------------------------------------------------


def _gpt2_kernels(dtype, attn_implementation: str, dynamic: bool = False) -> list[Function]:
    """Every kernel minicomp makes for a GPT-2 block on cuda-emu: the records' kernels, and the
    functions of KernelOps (fused attention) in their graphs."""
    transformers = pytest.importorskip("transformers")
    from transformers.models.gpt2.modeling_gpt2 import GPT2Block

    torch.manual_seed(0)
    config = transformers.GPT2Config(n_embd=64, n_head=2, attn_implementation=attn_implementation)
    block = GPT2Block(config, layer_idx=0).eval().to(dtype)

    def fn(x):
        out = block(x)
        return out[0] if isinstance(out, tuple) else out

    x = torch.randn(2, 16, 64, dtype=dtype)
    records: list = []
    torch._dynamo.reset()
    options = {"target": "cuda-emu", "fallback": "error"}
    with recording(records), torch.no_grad():
        torch.compile(fn, backend="minicomp", options=options, dynamic=dynamic)(x)
    kernels = {k: None for r in records for k in r.kernels}
    for r in records:
        kernels.update({n.function: None for n in r.graph.nodes if isinstance(n, KernelOp)})
    return list(kernels)


@pytest.mark.parametrize(
    "dtype, attn, dynamic, templates",
    [
        (torch.float32, "eager", False, {"matmul_simt"}),
        (torch.float16, "sdpa", False, {"matmul_tc", "attention"}),
        (torch.float32, "eager", True, {"matmul_simt"}),
    ],
    ids=["f32_eager", "f16_sdpa", "f32_dynamic"],
)
def test_every_kernel_of_a_gpt2_block(dtype, attn, dynamic, templates):
    kernels = _gpt2_kernels(dtype, attn, dynamic)
    used = {k.attrs.template.split("[")[0] for k in kernels if k.attrs.template}
    assert used == templates and len(kernels) >= 8
    if dynamic:  # grids computed from the sequence length
        assert any(isinstance(d, E.Expr) for k in kernels for d in k.attrs.grid_dim)
    round_trip_all(kernels)


# ---- templates ------------------------------------------------------------------------------


def _matmul_problem(fn, *args):
    torch._dynamo.reset()
    with torch.no_grad():
        report = minicomp.explain(fn, *args, options={"target": "cuda-emu"})
    (record,) = report.records
    layouts = layouts_for(record.graph)
    groups = [n for n in record.graph.nodes if isinstance(n, FusedOp)]
    (problem,) = [p for p in (matmul_problem(g, layouts) for g in groups) if p is not None]
    return problem


def _representative(configs: list, count: int = 4) -> list:
    """`count` configs spread over a search space (its first and last among them)."""
    if len(configs) <= count:
        return configs
    step = (len(configs) - 1) / (count - 1)
    return [configs[round(k * step)] for k in range(count)]


H = torch.float16
# A linear layer with bias and gelu in f16, the template-shaped product both tensor-core
# templates take.
LINEAR_GELU = (
    lambda x, w, b: F.gelu(x @ w.t() + b),
    lambda: (torch.randn(128, 64, dtype=H), torch.randn(96, 64, dtype=H), torch.randn(96, dtype=H)),
)
TEMPLATE_CASES = {
    # SIMT: guarded loads (min_blocks), a fused bias + gelu epilogue.
    "simt_linear_gelu": (
        matmul_simt,
        lambda x, w, b: F.gelu(x @ w.t() + b),
        lambda: (torch.randn(100, 64), torch.randn(48, 64), torch.randn(48)),
    ),
    "simt_bmm_f64": (
        matmul_simt,
        torch.bmm,
        lambda: (torch.randn(3, 33, 19).double(), torch.randn(3, 19, 29).double()),
    ),
    # Tensor cores: async 16-byte copies ("k" layouts), a prologue through registers, and
    # transposed ("mn") operands with zero-filled edges.
    "tc_linear_gelu": (matmul_tc, *LINEAR_GELU),
    "tc_prologue": (
        matmul_tc,
        lambda a, b: torch.relu(a) @ (b * 2),
        lambda: (torch.randn(64, 40, dtype=H), torch.randn(40, 72, dtype=H)),
    ),
    "hopper_linear_gelu": (matmul_hopper, *LINEAR_GELU),
    # Hopper: per-head products of a transposed view (two batch dimensions, 4-D maps) with
    # an MN-major B (a [K, N] row-major value), its copies fragments issuing tma_load.
    "hopper_heads_mn_major": (
        matmul_hopper,
        lambda q, v: q.transpose(1, 2) @ v,
        lambda: (torch.randn(2, 64, 3, 64, dtype=H), torch.randn(2, 3, 64, 72, dtype=H)),
    ),
    "tc_transposed_bf16": (
        matmul_tc,
        lambda a, b: a.t() @ b,
        lambda: (
            torch.randn(72, 48, dtype=torch.bfloat16),
            torch.randn(72, 40, dtype=torch.bfloat16),
        ),
    ),
}


@pytest.mark.parametrize("case", list(TEMPLATE_CASES))
def test_matmul_templates(case):
    module, fn, make_args = TEMPLATE_CASES[case]
    problem = _matmul_problem(fn, *make_args())
    template = module.TEMPLATE
    configs = _representative(template.candidates(problem, 1), 3)
    configs += _representative(template.candidates(problem, 2), 2)
    kernels = [template.instantiate(problem, c) for c in configs]
    assert all(k.attrs.template.startswith(f"{template.name}[") for k in kernels)
    round_trip_all(kernels)


def _sdpa(**kwargs):
    return lambda q, k, v, *mask: F.scaled_dot_product_attention(q, k, v, *mask, **kwargs)


@pytest.mark.parametrize(
    "kwargs, d, masked",
    [({"is_causal": True}, 64, False), ({}, 64, True), ({}, 256, False)],
    ids=["causal", "additive_mask", "head_dim_256"],
)
def test_attention_template(kwargs, d, masked):
    q, k, v = (torch.randn(1, 2, s, d, dtype=H) for s in (40, 72, 72))
    mask = (torch.randn(1, 1, 40, 72, dtype=H),) if masked else ()
    problem = attention_problem_of(_sdpa(**kwargs), q, k, v, *mask)
    level1, level2 = attention.space(problem, 1), attention.space(problem, 2)
    configs = _representative(level1, 3) + _representative(level2, 3)
    # Q in registers and from shared memory are different kernels: one of each where the space
    # has both (the spread above can miss one; a mask or head dim 256 leaves Q in shared).
    for q_regs in (True, False):
        configs += [c for c in level1 + level2 if c.q_regs == q_regs][:1]
    has_q_regs = d < 256 and not masked
    assert {c.q_regs for c in configs} == ({True, False} if has_q_regs else {False})
    round_trip_all([attention.instantiate(problem, c) for c in configs])


def test_attention_hopper_bwd_pre_and_post():
    """The Hopper attention backward's first and last kernels (strided loads, shuffles, the
    workspace). Its main kernel, like attention_hopper's, does not round-trip yet: a fragment
    spliced inside an unrolled loop keeps `i64(i32(0)) * n` in an index, which the parser
    folds."""
    q, k = torch.empty(1, 4, 67, 64, dtype=H), torch.empty(1, 2, 130, 64, dtype=H)
    problem = attention_bwd_problem("bwd", q, k, k, causal=True)
    pre, _, post = attention_hopper_bwd.kernels(problem, attention_hopper_bwd.heuristic(problem))
    round_trip_all([pre, post])


# ---- script kernels: the rest of the language -----------------------------------------------


@script
def widest(x: f32, y: f32) -> f32:
    return max(x, y) * 0.5


@script
def everything(
    x: f32[dim.n], h: f16[dim.n], flags: boolean[dim.n], out: f32[dim.n], hits: i32[4], n: i32
):
    attrs.grid_dim = ((n + 127) // 128, 2)
    attrs.block_dim = 128
    attrs.launch_bounds = 256
    attrs.min_blocks = 2
    attrs.template = "hand[written]"
    comment("shared partials, then a tree")
    part = shared_tensor(f32, 4)
    stage = dynamic_shared_tensor(f16, (2, 128))
    extra = dynamic_shared_tensor(f32, 3)
    regs = register_tensor(u8, 4)
    t = threadIdx.x
    i = blockIdx.x * blockDim.x + t
    v = -math.inf
    w: f64 = 0.0
    if i < n:
        v = x[i] if flags[i] else math.nan
        stage[1, t] = h[i] * f16(0.5)
        w = f64(h[i]) + 1e-300
    for d in unroll(range(4)):
        v = widest(v, shfl_down_sync(v, 16 >> d))
        regs[d] = u8(d * 3)
    if t % 32 == 0:
        part[t // 32] = v
    syncthreads()
    k = 0
    while True:
        k += 1
        if k > 3:
            break
        if k == 2:
            continue
        extra[k - 1] = f32(stage[1, k]) + f32(regs[k])
    for j in range(2, n, 3):
        if flags[j] and not (j > 7 or x[j] != x[j]):
            atomic_add(hits[j % 4], 1)
    old = atomic_max(hits[0], i32(w > 0.0))
    if i == 0:
        printf("%d %f %lld\n", old, part[0], i64(n) * 3)
    if i < n:
        out[i] = pow(abs(v), 2.0) + exp2(f32(k)) if not isnan(v) else -0.0


mapping = spatial(4, 8) * repeat(2, 1)


@script
def mapped(a: f32[8, 8], b: f32[8, 8]):
    attrs.grid_dim = 1
    attrs.block_dim = 32
    for r, c in mapping.on(threadIdx.x):
        b[r, c] = a[c, r] * 2.0


def test_script_kernel_with_a_task_mapping():
    parsed = round_trip(mapped.ir)
    assert parsed == mapped.ir  # no name is reused: no renaming at all


def test_a_module_with_a_device_function():
    # The kernel calls `widest`, so the two print, parse and compare as a module.
    module = everything.module
    assert [f.name for f in module.functions] == ["widest", "everything"]
    text = module_str(module)
    for line in (
        "attrs.template = 'hand[written]'",
        "extra = dynamic_shared_tensor(f32, 131, at=0)",
    ):
        assert line in text
    parsed = parse_module(text, module.name)
    for original, again in zip(module.functions, parsed.functions, strict=True):
        assert_same_function(original, again)
    assert parsed == module


# ---- the comparison can fail ----------------------------------------------------------------


def _nodes(n, klass) -> list:
    return collect(n, klass)


def _swap(body, old, new):
    out = substitute(body, {old: new})
    assert out != body
    return out


def _variants(f: Function) -> dict[str, Function]:
    """Functions that differ from `f` in one way each."""
    body = f.body
    loads = _nodes(body, E.Load)
    loops = _nodes(body, S.For)
    two = next(c for c in _nodes(body, E.Const) if c == E.const(2.0))
    a, b = f.params
    return {
        "constant": f.replace(body=_swap(body, two, E.const(2.5))),
        "constant type": f.replace(body=_swap(body, two, E.const(2.0, T.f64))),
        "loop kind": f.replace(body=_swap(body, loops[-1], loops[-1].replace(kind="serial"))),
        "buffer": f.replace(body=_swap(body, loads[0], E.Load(b, loads[0].index))),
        "index": f.replace(body=_swap(body, loads[0], E.Load(a, loops[0].var))),
        "attrs": f.replace(attrs=f.attrs.replace(block_dim=(64, 1, 1))),
        "name": f.replace(name="other"),
        "local renamed": f.replace(body=substitute(body, {loops[0].var: E.Var("rows", T.i64)})),
    }


VARIANTS = list(_variants(mapped.ir))
WELL_TYPED = ("constant", "loop kind", "buffer", "index", "attrs", "name")


@pytest.mark.parametrize("change", VARIANTS)
def test_a_different_function_does_not_compare_equal(change):
    f = mapped.ir
    other = _variants(f)[change]
    with pytest.raises(Mismatch):
        assert_same_function(f, other)
    if change in WELL_TYPED:
        # Printed and parsed, the changed function is itself again, and still not `f`.
        with pytest.raises(Mismatch):
            assert_same_function(f, round_trip(other))


def test_locals_may_differ_by_a_suffix_only():
    f = mapped.ir
    loop = _nodes(f.body, S.For)[0]
    suffixed = substitute(f.body, {loop.var: E.Var(loop.var.name + "_3", loop.var.type)})
    assert_same_function(f, f.replace(body=suffixed))
    with pytest.raises(Mismatch, match="variable names differ"):
        assert_same_function(f, _variants(f)["local renamed"])


def test_uses_must_refer_to_the_corresponding_declaration():
    # Nested loops over i and i_1: a use of the outer one is not a use of the inner one,
    # though the names match up to the suffix.
    i, i1 = E.Var("i", T.i64), E.Var("i_1", T.i64)
    out = E.Var("out", T.PointerType(T.f32))

    def nest(used):
        inner = S.For(i1, E.const(4), S.Store(out, used, E.const(1.0)))
        return Function("k", (out,), S.For(i, E.const(4), inner))

    assert_same_function(nest(i), nest(i))
    with pytest.raises(Mismatch, match="different variables"):
        assert_same_function(nest(i), nest(i1))


def test_an_edited_text_parses_to_a_different_function():
    text = function_str(mapped.ir)
    assert " * 2.0" in text
    with pytest.raises(Mismatch, match="different constants"):
        assert_same_function(mapped.ir, parse_function(text.replace(" * 2.0", " * 2.5")))


# ---- what does not round-trip --------------------------------------------------------------

_buf = E.Var("buf", T.PointerType(T.i32))
_n = E.Var("n", T.i32)
_q = E.Var("q", T.i32)
_x = E.Load(_buf, E.const(1))


def _store(value):
    return S.Store(_buf, E.const(0), value)


@pytest.mark.parametrize(
    "stmt, printed, refused",
    [
        (
            S.For(_q, E.const(4, T.i32), _store(_q), "parallel"),
            "in parallel(range(4)):",
            "parallel",
        ),
        (S.For(_q, E.const(4, T.i32), _store(_q), "vectorize"), "vectorize(range(4))", "vectorize"),
        (_store(E.binary("floordiv", _x, _n)), "floordiv(buf[1], n)", "floordiv"),
        (_store(E.binary("mod", _x, _n)), "mod(buf[1], n)", "mod"),
        (_store(E.binary("div", _x, _n)), "div(buf[1], n)", "div"),
        (
            _store(E.cast(E.binary("bitor", _n > 0, _x < 3), T.i32)),
            "bitor(n > 0, buf[1] < 3)",
            "bitor",
        ),
        (
            _store(E.cast(checked_index(E.cast(_x, T.i64), _n), T.i32)),
            "checked_index(i64(buf[1]), i64(n), i64(2))",
            "checked_index",
        ),
    ],
    ids=["parallel", "vectorize", "floordiv", "mod", "int_div", "bool_bitor", "checked_index"],
)
def test_what_the_language_cannot_say_is_refused_by_the_parser(stmt, printed, refused):
    # The cpu target's loop kinds, the auto-scheduler's integer division of tensor data
    # (checked for zero, with Python's rounding for floordiv and mod), `|` on bools without
    # short-circuit, and index checks have no script spelling: they print as calls that the
    # parser refuses, never as something that parses to another function.
    f = Function("k", (_buf, _n), stmt, attrs=LaunchAttrs(grid_dim=(1, 1, 1), block_dim=(1, 1, 1)))
    text = function_str(f)
    assert printed in text
    with pytest.raises(ScriptError, match=f"undefined name '{refused}'"):
        parse_function(text)
