"""The cpu target asks for 512-bit vectors in kernels that stream more than a core's caches
(backends/cpu/vector_width.py): which kernels, and that GCC then uses zmm registers on an
AVX-512 CPU and keeps 256-bit code in small ones."""

import re
import shlex
import subprocess

import pytest
import torch
from helpers import compile_minicomp

from minicomp import config
from minicomp.backends.cpu import render_module
from minicomp.backends.cpu.vector_width import WIDE_MIN_ITERATIONS, iterations
from minicomp.dynamo.backend import recording
from minicomp.ir import expr as E
from minicomp.ir import stmt as S
from minicomp.ir.func import Function, Module
from minicomp.ir.types import PointerType, f32, i64

c, j, n = E.Var("c", i64), E.Var("j", i64), E.Var("n", i64)
x, out = E.Var("x", PointerType(f32)), E.Var("out", PointerType(f32))


def sin_kernel(name: str, numel: int | None) -> Function:
    """`out = sin(x)` over `numel` floats (symbolic `n` when None), as the cpu schedule tiles
    it: chunks of 4096 in a parallel loop, a vector loop over each chunk's (tail) elements."""
    total = n if numel is None else E.const(numel, i64)
    chunks = E.binary("idiv", total + 4095, E.const(4096, i64))
    tail = E.binary("min", E.const(4096, i64), total - c * 4096)
    k = c * 4096 + j
    inner = S.For(j, tail, S.Store(out, k, E.call("sin", E.Load(x, k))), kind="vectorize")
    params = (x, out) if numel is not None else (x, out, n)
    return Function(name, params, S.For(c, chunks, inner, kind="parallel"))


def test_iterations_bound_the_loop_nests():
    # 4 chunks of at most 4096: the tail's min bounds it; a symbolic size has no bound.
    assert iterations(sin_kernel("k", 16384).body) == 4 * 4096
    assert iterations(sin_kernel("k", None).body) is None
    two_nests = S.Seq((sin_kernel("a", 8192).body, sin_kernel("b", 4096).body))
    assert iterations(two_nests) == 3 * 4096


def test_large_and_unknown_sizes_ask_for_wide_vectors():
    source = render_module(
        Module(
            "m",
            (
                sin_kernel("k_small", 4096),
                sin_kernel("k_large", 1 << 20),
                sin_kernel("k_dyn", None),
            ),
        )
    )
    heads = {
        m.group(2): m.group(1)
        for m in re.finditer(r"^(MC_WIDE_VECTORS )?void (\w+)\(", source, re.M)
    }
    assert heads == {"k_small": None, "k_large": "MC_WIDE_VECTORS ", "k_dyn": "MC_WIDE_VECTORS "}
    assert WIDE_MIN_ITERATIONS > 4096


def compiler_macros() -> str:
    cmd = [config.get("cc"), *shlex.split(config.get("cflags")), "-dM", "-E", "-x", "c", "-"]
    return subprocess.run(cmd, input="", capture_output=True, text=True, check=True).stdout


@pytest.mark.skipif(
    "__AVX512F__" not in compiler_macros() or "__x86_64__" not in compiler_macros(),
    reason="the cpu target's flags give no AVX-512 here",
)
def test_gcc_uses_zmm_registers_in_the_large_kernel_only(tmp_path):
    module = Module("m", (sin_kernel("k_small", 4096), sin_kernel("k_large", 1 << 20)))
    path = tmp_path / "widths.c"
    path.write_text(render_module(module))
    flags = [f for f in shlex.split(config.get("cflags")) if f not in ("-shared", "-fPIC")]
    asm = tmp_path / "widths.s"
    subprocess.run([config.get("cc"), *flags, "-S", "-o", str(asm), str(path)], check=True)
    text = asm.read_text()
    # Each kernel's code and its OpenMP-outlined body (k_large._omp_fn.0), up to its .size.
    bodies: dict[str, str] = {}
    for name, body in re.findall(
        r"^(k_[a-z]+)(?:\._omp_fn\.\d+)?:\n(.*?)^\s*\.size", text, re.M | re.S
    ):
        bodies[name] = bodies.get(name, "") + body
    assert "%zmm" in bodies["k_large"]
    assert "%zmm" not in bodies["k_small"] and "%ymm" in bodies["k_small"]


def test_a_compiled_function_on_a_large_tensor_matches_eager():
    fn = compile_minicomp(lambda t: torch.sin(t) * torch.exp(-t * t), "cpu")
    t = torch.randn(3 * 4096 * 11 + 5) * 4
    records: list = []
    with recording(records):
        got = fn(t)
    torch.testing.assert_close(got, torch.sin(t) * torch.exp(-t * t), rtol=1e-5, atol=1e-6)
    assert "MC_WIDE_VECTORS void" in records[0].source
