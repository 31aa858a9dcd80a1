"""Tests of the C compiler driver: building, caching, errors and concurrent processes."""

import ctypes
import multiprocessing
import os
import random
import re
import stat
from concurrent.futures import ThreadPoolExecutor

import pytest

from minicomp.backends.cpu import compiler
from minicomp.backends.errors import CompileError

FLAGS = "-O1 -fPIC -shared"

ADD_SOURCE = """\
#include <stdint.h>

int64_t add(int64_t a, int64_t b) {
    return a + b;
}
"""


@pytest.fixture(autouse=True)
def _fresh_memory_cache():
    compiler.clear_memory_cache()
    compiler.reset_cache_stats()
    yield
    compiler.clear_memory_cache()


def _add_function(path: str):
    add = compiler.load_library(path).add
    add.argtypes = [ctypes.c_int64, ctypes.c_int64]
    add.restype = ctypes.c_int64
    return add


def test_compiled_function_computes(tmp_path):
    path = compiler.compile_c(ADD_SOURCE, cc="cc", cflags=FLAGS, cache_dir=str(tmp_path))
    key = compiler.cache_key(ADD_SOURCE, cc="cc", cflags=FLAGS)
    assert path == os.path.join(tmp_path, "kernels", key[:2], key, "lib.so")
    with open(os.path.join(os.path.dirname(path), "source.c")) as f:
        assert f.read() == ADD_SOURCE
    add = _add_function(path)
    rng = random.Random(0)
    for _ in range(100):
        a, b = rng.randint(-(2**62), 2**62), rng.randint(-(2**62), 2**62)
        assert add(a, b) == a + b
    assert compiler.load_library(path) is compiler.load_library(path)


def test_second_compile_is_a_cache_hit(tmp_path):
    first = compiler.compile_c(ADD_SOURCE, cc="cc", cflags=FLAGS, cache_dir=str(tmp_path))
    after_first = compiler.cache_stats()
    assert (after_first.misses, after_first.hits) == (1, 0)
    assert after_first.compile_seconds > 0

    # Same process: answered from memory.
    second = compiler.compile_c(ADD_SOURCE, cc="cc", cflags=FLAGS, cache_dir=str(tmp_path))
    stats = compiler.cache_stats()
    assert second == first
    assert (stats.misses, stats.memory_hits, stats.disk_hits) == (1, 1, 0)
    assert stats.compile_seconds == after_first.compile_seconds

    # As a new process would: answered from disk, still without running the compiler.
    compiler.clear_memory_cache()
    third = compiler.compile_c(ADD_SOURCE, cc="cc", cflags=FLAGS, cache_dir=str(tmp_path))
    stats = compiler.cache_stats()
    assert third == first
    assert (stats.misses, stats.memory_hits, stats.disk_hits) == (1, 1, 1)
    assert stats.hits == 2


def test_key_depends_on_flags_and_source(tmp_path):
    key = compiler.cache_key(ADD_SOURCE, cc="cc", cflags=FLAGS)
    assert key == compiler.cache_key(ADD_SOURCE, cc="cc", cflags=FLAGS)
    assert key != compiler.cache_key(ADD_SOURCE, cc="cc", cflags="-O2 -fPIC -shared")
    assert key != compiler.cache_key(ADD_SOURCE + "\n", cc="cc", cflags=FLAGS)

    first = compiler.compile_c(ADD_SOURCE, cc="cc", cflags=FLAGS, cache_dir=str(tmp_path))
    other = compiler.compile_c(
        ADD_SOURCE, cc="cc", cflags="-O2 -fPIC -shared", cache_dir=str(tmp_path)
    )
    assert first != other
    assert compiler.cache_stats().misses == 2
    assert _add_function(other)(2, 3) == 5


def test_syntax_error_reports_the_offending_line(tmp_path):
    source = ADD_SOURCE.replace("return a + b;", "return a + ;")
    with pytest.raises(CompileError) as info:
        compiler.compile_c(source, cc="cc", cflags=FLAGS, cache_dir=str(tmp_path), name="broken")
    err = info.value
    message = str(err)
    assert err.source == source
    assert "error" in err.log
    assert "broken" in message
    assert "-fPIC" in message  # the command line
    assert re.search(r"^> +4 \| +return a \+ ;$", message, re.MULTILINE), message
    assert re.search(r"^  +3 \| int64_t add", message, re.MULTILINE), message
    # A failed build leaves nothing behind in the cache.
    assert not [name for _, _, files in os.walk(tmp_path) for name in files]


def test_missing_compiler_raises_compile_error(tmp_path):
    with pytest.raises(CompileError, match="not found"):
        compiler.compile_c(
            ADD_SOURCE, cc="no-such-cc-minicomp", cflags=FLAGS, cache_dir=str(tmp_path)
        )


