"""The memory a kernel's launcher provides beside its tensors (LaunchAttrs.scratch), as what a
launcher allocates: the plan (runtime/plan_builder.py) and the tuner's runners."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from minicomp.ir.func import Function
from minicomp.ir.types import PointerType, to_torch


@dataclass(frozen=True)
class Scratch:
    """Pointer parameter `param` gets `elements` elements of `dtype`: zeros before the first
    launch (and after every one: the kernel restores them) when `zeroed`, else memory of
    undefined contents."""

    param: str
    dtype: torch.dtype
    elements: int
    zeroed: bool

    def allocate(self, device: torch.device | str) -> torch.Tensor:
        """A tensor for this parameter on `device`."""
        make = torch.zeros if self.zeroed else torch.empty
        return make(self.elements, dtype=self.dtype, device=device)


def scratch_of(f: Function) -> tuple[Scratch, ...]:
    """The scratch parameters of kernel `f`, in its parameters' order."""
    entries = {name: (elements, zeroed) for name, elements, zeroed in f.attrs.scratch}
    out = []
    for p in f.params:
        if p.name in entries and isinstance(p.type, PointerType):  # Function checks it is
            elements, zeroed = entries[p.name]
            out.append(Scratch(p.name, to_torch(p.type.elem), elements, zeroed))
    return tuple(out)


def scratch_tensors(f: Function, device: torch.device | str) -> list[torch.Tensor]:
    """Fresh tensors for the scratch parameters of kernel `f` (the arguments that follow its
    outputs), on `device`."""
    return [s.allocate(device) for s in scratch_of(f)]
