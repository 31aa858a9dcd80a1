"""The script language construct by construct: each kernel runs on cuda-emu (and cuda when
present) on fresh random inputs and is compared with PyTorch; outputs are poisoned first."""

import math

import pytest
import torch

import minicomp
from minicomp.backends.cuda.emu import EmulatorError
from minicomp.ir import stmt as S
from minicomp.ir.expr import StringLiteral
from minicomp.ir.functor import collect
from minicomp.script import (
    abs,
    atan2,
    atomic_add,
    atomic_max,
    attrs,
    bf16,
    blockDim,
    blockIdx,
    boolean,
    ceil,
    dim,
    dynamic_shared_tensor,
    erf,
    exp,
    f16,
    f32,
    f64,
    floor,
    fmod,
    i32,
    i64,
    is_aligned,
    isnan,
    load_vec,
    log,
    max,
    min,
    printf,
    register_tensor,
    rsqrt,
    shared_tensor,
    shfl_down_sync,
    shfl_sync,
    shfl_xor_sync,
    sigmoid,
    sqrt,
    store_vec,
    syncthreads,
    tanh,
    threadIdx,
    unroll,
)

N = 300  # not a multiple of any block size below


def nan(*shape, dtype=torch.float32):
    return torch.full(shape, math.nan, dtype=dtype)


def sentinel(*shape, dtype=torch.int32):
    return torch.full(shape, -12345, dtype=dtype)


@minicomp.script
def vadd(a: f32[dim.n], b: f32[dim.n], out: f32[dim.n], n: i32):
    attrs.grid_dim = (n + 127) // 128
    attrs.block_dim = 128
    i = blockIdx.x * 128 + threadIdx.x
    if i < n:
        out[i] = a[i] + b[i]


def test_vector_add(script_target):
    a, b, out = torch.randn(N), torch.randn(N), nan(N)
    vadd.with_target(script_target)(a, b, out)
    assert torch.equal(out, a + b)


@minicomp.script
def int_arith(x: i32[dim.n], y: i32[dim.n], q: i32[dim.n], r: i32[dim.n], bits: i32[dim.n], n: i32):
    attrs.grid_dim = (n + 63) // 64
    attrs.block_dim = 64
    i = blockIdx.x * 64 + threadIdx.x
    if i < n:
        a = x[i]
        b = y[i]
        q[i] = a // b
        r[i] = a % b
        bits[i] = (((a & 1023) << 2) ^ (b >> 1)) & 0xFFFF | (~a & 3)


def test_integer_division_truncates_like_c(script_target):
    x = torch.randint(-1000, 1000, (N,), dtype=torch.int32)
    y = torch.randint(1, 50, (N,), dtype=torch.int32) * (torch.randint(0, 2, (N,)) * 2 - 1).int()
    q, r, bits = sentinel(N), sentinel(N), sentinel(N)
    int_arith.with_target(script_target)(x, y, q, r, bits)
    assert torch.equal(q, torch.div(x, y, rounding_mode="trunc"))
    assert torch.equal(r, torch.fmod(x, y))
    assert torch.equal(bits, (((x & 1023) << 2) ^ (y >> 1)) & 0xFFFF | (~x & 3))


@minicomp.script
def float_mix(
    x: f32[dim.n],
    k: i32[dim.n],
    h: f16[dim.n],
    out: f32[dim.n],
    outh: f16[dim.n],
    flags: boolean[dim.n],
    n: i32,
    scale: f32,
):
    attrs.grid_dim = (n + 63) // 64
    attrs.block_dim = 64
    i = blockIdx.x * 64 + threadIdx.x
    if i < n:
        v = x[i] * scale + f32(k[i]) / 4
        w = f32(h[i]) * 2.0
        out[i] = v - w if v > w else w
        outh[i] = f16(v)
        flags[i] = v > 0.0 and not k[i] % 2 == 0 or x[i] < -1.0


