"""The cpu target: C rendering, the C compiler driver and ctypes loading."""

from minicomp.backends.cpu.codegen import CRenderer, render_module
from minicomp.backends.cpu.module import CpuModule, build

__all__ = ["CRenderer", "CpuModule", "build", "render_module"]
