"""Fused attention on the CUDA targets: ATen's scaled-dot-product-attention calls become
launches of the attention template (strided KernelOps compiled into the graph's module).

The decomposition table keeps `scaled_dot_product_attention` whole as the fused op PyTorch's
dispatcher picked for the inputs: `_scaled_dot_product_flash_attention_for_cpu` for CPU
tensors (so on cuda-emu), `_scaled_dot_product_flash_attention`,
`_scaled_dot_product_efficient_attention` or `_scaled_dot_product_cudnn_attention` for CUDA
tensors. The importer leaves each as an ExternOp (the cpu target runs it so); this pass,
which runs after the default passes (views read by the call are zero-copy aliases by then,
and the layouts of every value are final), turns each one it can compute into a KernelOp
launching `schedule.templates.attention` (or, on sm_90a where it applies, `attention_hopper`:
`templates.attention_choice`) with the heuristic config, passing the strides of Q, K, V, the
mask and the outputs as scalar arguments (`KernelOp.strided`), so transposed projections are
read in place. Its outputs keep the strides PyTorch gave them. A
memory-efficient or cuDNN call whose key and value are a repeat over heads (which
`group_query_attention` leaves, PyTorch's kernels for them taking no grouped heads) launches
over zero-copy views of the un-repeated tensors, key head h // groups per query head, and has
no ATen candidate when tuned; the repeats die.

The fused attention backward calls of a training graph are the next pass's
(attention_backward.py: the Hopper backward template's launches on sm_90a).

A call stays an ATen call, with the reason `minicomp.explain` prints, for: dropout, f32 or
f64 inputs (the template needs f16/bf16 tensor cores; PyTorch's own kernel is used there),
a head dim that is not a static multiple of 16 up to 256, value and query head dims that
differ, a mask that is not a float tensor broadcastable to (B, H, Sq, Sk), and outputs it
does not produce that the graph reads (the RNG state and debug mask a CUDA training graph
saves for the backward; the logsumexp is produced when it has the (B, H, Sq) shape).
"""

from __future__ import annotations

import dataclasses
import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import torch

from minicomp.backends.cuda.sm_count import H100_SMS
from minicomp.ir import types as T
from minicomp.ir.expr import Dim, Expr, dim_expr, minimum
from minicomp.ir.func import Function
from minicomp.ir.graph import ArgRef, ComputeOp, ExternOp, Graph, KernelOp, Value
from minicomp.ir.types import PointerType
from minicomp.passes.graph.dce import eliminate_dead_code
from minicomp.passes.graph.layout import layouts_for
from minicomp.passes.graph.rewrite import value_names
from minicomp.schedule.templates.base import DEFAULT_ARCH

aten = torch.ops.aten


def sdpa_ops() -> tuple:
    """The fused attention ops of PyTorch this pass computes (those this build has)."""
    names = (
        "_scaled_dot_product_flash_attention_for_cpu",
        "_scaled_dot_product_flash_attention",
        "_scaled_dot_product_efficient_attention",
        "_scaled_dot_product_cudnn_attention",
    )
    return tuple(getattr(aten, n).default for n in names if hasattr(aten, n))


class Refused(Exception):
    """Why one attention call stays an ATen call."""


def lower_attention(graph: Graph, *, sms: int = H100_SMS, arch: str = DEFAULT_ARCH) -> Graph:
    """Every fused attention call a template computes as a launch of its kernel, its
    heuristic config chosen for a GPU of `sms` SMs and architecture `arch` (the targets bind
    the compile's; sm_90a picks the Hopper template where it applies); the others keep their
    ATen call with the reason why."""
    ops = sdpa_ops()

    def fused_attention(n) -> bool:
        return isinstance(n, ExternOp) and any(n.target is op for op in ops)

    if not any(fused_attention(n) for n in graph.nodes):
        return graph
    layouts = layouts_for(graph)
    read = set(graph.users()) | graph.output_values()
    producers = {v: n for n in graph.nodes for v in n.outputs}
    used = value_names(graph)
    nodes, changed, grouped = [], False, False
    for n in graph.nodes:
        if fused_attention(n):
            try:
                launch = _grouped_launch(n, producers, layouts, read, sms, used, arch)
                if launch is not None:
                    nodes.extend(launch[:-1])
                    n, grouped = launch[-1], True
                else:
                    n = attention_kernel_op(n, layouts, read, sms, arch)
            except Refused as why:
                n = n.replace(reason=f"attention not fused: {why}")
            changed = True
        nodes.append(n)
    if not changed:
        return graph
    graph = graph.replace(nodes=tuple(nodes))
    # The repeats the grouped launches no longer read.
    return eliminate_dead_code(graph) if grouped else graph


