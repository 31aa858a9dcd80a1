"""The examples of examples/: each runs as a script and reports a small error, and the tiled
matmul template is checked directly against torch.matmul for several tile configurations."""

import importlib.util
import math
import os
import re
import runpy
import subprocess
import sys

import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EXAMPLES = os.path.join(ROOT, "examples")
ERROR = re.compile(r"max error vs torch\.\w+: ([0-9.e+-]+)")


def _load_example(name: str):
    spec = importlib.util.spec_from_file_location(f"example_{name}", f"{EXAMPLES}/{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _devices() -> list:
    return ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]


@pytest.mark.parametrize("device", _devices())
@pytest.mark.parametrize(
    "name,args,tolerance",
    [
        ("script_naive_matmul", ["--size", "33", "40", "21"], 1e-4),
        (
            "script_tiled_matmul",
            ["--size", "70", "45", "67", "--tiles", "64", "64", "8", "4", "4"],
            1e-4,
        ),
        ("script_softmax", ["--size", "9", "300"], 1e-6),
    ],
)
def test_example_runs_and_reports_a_small_error(name, args, tolerance, device, capsys):
    """The script runs as `python examples/NAME.py ARGS` would, in this process (a subprocess
    would spend seconds importing torch; quickstart and resnet50 below run as subprocesses)."""
    path = os.path.join(EXAMPLES, f"{name}.py")
    argv = sys.argv
    sys.argv = [path, *args, "--device", device]
    try:
        runpy.run_path(path, run_name="__main__")
    finally:
        sys.argv = argv
    stdout = capsys.readouterr().out
    found = ERROR.search(stdout)
    assert found is not None, stdout
    assert float(found.group(1)) < tolerance, stdout
    where = "GPU" if device == "cuda" else "emulat"
    assert where in stdout


@pytest.fixture
def script_target(target):
    """Script kernels run on cuda-emu and cuda (tensors are created on the GPU for cuda)."""
    if target == "cpu":
        pytest.skip("script kernels run on cuda or cuda-emu")
    return target


TILED = _load_example("script_tiled_matmul")
CONFIGS = [TILED.TILES, (64, 32, 16, 4, 2)]
_kernels = {}


def _tiled(config):
    if config not in _kernels:
        _kernels[config] = TILED.make_tiled_matmul(*config)
    return _kernels[config]


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: "x".join(map(str, c)))
@pytest.mark.parametrize("shape", [(37, 50, 21), (130, 16, 129), (64, 32, 128)])
def test_tiled_matmul_template(script_target, config, shape):
    m, k, n = shape
    a, b = torch.randn(m, k), torch.randn(k, n)
    c = torch.full((m, n), math.nan)
    _tiled(config).with_target(script_target)(a, b, c)
    torch.testing.assert_close(c, a @ b, rtol=1e-4, atol=1e-4)


def test_tiled_matmul_template_rejects_uneven_tiles():
    with pytest.raises(ValueError, match="cannot share"):
        TILED.make_tiled_matmul(64, 64, 12, 4, 4)


def test_language_reference_snippets_run(tmp_path):
    """Every ```python block of docs/script.md, run in order as one module on CPU tensors
    (the emulator); the blocks hold their own checks."""
    with open(os.path.join(ROOT, "docs", "script.md")) as f:
        blocks = re.findall(r"```python\n(.*?)```", f.read(), re.S)
    assert len(blocks) > 10
    script = tmp_path / "snippets.py"
    script.write_text("\n".join(f"# block {k}\n{b}" for k, b in enumerate(blocks)))
    result = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=600, cwd=tmp_path
    )
    assert result.returncode == 0, result.stderr[-4000:]
    assert "thread 2 sees 1.25" in result.stdout  # the printf snippet


def test_example_kernels_compile_for_sm80_without_spills(tmp_path):
    """The GPU path, checked without a GPU: NVRTC compiles each example's kernels."""
    nvrtc = pytest.importorskip("minicomp.backends.cuda.nvrtc")
    try:
        nvrtc.nvrtc_version()
    except nvrtc.NvrtcUnavailableError as err:  # pragma: no cover - depends on the machine
        pytest.skip(f"NVRTC unavailable: {err}")
    kernels = [_load_example("script_naive_matmul").matmul, _load_example("script_softmax").softmax]
    kernels += [_tiled(config) for config in CONFIGS]
    for kernel in kernels:
        binary = nvrtc.compile_cuda(
            kernel.source, arch="sm_80", name=kernel.ir.name, cache_dir=str(tmp_path)
        )
        usage = binary.resources[kernel.ir.name]
        assert usage.spill_stores == 0 and usage.stack_bytes == 0, (kernel, usage)


def test_resnet50_example_matches_eager_on_the_cpu():
    """examples/resnet50.py on a machine without a GPU: float32 on the cpu target, checked
    against eager inside the script (small images keep it quick)."""
    if torch.cuda.is_available():
        pytest.skip("with a GPU the example runs float16 at search space 2: benchmarks do that")
    result = subprocess.run(
        [sys.executable, os.path.join(EXAMPLES, "resnet50.py"), "--image-size", "32",
         "--rounds", "2"],
        capture_output=True, text=True, timeout=600, cwd=ROOT,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-4000:]
    assert "no GPU: ResNet-50 in float32 on the CPU" in result.stdout
    assert "matches eager" in result.stdout
    assert re.search(r"minicomp +[0-9.]+ ms +\([0-9.]+x eager", result.stdout), result.stdout
    assert "Warning" not in result.stderr, result.stderr


def test_quickstart_checks_times_and_names_what_it_fused():
    """examples/quickstart.py (`make demo`): matches eager, times eager and minicomp
    interleaved, and lists the kernels with the operators each fused; --explain adds the
    stages."""
    result = subprocess.run(
        [sys.executable, os.path.join(EXAMPLES, "quickstart.py"), "--shape", "2", "8", "64",
         "--rounds", "2", "--explain"],
        capture_output=True, text=True, timeout=600, cwd=ROOT,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-4000:]
    assert "Warning" not in result.stderr, result.stderr
    out = result.stdout
    assert "minicomp matches eager on a [2, 8, 64] input" in out
    assert re.search(r"minicomp +[0-9.]+ ms +[0-9.]+x eager", out), out
    assert "0 calls made to ATen" in out
    # The two reductions (RMSNorm's mean, LayerNorm's) bound the two kernels.
    kernels = re.findall(r"^  (k\d\w*): (.*)$", out, re.MULTILINE)
    assert len(kernels) == 2, out
    assert "mean" in kernels[0][1] and "native_layer_norm" in kernels[1][1], kernels
    assert "graph breaks: 0" in out and "calls made to ATen   0" in out  # explain, asked for
