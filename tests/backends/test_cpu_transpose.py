"""Tests of runtime.h's mc_transpose16_f32 on each of its paths: AVX-512, AVX and plain C."""

import subprocess

import pytest

from minicomp.backends.cpu.codegen import runtime_header

PROGRAM = r"""
#include <stdio.h>
int main(void) {
    /* A 16x16 tile of a 16 x 37 matrix (rows 37 floats apart), from column 5. */
    float src[16 * 37], dst[256];
    for (int k = 0; k < 16 * 37; ++k) src[k] = (float)k;
    mc_transpose16_f32(src + 5, 37, dst);
    int bad = 0;
    for (int i = 0; i < 16; ++i)
        for (int j = 0; j < 16; ++j) bad += dst[j * 16 + i] != src[i * 37 + 5 + j];
    printf("%d\n", bad);
    return 0;
}
"""

# Flags that select each path on an x86 CPU with AVX-512 (the others turn features off, so
# they run on any x86 CPU that runs the first).
PATHS = {
    "native": ["-march=native"],
    "avx": ["-march=native", "-mno-avx512f"],
    "plain": ["-march=native", "-mno-avx512f", "-mno-avx"],
}


@pytest.mark.parametrize("path", PATHS)
def test_transpose16_on_every_path(tmp_path, path):
    source = tmp_path / "transpose.c"
    source.write_text(runtime_header() + PROGRAM)
    exe = tmp_path / "transpose"
    cmd = ["cc", "-O2", *PATHS[path], "-o", str(exe), str(source), "-lm"]
    if subprocess.run(cmd, capture_output=True).returncode != 0:
        pytest.skip(f"cc cannot build with {PATHS[path]}")
    assert subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout == "0\n"