def _grouped_launch(
    call: ExternOp, producers: dict, layouts: dict, read: set, sms: int, used, arch: str
):
    """[zero-copy views..., the launch] computing `call`, a memory-efficient or cuDNN call
    (which reject fewer key than query heads, so group_query_attention left their key and
    value repeated over heads), from the un-repeated key and value; None where they are not
    such repeats, or the un-repeated tensors are no strided views of their sources. Raises
    Refused when the template does not compute the call."""
    from minicomp.passes.graph.alias_views import as_alias
    from minicomp.passes.graph.attention_groups import grouped_key_value, grouped_ops, ungrouped

    found = None if call.target in grouped_ops() else grouped_key_value(call, producers)
    if found is None:
        return None
    (k, v), groups = found
    views, inputs, strides = [], list(call.inputs), dict(layouts)
    for repeat in dict.fromkeys((k, v)):
        source = ungrouped(producers[repeat], groups, used)
        if isinstance(source, ComputeOp):
            alias = as_alias(source, layouts)
            if alias is None:
                return None
            views.append(alias)
            source = alias.outputs[0]
            strides[source.name] = source.type.strides
        inputs = [source if x == repeat else x for x in inputs]
    launch = attention_kernel_op(call.replace(inputs=tuple(inputs)), strides, read, sms, arch)
    # PyTorch's kernel for this call takes no grouped heads: the tuner has no ATen candidate.
    _forget_aten(launch.function)
    return [*views, launch]


def attention_kernel_op(
    call: ExternOp, layouts: dict, read: set, sms: int = H100_SMS, arch: str = DEFAULT_ARCH
) -> KernelOp:
    """The launch computing attention call `call` on a GPU of `sms` SMs and architecture
    `arch` (templates.attention_choice picks the template); raises Refused when none can."""
    from minicomp.schedule.templates import attention_choice

    problem, inputs, outputs, roles = attention_problem(call, layouts, read, sms, arch)
    template, why = attention_choice(problem)
    if not template.applies(problem):
        raise Refused(f"head dim {problem.head_dim} is not a multiple of 16 up to 256")
    config = template.heuristic(problem)
    function = template.instantiate(problem, config)
    values = inputs + outputs
    args: list[Any] = [ArgRef(values.index(v)) for v in roles]
    args += list(problem.symbols)
    op = KernelOp(call.name, inputs, outputs, function, (), tuple(args), strided=True)
    remember_choice(function, Made(problem, config, tuple(roles) == values, call, template, why))
    return op


@dataclasses.dataclass(frozen=True)
class Made:
    """What tune_attention needs of a kernel the pass made: its problem, config, whether its
    buffers are the launch's values in order (what the tuner's runner passes), the ATen call
    it replaced (None: no ATen candidate), its template module and why that one."""

    problem: Any
    config: Any
    in_order: bool
    call: ExternOp | None
    template: Any
    why: str


# The kernels the pass made, by the kernel's identity. The last few only: a graph is tuned
# right after its passes.
_made: OrderedDict[int, tuple] = OrderedDict()
_made_lock = threading.Lock()
_MADE_KEPT = 64


def remember_choice(function: Function, entry: Made) -> None:
    """Keep what tune_attention needs of a kernel function the pass made (a bounded record)."""
    with _made_lock:
        _made[id(function)] = (function, entry)
        while len(_made) > _MADE_KEPT:
            _made.popitem(last=False)


def _forget_aten(function: Function) -> None:
    """No ATen candidate for the launch of `function` (its call's kernel cannot compute it)."""
    with _made_lock:
        function_, made = _made[id(function)]
        _made[id(function)] = (function_, dataclasses.replace(made, call=None))


def tune_attention(graph: Graph, choose: Callable) -> Graph:
    """`graph` with each attention launch's config chosen by `choose` (tune.chooser's
    make_chooser: on the cuda target with search space 1 or 2 the tuner times the
    template's candidates, and PyTorch's attention beside them; elsewhere the heuristic's
    config, which the launch already has)."""
    nodes, changed = [], False
    for n in graph.nodes:
        with _made_lock:
            found = _made.get(id(n.function)) if isinstance(n, KernelOp) else None
        if found is not None and found[0] is n.function:
            made = found[1]
            problem, call, template = made.problem, made.call, made.template
            if made.in_order:
                # The ATen candidate writes the attention only: not with a logsumexp too.
                aten = _aten_candidate(call) if call and len(n.outputs) == 1 else None
                choice = choose(template.TEMPLATE, problem, n, aten, why=made.why)
                if choice.aten:
                    n, changed = _back_to_aten(call, n, choice), True
                elif choice.config != made.config:
                    function = template.instantiate(problem, choice.config)
                    remember_choice(function, dataclasses.replace(made, config=choice.config))
                    n, changed = n.replace(function=function), True
        nodes.append(n)
    return graph.replace(nodes=tuple(nodes)) if changed else graph


