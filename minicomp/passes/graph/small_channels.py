"""Convolutions over few input channels (an image's RGB) read a padded copy of their input on
the CUDA targets, so that the tensor-core template copies their window in 16-byte runs.

The implicit GEMM of a convolution over a channels-last input reads, for one output position
and one kernel row, the S x C elements of the window's row: one run of memory. Where C is a
multiple of 8 (f16/bf16), each 8 channels of a pixel are an aligned 16-byte chunk the
template copies with cp.async (problem.GatheredOperand). With fewer channels no chunk is
aligned (3 channels are 6 bytes a pixel), and the window goes through registers 2 bytes a
load, most of every 32-byte sector wasted: the ResNet-50 stem (3 -> 64, 7x7, stride 2) at
batch 32 was estimated at 13% of its roofline on an H100, L2-bound at 0.18 sector efficiency.

For such a convolution (2-d, f16 or bf16, C < 8, one group, not transposed, static sizes, no
dilation along the width) this pass writes the input once more, channels-last, zero-padded to
C' channels and with the convolution's padding made explicit, as rows of Wp pixels:

    xp[n, h, w * C' + c] = x[n, c, h - ph, w - pw]   (0 outside the input, and for c >= C)

C' is the smallest of 1, 2, 4, 8 at least C with sw * C' a multiple of 8: output column q's
window row then starts q * sw * C' elements into a row of xp, a whole number of 16-byte
chunks, and is one run of J = S * C' elements. The convolution becomes a sum over the kernel
rows r and the run's elements j < J8 (J rounded up to a multiple of 8):

    conv[n, o, p, q] = sum_{r, j} xp[n, p * sh + r * dh, q * sw * C' + j] * wp[o, r, j]
    wp[o, r, j]      = w[o, j % C', r, j // C']   (0 for j % C' >= C and for j >= J)

which the template computes gathering xp in aligned chunks of 8 run elements (K = (r, j), the
window's rows; the weight a plain K-major operand). Elements j >= J of a run (the stem: J = 28,
J8 = 32) lie in the next pixels of xp; a guard `j < J` makes the copies zero-fill them
(problem.GatheredOperand.limit), so an inf or nan in the input there adds no 0 * inf. Every
other term the padding adds is 0 * 0: the results are exact. The cost is the copy (each input
element written once more, in C'/C the bytes) and the tensor-core work of K = R * J8 instead of
R * S * C (1.5x for the stem, 7 * 32 against 147).

Both copies are materialized: each is read through a zero-copy view (`strided_view`, an
ExternOp, as alias_views makes), so that fusion does not inline it into the template's
operand, which would then be computed in registers again. A constant weight's copy and its
view fold at compile time (fold_constants).
"""

from __future__ import annotations

from minicomp.ir import types as T
from minicomp.ir.compute import TensorInput, compute, reduce
from minicomp.ir.expr import Expr, cast, const, logical_and, maximum, minimum, select
from minicomp.ir.graph import ArgRef, ComputeOp, ExternOp, Graph, Op, TensorType, Value
from minicomp.passes.graph.alias_views import strided_view
from minicomp.passes.graph.anchors import arguments, conv_params
from minicomp.passes.graph.rewrite import fresh_name, value_names

# The channels below which a convolution's input is padded: from 8 on, f16/bf16 pixels hold
# whole 16-byte chunks where C % 8 == 0, and other channel counts keep their register path.
MAX_CHANNELS = 8
# The elements of a 16-byte chunk of f16/bf16, the template's gather unit.
CHUNK = 8
_TYPES = (T.f16, T.bf16)


def pad_small_channels(graph: Graph) -> Graph:
    """`graph` with each convolution over few channels computed from padded copies (see the
    module doc)."""
    import torch

    names = value_names(graph)
    nodes: list[Op] = []
    changed = False
    for n in graph.nodes:
        found = None
        if isinstance(n, ExternOp) and n.target is torch.ops.aten.convolution.default:
            found = _padded_convolution(n, names)
        nodes.extend(found or (n,))
        changed |= found is not None
    return graph.replace(nodes=tuple(nodes)) if changed else graph


def padded_channels(c: int, stride_w: int) -> int | None:
    """C', the channels a pixel of the padded input holds (see the module doc), or None when
    the convolution keeps its input."""
    if c >= MAX_CHANNELS:
        return None
    return next(p for p in (1, 2, 4, 8) if p >= c and stride_w * p % CHUNK == 0)


def _padded_convolution(op: ExternOp, names: set[str]) -> list[Op] | None:
    """The ops computing convolution call `op` from padded copies, or None to keep it."""
    args = arguments(op)
    if len(op.outputs) != 1 or args.get("transposed") is not False or args.get("groups") != 1:
        return None
    x_ref, w_ref, b_ref = args.get("input"), args.get("weight"), args.get("bias")
    if not all(isinstance(r, ArgRef) for r in (x_ref, w_ref, b_ref) if r is not None):
        return None
    x, w = op.inputs[x_ref.index], op.inputs[w_ref.index]
    bias = op.inputs[b_ref.index] if b_ref is not None else None
    out = op.outputs[0]
    dt = out.dtype
    if dt not in _TYPES or any(v.dtype != dt for v in (x, w, bias) if v is not None):
        return None
    shapes = (x.shape, w.shape, out.shape)
    if any(len(s) != 4 or not all(isinstance(d, int) and d > 0 for d in s) for s in shapes):
        return None
    params = conv_params(args, 2)
    if params is None:
        return None
    (sh, sw), (ph, pw), (dh, dw) = params
    cp = padded_channels(x.shape[1], sw)
    if cp is None or dw != 1 or w.shape[1] != x.shape[1]:
        return None
    return _Padding(op, x, w, bias, (sh, sw), (ph, pw), dh, cp, names).ops()


