"""FSDP2 units that are built-in torch.nn modules, compiled one by one.

Why `torch.compile(model, backend="minicomp")` of a model whose `nn.Linear` layers are each
`fully_shard`ed captures no graph of them (PyTorch 2.13): FSDP2 runs its forward hooks (the
all-gather of the parameters, the reshard) under `torch._dynamo.disable`, so a call of any
FSDP-managed module is a graph break; the module's `forward` then runs as a frame of its own,
which Dynamo compiles only if it would trace that frame at the top level. A user-defined
module's `forward` it does; a torch.nn built-in's (`Linear.forward`, in torch/nn) it skips
unless the module has hooks and `type(module).__module__` starts with "torch.nn."
(torch/_dynamo/trace_rules.py, `check_verbose`). `fully_shard` swaps the module's class for a
new `FSDPLinear` made in torch.distributed.fsdp, so that test fails, the frame is skipped and
the layer runs eagerly, whatever the backend. With every Linear sharded, what is left for
Dynamo is the glue between them (an activation, a residual addition), or nothing.

`compile_builtin_fsdp_modules(model, ...)` compiles the `forward` of each such module itself
(`torch.compile` of the bound method, set on the instance), so that the layer's own graph, and
its backward, reach minicomp; the FSDP hooks around it still run eagerly, as PyTorch wants.
Call it after `fully_shard` and before running the model; compile the model (or its blocks)
as usual beside it. User-defined FSDP units need nothing: Dynamo traces their `forward`.
"""

from __future__ import annotations

from typing import Any

import torch


def builtin_fsdp_modules(model: torch.nn.Module) -> list[tuple[str, torch.nn.Module]]:
    """The FSDP-managed submodules of `model` (itself included) whose `forward` is a torch.nn
    built-in's, which Dynamo skips as a frame of its own (see the module docstring)."""
    # Lazy: torch.distributed.fsdp is a large import that models without FSDP never need.
    from torch.distributed.fsdp import FSDPModule

    found = []
    for name, module in model.named_modules():
        if not isinstance(module, FSDPModule) or "forward" in vars(module):
            continue
        forward = type(module).forward
        if getattr(forward, "__module__", "").startswith(("torch.nn.", "torch.ao.")):
            found.append((name, module))
    return found


def compile_builtin_fsdp_modules(
    model: torch.nn.Module, *, options: dict | None = None, **compile_kwargs: Any
) -> list[str]:
    """Compile, with minicomp, the `forward` of every FSDP unit of `model` that is a torch.nn
    built-in module (an `nn.Linear` passed to `fully_shard`); return their names ("" for
    `model` itself). `options` and `compile_kwargs` (`dynamic`, `mode`, `fullgraph`) go to
    each `torch.compile`. A unit compiled before (its instance has a `forward` of its own) is
    left alone, so calling it twice compiles nothing more."""
    names = []
    for name, module in builtin_fsdp_modules(model):
        compiled = torch.compile(
            module.forward, backend="minicomp", options=options, **compile_kwargs
        )
        # An instance attribute: nn.Module.__call__ runs it between FSDP's hooks.
        module.forward = compiled
        names.append(name)
    return names
