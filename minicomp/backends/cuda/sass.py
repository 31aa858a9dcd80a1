"""SASS, the GPU's machine code, read from a cubin: each kernel's instruction counts, and
whether the instructions its source asked for (tensor-core mma, ldmatrix, cp.async) are there.

The disassembler is CUDA's `cuobjdump` (or `nvdisasm`). Neither needs a GPU: a CUDA toolkit
has them, and so do the `nvidia-cuda-cuobjdump` and `nvidia-cuda-nvdisasm` wheels (the `sass`
extra), whose binaries this module finds inside the installed `nvidia` package.
"""

from __future__ import annotations

import collections
import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field

# What the CUDA helpers (mma.h) compile to: a kernel calling the helper must contain the opcode.
INTRINSIC_OPCODES = {
    "mc_mma_m16n8k16_": "HMMA",
    "mc_ldmatrix_": "LDSM",
    "mc_cp_async_ca": "LDGSTS",
    "mc_cp_async_cg": "LDGSTS",
}
# Opcodes that say something about a kernel's speed, reported even when the count is zero.
NOTABLE = ("HMMA", "LDSM", "LDGSTS", "FFMA", "LDG", "STG", "LDS", "STS", "LDL", "STL", "BAR")

_FUNCTION = re.compile(r"^\s*Function : (?P<name>\S+)", re.MULTILINE)
_INSTRUCTION = re.compile(
    r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P[T0-9]+\s+)?(?P<op>[A-Z][A-Z0-9_]*)(?P<mods>(?:\.[A-Z0-9_]+)*)"
)
# `__global__ [__launch_bounds__(...)] void name(`: the kernel's name is the word before the
# first parenthesis that follows the return type.
_KERNEL = re.compile(r"__global__\s+(?:__launch_bounds__\([^)]*\)\s+)?\w+\s+(\w+)\s*\(")
_WIDTH = re.compile(r"\.(?P<bits>64|128)\b")


class SassUnavailableError(RuntimeError):
    """No disassembler (cuobjdump or nvdisasm) could be found or run."""


def find_tool(name: str) -> str | None:
    """The path of CUDA's `name` tool (cuobjdump, nvdisasm): on PATH, in the CUDA toolkit
    (CUDA_HOME, /usr/local/cuda) or in an installed nvidia-cuda-* wheel; None if absent."""
    found = shutil.which(name)
    if found:
        return found
    folders = [
        os.path.join(os.environ[v], "bin") for v in ("CUDA_HOME", "CUDA_PATH") if v in os.environ
    ]
    folders.append("/usr/local/cuda/bin")
    try:
        import nvidia

        for root in nvidia.__path__:
            folders += [os.path.join(root, d, "bin") for d in sorted(os.listdir(root))]
    except ImportError:
        pass
    for folder in folders:
        path = os.path.join(folder, name)
        if os.path.isfile(path) and os.access(path, os.X_OK):
            return path
    return None


def disassemble(cubin: bytes) -> dict[str, str]:
    """Each kernel's SASS text in `cubin`, by kernel name; raises SassUnavailableError."""
    tool = find_tool("cuobjdump")
    if tool is None:
        raise SassUnavailableError(
            "cuobjdump was not found (install the `sass` extra: nvidia-cuda-cuobjdump, or a CUDA "
            "toolkit)"
        )
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        run = subprocess.run([tool, "-sass", f.name], capture_output=True, text=True, check=False)
    if run.returncode != 0:
        raise SassUnavailableError(f"cuobjdump -sass failed: {run.stderr.strip()[:300]}")
    text = run.stdout
    marks = list(_FUNCTION.finditer(text))
    return {
        m["name"]: text[m.end() : marks[i + 1].start() if i + 1 < len(marks) else len(text)]
        for i, m in enumerate(marks)
    }


def opcode_counts(sass: str) -> collections.Counter:
    """How often each opcode occurs in a kernel's SASS, by base name (HMMA, LDG...); memory
    accesses 8 or 16 bytes wide are also counted as LDG.64, LDG.128 and so on."""
    counts: collections.Counter = collections.Counter()
    for m in _INSTRUCTION.finditer(sass):
        op = m["op"]
        counts[op] += 1
        if op in ("LDG", "STG", "LDS", "STS", "LDL", "STL") and (w := _WIDTH.search(m["mods"])):
            counts[f"{op}.{w['bits']}"] += 1
    return counts


def kernel_sources(source: str) -> dict[str, str]:
    """Each `__global__` kernel's text in a generated CUDA source, by name (a kernel's text
    runs to the next kernel; the helpers before the first are the shared header)."""
    starts = list(_KERNEL.finditer(source))
    return {
        m[1]: source[m.start() : starts[i + 1].start() if i + 1 < len(starts) else len(source)]
        for i, m in enumerate(starts)
    }


def intended_opcodes(kernel_source: str) -> set[str]:
    """The opcodes a kernel's source asks for through the intrinsic helpers it calls."""
    return {op for helper, op in INTRINSIC_OPCODES.items() if helper in kernel_source}


@dataclass(frozen=True)
class SassReport:
    """One kernel's SASS summary: notable opcode counts, what its source meant and lacks."""

    kernel: str
    counts: dict[str, int] = field(default_factory=dict)
    intended: tuple[str, ...] = ()
    missing: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        """Every intended instruction is in the machine code."""
        return not self.missing


def check_kernels(source: str, cubin: bytes) -> list[SassReport]:
    """A SassReport for every kernel of a module: its source (the generated CUDA) and the
    cubin NVRTC built from it; raises SassUnavailableError."""
    sass = disassemble(cubin)
    sources = kernel_sources(source)
    reports = []
    for name, text in sorted(sass.items()):
        counts = opcode_counts(text)
        intended = intended_opcodes(sources.get(name, ""))
        shown = {op: counts.get(op, 0) for op in NOTABLE}
        shown.update({k: v for k, v in counts.items() if "." in k})
        missing = tuple(sorted(op for op in intended if counts.get(op, 0) == 0))
        reports.append(SassReport(name, shown, tuple(sorted(intended)), missing))
    return reports