def _slow_compiler(tmp_path) -> str:
    """A cc wrapper that notes each build and takes a second over it, so that a process
    starting at the same time finds the build under way."""
    arrivals = tmp_path / "arrivals"
    arrivals.mkdir()
    script = tmp_path / "slow-cc"
    script.write_text(
        "#!/bin/sh\n"
        'if [ "$1" = --version ]; then exec cc --version; fi\n'
        f'touch "{arrivals}/$$"\n'
        "sleep 1\n"
        'exec cc "$@"\n'
    )
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return str(script)


def test_concurrent_processes_share_one_build(tmp_path):
    """Two processes (a job's ranks) missing the same build at once: one builds, the other
    waits for it (the entry's lock) and loads it."""
    cc = _slow_compiler(tmp_path)
    source = ADD_SOURCE.replace("add(", "add_concurrently(")
    kwargs = {"cc": cc, "cflags": FLAGS, "cache_dir": str(tmp_path / "cache")}
    with multiprocessing.get_context("spawn").Pool(2) as pool:
        results = [pool.apply_async(compiler.compile_c, (source,), kwargs) for _ in range(2)]
        paths = [result.get(timeout=120) for result in results]
    assert paths[0] == paths[1]
    assert len(os.listdir(tmp_path / "arrivals")) == 1  # one process compiled
    builds = [root for root, _, files in os.walk(tmp_path / "cache") if "lib.so" in files]
    assert builds == [os.path.dirname(paths[0])]
    leftovers = [n for _, dirs, _ in os.walk(tmp_path / "cache") for n in dirs if "tmp" in n]
    assert leftovers == []
    assert os.listdir(tmp_path / "cache" / "building" / "locks") == []
    assert ctypes.CDLL(paths[0]).add_concurrently(2, 40) == 42


def test_debug_build_keeps_working(tmp_path):
    path = compiler.compile_c(ADD_SOURCE, cc="cc", cflags="-g " + FLAGS, cache_dir=str(tmp_path))
    assert _add_function(path)(-1, 1) == 0


def test_concurrent_threads_share_one_build(tmp_path):
    source = ADD_SOURCE.replace("add(", "add_from_threads(")
    kwargs = {"cc": "cc", "cflags": FLAGS, "cache_dir": str(tmp_path)}
    with ThreadPoolExecutor(4) as pool:
        paths = list(pool.map(lambda _: compiler.compile_c(source, **kwargs), range(4)))
    assert len(set(paths)) == 1
    assert compiler.load_library(paths[0]).add_from_threads(1, 2) == 3


PRELUDE = """\
#include <stdint.h>
#include <stdio.h>

static inline int64_t triple(int64_t x) { return 3 * x; }
"""


def test_precompiled_header_is_included_by_its_path(tmp_path):
    cache_dir = str(tmp_path)
    header = compiler.precompiled_header(PRELUDE, cc="cc", cflags=FLAGS, cache_dir=cache_dir)
    assert header.startswith(os.path.join(cache_dir, "headers"))
    with open(header) as f:
        assert f.read() == PRELUDE
    source = f'#include "{header}"\nint64_t add(int64_t a, int64_t b) {{ return triple(a) + b; }}\n'
    add = _add_function(compiler.compile_c(source, cc="cc", cflags=FLAGS, cache_dir=cache_dir))
    assert add(5, 2) == 17
    # Asked again, even after the process forgot it: the same file, not a second build.
    compiler.clear_memory_cache()
    assert (
        compiler.precompiled_header(PRELUDE, cc="cc", cflags=FLAGS, cache_dir=cache_dir) == header
    )
    other = compiler.precompiled_header(PRELUDE + "\n", cc="cc", cflags=FLAGS, cache_dir=cache_dir)
    assert other != header


def test_gcc_uses_the_precompiled_form(tmp_path):
    header = compiler.precompiled_header(PRELUDE, cc="cc", cflags=FLAGS, cache_dir=str(tmp_path))
    version = compiler._run(["cc", "--version"]).stdout
    if "gcc" not in version.lower() and "free software" not in version.lower():
        pytest.skip("only GCC finds a .gch beside an included header")
    assert os.path.isfile(header + ".gch")
    unit = tmp_path / "unit.c"
    unit.write_text(f'#include "{header}"\nint64_t six(void) {{ return triple(2); }}\n')
    # -H lists the headers read; a "!" marks a precompiled one that was used.
    proc = compiler._run(["cc", *FLAGS.split(), "-H", str(unit), "-o", str(tmp_path / "u.so")])
    assert proc.returncode == 0, proc.stderr
    assert f"! {header}.gch" in proc.stderr


def test_a_removed_precompiled_header_is_built_again(tmp_path):
    header = compiler.precompiled_header(PRELUDE, cc="cc", cflags=FLAGS, cache_dir=str(tmp_path))
    os.remove(header)  # as `minicomp cache clear` would, while this process remembers it
    again = compiler.precompiled_header(PRELUDE, cc="cc", cflags=FLAGS, cache_dir=str(tmp_path))
    assert again == header and os.path.isfile(header)
