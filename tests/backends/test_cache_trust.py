"""The build cache trusts nothing it did not build: planted, damaged or shared entries, a
cache cleared mid-compile, a read-only cache, and a cache moved elsewhere."""

import contextlib
import ctypes
import os
import shutil
import stat
import tempfile
import threading
import warnings

import pytest

from minicomp import cli
from minicomp.backends import cache
from minicomp.backends.cpu import compiler
from minicomp.backends.cuda import emu, nvrtc

FLAGS = "-O1 -fPIC -shared"
NOBODY = 65534


def _adder(name: str, result: str = "a + b") -> str:
    return f"long {name}(long a, long b) {{ return {result}; }}\n"


def _call(path: str, name: str, *args: int) -> int:
    function = getattr(compiler.load_library(path), name)
    function.restype = ctypes.c_long
    return function(*[ctypes.c_long(a) for a in args])


@pytest.fixture(autouse=True)
def _fresh_memory_cache():
    compiler.clear_memory_cache()
    compiler.reset_cache_stats()
    yield
    compiler.clear_memory_cache()


def _integrity_warnings(caught) -> list:
    return [w for w in caught if issubclass(w.category, cache.CacheIntegrityWarning)]


def test_a_planted_library_is_refused_and_rebuilt(tmp_path):
    source = _adder("planted_add")
    key = compiler.cache_key(source, cc="cc", cflags=FLAGS)
    # Another library exporting the same function, dropped where the real one would go.
    evil = compiler.compile_c(
        _adder("planted_add", "666"), cc="cc", cflags=FLAGS, cache_dir=str(tmp_path / "other")
    )
    entry = cache.entry_dir(str(tmp_path / "cache"), "kernels", key)
    os.makedirs(entry)
    shutil.copy(evil, os.path.join(entry, "lib.so"))

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        path = compiler.compile_c(source, cc="cc", cflags=FLAGS, cache_dir=str(tmp_path / "cache"))
    assert _call(path, "planted_add", 2, 3) == 5  # not the planted library's 666
    assert "damaged" in str(_integrity_warnings(caught)[0].message)
    assert compiler.cache_stats().misses == 2  # the other library, then this one rebuilt
    assert os.listdir(tmp_path / "cache" / "quarantine")  # kept aside, for a look