def _back_to_aten(call: ExternOp, launch: KernelOp, choice: Any) -> ExternOp:
    """ATen call `call` again, producing what `launch` did, since it measured faster."""
    paths = tuple(p for p, v in zip(call.result_paths, call.outputs) if v in launch.outputs)
    reason = (
        f"PyTorch's attention measured faster than the template ({choice.aten_time_us:.1f} "
        f"us against {choice.time_us:.1f} us)"
    )
    return call.replace(outputs=launch.outputs, result_paths=paths, reason=reason)


def _aten_candidate(call: ExternOp) -> Callable:
    """PyTorch's attention on a tuning workload (the tuner's ATen candidate): the inputs in
    the launch's order, the attention written into its first output."""
    args, kwargs = call.args, dict(call.kwargs)

    def run(w) -> None:
        def value(a):
            return w.inputs[a.index] if isinstance(a, ArgRef) else a

        result = call.target(*(value(a) for a in args), **{k: value(a) for k, a in kwargs.items()})
        w.outputs[0].copy_(result[0])

    return run


def call_arguments(call: ExternOp) -> dict[str, Any]:
    """The call's arguments by schema name, defaults filled in."""
    schema = call.target._schema
    given = dict(zip((a.name for a in schema.arguments), call.args))
    given.update(dict(call.kwargs))
    for a in schema.arguments:
        if a.name not in given and a.has_default_value():
            given[a.name] = a.default_value
    return given


def call_tensors(call: ExternOp) -> tuple[dict[str, Any], Callable[[str], Value | None]]:
    """The arguments of fused attention call `call` by schema name, and what gives the graph
    value an argument names (None where it is absent); raises Refused for a tensor argument
    that is no graph value, or dropout."""
    given = call_arguments(call)
    values = call.inputs + call.outputs

    def tensor(name: str) -> Value | None:
        ref = given.get(name)
        if ref is None:
            return None
        if not isinstance(ref, ArgRef):
            raise Refused(f"argument {name} is not a tensor of the graph")
        return values[ref.index]

    dropout = given.get("dropout_p", 0.0)
    if not (isinstance(dropout, (int, float)) and dropout == 0):
        raise Refused(f"dropout_p={dropout}")
    return given, tensor


def attention_problem(
    call: ExternOp, layouts: dict, read: set, sms: int = H100_SMS, arch: str = DEFAULT_ARCH
):
    """(problem, KernelOp inputs, KernelOp outputs, the value of each buffer parameter) for
    attention call `call` on a GPU of `sms` SMs and architecture `arch`; raises Refused for
    what no template computes."""
    from minicomp.schedule.templates.attention import AttentionProblem

    given, tensor = call_tensors(call)
    if given.get("return_debug_mask"):
        raise Refused("it returns its debug mask")
    q, k, v = tensor("query"), tensor("key"), tensor("value")
    mask = tensor("attn_mask") if "attn_mask" in given else tensor("attn_bias")
    (bq, hq, sq, d), hk, sk = check_inputs(q, k, v)
    causal = bool(given.get("is_causal", False))
    scale = given.get("scale")
    if scale is None:
        scale = d**-0.5
    if not isinstance(scale, (int, float)):
        raise Refused("the scale is not a number")
    outs = _outputs(call, read, (bq, hq, sq))
    o_val, lse_val = outs.get(0), outs.get(1)
    roles = [q, k, v] + ([mask] if mask is not None else [])
    inputs = tuple(dict.fromkeys(roles))
    outputs = tuple(x for x in (o_val, lse_val) if x is not None)
    roles += list(outputs)
    names = ["q", "k", "v"] + (["mask"] if mask is not None else []) + ["o"]
    names += ["lse"] if lse_val is not None else []
    full = {"mask": (bq, hq, sq, sk), "lse": (bq, hq, sq)}
    ops = {
        name: operand_view(name, val, layouts[val.name], full.get(name))
        for name, val in zip(names, roles)
    }
    problem = AttentionProblem(
        name=f"attention_{o_val.name}",
        dtype=q.dtype,
        batch=bq,
        heads=hq,
        kv_heads=hk,
        seq_q=sq,
        seq_k=sk,
        head_dim=d,
        q=ops["q"],
        k=ops["k"],
        v=ops["v"],
        o=ops["o"],
        lse=ops.get("lse"),
        mask=ops.get("mask"),
        causal=causal,
        scale=float(scale),
        sms=sms,
        arch=arch,
    )
    return problem, inputs, outputs, roles


