"""DistributedDataParallel and torch.compile: a warning where `torch.compile(DDP(model))`
compiles nothing.

Both forms work with Dynamo's DDP optimizer (`torch._dynamo.config.optimize_ddp`, on by
default), which splits each graph at DDP's bucket boundaries and hands the backend one graph
per bucket, so that each bucket's gradients are all-reduced as soon as its backward is done:

- `DDP(torch.compile(model))`: Dynamo compiles the model's forward inside DDP's;
- `torch.compile(DDP(model))`: Dynamo cannot trace DDP's forward (it breaks at DDP's logger,
  inside a `record_function` block it cannot resume in, so DDP's forward runs eagerly) and
  only kicks in again at the frame of `model.forward`, under DDP's `_inside_ddp_forward`.

When `model.forward` is PyTorch's own code (`nn.Sequential`, `nn.Transformer`...), Dynamo
skips that frame too, as it skips every top-level frame in `torch.nn`, and no graph reaches any
backend: the model trains eagerly, silently. `watch_ddp` tells the user: a callback Dynamo
calls after each frame compile looks for DDP's `_run_ddp_forward` on the Python stack (the
frames Dynamo compiles there are those of the first form, or of the second's
`_inside_ddp_forward`), and when that DDP wraps a module whose forward Dynamo skips, warns once
per DDP module with `DistributedWarning` at the user's line. docs/distributed.md says which
form to use.
"""

from __future__ import annotations

import sys
import threading
import weakref

import torch

from minicomp.logs import warn_user

_RUN_DDP_FORWARD = "_run_ddp_forward"
# DDP modules warned about, so that each is warned about once.
_warned: weakref.WeakSet = weakref.WeakSet()
_install_lock = threading.Lock()
_callback = None  # _after_frame_compile kept from Dynamo, made once by watch_ddp


class DistributedWarning(UserWarning):
    """A distributed training setup minicomp cannot compile as written; the message says what
    to write instead."""


def watch_ddp() -> None:
    """Register the after-compile callback with Dynamo, unless it is registered already.

    `torch._dynamo.reset()` drops every callback: the backend registers it again when it is
    next called, so a reset followed by a compile that never calls it goes unwatched.
    """
    handler = getattr(torch._dynamo, "callback_handler", None)
    if handler is None:  # a PyTorch without compile callbacks: nothing to watch with
        return
    global _callback
    with _install_lock:
        if _callback is None:
            # Dynamo runs its end callbacks under its own lock, and with its frame hook still
            # set when a backward compiles lazily inside a compiled frame (`loss.backward()`
            # after a graph break): a callback frame Dynamo tried to compile would take that
            # lock again and hang the process. Made here, not at import: `disable` imports
            # torch._dynamo, which importing minicomp must not.
            _callback = torch.compiler.disable(_after_frame_compile)
        if _callback not in handler.end_callbacks:
            handler.register_end_callback(_callback)


def _after_frame_compile(_args: object = None) -> None:
    ddp = _ddp_forward_running()
    if ddp is None or ddp in _warned:
        return
    module = ddp.module
    if isinstance(module, torch._dynamo.eval_frame.OptimizedModule):
        return  # DDP(torch.compile(model)): the frames Dynamo compiles are the model's
    forward = getattr(type(module).forward, "__code__", None)
    if forward is None or not torch._dynamo.trace_rules.check(forward):
        return  # Dynamo compiles model.forward's frame: one graph per bucket
    _warned.add(ddp)
    warn_user(unwrapped_message(module), DistributedWarning)


def unwrapped_message(module: torch.nn.Module) -> str:
    """What to tell the user whose `torch.compile(DDP(module))` compiles nothing."""
    name = f"{type(module).__module__}.{type(module).__qualname__}"
    return (
        f"minicomp: torch.compile(DDP(model)) compiles nothing here: Dynamo runs DDP's forward "
        f"eagerly and then skips model.forward, which is PyTorch's own code ({name}.forward), "
        "so the model trains eagerly. Compile the model inside DDP instead: "
        'DDP(torch.compile(model, backend="minicomp")), or give the model a forward of your '
        "own (a module class in your code), or set "
        'torch._dynamo.config.optimize_ddp = "python_reducer" before building DDP '
        "(see docs/distributed.md)"
    )


def _ddp_forward_running() -> torch.nn.Module | None:
    """The DDP module whose `_run_ddp_forward` is on this thread's stack, if any."""
    from torch.nn.parallel import DistributedDataParallel

    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_name == _RUN_DDP_FORWARD:
            module = frame.f_locals.get("self")
            if isinstance(module, DistributedDataParallel):
                return module
        frame = frame.f_back
    return None
