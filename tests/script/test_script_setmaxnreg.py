"""setmaxnreg_inc / setmaxnreg_dec (minicomp.script.cluster): a producer warpgroup giving its
registers to a consumer warpgroup leaves results unchanged, the emulator reports a warpgroup
that does not execute it together (some warps never reach it, two calls at once, a partial
warpgroup), compile errors name the line, and NVRTC builds it for sm_90a only (USETMAXREG)."""

import pytest
import torch

import minicomp
from minicomp.backends.cuda import nvrtc
from minicomp.backends.cuda.emu import EmulatorError
from minicomp.backends.errors import CompileError
from minicomp.ir.printer import function_str
from minicomp.script import (
    ScriptError,
    attrs,
    f32,
    setmaxnreg_dec,
    setmaxnreg_inc,
    shared_tensor,
    syncthreads,
    threadIdx,
)
from minicomp.script.text import parse_function


def handoff(bug: str = ""):
    """Warpgroup 1 writes x * 2 into shared memory and lowers its registers to 40; warpgroup 0
    raises its own to 232 and adds x. `bug`: "partial" (only warps 4 to 6 of warpgroup 1 lower
    theirs), "mixed" (warp 7 asks for 48)."""

    @minicomp.script
    def handoff_kernel(x: f32[128], out: f32[128]):
        attrs.grid_dim = 1
        attrs.block_dim = 256
        attrs.min_blocks = 1  # ptxas needs the registers at entry
        t = threadIdx.x
        s = shared_tensor(f32, (128,))
        if t >= 128:
            s[t - 128] = x[t - 128] * 2.0
            if bug == "mixed" and t >= 224:
                setmaxnreg_dec(48)
            elif bug != "partial" or t < 224:
                setmaxnreg_dec(40)
        else:
            setmaxnreg_inc(232)
        syncthreads()
        if t < 128:
            out[t] = s[t] + x[t]

    return handoff_kernel


HANDOFF = handoff()


def test_reallocating_registers_leaves_the_result_unchanged():
    x = torch.randn(128)
    out = torch.full((128,), float("nan"))
    HANDOFF.with_target("cuda-emu")(x, out)
    torch.testing.assert_close(out, x * 3)


def test_a_warpgroup_whose_warps_do_not_all_reach_it_is_a_reported_deadlock():
    x, out = torch.randn(128), torch.empty(128)
    with pytest.raises(
        EmulatorError,
        match=r"deadlock.*96 of 128 threads of warpgroup 1 wait at "
        r"setmaxnreg_dec \(line \d+\)",
    ):
        handoff("partial").with_target("cuda-emu")(x, out)


def test_a_warpgroup_at_two_different_calls_is_an_error():
    x, out = torch.randn(128), torch.empty(128)
    with pytest.raises(
        EmulatorError,
        match=r"warpgroup 1 execute different setmaxnreg calls.*"
        r"setmaxnreg_dec\(40\).*setmaxnreg_dec\(48\)",
    ):
        handoff("mixed").with_target("cuda-emu")(x, out)


def test_a_partial_warpgroup_is_an_error():
    @minicomp.script
    def partial(out: f32[160]):
        attrs.grid_dim = 1
        attrs.block_dim = 160
        attrs.min_blocks = 1
        setmaxnreg_dec(40)
        out[threadIdx.x] = 1.0

    with pytest.raises(EmulatorError, match=r"warpgroup 1 has only 32 threads"):
        partial.with_target("cuda-emu")(torch.empty(160))


def test_the_kernel_prints_and_parses_back():
    text = function_str(HANDOFF.ir)
    assert "setmaxnreg_dec(40)" in text and "setmaxnreg_inc(232)" in text
    assert parse_function(text) == HANDOFF.ir


@pytest.mark.parametrize("n", [20, 44, 264])
def test_a_register_count_off_the_range_is_refused_with_its_line(n):
    def kernel(out: f32[128]):
        attrs.grid_dim = 1
        attrs.block_dim = 128
        attrs.min_blocks = 1
        setmaxnreg_inc(n)

    with pytest.raises(ScriptError) as err:
        minicomp.script(kernel).ir  # noqa: B018
    assert (
        f"setmaxnreg_inc() sets a multiple of 8 registers from 24 to 256 a thread, not {n}\n"
        "    setmaxnreg_inc(n)" in str(err.value)
    )


def test_it_needs_min_blocks():
    def kernel(out: f32[128]):
        attrs.grid_dim = 1
        attrs.block_dim = 128
        setmaxnreg_dec(40)

    with pytest.raises(ScriptError) as err:
        minicomp.script(kernel).ir  # noqa: B018
    assert "setmaxnreg needs attrs.min_blocks" in str(err.value)
    assert str(err.value).endswith("setmaxnreg_dec(40)"), str(err.value)


def _nvrtc():
    try:
        nvrtc.nvrtc_version()
    except nvrtc.NvrtcUnavailableError as err:  # pragma: no cover - depends on the machine
        pytest.skip(f"NVRTC unavailable: {err}")


def test_it_compiles_for_sm_90a_to_usetmaxreg_and_is_refused_for_sm_90(tmp_path):
    _nvrtc()
    from minicomp.backends.cuda import sass

    name = HANDOFF.ir.name
    binary = nvrtc.compile_cuda(HANDOFF.source, arch="sm_90a", name=name, cache_dir=str(tmp_path))
    try:
        (report,) = sass.check_kernels(HANDOFF.source, binary.cubin)
    except sass.SassUnavailableError as err:  # pragma: no cover - depends on the machine
        pytest.skip(str(err))
    assert "USETMAXREG" in report.intended and report.ok, report
    with pytest.raises(CompileError, match=r"setmaxnreg_dec\(\) needs sm_90a"):
        nvrtc.compile_cuda(HANDOFF.source, arch="sm_90", name=name, cache_dir=str(tmp_path))