def test_promotion_casts_select_and_logic(script_target):
    x, k = torch.randn(N), torch.randint(-9, 9, (N,), dtype=torch.int32)
    h = torch.randn(N).half()
    out, outh, flags = nan(N), nan(N, dtype=torch.float16), torch.zeros(N, dtype=torch.bool)
    float_mix.with_target(script_target)(x, k, h, out, outh, flags, scale=1.5)
    v = x * 1.5 + k.float() / 4
    w = h.float() * 2.0
    torch.testing.assert_close(out, torch.where(v > w, v - w, w))
    torch.testing.assert_close(outh, v.half())
    assert torch.equal(flags, (v > 0) & (k % 2 != 0) | (x < -1))


@minicomp.script
def control(x: f32[dim.n], out: f32[dim.n], steps: i32[dim.n], n: i32):
    attrs.grid_dim = (n + 63) // 64
    attrs.block_dim = 64
    i = blockIdx.x * blockDim.x + threadIdx.x
    if i >= n:
        return
    v = x[i]
    if v > 1.0:
        label = 3
    elif v > 0.0:
        label = 2
    else:
        label = 1
    count = 0
    m = abs(v)
    while True:
        if m < 0.1 or count >= 20:
            break
        m = m * 0.5
        count += 1
    s = 0
    for j in range(10):
        if j % 3 == 0:
            continue
        s += j
    out[i] = f32(label) + m
    steps[i] = count * 100 + s


def test_branches_loops_break_continue(script_target):
    x = torch.randn(N) * 4
    out, steps = nan(N), sentinel(N)
    control.with_target(script_target)(x, out, steps)
    label = torch.where(x > 1, 3.0, torch.where(x > 0, 2.0, 1.0))
    m, count = x.abs().clone(), torch.zeros(N, dtype=torch.int32)
    for _ in range(20):
        big = m >= 0.1
        m = torch.where(big, m * 0.5, m)
        count += big.int()
    torch.testing.assert_close(out, label + m)
    assert torch.equal(steps, count * 100 + sum(j for j in range(10) if j % 3))


@minicomp.script
def loops(x: f32[dim.n, 8], out: f32[dim.n, 5], n: i32):
    attrs.grid_dim = (n + 31) // 32
    attrs.block_dim = 32
    r = blockIdx.x * 32 + threadIdx.x
    if r < n:
        even = 0.0
        for j in range(0, 8, 2):
            even += x[r, j]
        odd_rev = 0.0
        for j in range(7, 0, -2):
            odd_rev = odd_rev * 0.5 + x[r, j]
        total = 0.0
        for j in unroll(range(8)):
            total += x[r, j]
        for j in range(8):
            last = x[r, j] * 2.0
        pairs = 0.0
        for a in range(4):
            for b in range(a + 1, 4):
                pairs += x[r, a] * x[r, b]
        strided = 0.0
        for j in range(r % 3, 8, 3):
            strided += x[r, j]
        out[r, 0] = even
        out[r, 1] = odd_rev
        out[r, 2] = total + last
        out[r, 3] = pairs
        out[r, 4] = strided


def test_range_forms_unroll_and_hoisting(script_target):
    x = torch.randn(N, 8)
    out = nan(N, 5)
    loops.with_target(script_target)(x, out)
    odd_rev = torch.zeros(N)
    for j in (7, 5, 3, 1):
        odd_rev = odd_rev * 0.5 + x[:, j]
    pairs = sum(x[:, a] * x[:, b] for a in range(4) for b in range(a + 1, 4))
    strided = torch.stack([x[r, r % 3 :: 3].sum() for r in range(N)])
    expected = torch.stack(
        [x[:, ::2].sum(1), odd_rev, x.sum(1) + 2 * x[:, 7], pairs, strided], dim=1
    )
    torch.testing.assert_close(out, expected)
    # `last` is declared before its loop (it is used after it) and assigned inside.
    declared = [s.var.name for s in collect(loops.ir.body, S.Declare)]
    assert "last" in declared


