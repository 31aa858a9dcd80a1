"""SASS, the GPU's machine code, read from a cubin: each kernel's instruction counts, the
classes of instructions the performance lens reports (integer divisions, spills, conversions...),
and whether the instructions its source asked for (tensor-core mma, ldmatrix, cp.async) are there.

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
from collections.abc import Callable
from dataclasses import dataclass, field

# What the CUDA helpers (mma.h) compile to: a kernel calling the helper must contain the opcode
# (one of them, where "|" separates those of different architectures: a float8 mma is QMMA on
# sm_89 and HMMA on sm_90, which unpacks the bytes to f16).
INTRINSIC_OPCODES = {
    "mc_mma_m16n8k16_": "HMMA",
    "mc_mma_m16n8k32_s8": "IMMA",
    "mc_mma_m16n8k32_u8": "IMMA",
    "mc_mma_m16n8k32_e": "QMMA|HMMA",
    "mc_ldmatrix_": "LDSM",
    "mc_cp_async_ca": "LDGSTS",
    "mc_cp_async_cg": "LDGSTS",
    "mc_bulk_copy_g2s": "UBLKCP",
    "mc_tma_load_": "UTMALDG",
    "mc_tma_store_": "UTMASTG",
    "mc_wgmma_mma_async": "HGMMA|QGMMA",  # f16/bf16, float8
    "mc_setmaxnreg_": "USETMAXREG",
}
# Opcodes that say something about a kernel's speed, reported even when the count is zero.
NOTABLE = ("HMMA", "LDSM", "LDGSTS", "FFMA", "LDG", "STG", "LDS", "STS", "LDL", "STL", "BAR")

_FUNCTION = re.compile(r"^\s*Function : (?P<name>\S+)", re.MULTILINE)
_INSTRUCTION = re.compile(
    r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P[T0-9]+\s+)?(?P<op>[A-Z][A-Z0-9_]*)(?P<mods>(?:\.[A-Z0-9_]+)*)"
)
# `__global__ [__cluster_dims__(...)] [__launch_bounds__(...)] void name(`: the kernel's name is
# the word before the first parenthesis that follows the return type.
_KERNEL = re.compile(r"__global__\s+(?:__\w+__\([^)]*\)\s+)*\w+\s+(\w+)\s*\(")
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


def full_opcode_counts(sass: str) -> collections.Counter:
    """How often each instruction occurs in a kernel's SASS with all its modifiers
    ("I2F.U32.RP", "LDG.E.128", "HMMA.16816.F32"): what instruction_classes reads."""
    return collections.Counter(m["op"] + m["mods"] for m in _INSTRUCTION.finditer(sass))


def _is(*ops: str) -> Callable[[str, tuple[str, ...]], bool]:
    return lambda op, mods: op in ops


def _wide(*ops: str) -> Callable[[str, tuple[str, ...]], bool]:
    return lambda op, mods: op in ops and "128" in mods


# The classes of instructions the performance lens reports, each a test on an instruction's
# opcode and modifiers; instruction_classes counts the instructions that pass. Classes overlap
# (a 128-bit global load is also a global load; a division's MUFU.RCP is a special function).
INSTRUCTION_CLASSES: dict[str, Callable[[str, tuple[str, ...]], bool]] = {
    # Matrix multiply-accumulate: HMMA (f16/bf16/tf32, mma.sync), IMMA (integer), DMMA (f64),
    # QMMA (fp8, sm_89), and Hopper's warpgroup HGMMA/IGMMA/QGMMA (wgmma).
    "tensor core": _is("HMMA", "IMMA", "DMMA", "QMMA", "HGMMA", "IGMMA", "QGMMA"),
    "ldmatrix": _is("LDSM"),
    # cp.async (LDGSTS), and Hopper's bulk and tensor-map copies (cp.async.bulk), loads and
    # stores (UTMASTG).
    "async copy": _is("LDGSTS", "UBLKCP", "UTMALDG", "UTMASTG"),
    "global load": _is("LDG"),
    "global load 128-bit": _wide("LDG"),
    "global store": _is("STG"),
    "global store 128-bit": _wide("STG"),
    "shared load": _is("LDS"),
    "shared store": _is("STS"),
    "shared 128-bit": _wide("LDS", "STS"),
    # Local memory: register spills, and arrays the compiler could not keep in registers.
    "local (spill) access": _is("LDL", "STL"),
    # Conversions to and from f16/bf16: F2FP packs f32 into f16/bf16 (F2FP.F16.F32.PACK_AB,
    # F2FP.BF16...), ptxas widens f16 to f32 with HADD2.F32 (adding -0), and F2F.F16.F64 or
    # F2F.F64.F16 go to and from f64 (F2F.F64.F32 and F2F.F32.F64 are not counted). Widening
    # bf16 to f32 is a shift, not counted either.
    "half conversion": lambda op, mods: (
        op == "F2FP"
        or (op, mods) == ("HADD2", ("F32",))
        or (op == "F2F" and bool({"F16", "BF16"} & set(mods)))
    ),
    "F2F": _is("F2F"),
    "F2FP": _is("F2FP"),
    # I2F (I2FP.F32.S32 on sm_90), F2I; the pair that each integer division contains is not
    # counted here (instruction_classes subtracts it).
    "int<->float conversion": _is("I2F", "I2FP", "F2I"),
    # An integer division (or remainder) by a value known only at run time has no opcode:
    # ptxas computes a reciprocal estimate and corrects it. Each such sequence starts with an
    # I2F rounding toward +inf (I2F.U32.RP unsigned, I2F.RP signed, I2F.U64.RP in the 64-bit
    # subroutine), then MUFU.RCP and F2I. A quotient and remainder of the same operands share
    # one; division by a constant is a multiply-high, not counted. A 64-bit division counts 2:
    # its 32-bit fast path, and the subroutine it CALLs.
    "integer divide": lambda op, mods: op == "I2F" and "RP" in mods,
    # Subroutine calls (CALL.REL): 64-bit integer division, IEEE float division's slow path.
    "calls": _is("CALL"),
    # IMAD.WIDE(.U32): a 32 x 32 -> 64-bit multiply-add. Every address formed from a 32-bit
    # index takes one (pointer + index * size); 64-bit index products take more.
    "wide integer multiply": lambda op, mods: op == "IMAD" and "WIDE" in mods,
    # The high half of a 64-bit add (IADD3.X, IMAD.X, LEA.HI.X): 64-bit index arithmetic,
    # which a 32-bit index folds into its IMAD.WIDE.
    "64-bit integer add": lambda op, mods: op in ("IADD3", "IMAD", "LEA") and "X" in mods,
    "barrier": _is("BAR"),
    "special function": _is("MUFU"),
    "fp32 fma/add/mul": _is("FFMA", "FADD", "FMUL"),
}


def instruction_classes(counts: collections.Counter) -> dict[str, int]:
    """How many instructions of each of INSTRUCTION_CLASSES a kernel has, from its
    `full_opcode_counts` (opcodes with their modifiers; `opcode_counts` loses the modifiers
    some classes need). Every class is present, zero or not, in INSTRUCTION_CLASSES's order."""
    classes = dict.fromkeys(INSTRUCTION_CLASSES, 0)
    for full, n in counts.items():
        op, *mods = full.split(".")
        for name, test in INSTRUCTION_CLASSES.items():
            if test(op, tuple(mods)):
                classes[name] += n
    # Each division sequence holds one I2F...RP and one F2I: not conversions of the kernel's.
    classes["int<->float conversion"] = max(
        0, classes["int<->float conversion"] - 2 * classes["integer divide"]
    )
    return classes


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
        missing = tuple(
            sorted(op for op in intended if not any(counts.get(o, 0) for o in op.split("|")))
        )
        reports.append(SassReport(name, shown, tuple(sorted(intended)), missing))
    return reports