def check_inputs(q: Value, k: Value, v: Value) -> tuple:
    """((B, H, Sq, D), key heads, key count) of query, key and value, or Refused."""
    dtype = q.dtype
    if dtype not in (T.f16, T.bf16):
        raise Refused(f"{dtype.name} inputs (the template computes f16 and bf16)")
    if k.dtype != dtype or v.dtype != dtype:
        raise Refused("query, key and value types differ")
    if not all(len(t.shape) == 4 for t in (q, k, v)):
        raise Refused("inputs are not 4-D")
    (bq, hq, sq, d), (bk, hk, sk, dk), (bv, hv, sv, dv) = q.shape, k.shape, v.shape
    if not isinstance(d, int) or not _same(dk, d) or not _same(dv, d):
        raise Refused("head dims of query, key and value differ or are symbolic")
    if not (_same(bk, bq) and _same(bv, bq) and _same(hv, hk)):
        raise Refused("key and value shapes do not match the query's")
    if not _same(sv, sk):
        if isinstance(sv, int) and isinstance(sk, int):
            raise Refused("key and value lengths differ")
        # Two symbols PyTorch checks equal when it runs: read no key past either.
        sk = minimum(dim_expr(sk), dim_expr(sv))
    if not _same(hk, hq) and not (isinstance(hq, int) and isinstance(hk, int) and hq % hk == 0):
        raise Refused(f"{hq} query heads over {hk} key heads")
    return (bq, hq, sq, d), hk, sk


def _outputs(call: ExternOp, read: set, bhs: tuple) -> dict[int, Value]:
    """The call's outputs the graph reads, by position in ATen's result: 0 (the attention)
    and 1 (the logsumexp); raises Refused when it reads another or an odd logsumexp."""
    found: dict[int, Value] = {}
    for path, val in zip(call.result_paths, call.outputs):
        pos = path[0] if path else 0
        if pos == 0:
            found[0] = val
        elif val in read:
            if pos != 1:
                raise Refused(f"the graph reads output {pos} (its RNG state or debug mask)")
            shape = tuple(val.shape)
            ok = shape[:3] == tuple(bhs) or all(_same(a, b) for a, b in zip(shape[:3], bhs))
            if not ok or len(shape) not in (3, 4) or shape[3:] not in ((), (1,)):
                raise Refused(f"the graph reads its logsumexp of shape {list(shape)}")
            if val.dtype != T.f32:
                raise Refused(f"the graph reads its {val.dtype.name} logsumexp")
            found[1] = val
    if 0 not in found:
        raise Refused("it has no attention output")
    return found


def operand_view(role: str, val: Value, strides: tuple, full: tuple | None):
    """The template operand of value `val` in role `role`: its buffer and the strides of its
    (batch, head, row, column) dims. A mask's dims are right-aligned to `full` (B, H, Sq, Sk)
    and broadcast where it has size 1 or lacks them; the logsumexp's column stride is 0."""
    from minicomp.ir.expr import Var
    from minicomp.schedule.templates.attention import Operand
    from minicomp.script.values import TensorRef

    shape = tuple(val.shape)
    if role == "mask":
        if not val.dtype.is_float:
            raise Refused(f"a {val.dtype.name} mask")
        if len(shape) > 4:
            raise Refused(f"a {len(shape)}-d mask")
        pad = 4 - len(shape)
        dims, given = (1,) * pad + shape, (0,) * pad + tuple(strides)
        strides4 = []
        for size, stride, want in zip(dims, given, full):
            if isinstance(size, int) and size == 1:
                strides4.append(0)
            elif _same(size, want):
                strides4.append(stride)
            else:
                raise Refused(f"a mask of shape {list(shape)} for scores of shape {list(full)}")
    elif role == "lse":
        strides4 = [*strides[:3], 0]
    else:
        strides4 = list(strides)
    var = Var(f"{role}_{val.name}", PointerType(val.dtype))
    ref = TensorRef(val.name, var, (_extent(shape, tuple(strides)),))
    return Operand(ref, tuple(strides4))


def _extent(shape: tuple, strides: tuple) -> Dim:
    """Elements from a tensor's first to its last element, plus one (at least 1)."""
    total: Dim = 1
    for size, stride in zip(shape, strides):
        if isinstance(size, int) and isinstance(stride, int) and isinstance(total, int):
            total += max(size - 1, 0) * stride
        else:
            total = dim_expr(total) + (dim_expr(size) - 1) * dim_expr(stride)
    return max(total, 1) if isinstance(total, int) else total


def _same(a: Dim, b: Dim) -> bool:
    if isinstance(a, int) and isinstance(b, int):
        return a == b
    if isinstance(a, Expr) and isinstance(b, Expr):
        return a == b
    return False