@minicomp.script
def math_fns(x: f32[dim.n], y: f32[dim.n], out: f32[10, dim.n], flags: boolean[dim.n], n: i32):
    attrs.grid_dim = (n + 63) // 64
    attrs.block_dim = 64
    i = blockIdx.x * 64 + threadIdx.x
    if i < n:
        a = x[i]
        b = y[i]
        out[0, i] = exp(a)
        out[1, i] = log(abs(a) + 1.0)
        out[2, i] = sqrt(abs(a)) + rsqrt(abs(b) + 1.0)
        out[3, i] = tanh(a) + erf(b)
        out[4, i] = max(a, b, 0.5) - min(a, b)
        out[5, i] = a**2 + (abs(b) ** 0.5)
        out[6, i] = fmod(a, 0.7) + atan2(a, b)
        out[7, i] = floor(a) + ceil(b)
        out[8, i] = sigmoid(a)
        out[9, i] = f32(max(i, 5) - min(i, 250))
        flags[i] = isnan(a)


def test_math_functions(script_target):
    x, y = torch.randn(N) * 2, torch.randn(N) * 2
    x[::17] = math.nan
    out, flags = nan(10, N), torch.zeros(N, dtype=torch.bool)
    math_fns.with_target(script_target)(x, y, out, flags)
    i = torch.arange(N)
    expected = torch.stack(
        [
            x.exp(),
            (x.abs() + 1).log(),
            x.abs().sqrt() + (y.abs() + 1).rsqrt(),
            x.tanh() + y.erf(),
            torch.maximum(torch.maximum(x, y), torch.tensor(0.5)) - torch.minimum(x, y),
            x**2 + y.abs() ** 0.5,
            torch.fmod(x, 0.7) + torch.atan2(x, y),
            x.floor() + y.ceil(),
            x.sigmoid(),
            (i.clamp(min=5) - i.clamp(max=250)).float(),
        ]
    )
    torch.testing.assert_close(out, expected, equal_nan=True, rtol=2e-5, atol=2e-5)
    assert torch.equal(flags, x.isnan())


@minicomp.script
def poly(x: f32, c0: f32, c1: f32) -> f32:
    return c0 + x * c1 + x * x


@minicomp.script
def clamp_store(out: f32[dim.n], i: i32, v: f32, n: i32):
    if v > 1.0:
        out[i] = 1.0
        return
    out[i] = v


@minicomp.script
def sign(v: f32) -> i32:
    if v > 0.0:
        return 1
    if v < 0.0:
        return -1
    return 0


@minicomp.script
def use_device(x: f32[dim.n], out: f32[dim.n], signs: i32[dim.n], n: i32):
    attrs.grid_dim = (n + 63) // 64
    attrs.block_dim = 64
    i = blockIdx.x * 64 + threadIdx.x
    if i < n:
        clamp_store(out, i, poly(x[i], c1=0.5, c0=0.25), n)
        signs[i] = sign(x[i])


def test_device_functions(script_target):
    x = torch.randn(N)
    x[::10] = 0.0
    out, signs = nan(N), sentinel(N)
    use_device.with_target(script_target)(x, out, signs)
    torch.testing.assert_close(out, (0.25 + x * 0.5 + x * x).clamp(max=1.0))
    assert torch.equal(signs, x.sign().int())
    names = [f.name for f in use_device.module.functions]
    assert names[-1] == use_device.ir.name and len(names) == 4


@minicomp.script
def row_sum(x: f32[dim.rows, 256], out: f32[dim.rows], rows: i32):
    attrs.grid_dim = rows
    attrs.block_dim = 128
    buf = shared_tensor(f32, 128)
    t = threadIdx.x
    r = blockIdx.x
    buf[t] = x[r, t] + x[r, t + 128]
    syncthreads()
    k = 64
    while k > 0:
        if t < k:
            buf[t] += buf[t + k]
        syncthreads()
        k //= 2
    if t == 0:
        out[r] = buf[0]


def test_shared_memory_tree_reduction(script_target):
    x = torch.randn(7, 256)
    out = nan(7)
    row_sum.with_target(script_target)(x, out)
    torch.testing.assert_close(out, x.sum(1), rtol=1e-5, atol=1e-4)