class _Padding:
    """The ops computing one convolution from padded copies of its input and weight."""

    def __init__(self, op, x, w, bias, stride, padding, dh, cp, names):
        self.op, self.x, self.w, self.bias, self.names = op, x, w, bias, names
        self.out = op.outputs[0]
        self.stride, self.padding, self.dh, self.cp = stride, padding, dh, cp
        n, c, h, wd = x.shape
        o, _, r, s = w.shape
        self.run = s * cp  # J
        self.run8 = -(-self.run // CHUNK) * CHUNK  # J8
        q = self.out.shape[3]
        # Every run read stays inside a row of xp, and rows start 16 bytes apart.
        width = max(wd + 2 * padding[1], (q - 1) * stride[1] + -(-self.run8 // cp))
        while width * cp % CHUNK:
            width += 1
        self.xp_shape = (n, h + 2 * padding[0], width * cp)
        self.wp_shape = (o, r, self.run8)

    def ops(self) -> list[Op]:
        xp = self._materialized(self.x, "padded_input", self.xp_shape, self._input_copy)
        wp = self._materialized(self.w, "padded_weight", self.wp_shape, self._weight_copy)
        return [*xp[1:], *wp[1:], *self._convolution(xp[0], wp[0])]

    def _value(self, base: str, shape: tuple, dtype=None, strides=None) -> Value:
        name = fresh_name(f"{self.out.name}_{base}", self.names)
        device = self.out.type.device
        return Value(name, TensorType(shape, dtype or self.out.dtype, device, strides))

    def _materialized(self, source: Value, base: str, shape: tuple, fn):
        """(view, copy op, view op): a row-major copy of `source` of `shape` computed by `fn`,
        and a zero-copy view of it, which the convolution reads: so the copy is a kernel of
        its own, not a prologue fused into the template's operand."""
        copy = self._value(base, shape)
        copy_op = ComputeOp(self.op.name, (source,), (copy,), compute(copy.name, shape, fn))
        strides = _row_major(shape)
        view = self._value(f"{base}_view", shape, strides=strides)
        alias = ExternOp(
            f"{self.op.name} ({base.replace('_', ' ')}, zero-copy view)",
            (copy,),
            (view,),
            strided_view,
            (ArgRef(0), shape, strides, 0),
            (),
            ((),),
            "a view of its input's memory",
        )
        return view, copy_op, alias

    def _input_copy(self, n, h, wc) -> Expr:
        x = self.x
        w, c = wc // self.cp, wc % self.cp
        _, channels, height, width = x.shape
        ph, pw = self.padding
        hh, ww = h - ph, w - pw
        inside = [hh >= 0, hh < height, ww >= 0, ww < width]
        if channels < self.cp:
            inside.append(c < channels)
        tx = TensorInput(x.name, x.shape, x.dtype)
        el = tx[(n, minimum(c, channels - 1), _clamp(hh, height), _clamp(ww, width))]
        return select(logical_and(*inside), el, const(0, el.dtype))

    def _weight_copy(self, o, r, j) -> Expr:
        w = self.w
        channels, taps = w.shape[1], w.shape[3]
        c, s = j % self.cp, j // self.cp
        inside = []
        if channels < self.cp:
            inside.append(c < channels)
        if self.run8 > self.run:
            inside.append(j < self.run)
        tw = TensorInput(w.name, w.shape, w.dtype)
        el = tw[(o, minimum(c, channels - 1), r, minimum(s, taps - 1))]
        return select(logical_and(*inside), el, const(0, el.dtype)) if inside else el

    def _convolution(self, xp: Value, wp: Value) -> list[Op]:
        acc = T.f32
        out, dt = self.out, self.out.dtype
        sh, sw = self.stride
        rows = self.w.shape[2]
        txp = TensorInput(xp.name, xp.shape, xp.dtype)
        twp = TensorInput(wp.name, wp.shape, wp.dtype)
        step = sw * self.cp

        def total(n, o, p, q):
            def term(*k):
                r, j = k if rows != 1 else (0, k[0])
                el = txp[(n, p * sh + r * self.dh, q * step + j)]
                if self.run8 > self.run:
                    el = select(j < self.run, el, const(0, el.dtype))
                return cast(el, acc) * cast(twp[(o, r, j)], acc)

            extents = (self.run8,) if rows == 1 else (rows, self.run8)
            return reduce("sum", extents, term)

        if self.bias is None:
            definition = compute(out.name, out.shape, lambda *i: cast(total(*i), dt))
            return [ComputeOp(self.op.name, (xp, wp), (out,), definition)]
        # The sum in the accumulator type, then the bias as an elementwise op (as anchors.py
        # lowers a convolution with a bias).
        summed = self._value("conv", out.shape, acc)
        tsum = TensorInput(summed.name, out.shape, acc)
        tbias = TensorInput(self.bias.name, self.bias.shape, self.bias.dtype)

        def add_bias(*i):
            return cast(tsum[i] + cast(tbias[i[1]], acc), dt)

        return [
            ComputeOp(self.op.name, (xp, wp), (summed,), compute(summed.name, out.shape, total)),
            ComputeOp(
                self.op.name, (summed, self.bias), (out,), compute(out.name, out.shape, add_bias)
            ),
        ]


def _clamp(e: Expr, size: int) -> Expr:
    """`e` clamped into [0, size): the index a guarded load reads (in bounds everywhere)."""
    return minimum(maximum(e, 0), size - 1)


def _row_major(shape: tuple) -> tuple:
    strides, step = [], 1
    for d in reversed(shape):
        strides.append(step)
        step *= d
    return tuple(reversed(strides))
