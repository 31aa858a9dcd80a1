"""The attention backward on sm_90a: ATen's fused attention backward calls become launches of
the Hopper backward template's three kernels (schedule/templates/attention_hopper_bwd.py).

A training graph's backward holds the backward op matching its forward's:
`_scaled_dot_product_flash_attention_for_cpu_backward` for CPU tensors (so on cuda-emu),
`_scaled_dot_product_flash_attention_backward` or `_scaled_dot_product_efficient_attention_
backward` for CUDA tensors. Each reads the forward's output and logsumexp (natural log, f32,
[B, H, Sq]; the efficient kernel's rows padded past Sq, read up to Sq), which the Hopper
forward writes when the training graph saves it (passes/graph/attention.py). The pass
`lower_attention_backward` runs last, after `lower_attention` (layouts final), and each call
becomes three KernelOps over three new f32 workspace values (`backward_launches`):

    pre:  (O, dO, lse) -> (D and the log2 logsumexp [B * H, rows], the dQ accumulator)
    main: (Q, K, V, dO, log2 lse, D, dQ accumulator) -> (dK, dV), adding into the accumulator
    post: (dQ accumulator, dK) -> dQ

The main kernel adds into the accumulator it reads (atomics): only the three launches see
that value (the pass makes it), and post takes dK, which it does not read, so that every
order of the launches a later pass may choose puts it after main.

The main kernel's config is the heuristic's, or the tuner's at search space 1 or 2
(tune_attention times the template's candidates; there is no ATen candidate: PyTorch's
backward computes all three gradients in one call).

A call stays an ATen call, with the reason `minicomp.explain` prints, where the template does
not compute it (`attention_hopper_bwd.refusal`: not sm_90a, f32 inputs, head dims other than
64 and 128, strides TMA cannot read, symbolic sizes), with dropout, an additive mask (attn_mask
or attn_bias), a logsumexp of another shape or type, or a gradient it does not produce.
"""

from __future__ import annotations

import math

import torch

from minicomp.backends.cuda.arch import WGMMA_ARCH
from minicomp.backends.cuda.sm_count import H100_SMS
from minicomp.ir import types as T
from minicomp.ir.graph import ArgRef, ExternOp, Graph, KernelOp, TensorType, Value
from minicomp.passes.graph.attention import (
    Made,
    Refused,
    call_tensors,
    check_inputs,
    operand_view,
    remember_choice,
)
from minicomp.passes.graph.layout import layouts_for
from minicomp.passes.graph.rewrite import fresh_name, value_names
from minicomp.schedule.templates.base import DEFAULT_ARCH

aten = torch.ops.aten


def sdpa_backward_ops() -> tuple:
    """The fused attention backward ops this pass computes (those this build has)."""
    names = (
        "_scaled_dot_product_flash_attention_for_cpu_backward",
        "_scaled_dot_product_flash_attention_backward",
        "_scaled_dot_product_efficient_attention_backward",
    )
    return tuple(getattr(aten, n).default for n in names if hasattr(aten, n))


def lower_attention_backward(
    graph: Graph, *, sms: int = H100_SMS, arch: str = DEFAULT_ARCH
) -> Graph:
    """Every fused attention backward call the Hopper backward template computes on a GPU of
    `sms` SMs and architecture `arch` (the targets bind the compile's) as its three launches;
    the others keep their ATen call with the reason why."""
    ops = sdpa_backward_ops()
    calls = [n for n in graph.nodes if isinstance(n, ExternOp) and any(n.target is o for o in ops)]
    if not calls:
        return graph
    layouts = layouts_for(graph)
    used = value_names(graph)
    nodes: list = []
    for n in graph.nodes:
        if n in calls:
            try:
                nodes.extend(backward_launches(n, layouts, sms, arch, used))
                continue
            except Refused as why:
                n = n.replace(reason=f"attention backward not fused: {why}")
        nodes.append(n)
    return graph.replace(nodes=tuple(nodes))


