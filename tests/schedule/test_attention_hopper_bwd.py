"""The Hopper attention backward (schedule/templates/attention_hopper_bwd.py, issue 21): its
three kernels, run by cuda-emu as sm_90a code on fresh inputs with odd lengths (a partial
query block, keys over two and a bit blocks, and the reverse), causal or not, grouped-query
heads, head dims 64 and 128, f16 and bf16, every output and workspace poisoned with NaN,
match float64 autograd of the math attention; every config of the space builds for sm_90a
with NVRTC without spills or serialized mma's, with HGMMA, UTMALDG and UTMASTG in its SASS."""

import pytest
import torch
from helpers import attention_bwd_problem

from minicomp.backends.cuda.codegen import render_module
from minicomp.backends.cuda.emu import build_emulated
from minicomp.backends.cuda.module import dynamic_shared_bytes
from minicomp.backends.cuda.tensor_map import encoded_maps, tensor_map_arguments
from minicomp.ir.func import Module
from minicomp.ir.symbols import launch_dims
from minicomp.schedule.templates import attention_hopper_bwd as template

TOLERANCE = {torch.float16: 1e-2, torch.bfloat16: 5e-2}
Config = template.HopperAttnBwdConfig

# (dtype, head dim, Sq, Sk, causal, key heads of 2, config): a config of the space each.
CASES = [
    (torch.float16, 64, 67, 130, True, 2, Config(1, 64, 2)),
    (torch.bfloat16, 64, 67, 130, False, 1, Config(2, 64, 2)),  # grouped-query heads
    (torch.float16, 128, 130, 67, True, 1, Config(1, 64, 3)),  # more queries than keys
    (torch.bfloat16, 64, 130, 67, True, 2, Config(1, 128, 2)),
]
IDS = ["f16-d64-causal", "bf16-d64-gqa", "f16-d128-causal-gqa", "bf16-d64-causal-bm128"]


def inputs(i: int, dtype, d, sq, sk, causal, hk):
    """Fresh q, k, v, dO, with O and the logsumexp of the float64 forward."""
    q = torch.randn(1, 2, sq, d, dtype=dtype)
    k, v = (torch.randn(1, hk, sk, d, dtype=dtype) for _ in range(2))
    do = torch.randn(1, 2, sq, d, dtype=dtype)
    o, lse, _ = reference(q, k, v, do, causal, backward=False)
    return q, k, v, o.to(dtype), do, lse.float()


def reference(q, k, v, do, causal, backward=True):
    """(O, logsumexp, [dQ, dK, dV]) of the math attention in float64."""
    q, k, v = (t.double().requires_grad_() for t in (q, k, v))
    groups = q.shape[1] // k.shape[1]
    keys, values = k.repeat_interleave(groups, 1), v.repeat_interleave(groups, 1)
    s = q @ keys.transpose(-1, -2) * q.shape[-1] ** -0.5
    if causal:
        s = s.masked_fill(torch.ones(s.shape[-2:], dtype=torch.bool).triu(1), float("-inf"))
    o = torch.softmax(s, -1) @ values
    grads = torch.autograd.grad(o, (q, k, v), do.double()) if backward else None
    return o.detach(), s.logsumexp(-1).detach(), grads


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """Every case's three kernels, built for the emulator in one module."""
    problems, kernels = [], []
    for i, (dtype, d, sq, sk, causal, hk, config) in enumerate(CASES):
        q, k, v = (torch.empty(1, n, s, d, dtype=dtype) for n, s in ((2, sq), (hk, sk), (hk, sk)))
        problem = attention_bwd_problem(f"bwd{i}", q, k, v, causal)
        problems.append(problem)
        kernels += template.kernels(problem, config)
    emu = build_emulated(
        render_module(Module("bwd", tuple(kernels))),
        kernels,
        cache_dir=str(tmp_path_factory.mktemp("emu")),
    )
    return emu, problems, kernels