@pytest.mark.parametrize("damage", ["truncated", "empty", "garbage", "unrecorded"])
def test_a_damaged_library_is_rebuilt_once_with_one_warning(tmp_path, damage):
    source = _adder(f"add_{damage}")
    path = compiler.compile_c(source, cc="cc", cflags=FLAGS, cache_dir=str(tmp_path))
    size = os.path.getsize(path)
    if damage == "unrecorded":
        os.remove(os.path.join(os.path.dirname(path), "meta.json"))
    else:
        data = {"truncated": open(path, "rb").read()[: size // 2], "empty": b""}
        with open(path + ".new", "wb") as f:
            f.write(data.get(damage, os.urandom(size)))
        # A new file in its place: writing into the one this process loaded would crash it.
        os.replace(path + ".new", path)

    compiler.clear_memory_cache()  # as a new process would find it
    compiler.reset_cache_stats()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        again = compiler.compile_c(source, cc="cc", cflags=FLAGS, cache_dir=str(tmp_path))
        compiler.clear_memory_cache()
        third = compiler.compile_c(source, cc="cc", cflags=FLAGS, cache_dir=str(tmp_path))
    assert again == third == path and os.path.getsize(path) == size
    assert len(_integrity_warnings(caught)) == 1
    stats = compiler.cache_stats()
    assert (stats.misses, stats.disk_hits) == (1, 1)


def test_a_tampered_precompiled_header_is_rebuilt(tmp_path):
    text = "static inline long triple(long x) { return 3 * x; }\n"
    header = compiler.precompiled_header(text, cc="cc", cflags=FLAGS, cache_dir=str(tmp_path))
    with open(header, "a") as f:
        f.write("#define triple(x) 0\n")
    compiler.clear_memory_cache()
    with pytest.warns(cache.CacheIntegrityWarning, match="prelude.h"):
        again = compiler.precompiled_header(text, cc="cc", cflags=FLAGS, cache_dir=str(tmp_path))
    assert again == header and open(header).read() == text


def test_a_damaged_cubin_is_rebuilt(tmp_path):
    try:
        nvrtc.nvrtc_version()
    except nvrtc.NvrtcUnavailableError as err:  # pragma: no cover - depends on the machine
        pytest.skip(str(err))
    source = 'extern "C" __global__ void halve(float* x) { x[threadIdx.x] *= 0.5f; }\n'
    first = nvrtc.compile_cuda(source, arch="sm_90", cache_dir=str(tmp_path))
    cubin = os.path.join(cache.entry_dir(str(tmp_path), "cubins", first.key), "kernel.cubin")
    with open(cubin, "r+b") as f:
        f.truncate(len(first.cubin) // 2)
    nvrtc.clear_memory_cache()
    nvrtc.reset_compile_stats()
    with pytest.warns(cache.CacheIntegrityWarning, match="kernel.cubin"):
        again = nvrtc.compile_cuda(source, arch="sm_90", cache_dir=str(tmp_path))
    assert again.cubin == first.cubin and nvrtc.compile_stats()["compiles"] == 1


def test_a_cache_root_other_users_can_write_is_refused(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    with pytest.raises(cache.UntrustedCacheError, match=f"{shared}.*chmod go-w"):
        compiler.compile_c(_adder("shared_add"), cc="cc", cflags=FLAGS, cache_dir=str(shared))
    assert not os.path.exists(shared / "kernels")

    theirs = tmp_path / "theirs"
    theirs.mkdir(mode=0o755)
    if os.geteuid() == 0:
        os.chown(theirs, NOBODY, NOBODY)
    else:
        theirs = "/"  # a directory of root's, for any other user
    with pytest.raises(cache.UntrustedCacheError, match="belongs to user id"):
        compiler.compile_c(_adder("their_add"), cc="cc", cflags=FLAGS, cache_dir=str(theirs))


def test_a_new_cache_root_is_private(tmp_path):
    root = tmp_path / "new" / "cache"
    compiler.compile_c(_adder("private_add"), cc="cc", cflags=FLAGS, cache_dir=str(root))
    assert stat.S_IMODE(os.stat(root).st_mode) == 0o700


def _waiting_compiler(folder) -> str:
    """A cc wrapper that says when it starts, then waits for a `go` file before compiling."""
    script = folder / "waiting-cc"
    script.write_text(
        "#!/bin/sh\n"
        'if [ "$1" = --version ]; then exec cc --version; fi\n'
        f'touch "{folder}/started"\n'
        "i=0\n"
        f'while [ ! -e "{folder}/go" ] && [ "$i" -lt 400 ]; do sleep 0.05; i=$((i + 1)); done\n'
        'exec cc "$@"\n'
    )
    script.chmod(0o755)
    return str(script)


@pytest.mark.parametrize("command", [["clear"], ["prune", "--older-than", "0s"]])
def test_cleaning_the_cache_during_a_compile_leaves_the_compile_correct(tmp_path, command):
    root = str(tmp_path / "cache")
    compiler.compile_c(_adder("earlier_add"), cc="cc", cflags=FLAGS, cache_dir=root)
    cc = _waiting_compiler(tmp_path)
    result = {}

    def compile_meanwhile():
        try:
            result["path"] = compiler.compile_c(
                _adder("meanwhile_add"), cc=cc, cflags=FLAGS, cache_dir=root
            )
        except Exception as err:  # reported on the test's thread
            result["error"] = err

    thread = threading.Thread(target=compile_meanwhile)
    thread.start()
    try:
        for _ in range(400):
            if os.path.exists(tmp_path / "started") or not thread.is_alive():
                break
            thread.join(0.05)
        assert cli.main(["cache", "--cache-dir", root, *command]) == 0
    finally:
        (tmp_path / "go").touch()
        thread.join(60)
    assert "error" not in result, result.get("error")
    assert _call(result["path"], "meanwhile_add", 40, 2) == 42
    assert os.path.isfile(result["path"])


@contextlib.contextmanager
def _without_write_access(folder: str):
    """Run the body unable to write under `folder`: as the nobody user when this is root (whom
    permissions do not stop), else with the write permission taken away."""
    if os.geteuid() == 0:
        os.seteuid(NOBODY)
        try:
            yield
        finally:
            os.seteuid(0)
        return
    folders = [path for path, _, _ in os.walk(folder)]
    for path in folders:
        os.chmod(path, 0o555)
    try:
        yield
    finally:
        for path in folders:
            os.chmod(path, 0o755)


@pytest.fixture
def readable_cache():
    """A cache root that other users may read (tmp_path is private to this user)."""
    root = tempfile.mkdtemp(prefix="minicomp-read-only-")
    os.chmod(root, 0o755)
    yield root
    shutil.rmtree(root, ignore_errors=True)


def test_a_read_only_cache_says_what_it_could_not_remove(readable_cache, capsys):
    root = readable_cache
    path = compiler.compile_c(_adder("kept_add"), cc="cc", cflags=FLAGS, cache_dir=root)
    with _without_write_access(root):
        clear = cli.main(["cache", "--cache-dir", root, "clear"])
        clear_out = capsys.readouterr()
        prune = cli.main(["cache", "--cache-dir", root, "prune", "--older-than", "0s"])
        prune_out = capsys.readouterr()
    assert os.path.isfile(path)
    assert clear == 1 and "removed 0 libraries" in clear_out.out
    assert "could not remove 1 libraries" in clear_out.err
    assert os.path.join(root, "kernels") in clear_out.err
    assert prune == 1 and "removed 0 kernel builds" in prune_out.out
    assert "could not remove" in prune_out.err and os.path.dirname(path) in prune_out.err


VADD = """
extern "C" __global__ void vadd(const float* a, const float* b, float* out, long n) {
    long i = blockIdx.x * (long)blockDim.x + threadIdx.x;
    if (i < n) out[i] = a[i] + b[i];
}
"""


def test_a_moved_or_copied_emulator_cache_still_hits(tmp_path):
    import torch

    kernels = [("vadd", "const float*, const float*, float*, long")]
    emu.build_emulated(VADD, kernels, cache_dir=str(tmp_path / "first"))
    shutil.copytree(tmp_path / "first", tmp_path / "copied")
    os.rename(tmp_path / "first", tmp_path / "moved")
    for where in ("copied", "moved"):
        compiler.clear_memory_cache()
        compiler.reset_cache_stats()
        module = emu.build_emulated(VADD, kernels, cache_dir=str(tmp_path / where))
        assert compiler.cache_stats().misses == 0, where
        a, b, out = torch.arange(5.0), torch.ones(5), torch.zeros(5)
        module.launch("vadd", 1, 32, [a, b, out, 5])
        assert out.tolist() == [1.0, 2.0, 3.0, 4.0, 5.0]