def backward_launches(call: ExternOp, layouts: dict, sms: int, arch: str, used: set) -> list:
    """[pre, main, post]: the KernelOps computing backward call `call` on a GPU of `sms` SMs
    and architecture `arch` (their workspace values named fresh among `used`); raises
    Refused where the template does not compute it."""
    from minicomp.schedule.templates import attention_hopper_bwd as template

    given, tensor = call_tensors(call)
    if tensor("attn_mask") is not None or tensor("attn_bias") is not None:
        raise Refused("an additive mask (it takes causal masking or none)")
    do = tensor("grad_out") if "grad_out" in given else tensor("grad_out_")
    q, k, v, o, lse = (tensor(n) for n in ("query", "key", "value", "out", "logsumexp"))
    (b, h, sq, d), hk, sk = check_inputs(q, k, v)
    for name, val in (("out", o), ("grad_out", do)):
        if val.dtype != q.dtype or tuple(val.shape) != tuple(q.shape):
            raise Refused(f"its {name} is not shaped and typed like the query")
    lse_shape = tuple(lse.shape)
    if lse.dtype != T.f32 or len(lse_shape) != 3 or lse_shape[:2] != (b, h):
        raise Refused(f"a {lse.dtype.name} logsumexp of shape {list(lse_shape)}")
    if not isinstance(lse_shape[2], int) or not isinstance(sq, int) or lse_shape[2] < sq:
        raise Refused(f"a logsumexp of shape {list(lse_shape)} for {sq} queries")
    grads = {}
    for path, val in zip(call.result_paths, call.outputs):
        grads[path[0] if path else 0] = val
    if not all(i in grads for i in range(3)):
        raise Refused("it does not return all three gradients")
    scale = given.get("scale")
    scale = d**-0.5 if scale is None else scale
    if not isinstance(scale, (int, float)):
        raise Refused("the scale is not a number")
    roles = dict(q=q, k=k, v=v, o=o, do=do, lse=lse, dq=grads[0], dk=grads[1], dv=grads[2])
    ops = {r: operand_view(r, val, layouts[val.name], None) for r, val in roles.items()}
    problem = template.BackwardProblem(
        name=f"attention_bwd_{grads[0].name}",
        dtype=q.dtype,
        batch=b,
        heads=h,
        kv_heads=hk,
        seq_q=sq,
        seq_k=sk,
        head_dim=d,
        **ops,
        causal=bool(given.get("is_causal", False)),
        scale=float(scale),
        sms=sms,
        arch=arch,
    )
    refused = template.refusal(problem)
    if refused is not None:
        raise Refused(f"not {template.NAME}: {refused}")
    config = template.heuristic(problem)
    pre, main, post = template.kernels(problem, config)
    device = q.type.device
    for name, shape in problem.workspace().items():
        strides = tuple(math.prod(shape[i + 1 :]) for i in range(len(shape)))
        workspace = TensorType(shape, T.f32, device, strides)
        roles[name] = Value(fresh_name(f"{name}_{grads[0].name}", used), workspace)
    functions = {"pre": pre, "main": main, "post": post}
    produced = {"pre": ("delta", "lse2", "dqacc"), "main": ("dk", "dv"), "post": ("dq",)}
    launches = []
    for role, function in functions.items():
        buffers = template.params(problem)[role]
        outputs = tuple(roles[r] for r in produced[role])
        inputs = tuple(dict.fromkeys(roles[r] for r in buffers if r not in produced[role]))
        order = inputs + outputs
        args = tuple(ArgRef(order.index(roles[r])) for r in buffers)
        launches.append(
            KernelOp(f"{call.name}_{role}", inputs, outputs, function, (), args, strided=True)
        )
    # The main kernel's config is the tuner's to choose (tune_attention), as the forward's:
    # its buffers are its launch's values in order unless one tensor plays two roles.
    main_op = launches[1]
    in_order = tuple(roles[r] for r in template.params(problem)["main"]) == (
        main_op.inputs + main_op.outputs
    )
    why = f"{WGMMA_ARCH}: TMA and wgmma"
    remember_choice(main, Made(problem, config, in_order, None, template, why))
    return launches