def run(emu, problem, kernels, q, k, v, o, do, lse):
    """(dQ, dK, dV): the three launches, outputs and workspace poisoned with NaN."""
    dq, dk, dv = (torch.full_like(t, float("nan")) for t in (q, k, v))
    tensors = dict(q=q, k=k, v=v, o=o, do=do, lse=lse, dq=dq, dk=dk, dv=dv)
    for name, shape in problem.workspace().items():
        tensors[name] = torch.full(shape, float("nan"))
    for role, kernel in zip(("pre", "main", "post"), kernels):
        buffers = [tensors[r] for r in template.params(problem)[role]]
        args = encoded_maps(tensor_map_arguments(kernel), buffers)
        args += [t.data_ptr() for t in buffers]
        grid, block = launch_dims(kernel)(args)
        shared = dynamic_shared_bytes(kernel)
        emu.launch(kernel.name, grid, block, args, shared(args) if callable(shared) else shared)
    return dq, dk, dv


@pytest.mark.parametrize("case", range(len(CASES)), ids=IDS)
def test_gradients_match_float64(built, case):
    emu, problems, kernels = built
    dtype, d, sq, sk, causal, hk, _ = CASES[case]
    q, k, v, o, do, lse = inputs(case, dtype, d, sq, sk, causal, hk)
    got = run(emu, problems[case], kernels[3 * case : 3 * case + 3], q, k, v, o, do, lse)
    _, _, want = reference(q, k, v, do, causal)
    tol = TOLERANCE[dtype]
    for name, g, w in zip(("dQ", "dK", "dV"), got, want):
        assert not g.isnan().any(), f"{name} is not written whole"
        torch.testing.assert_close(
            g.double(), w, rtol=tol, atol=tol, msg=lambda m, name=name: f"{name}: {m}"
        )


def test_what_the_template_refuses_and_why():
    q, k = torch.empty(1, 2, 67, 64, dtype=torch.float16), torch.empty(1, 2, 130, 64).half()
    assert template.refusal(attention_bwd_problem("p", q, k, k, False)) is None
    assert template.refusal(attention_bwd_problem("p", q, k, k, False, arch="sm_90")) == (
        "wgmma needs sm_90a, not sm_90"
    )
    q96, k96 = torch.empty(1, 2, 67, 96).half(), torch.empty(1, 2, 130, 96).half()
    assert template.refusal(attention_bwd_problem("p", q96, k96, k96, False)) == (
        "head dim 96 (it takes 64 or 128)"
    )
    wide = torch.empty(1, 2, 130, 65, dtype=torch.float16)[..., :64]
    assert "K's strides (16900, 8450, 65, 1) are not multiples of 16 bytes" in (
        template.refusal(attention_bwd_problem("p", q, wide, k, False))
    )
    with pytest.raises(ValueError, match="does not compute this attention backward: head dim"):
        template.kernels(attention_bwd_problem("p", q96, k96, k96, False), Config())


# ---- NVRTC (sm_90a)


@pytest.mark.parametrize(
    ("d", "causal"),
    [(64, False), (64, True), (128, True)],
    ids=["d64", "d64-causal", "d128-causal"],
)
def test_every_config_builds_for_sm_90a_without_spills(d, causal, tmp_path):
    from minicomp.backends.cuda import nvrtc, sass

    try:
        nvrtc.nvrtc_version()
    except nvrtc.NvrtcUnavailableError as err:  # pragma: no cover - depends on the machine
        pytest.skip(f"NVRTC unavailable: {err}")
    # An H100 shape: two warpgroups at head dim 64, one at 128.
    q = torch.empty(4, 16, 1024, d, dtype=torch.bfloat16)
    problem = attention_bwd_problem("bwd", q, q, q, causal)
    configs = template.space(problem, 1)
    assert template.heuristic(problem).consumers == (1 if causal else 2), configs
    for config in configs:
        kernel = template.instantiate(problem, config)
        source = render_module(Module(kernel.name, (kernel,)))
        binary = nvrtc.compile_cuda(
            source, arch="sm_90a", name=kernel.name, cache_dir=str(tmp_path)
        )
        usage = binary.resources[kernel.name]
        what = (d, str(config), usage)
        assert usage.spill_stores == 0 and usage.spill_loads == 0 and usage.stack_bytes == 0, what
        assert "serialized" not in binary.log, (what, binary.log)  # C7518/C7519
        try:
            text = sass.disassemble(binary.cubin)[kernel.name]
        except sass.SassUnavailableError as err:  # pragma: no cover - depends on the machine
            pytest.skip(str(err))
        ops = sass.full_opcode_counts(text)
        for op in ("HGMMA", "UTMALDG", "UTMASTG"):  # dK's and dV's boxes by TMA stores
            assert any(o.startswith(op) for o in ops), (op, sorted(ops))
        # dV and dK read A from registers and dO, Q transposed; dQ^T reads K^T transposed.
        assert ".tnspB" in text and ".tnspA" in text, what


