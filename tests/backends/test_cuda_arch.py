"""The table of CUDA architectures' limits (backends/cuda/arch.py) and who reads it: templates
size their configs by what every architecture allows, the emulator and the driver's fallback
accept up to the largest."""

import pytest

from minicomp.backends.cuda import arch, driver, emu
from minicomp.schedule.templates import attention, matmul_simt, matmul_tc


def test_limits_by_architecture():
    assert arch.limits("sm_80").shared_per_block_optin == 163 * 1024
    assert arch.limits("sm_86").shared_per_block_optin == 99 * 1024
    assert arch.limits("sm_90a") is arch.ARCHS["sm_90"]
    with pytest.raises(KeyError, match="sm_75"):
        arch.limits("sm_75")
    for limits in arch.ARCHS.values():
        # CUDA keeps 1 KiB of each SM's shared memory for every resident block.
        assert limits.shared_per_block_optin == limits.shared_per_sm - 1024
        assert limits.threads_per_sm >= limits.threads_per_block


def test_portable_and_largest():
    """PORTABLE is each limit's least over the table, LARGEST its most."""
    for field in ("shared_per_block_optin", "threads_per_sm", "blocks_per_sm"):
        values = [getattr(a, field) for a in arch.ARCHS.values()]
        assert getattr(arch.PORTABLE, field) == min(values)
        assert getattr(arch.LARGEST, field) == max(values)
    assert arch.PORTABLE.shared_per_block_optin == 99 * 1024
    assert arch.LARGEST.shared_per_block_optin == 227 * 1024


def test_readers_take_their_limits_from_the_table():
    assert matmul_tc.MAX_SHARED == attention.MAX_SHARED == arch.PORTABLE.shared_per_block_optin
    assert matmul_simt.MAX_SHARED == arch.PORTABLE.shared_per_block == 48 * 1024
    largest = arch.LARGEST.shared_per_block_optin
    assert emu.MAX_DYNAMIC_SHARED == driver.MAX_DYNAMIC_SHARED == largest
    assert driver.DEFAULT_DYNAMIC_SHARED == arch.PORTABLE.shared_per_block