@minicomp.script
def warp_ops(x: f32[4, 32], y: i32[4, 32], sums: f32[4], maxes: i32[4, 32], back: f32[4, 32]):
    attrs.grid_dim = 4
    attrs.block_dim = 32
    w = blockIdx.x
    lane = threadIdx.x
    v = x[w, lane]
    for s in (16, 8, 4, 2, 1):
        v += shfl_down_sync(v, s)
    if lane == 0:
        sums[w] = v
    m = y[w, lane]
    d = 1
    while d < 32:
        m = max(m, shfl_xor_sync(m, d))
        d *= 2
    maxes[w, lane] = m
    back[w, lane] = shfl_sync(x[w, lane], 31 - lane)


def test_warp_shuffles(script_target):
    x, y = torch.randn(4, 32), torch.randint(-1000, 1000, (4, 32), dtype=torch.int32)
    sums, maxes, back = nan(4), sentinel(4, 32), nan(4, 32)
    warp_ops.with_target(script_target)(x, y, sums, maxes, back)
    torch.testing.assert_close(sums, x.sum(1), rtol=1e-5, atol=1e-4)
    assert torch.equal(maxes, y.amax(1, keepdim=True).expand(4, 32))
    assert torch.equal(back, x.flip(1))


@minicomp.script
def atomics(
    x: f32[dim.n],
    bins: i32[dim.n],
    total: f32[1],
    hist: i32[8],
    biggest: i32[1],
    order: i32[dim.n],
    n: i32,
):
    attrs.grid_dim = (n + 63) // 64
    attrs.block_dim = 64
    i = blockIdx.x * 64 + threadIdx.x
    if i < n:
        atomic_add(total[0], x[i])
        old = atomic_add(hist[bins[i]], 1)
        order[i] = old
        atomic_max(biggest[0], bins[i] * 10 + 3)


def test_atomics(script_target):
    x, bins = torch.randn(N), torch.randint(0, 7, (N,), dtype=torch.int32)
    total, hist = torch.zeros(1), torch.zeros(8, dtype=torch.int32)
    biggest, order = torch.full((1,), -1, dtype=torch.int32), sentinel(N)
    atomics.with_target(script_target)(x, bins, total, hist, biggest, order)
    torch.testing.assert_close(total, x.sum(0, keepdim=True), rtol=1e-5, atol=1e-3)
    assert torch.equal(hist, torch.bincount(bins, minlength=8).int())
    assert biggest.item() == bins.max().item() * 10 + 3
    for b in range(8):
        olds = sorted(order[bins == b].tolist())
        assert olds == list(range(len(olds)))  # every old value of a bin's counter, once