# ---- torch.compile: the training graph's backward on sm_90a

HOPPER = {"target": "cuda-emu", "arch": "sm_90a", "fallback": "error"}
# (dtype, head dim, Sq, Sk, causal, key heads of 2), one attention each in a training step,
# and a third over Q, K and V sliced from one packed projection (rows 384 elements apart).
STEP = [(torch.float16, 64, 67, 130, True, 2), (torch.bfloat16, 128, 130, 67, False, 1)]


def attentions(*args):
    sdpa = torch.nn.functional.scaled_dot_product_attention
    outs = [
        sdpa(*args[3 * i : 3 * i + 3], is_causal=causal, enable_gqa=hk != 2)
        for i, (_, _, _, _, causal, hk) in enumerate(STEP)
    ]
    q, k, v = args[-1].view(1, 67, 3, 2, 64).permute(2, 0, 3, 1, 4)
    return (*outs, sdpa(q, k, v, is_causal=True).transpose(1, 2))


def step_inputs() -> list:
    separate = [
        t
        for dtype, d, sq, sk, _, hk in STEP
        for t in (
            torch.randn(1, 2, sq, d, dtype=dtype),
            torch.randn(1, hk, sk, d, dtype=dtype),
            torch.randn(1, hk, sk, d, dtype=dtype),
        )
    ]
    packed = torch.randn(1, 67, 3 * 2 * 64, dtype=torch.float16)
    return [t.requires_grad_() for t in (*separate, packed)]


def training_step(fn, args) -> list:
    """The gradients of the inputs `args` of `fn` for random output gradients, and those."""
    outs = fn(*args)
    grads = [torch.randn_like(o) for o in outs]
    torch.autograd.backward(outs, grads)
    return grads


@pytest.fixture(scope="module")
def compiled_step():
    """attentions compiled once for sm_90a on cuda-emu, with the templates its backward
    graph used."""
    from minicomp.dynamo.backend import recording

    torch._dynamo.reset()
    fn = torch.compile(attentions, backend="minicomp", options=HOPPER)
    records: list = []
    with recording(records):
        training_step(fn, step_inputs())
    backward = [k.attrs.template for r in records if r.kind == "backward" for k in r.kernels]
    return fn, [t for t in backward if t]


def test_training_step_on_sm_90a_runs_the_backward_template(compiled_step):
    fn, used = compiled_step
    assert sorted(used) == sorted(
        [f"{template.NAME}_pre", f"{template.NAME}[64x64_s2]", f"{template.NAME}_post"] * 3
    ), used
    args = step_inputs()  # fresh inputs at new addresses
    grads = training_step(fn, args)
    ref = [t.detach().double().requires_grad_() for t in args]
    torch.autograd.backward(attentions(*ref), [g.double() for g in grads])
    for i, (t, r) in enumerate(zip(args, ref)):
        tol = TOLERANCE[t.dtype]
        torch.testing.assert_close(t.grad.double(), r.grad, rtol=tol, atol=tol, msg=str(i))


def _explain_backward(options, causal=True, d=64, grad=True):
    """What explain says of a training step of one attention (the output gradient
    `grad`: a tensor, else the broadcast one of out.sum())."""
    import minicomp

    q, k, v = (torch.randn(1, 2, 67, d, dtype=torch.float16).requires_grad_() for _ in range(3))

    def step(q, k, v, g):
        out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
        out.backward(g) if g is not None else out.sum().backward()

    g = torch.randn(1, 2, 67, d, dtype=torch.float16) if grad else None
    return minicomp.explain(step, q, k, v, g, options=options)


def test_explain_names_the_backward_template():
    report = _explain_backward(HOPPER)
    assert f"[{template.NAME}_pre]" in str(report) and f"[{template.NAME}_post]" in str(report)
    assert f"attrs.template = '{template.NAME}[64x64_s2]'" in report.ir()
    # Its config is the tuner's (the heuristic's at search space 0), as the forward's.
    backward = report.ir().split("(backward)")[1]
    assert "template: sm_90a: TMA and wgmma; config: the template's heuristic" in backward


def test_sm_90_keeps_atens_backward_and_says_why():
    not_fused = "attention backward not fused: not attention_hopper_bwd:"
    ir = _explain_backward({"target": "cuda-emu"}).ir()
    assert f"{not_fused} wgmma needs sm_90a, not sm_90" in ir
    assert f"{not_fused} head dim 96 (it takes 64 or 128)" in _explain_backward(HOPPER, d=96).ir()
    # out.sum()'s gradient is one number expanded: TMA cannot read it.
    ir = _explain_backward(HOPPER, grad=False).ir()
    assert f"{not_fused} DO has head-dim stride 0 (TMA needs 1)" in ir


@pytest.mark.parametrize("op", ["flash", "efficient"])
def test_cuda_backward_ops_become_the_three_launches(op):
    """The backward ops a CUDA training graph carries (traced here with fake tensors) become
    pre, main and post on sm_90a, the RNG state they take unread (no dropout)."""
    from torch.fx.experimental.proxy_tensor import make_fx

    from minicomp.dynamo.importer import import_graph
    from minicomp.ir.graph import KernelOp
    from minicomp.passes.graph.attention_backward import lower_attention_backward

    aten = torch.ops.aten
    q, k, v, o, do = (torch.randn(2, 2, 67, 64, dtype=torch.float16) for _ in range(5))
    lse = torch.randn(2, 2, 96 if op == "efficient" else 67)  # efficient pads rows to 32
    seed, offset = torch.zeros((), dtype=torch.int64), torch.zeros((), dtype=torch.int64)

    def fn(q, k, v, o, do, lse, seed, offset):
        if op == "flash":
            return aten._scaled_dot_product_flash_attention_backward(
                do, q, k, v, o, lse, None, None, 67, 67, 0.0, True, seed, offset
            )
        return aten._scaled_dot_product_efficient_attention_backward(
            do, q, k, v, None, o, lse, seed, offset, 0.0, [True] * 3 + [False], True
        )[:3]

    graph = import_graph(make_fx(fn, tracing_mode="fake")(q, k, v, o, do, lse, seed, offset))
    launches = lower_attention_backward(graph, arch="sm_90a").nodes
    assert [type(n) for n in launches] == [KernelOp] * 3
    assert launches[1].function.attrs.template == f"{template.NAME}[64x64_s2]"


def test_the_lens_estimates_every_backward_launch_with_its_registers():
    """A training step under the lens as on an H100 (sm_90a): each of the backward's launches
    is counted and gets ptxas's registers, pre and post too (they compile in one module with
    the wgmma kernel, for sm_90a)."""
    from minicomp.lens.devices import H100
    from minicomp.lens.profile import lens_options, profile_session
    from minicomp.lens.session import recording

    q, k, v = (torch.randn(1, 2, 67, 64, dtype=torch.float16).requires_grad_() for _ in range(3))
    torch._dynamo.reset()
    fn = torch.compile(
        lambda q, k, v: torch.nn.functional.scaled_dot_product_attention(q, k, v),
        backend="minicomp",
        options=lens_options(H100),
    )
    with recording(sample_only=True) as session:
        out = fn(q, k, v)
        out.backward(torch.randn_like(out))
    profile = profile_session(session, H100)
    templates = [launch.function.attrs.template for launch in session.launches]
    assert templates[1:] == [
        f"{template.NAME}_pre",
        f"{template.NAME}[64x64_s2]",
        f"{template.NAME}_post",
    ]
    assert not profile.problems, profile.problems
    for launch, k in zip(session.launches, profile.graph.kernels):
        assert k.resources is not None and k.resources.registers > 0, launch.function.name
        assert k.time > 0