@minicomp.script
def reverse4(x: f32[dim.n, 4], out: f32[dim.n, 4], n: i32):
    attrs.grid_dim = (n + 63) // 64
    attrs.block_dim = 64
    r = blockIdx.x * 64 + threadIdx.x
    if r < n:
        regs = register_tensor(f32, (2, 2))
        for j in unroll(range(4)):
            regs[j // 2, j % 2] = x[r, j]
        for j in range(4):
            out[r, j] = regs[(3 - j) // 2, (3 - j) % 2] * 2.0


def test_register_tensor(script_target):
    x = torch.randn(N, 4)
    out = nan(N, 4)
    reverse4.with_target(script_target)(x, out)
    assert torch.equal(out, x.flip(1) * 2)


def make_scale(rows, cols, negate):
    """A template: sizes and a flag are compile-time constants of the kernel it returns."""

    @minicomp.script
    def scale(x: f32[rows, cols], out: f32[rows, cols], s: f32):
        attrs.grid_dim = rows
        attrs.block_dim = cols
        r = blockIdx.x
        c = threadIdx.x
        v = x[r, c] * s
        if negate:
            v = -v
        for extra in (1.0, 2.0):
            v += extra
        half = cols // 2
        row = x[r]
        out[r, c] = v + row[half]

    return scale


SCALE_NEG = make_scale(4, 32, True)
SCALE_POS = make_scale(3, 16, False)


@pytest.mark.parametrize("kernel,rows,cols,sign", [(SCALE_NEG, 4, 32, -1), (SCALE_POS, 3, 16, 1)])
def test_template_constants(script_target, kernel, rows, cols, sign):
    x = torch.randn(rows, cols)
    out = nan(rows, cols)
    kernel.with_target(script_target)(x, out, 0.5)
    torch.testing.assert_close(out, sign * x * 0.5 + 3.0 + x[:, cols // 2 : cols // 2 + 1])
    # The compile-time branch leaves no trace in the IR.
    assert not collect(kernel.ir.body, S.If)


@minicomp.script
def matmul(
    a: f32[dim.m, dim.k], b: f32[dim.k, dim.n], c: f32[dim.m, dim.n], m: i32, n: i32, k: i32
):
    attrs.grid_dim = ((m + 15) // 16, (n + 15) // 16)
    attrs.block_dim = (16, 16)
    i = threadIdx.x + blockIdx.x * blockDim.x
    j = threadIdx.y + blockIdx.y * blockDim.y
    if i < m and j < n:
        c[i, j] = 0.0
        for kk in range(k):
            c[i, j] += a[i, kk] * b[kk, j]


def test_naive_matmul_of_hidets_announcement(script_target):
    a, b = torch.randn(37, 50), torch.randn(50, 21)
    c = nan(37, 21)
    matmul.with_target(script_target)(a, b, c)
    torch.testing.assert_close(c, a @ b, rtol=1e-4, atol=1e-4)


@minicomp.script
def half_ops(
    a: f16[dim.n],
    b: bf16[dim.n],
    out16: f16[dim.n],
    sq: f16[dim.n],
    outb: bf16[dim.n],
    out32: f32[dim.n],
    n: i32,
):
    attrs.grid_dim = (n + 63) // 64
    attrs.block_dim = 64
    i = blockIdx.x * 64 + threadIdx.x
    if i < n:
        x = a[i]
        y: f32 = b[i]
        s = f32(x) + y
        out32[i] = s
        out16[i] = f16(s)
        sq[i] = x * x
        outb[i] = bf16(f32(x) * y)


def test_half_precision(script_target):
    a, b = torch.randn(N).half(), torch.randn(N).bfloat16()
    out16, sq = nan(N, dtype=torch.float16), nan(N, dtype=torch.float16)
    outb, out32 = nan(N, dtype=torch.bfloat16), nan(N)
    half_ops.with_target(script_target)(a, b, out16, sq, outb, out32)
    s = a.float() + b.float()
    assert torch.equal(out32, s)
    assert torch.equal(out16, s.half())
    assert torch.equal(sq, a * a)
    assert torch.equal(outb, (a.float() * b.float()).bfloat16())


@minicomp.script
def scalars(out: f64[4], big: i64, flag: boolean, s: f64, h: f16):
    attrs.grid_dim = 1
    attrs.block_dim = 1
    out[0] = f64(big) * s
    out[1] = 1.0 if flag else -1.0
    out[2] = f64(h)
    out[3] = f64(big // 3 - big % 5)


@pytest.mark.parametrize("flag", [True, False])
def test_scalar_parameters(script_target, flag):
    out = nan(4, dtype=torch.float64)
    big = 2**40 + 7
    scalars.with_target(script_target)(out, big, flag, 0.1, 1.5)
    expected = [big * 0.1, 1.0 if flag else -1.0, 1.5, float(big // 3 - big % 5)]
    assert out.tolist() == expected


@minicomp.script
def vec_add_one(
    x: f32[dim.n, 4], h: f16[dim.n, 8], out: f32[dim.n, 4], hout: f16[dim.n, 8], n: i32
):
    attrs.grid_dim = (n + 63) // 64
    attrs.block_dim = 64
    r = blockIdx.x * 64 + threadIdx.x
    if r < n:
        regs = register_tensor(f32, 4)
        if is_aligned(x[r, 0], 16):
            load_vec(regs, x[r, 0])
        else:
            for j in range(4):
                regs[j] = x[r, j]
        for j in unroll(range(4)):
            regs[j] += 1.0
        store_vec(out[r, 0], regs)
        hregs = register_tensor(f16, (2, 4))
        load_vec(hregs, h[r, 0], 8)
        for j in unroll(range(8)):
            hregs[j // 4, j % 4] = hregs[j // 4, j % 4] * f16(2.0)
        store_vec(hout[r, 0], hregs)


def test_vector_loads_and_stores(script_target):
    n = 50
    x = torch.randn(4 * n + 1)[1:].view(n, 4)  # not 16-byte aligned: the scalar path
    h = torch.randn(n, 8).half()
    out, hout = nan(n, 4), nan(n, 8, dtype=torch.float16)
    vec_add_one.with_target(script_target)(x, h, out, hout)
    assert torch.equal(out, x + 1) and torch.equal(hout, h * 2)
    x = torch.randn(n, 4)
    vec_add_one.with_target(script_target)(x, h, out, hout)
    assert torch.equal(out, x + 1)
    calls = [s.expr.name for s in collect(vec_add_one.ir.body, S.Evaluate)]
    assert calls == ["load_vec", "store_vec", "load_vec", "store_vec"]


def test_misaligned_vector_store_fails_in_the_emulator():
    n = 8
    x, h = torch.randn(n, 4), torch.randn(n, 8).half()
    out = torch.randn(4 * n + 1)[1:].view(n, 4)
    with pytest.raises(EmulatorError, match="misaligned"):
        vec_add_one.with_target("cuda-emu")(x, h, out, torch.empty_like(h))


@minicomp.script
def hello(x: f32[4]):
    attrs.grid_dim = 1
    attrs.block_dim = 4
    t = threadIdx.x
    if t == 2:
        printf("thread %d sees %.2f (%d)\n", t, x[t], t > 1)


def test_printf_ir():
    (call,) = [c for c in collect(hello.ir.body, S.Evaluate)]
    fmt, *values = call.expr.args
    assert call.expr.name == "printf" and fmt == StringLiteral("thread %d sees %.2f (%d)\n")
    assert [v.dtype.short for v in values] == ["i32", "f32", "i32"]


def test_printf_prints(script_target, capfd):
    x = torch.tensor([0.0, 0.5, 1.25, 2.0])
    hello.with_target(script_target)(x)
    if script_target == "cuda":
        torch.cuda.synchronize()
    assert capfd.readouterr().out == "thread 2 sees 1.25 (1)\n"


@minicomp.script
def dyn_reverse(x: f32[256], y: i32[256], out: f32[256], outi: i32[256]):
    attrs.grid_dim = 1
    attrs.block_dim = 256
    buf = dynamic_shared_tensor(f32, 200)
    ibuf = dynamic_shared_tensor(i32, 256)
    t = threadIdx.x
    if t < 200:
        buf[t] = x[t]
    ibuf[t] = y[t]
    syncthreads()
    if t < 200:
        out[t] = buf[199 - t]
    outi[t] = ibuf[255 - t]


def test_dynamic_shared_memory_ir():
    f = dyn_reverse.ir
    arrays = collect(f.body, S.DeclareArray)
    assert [(a.scope, a.dtype.short) for a in arrays] == [("dynamic", "f32"), ("dynamic", "i32")]
    # The i32 tensor starts after the f32 one, rounded up to 16 bytes: at byte 800.
    assert arrays[1].size == 800 // 4 + 256
    assert f.attrs.dynamic_smem == 800 + 256 * 4


def test_dynamic_shared_memory_runs(script_target):
    x, y = torch.randn(256), torch.randint(-100, 100, (256,), dtype=torch.int32)
    out, outi = nan(256), sentinel(256)
    dyn_reverse.with_target(script_target)(x, y, out, outi)
    assert torch.equal(out[:200], x[:200].flip(0))
    assert torch.equal(outi, y.flip(0))
